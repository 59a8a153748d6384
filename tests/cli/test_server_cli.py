"""``ds4-server``'s command line without a model or a socket served: flag checks, API keys,
the listening socket's family, and the server configuration the flags become."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from ds4mlx.cli import server as server_cli
from ds4mlx.experts import ExpertStats

import pytest


def test_api_keys_from_flags_and_a_file_are_stripped(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("\n  k2 \n\n\tk3\n")
    assert server_cli.api_keys_from([" k1 "], None) == ("k1",)
    assert server_cli.api_keys_from(["k1"], key_file) == ("k1", "k2", "k3")
    assert server_cli.api_keys_from([], None) == ()


@pytest.mark.parametrize("keys", [[" "], ["k1", ""], ["\t"]])
def test_a_blank_api_key_is_refused(keys):
    with pytest.raises(ValueError, match="--api-key must not be blank"):
        server_cli.api_keys_from(keys, None)


def test_a_key_file_of_blank_lines_holds_no_key(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("\n   \n")
    with pytest.raises(ValueError, match=f"--api-key-file {key_file} holds no key"):
        server_cli.api_keys_from([], key_file)


@pytest.mark.parametrize(
    ("host", "family"), [("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)]
)
def test_listen_binds_the_family_of_the_address(host, family):
    try:
        socket.create_server((host, 0), family=family).close()
    except OSError as exc:  # a machine without IPv6
        pytest.skip(str(exc))
    listener = server_cli.listen(host, 0)
    try:
        assert listener.family == family and listener.getsockname()[0] == host
    finally:
        listener.close()


def usage_error(capsys, monkeypatch, *flags: str) -> str:
    Fakes(monkeypatch)  # a check that lets the flags through must not serve for real
    with pytest.raises(SystemExit) as caught:
        server_cli.main(list(flags))
    assert caught.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tokens", "0"], "--tokens must be positive, got 0"),
        (["--tokens", "-5"], "--tokens must be positive, got -5"),
        (["--keepalive", "0"], "--keepalive must be positive, got 0.0"),
        (["--keepalive", "-1"], "--keepalive must be positive, got -1.0"),
        (["--batched-session", "0"], "--batched-session must be at least 1, got 0"),
        (["--api-key", " "], "--api-key must not be blank"),
        (["--api-key-file", "/nonexistent/keys"], "No such file or directory"),
        (["--mtp-model", "d.gguf"], "--mtp-model given without --dspark"),
    ],
)
def test_bad_server_flags_are_usage_errors(capsys, monkeypatch, flags, message):
    assert message in usage_error(capsys, monkeypatch, *flags)


def test_expert_details_are_the_store_summary_when_there_is_one():
    stats = ExpertStats("resident", resident_bytes=2**20)
    assert server_cli.expert_details(SimpleNamespace(expert_stats=lambda: stats)) == (
        "experts: resident, 1.0 MiB"
    )
    assert server_cli.expert_details(SimpleNamespace(expert_stats=lambda: None)) is None


class Fakes:
    """Stand-ins for the socket, engine thread, model, service and uvicorn: what main built."""

    def __init__(self, monkeypatch, chat_format="template"):
        self.closed: list[str] = []
        self.model = SimpleNamespace(chat_format=chat_format, expert_stats=lambda: None)
        fakes = self

        class Listener:
            def close(self):
                fakes.closed.append("listener")

        class Engine:
            def __init__(self, max_sessions):
                fakes.max_sessions = max_sessions

            def run(self, work):
                return work()

            def close(self):
                fakes.closed.append("engine")

        class Server:
            def __init__(self, config):
                fakes.uvicorn_config = config

            def run(self, sockets):
                fakes.sockets = sockets

        monkeypatch.setattr(server_cli, "listen", lambda host, port: Listener())
        monkeypatch.setattr(server_cli, "GenerationQueue", Engine)
        monkeypatch.setattr(
            server_cli, "load_engine", lambda options, speculation, ranks: (self.model, None, None)
        )
        monkeypatch.setattr(server_cli, "prompt_cache_for", lambda args, model: "cache")
        monkeypatch.setattr(server_cli, "ChatService", self.service)
        monkeypatch.setattr(server_cli, "create_app", self.app)
        monkeypatch.setattr(server_cli.uvicorn, "Server", Server)

    def service(self, model, drafter, speculation, **kwargs):
        self.service_kwargs = kwargs
        return "service"

    def app(self, service, config, engine):
        self.config = config
        return "app"


def test_the_flags_become_the_server_config(monkeypatch, tmp_path):
    fakes = Fakes(monkeypatch)
    code = server_cli.main(
        [
            *("-m", str(tmp_path / "my-model.gguf"), "-c", "512", "--tokens", "64", "--think"),
            *("--alias", "a", "--alias", "b", "--keepalive", "2.5", "--cors", "--api-key", "k"),
            *("--batched-session", "3", "--temp", "0.5", "-v"),
        ]
    )
    assert code == 0
    config = fakes.config
    assert (config.model_id, config.aliases) == ("my-model", ("a", "b"))
    assert (config.defaults.max_tokens, config.defaults.thinking) == (64, True)
    assert config.defaults.sampling.temperature == 0.5
    assert (config.keepalive_seconds, config.cors, config.api_keys) == (2.5, True, ("k",))
    assert config.details() is None  # --verbose: the expert counters (none for this model)
    assert fakes.max_sessions == 3
    assert fakes.service_kwargs == {"max_context": 512, "sessions": 3, "prompt_cache": "cache"}
    assert fakes.closed == ["listener", "engine"]


def test_without_tokens_a_reply_may_fill_the_context(monkeypatch):
    fakes = Fakes(monkeypatch)
    assert server_cli.main(["-c", "300"]) == 0
    config = fakes.config
    assert (config.defaults.max_tokens, config.defaults.thinking) == (300, False)
    assert (config.aliases, config.keepalive_seconds, config.cors, config.api_keys) == (
        (),
        5.0,
        False,
        (),
    )
    assert config.details is None
    assert fakes.max_sessions == 1


def test_a_model_without_a_chat_template_is_served_with_a_warning(monkeypatch, caplog):
    Fakes(monkeypatch, chat_format=None)
    assert server_cli.main(["-m", "plain.gguf"]) == 0
    assert "plain.gguf has no chat template: only /v1/completions can serve it" in caplog.text


def test_a_port_in_use_fails_before_loading(monkeypatch, caplog):
    fakes = Fakes(monkeypatch)

    def taken(host, port):
        raise OSError("address in use")

    monkeypatch.setattr(server_cli, "listen", taken)
    assert server_cli.main(["--host", "0.0.0.0", "--port", "9"]) == 1
    assert "cannot listen on 0.0.0.0 port 9: address in use" in caplog.text
    assert not hasattr(fakes, "config")
