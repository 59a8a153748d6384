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


@pytest.fixture
def ranks(monkeypatch):
    """Stand-in rank groups: ``ranks.group`` is what join_ranks returns (or raises)."""
    state = SimpleNamespace(group=None, asked=[], followed=[], stopped=0)

    def join_ranks(distributed):
        state.asked.append(distributed)
        if isinstance(state.group, Exception):
            raise state.group
        return state.group

    def follow_rank_0(front_end, options, group):
        state.followed.append((front_end, options.model, group))
        return 9

    monkeypatch.setattr(server_cli, "join_ranks", join_ranks)
    monkeypatch.setattr(server_cli, "follow_rank_0", follow_rank_0)
    return state


def conducted(fakes, monkeypatch, ranks):
    """Make the fake engine load with a conductor whose stops are counted in ``ranks``."""
    conductor = SimpleNamespace(stop=lambda: setattr(ranks, "stopped", ranks.stopped + 1))

    def load_engine(options, speculation, group):
        ranks.loaded_with = group
        return fakes.model, None, conductor

    monkeypatch.setattr(server_cli, "load_engine", load_engine)


def test_a_group_that_cannot_start_fails_before_listening(monkeypatch, caplog, ranks):
    fakes = Fakes(monkeypatch)
    ranks.group = server_cli.DistributedError("not launched by mlx.launch")
    assert server_cli.main(["--distributed"]) == 1
    assert ranks.asked == [True]
    assert "error: not launched by mlx.launch" in caplog.text
    assert fakes.closed == []  # nothing was listened on


@pytest.mark.parametrize("rank", [1, 2])
def test_ranks_but_0_follow_and_serve_nothing(monkeypatch, ranks, rank):
    fakes = Fakes(monkeypatch)
    ranks.group = SimpleNamespace(rank=rank, size=3)
    assert server_cli.main(["-m", "m.gguf", "--distributed"]) == 9
    assert ranks.followed == [("ds4-server", "m.gguf", ranks.group)]
    assert not hasattr(fakes, "config")


def test_rank_0_serves_without_a_prompt_cache_and_stops_the_followers(
    monkeypatch, caplog, ranks, tmp_path
):
    fakes = Fakes(monkeypatch)
    conducted(fakes, monkeypatch, ranks)
    ranks.group = SimpleNamespace(rank=0, size=2)
    argv = ["--distributed", "--kv-disk-dir", str(tmp_path / "kv")]
    assert server_cli.main(argv) == 0
    assert ranks.followed == [] and ranks.stopped == 1
    assert ranks.loaded_with is ranks.group
    assert fakes.service_kwargs["prompt_cache"] is None
    assert "--kv-disk-dir is ignored with --distributed" in caplog.text


def test_rank_0_without_a_disk_cache_is_not_warned(monkeypatch, caplog, ranks):
    fakes = Fakes(monkeypatch)
    conducted(fakes, monkeypatch, ranks)
    ranks.group = SimpleNamespace(rank=0, size=2)
    assert server_cli.main(["--distributed"]) == 0
    assert "ignored" not in caplog.text


def test_a_single_process_keeps_its_disk_cache_quietly(monkeypatch, caplog, ranks, tmp_path):
    fakes = Fakes(monkeypatch)
    assert server_cli.main(["--kv-disk-dir", str(tmp_path / "kv")]) == 0
    assert ranks.asked == [False]
    assert fakes.service_kwargs["prompt_cache"] == "cache"
    assert "ignored" not in caplog.text


@pytest.mark.parametrize(
    "error",
    [
        server_cli.GGUFError("bad header"),
        server_cli.TokenizerError("no vocabulary"),
        OSError("unreadable"),
        ValueError("odd"),
        server_cli.DistributedError("rank lost"),
    ],
)
def test_a_model_that_cannot_load_is_an_error(monkeypatch, caplog, error):
    fakes = Fakes(monkeypatch)

    def failing(options, speculation, group):
        raise error

    monkeypatch.setattr(server_cli, "load_engine", failing)
    assert server_cli.main([]) == 1
    assert f"error: {error}" in caplog.text
    assert fakes.closed == ["listener", "engine"]


def test_a_disk_cache_that_cannot_be_made_is_an_error(monkeypatch, caplog, ranks):
    fakes = Fakes(monkeypatch)
    conducted(fakes, monkeypatch, ranks)

    def failing(args, model):
        raise OSError("read-only file system")

    monkeypatch.setattr(server_cli, "prompt_cache_for", failing)
    assert server_cli.main([]) == 1
    assert "error: --kv-disk-dir: read-only file system" in caplog.text
    assert fakes.closed == ["listener", "engine"] and ranks.stopped == 1


def test_a_model_without_batched_decoding_is_an_error(monkeypatch, caplog):
    fakes = Fakes(monkeypatch)

    def refusing(model, drafter, speculation, **kwargs):
        raise ValueError("GLM decodes one sequence at a time")

    monkeypatch.setattr(server_cli, "ChatService", refusing)
    assert server_cli.main(["--batched-session", "4"]) == 1
    assert "error: --batched-session 4: GLM decodes one sequence at a time" in caplog.text
    assert fakes.closed == ["listener", "engine"]


