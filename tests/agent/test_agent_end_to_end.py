"""``ds4-agent --api-base`` run as a real process in a pseudo-terminal, on the scripted
OpenAI-compatible server: what reaches the terminal, autosave, SIGTERM, --continue."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.cli import agent as cli

import pytest
from processes import processes_with, sleeper
from pseudo_terminal import PseudoTerminal
from scripted_server import Server, chunk, text_chunks, tool_call_chunks

ROOT = Path(__file__).parents[2]
OSC_TITLE = "\x1b]0;PWNED\x07"


class Terminal(PseudoTerminal):
    """ds4-agent in a 100x30 pseudo-terminal; everything it writes is kept in ``output``."""

    def __init__(self, arguments: list[str], cwd: Path):
        super().__init__("ds4mlx.cli.agent", arguments, cwd)


def saved(data_dir: Path) -> list[dict]:
    store = ConversationStore(data_dir)
    return [store.load(entry.name).messages for entry in store.list() if not entry.problem]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks processes through /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_saves_stops_jobs_and_restores_the_terminal(workspace, tmp_path, sig):
    data = tmp_path / "data"
    script = [
        [
            chunk({"role": "assistant", "content": f"Starting {OSC_TITLE}a job."}),
            *tool_call_chunks([json.dumps({"command": f"{sleeper(4260)} &"})], name="bash"),
        ],
        text_chunks("The job runs."),
    ]
    with Server(script) as server:
        terminal = Terminal(
            [
                "--api-base",
                server.url,
                "--yolo",
                "--workspace",
                str(workspace),
                "--data-dir",
                str(data),
            ],
            tmp_path,
        )
        try:
            terminal.wait_for(lambda: b"Ask ds4-agent" in terminal.output)
            time.sleep(0.5)
            terminal.type("start a job\r")
            # autosaved after the turn, with the job running
            terminal.wait_for(lambda: any("The job runs." in json.dumps(m) for m in saved(data)))
            assert processes_with(sleeper(4260))
            terminal.process.send_signal(sig)
            terminal.process.wait(30)
        finally:
            terminal.close()
    output = bytes(terminal.output)
    assert terminal.process.returncode == 128 + sig
    assert b"\x1b]0;PWNED" not in output  # the model's escape sequence never reached it
    assert b"\x1b[?1049h" in output and output.rfind(b"\x1b[?1049l") > output.rfind(
        b"\x1b[?1049h"
    )  # the alternate screen was left
    assert output.rfind(b"\x1b[?1000l") > output.rfind(b"\x1b[?1000h")  # mouse off again
    assert processes_with(sleeper(4260)) == []
    messages = saved(data)[0]
    assert messages[1]["content"] == "start a job"
    assert not list(data.glob(".*.tmp"))


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks processes through /proc")
def test_sigterm_in_print_mode_stops_the_running_command(workspace, tmp_path):
    script = [tool_call_chunks([json.dumps({"command": sleeper(4270)})], name="bash")]
    with Server(script) as server:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ds4mlx.cli.agent",
                "--api-base",
                server.url,
                "--yolo",
                "--bash-timeout",
                "100",
                "--workspace",
                str(workspace),
                "--print",
                "wait",
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            while not processes_with(sleeper(4270)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert processes_with(sleeper(4270))
            process.send_signal(signal.SIGTERM)
            process.wait(30)  # the command was stopped, not waited for (--bash-timeout 100)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM
    assert processes_with(sleeper(4270)) == []


def test_sigterm_in_print_mode_ends_a_stalled_request(workspace, tmp_path):
    stall = threading.Event()
    with Server([], stall=stall) as server:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ds4mlx.cli.agent",
                "--api-base",
                server.url,
                "--workspace",
                str(workspace),
                "--print",
                "hello",
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            while not server.requests and time.monotonic() < deadline:
                time.sleep(0.1)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(30)
            elapsed = time.monotonic() - signalled
        finally:
            stall.set()
            if process.poll() is None:
                process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM
    assert elapsed < 20  # the 3 s grace, then unwound; the stalled request would wait forever


def test_continue_resumes_the_last_conversation_of_the_workspace(workspace, tmp_path, capsys):
    data = tmp_path / "data"
    store = ConversationStore(data)
    with Server([text_chunks("Second answer."), text_chunks("Third answer.")]) as server:
        base = ["--api-base", server.url, "--workspace", str(workspace), "--data-dir", str(data)]
        # the TUI autosaves; here the first conversation is made as it would leave it
        from ds4mlx.agent.conversations import Conversation

        other = tmp_path / "other"
        other.mkdir()
        store.save(
            Conversation(
                [{"role": "system", "content": "s"}, {"role": "user", "content": "elsewhere"}],
                workspace=str(other.resolve()),
            ),
            "other",
        )
        store.save(
            Conversation(
                [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "first question"},
                    {"role": "assistant", "content": "First answer."},
                ],
                workspace=str(workspace.resolve()),
            ),
            "mine",
        )
        store.save(
            Conversation(
                [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "elsewhere, later"},
                ],
                workspace=str(other.resolve()),
            ),
            "later",
        )
        assert cli.main([*base, "--continue", "--print", "second question"]) == 0
        sent = server.requests[0]["messages"]
        assert cli.main([*base, "--resume", "other", "--print", "third"]) == 0
        resumed = server.requests[1]["messages"]
    assert [m["content"] for m in sent[1:]] == [
        "first question",
        "First answer.",
        "second question",
    ]
    assert resumed[1]["content"] == "elsewhere"
    mine = store.load("mine").messages
    assert mine[-1] == {"role": "assistant", "content": "Second answer."}
    assert "Second answer." in capsys.readouterr().out


def test_continue_without_a_conversation_is_a_clear_error(workspace, tmp_path, capsys):
    code = cli.main(
        [
            "--api-base",
            "http://127.0.0.1:9/v1",
            "--continue",
            "--print",
            "hi",
            "--workspace",
            str(workspace),
            "--data-dir",
            str(tmp_path / "none"),
        ]
    )
    assert code == 1 and "no saved conversation for" in capsys.readouterr().err


def test_print_saves_so_that_continue_print_goes_on(workspace, tmp_path, capsys):
    data = tmp_path / "data"
    with Server([text_chunks("First answer."), text_chunks("Second answer.")]) as server:
        base = ["--api-base", server.url, "--workspace", str(workspace), "--data-dir", str(data)]
        assert cli.main([*base, "--print", "first question"]) == 0
        assert cli.main([*base, "--continue", "--print", "second question"]) == 0
        sent = server.requests[1]["messages"]
    assert [m["content"] for m in sent[1:]] == [
        "first question",
        "First answer.",
        "second question",
    ]
    assert len(saved(data)) == 1  # the continued conversation was saved back, not copied
    assert saved(data)[0][-1] == {"role": "assistant", "content": "Second answer."}


def test_print_with_a_context_too_small_says_what_helps_there(workspace, tmp_path, capsys):
    with Server([]) as server:
        code = cli.main(
            [
                "--api-base", server.url, "-c", "512", "--workspace", str(workspace),
                "--data-dir", str(tmp_path / "data"), "--print", "hi",
            ]
        )  # fmt: skip
        assert not server.requests
    err = capsys.readouterr().err
    assert code == 1
    assert "context not compacted: nothing to compact" in err and " -> " not in err
    assert "leaves no room in the context of 512 tokens" in err and "-c/--ctx" in err
    assert "/compact" not in err


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks processes through /proc")
def test_print_stops_its_background_jobs_on_exit(workspace, tmp_path, capsys):
    script = [
        tool_call_chunks([json.dumps({"command": f"{sleeper(4264)} &"})], name="bash"),
        text_chunks("ok"),
    ]
    with Server(script) as server:
        code = cli.main(
            [
                "--api-base", server.url, "--yolo", "--workspace", str(workspace),
                "--data-dir", str(tmp_path / "data"), "--print", "start a job",
            ]
        )  # fmt: skip
    assert code == 0 and "started background job 1" in capsys.readouterr().err
    assert processes_with(sleeper(4264)) == []
