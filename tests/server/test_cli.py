"""The ds4-server command: flags, serving, clean shutdown; and a smoke test with the trained tiny
model when it has been built."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ds4mlx.bench.server import free_port
from ds4mlx.cli.server import main
from ds4mlx.generation import ChatService

import httpx
import openai
import pytest

from server.harness import TIMEOUT, ScriptedService, config_with, serve

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
GLM_TINY_MODEL = TINY_MODEL.with_name("glm-tiny.gguf")
STARTUP_TIMEOUT = 180.0


def test_serves_until_interrupted_and_exits_cleanly(chat_model_path):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ds4mlx.cli.server",
            "-m",
            str(chat_model_path),
            "--port",
            str(port),
            "--alias",
            "deepseek-v4-flash",
            "-n",
            "4",
            "--temp",
            "0",
            "-c",
            "512",
            "--verbose",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Starting (imports, model load) takes a few seconds, many more on a loaded machine;
        # the deadline only bounds a hang, and a server that died is reported at once.
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "ds4-server did not come up"
                time.sleep(0.1)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )
        assert [m.id for m in client.models.list().data] == [
            chat_model_path.stem,
            "deepseek-v4-flash",
        ]
        reply = client.chat.completions.create(
            model="deepseek-v4-flash", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.usage.completion_tokens == 4  # the -n default
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=TIMEOUT)
    assert server.returncode == 0, stderr
    assert "serving" in stderr and "Traceback" not in stderr
    # --verbose: how the weights loaded, and the expert store's line after the request.
    assert "weights: " in stderr
    assert "/v1/chat/completions: experts: " in stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--port", "http"], "--port"),
        (["--temp", "-1"], "--temp"),
        (["-n", "0"], "--tokens"),
        (["--keepalive", "0"], "--keepalive"),
        (["--dspark"], "--mtp-model"),
        (["--batched-session", "0"], "--batched-session"),
    ],
)
def test_bad_flags_fail_with_a_message(chat_model_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exited:
        main(["-m", str(chat_model_path), *flags])
    assert exited.value.code == 2
    # The error line itself names the flag (the usage above it names every flag).
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.skipif(not GLM_TINY_MODEL.is_file(), reason=f"{GLM_TINY_MODEL} has not been built")
def test_batched_sessions_are_refused_for_glm(caplog):
    """GLM's recurrent (KDA) layers have no batched decode: the server says so and exits."""
    port = str(free_port())
    assert main(["-m", str(GLM_TINY_MODEL), "--port", port, "--batched-session", "2"]) == 1
    assert "--batched-session 2" in caplog.text and "no batched decode" in caplog.text


def test_a_missing_model_file_is_reported(tmp_path, caplog):
    assert main(["-m", str(tmp_path / "nope.gguf"), "--port", str(free_port())]) == 1
    assert "nope.gguf" in caplog.text


@pytest.fixture
def no_loading(monkeypatch) -> None:
    """Fails the test if the server starts loading the model."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad argument was found")

    monkeypatch.setattr("ds4mlx.cli.server.load_model", refuse)


def test_a_port_in_use_is_found_before_loading(chat_model_path, caplog, no_loading):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["-m", str(chat_model_path), "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1 port {port}" in caplog.text
    assert "serving" not in caplog.text


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dspark", "--mtp-model", "/nonexistent.gguf"], "--mtp-model /nonexistent.gguf"),
        (["--dspark", "--mtp-model", str(GLM_TINY_MODEL)], "not a drafter for --dspark"),
        (["--kv-disk-dir", "/proc/nonexistent/x"], "--kv-disk-dir /proc/nonexistent/x cannot"),
    ],
)
def test_bad_files_and_folders_are_found_before_loading(
    chat_model_path, capsys, no_loading, flags, message
):
    with pytest.raises(SystemExit) as exited:
        main(["-m", str(chat_model_path), "--port", str(free_port()), *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_cors_lets_browser_clients_in(engine):
    with serve(ScriptedService(), engine, config_with(cors=True)) as base_url:
        preflight = httpx.options(
            f"{base_url}/v1/chat/completions",
            timeout=TIMEOUT,
            headers={
                "Origin": "http://localhost:3000",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,authorization",
            },
        )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in ("*", "http://localhost:3000")


@pytest.mark.skipif(not TINY_MODEL.is_file(), reason=f"{TINY_MODEL} has not been built")
def test_the_trained_tiny_model_answers(engine):
    import ds4mlx

    model = engine.run(lambda: ds4mlx.load_model(TINY_MODEL))
    with serve(ChatService(model, max_context=1024), engine) as base_url:
        client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )
        reply = client.chat.completions.create(
            model="chat-model",
            max_tokens=12,
            messages=[
                {"role": "user", "content": "Write a Python function that adds two numbers."}
            ],
        )
    assert reply.choices[0].message.content.strip()