def test_uvicorn_serves_the_app_on_the_bound_socket(monkeypatch, caplog):
    caplog.set_level("INFO", logger="ds4mlx.server")
    fakes = Fakes(monkeypatch)
    listened = []
    listener = SimpleNamespace(close=lambda: fakes.closed.append("listener"))

    def listen(host, port):
        listened.append((host, port))
        return listener

    monkeypatch.setattr(server_cli, "listen", listen)
    assert server_cli.main(["-m", "dir/served.gguf", "--host", "::1", "--port", "8123"]) == 0
    assert listened == [("::1", 8123)]
    assert fakes.sockets == [listener]
    config = fakes.uvicorn_config
    assert (config.app, config.log_level, config.timeout_graceful_shutdown) == ("app", "info", 5)
    assert "serving 'served' on http://[::1]:8123/v1" in caplog.text


def test_an_ipv4_address_is_served_unbracketed(monkeypatch, caplog):
    caplog.set_level("INFO", logger="ds4mlx.server")
    Fakes(monkeypatch)
    assert server_cli.main(["-m", "m.gguf", "--host", "0.0.0.0"]) == 0
    assert "serving 'm' on http://0.0.0.0:8000/v1" in caplog.text


def test_ctrl_c_ends_serving_cleanly(monkeypatch):
    fakes = Fakes(monkeypatch)

    def interrupted(self, sockets):
        raise KeyboardInterrupt

    monkeypatch.setattr(server_cli.uvicorn.Server, "run", interrupted)
    try:
        code = server_cli.main([])
    except KeyboardInterrupt:  # (escaping, it would stop the test run instead of failing)
        pytest.fail("Ctrl+C escaped ds4-server's main")
    assert code == 0
    assert fakes.closed == ["listener", "engine"]


@pytest.fixture
def loading(monkeypatch):
    """``load_engine``'s pieces, recorded: the model, the drafter, the conductor, exits."""
    state = SimpleNamespace(exits=[], stops=0, drafter=None, loaded=None)
    model = SimpleNamespace(
        close="model.close", args_summary=lambda: "2 layers", load_summary=lambda: "q8, 1 MiB"
    )
    state.model = model
    conductor = SimpleNamespace(stop=lambda: setattr(state, "stops", state.stops + 1))
    state.conductor = conductor

    def load_model(path, **kwargs):
        state.loaded = (path, kwargs)
        return model

    def load_drafter(speculation, loaded):
        assert loaded is model
        if isinstance(state.drafter, BaseException):
            raise state.drafter
        return state.drafter

    def lead(loaded, group):
        state.led = (loaded, group)
        return conductor

    monkeypatch.setattr(server_cli, "load_model", load_model)
    monkeypatch.setattr(server_cli, "load_drafter", load_drafter)
    monkeypatch.setattr(server_cli, "lead", lead)
    monkeypatch.setattr(server_cli, "atexit", SimpleNamespace(register=state.exits.append))
    return state


def engine_options(*flags: str):
    args = server_cli.build_parser().parse_args(["-m", "m.gguf", *flags])
    return server_cli.model_options(args), server_cli.speculation_config(args)


def test_the_engine_loads_alone(loading, caplog):
    caplog.set_level("INFO", logger="ds4mlx.server")
    options, speculation = engine_options()
    assert server_cli.load_engine(options, speculation) == (loading.model, None, None)
    path, kwargs = loading.loaded
    assert path == "m.gguf"
    assert (kwargs["progress"], kwargs["ranks"]) == (server_cli.progress_line, None)
    assert (kwargs["weights_dtype"], kwargs["experts"]) == (options.weights_dtype, options.experts)
    assert loading.exits == ["model.close"]
    assert "loaded m.gguf (2 layers) in " in caplog.text
    for quiet in ("weights:", "drafter", "rank 0"):
        assert quiet not in caplog.text


def test_the_engine_tells_its_drafter_weights_and_ranks(loading, caplog):
    caplog.set_level("INFO", logger="ds4mlx.server")
    loading.drafter = SimpleNamespace(name="dspark")
    group = SimpleNamespace(rank=0, size=4)
    options, speculation = engine_options("-v", "--dspark-strict", "--mtp-model", "d.gguf")
    model, drafter, conductor = server_cli.load_engine(options, speculation, group)
    assert (model, drafter, conductor) == (loading.model, loading.drafter, loading.conductor)
    assert loading.loaded[1]["ranks"] is group and loading.led == (loading.model, group)
    assert "weights: q8, 1 MiB" in caplog.text
    assert "drafter dspark (strict: target-only decoding)" in caplog.text
    assert "rank 0 of 4: the other ranks follow this one's model calls" in caplog.text
    assert loading.stops == 0


def test_a_lenient_drafter_is_told_without_strict(loading, caplog):
    caplog.set_level("INFO", logger="ds4mlx.server")
    loading.drafter = SimpleNamespace(name="mtp")
    server_cli.load_engine(*engine_options("--mtp"))
    assert "drafter mtp\n" in caplog.text + "\n" and "strict" not in caplog.text


@pytest.mark.parametrize("group", [SimpleNamespace(rank=0, size=2), None])
@pytest.mark.parametrize("error", [server_cli.GGUFError("not a drafter"), KeyboardInterrupt()])
def test_a_drafter_that_cannot_load_lets_the_followers_go(loading, group, error):
    loading.drafter = error
    with pytest.raises(type(error)):
        server_cli.load_engine(*engine_options("--mtp"), group)
    assert loading.stops == (1 if group else 0)
