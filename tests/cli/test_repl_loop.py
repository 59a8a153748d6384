"""The chat loop of ``ds4`` on a terminal (``cli.repl``) driven in process: typed lines and
commands, the answer streamed from a stand-in service, Ctrl+C, and the history file."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from types import SimpleNamespace

from ds4mlx.cli import repl
from ds4mlx.generation import Finished, GenerationStats, PrefillProgress, TextDelta

import pytest


@pytest.mark.parametrize(
    ("xdg", "expected"),
    [
        ("data", "data/ds4mlx/ds4-history"),
        ("", "home/.local/share/ds4mlx/ds4-history"),  # set but empty: as unset
        (None, "home/.local/share/ds4mlx/ds4-history"),
    ],
)
def test_the_history_lives_under_the_xdg_data_home(monkeypatch, tmp_path, xdg, expected):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg is None:
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_DATA_HOME", xdg and str(tmp_path / xdg))
    assert repl.history_path() == tmp_path / expected


def reader(*lines: str):
    given = iter(lines)
    prompts: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(given)

    return read, prompts


@pytest.mark.parametrize(
    ("lines", "message", "prompts"),
    [
        (["hello"], "hello", ["> "]),
        (["a\\", "b\\", "c"], "a\nb\nc", ["> ", ". ", ". "]),
        (['  """ ', "x\\", "", "  y", ' """'], "x\\\n\n  y", ["> ", ". ", ". ", ". ", ". "]),
        (['"""', '"""'], "", ["> ", ". "]),
    ],
)
def test_a_message_is_a_line_continued_lines_or_a_block(lines, message, prompts):
    read, asked = reader(*lines)
    assert repl.read_message(read) == message
    assert asked == prompts


def test_the_history_file_is_the_users_only(tmp_path):
    pytest.importorskip("readline")
    history = repl._History(tmp_path / "data" / "ds4-history")
    history.save()
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE(history.path.stat().st_mode) == 0o600


def test_a_history_that_cannot_be_written_does_not_end_the_chat(tmp_path):
    pytest.importorskip("readline")
    (tmp_path / "file").write_text("")
    repl._History(tmp_path / "file" / "ds4-history").save()  # no exception


def test_ctrl_c_while_answering_sets_stop_and_the_handler_is_put_back():
    interrupts = repl._Interrupts()
    before = signal.getsignal(signal.SIGINT)
    with interrupts.catching():
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.stop.wait(5)
    assert signal.getsignal(signal.SIGINT) is before
    with interrupts.catching():
        assert not interrupts.stop.is_set()  # cleared for the next answer


def finished(reason="stop") -> Finished:
    stats = GenerationStats(
        prompt_tokens=12, prefill_seconds=0.5, generated_tokens=5, decode_seconds=2.0
    )
    return Finished(reason, prompt_tokens=12, completion_tokens=5, cached_tokens=8, stats=stats)


def test_the_turn_summary():
    assert repl._turn_summary(finished("length")) == (
        "ds4: prompt 12 tokens (8 cached), prefill 24.0 t/s | generated 5 tokens, "
        "decode 2.0 t/s (length)"
    )


class Service:
    """Answers each chat with ``replies`` in turn: a list of events, or an exception."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen: list[list[dict]] = []

    def chat(self, messages, **options):
        self.seen.append([dict(m) for m in messages])
        reply = self.replies.pop(0)

        def events():
            if isinstance(reply, Exception):
                raise reply
            yield from reply

        return events()


def chat(monkeypatch, tmp_path, lines, replies, system=None, verbose=False):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    service = Service(replies)
    monkeypatch.setattr(repl, "ChatService", lambda *a, **k: service)
    typed = iter(lines)

    def read_message():
        line = next(typed)
        if isinstance(line, BaseException):
            raise line
        return line

    monkeypatch.setattr(repl, "read_message", read_message)
    said: list[str] = []
    model = SimpleNamespace(chat_format="template", path=Path("/m/tiny.gguf"))
    code = repl.run_repl(
        model,
        system=system,
        max_tokens=8,
        max_context=64,
        sampling=None,
        drafter=None,
        speculation=None,
        info=said.append,
        verbose=verbose,
    )
    return code, service.seen, said


def text(*parts: str) -> list:
    return [TextDelta(p) for p in parts] + [finished()]


@pytest.mark.parametrize("leave", ["/exit", " /quit ", EOFError()])
def test_the_chat_remembers_its_turns_until_it_is_left(monkeypatch, tmp_path, capsys, leave):
    lines = ["hi", "", "   ", KeyboardInterrupt(), "more", leave, "never read"]
    code, seen, said = chat(monkeypatch, tmp_path, lines, [text("he", "llo"), text("ok")])
    assert code == 0
    assert seen == [
        [{"role": "user", "content": "hi"}],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
    ]
    assert said == ["ds4: chat with tiny · " + repl.HELP]
    assert capsys.readouterr().out == "hello\nok\n"


def test_clear_starts_again_from_the_system_prompt(monkeypatch, tmp_path):
    lines = ["hi", "/clear", "again", "/exit"]
    _, seen, said = chat(monkeypatch, tmp_path, lines, [text("a"), text("b")], system="be brief")
    system = {"role": "system", "content": "be brief"}
    assert seen == [
        [system, {"role": "user", "content": "hi"}],
        [system, {"role": "user", "content": "again"}],
    ]
    assert "ds4: the conversation starts again" in said


def test_a_refused_turn_is_forgotten(monkeypatch, tmp_path):
    lines = ["too long", "short", "/exit"]
    replies = [ValueError("the prompt does not fit"), text("fine")]
    _, seen, said = chat(monkeypatch, tmp_path, lines, replies)
    assert seen[1] == [{"role": "user", "content": "short"}]
    assert "ds4: error: the prompt does not fit; /clear starts again" in said


def test_verbose_says_each_turns_counts(monkeypatch, tmp_path, capsys):
    prefill = PrefillProgress(done=4, total=8, seconds=1.0)
    _, _, said = chat(monkeypatch, tmp_path, ["hi", "/exit"], [[prefill, *text("x")]], verbose=True)
    assert said[-1] == repl._turn_summary(finished())
    assert "prefill" not in capsys.readouterr().err  # progress is for a terminal only


def test_ctrl_c_keeps_what_was_said_before_it(monkeypatch, tmp_path):
    interrupts = repl._Interrupts()
    events = [TextDelta("partial"), TextDelta(" never")]

    def stream():
        yield events[0]
        interrupts.stop.set()
        yield events[1]

    service = SimpleNamespace(chat=lambda messages, **options: stream())
    said: list[str] = []
    answer = repl._answer(service, [], 8, None, interrupts, said.append, False)
    assert answer == "partial" and said == ["\nds4: stopped"]


def test_a_model_without_a_chat_template_cannot_chat():
    said: list[str] = []
    model = SimpleNamespace(chat_format=None, path=Path("/m/base.gguf"))
    options = dict(max_tokens=8, max_context=64, sampling=None, drafter=None, speculation=None)
    assert repl.run_repl(model, system=None, info=said.append, verbose=False, **options) == 1
    assert said == ["ds4: error: base.gguf has no chat template; give a prompt with -p"]
