"""``ds4`` without a prompt, on a terminal: a chat in the terminal, like ds4's and
``llama-cli -cnv``.

Each turn goes through the ChatService, which keeps the conversation's KV cache between turns:
only a turn's new tokens are prefilled (``--verbose`` reports how many were cached). Lines are
read with the standard library's readline where there is one: line editing, and a history kept
under the data folder (``$XDG_DATA_HOME/ds4mlx/ds4-history``, readable by the user only). A line
ending in ``\\`` goes on in the next one, and lines between two ``\"\"\"`` are one message; a
terminal's bracketed paste keeps its lines too. ``/clear`` starts the conversation again,
``/exit`` or Ctrl+D leaves, Ctrl+C stops the answer (also during a long prefill, within a
chunk) or clears the line being typed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ds4mlx.generation import (
    ChatService,
    Drafter,
    Finished,
    PrefillProgress,
    SamplingOptions,
    SpeculationConfig,
    TextDelta,
)
from ds4mlx.loader import LoadedModel

HISTORY_LENGTH = 1000
BLOCK = '"""'
PROMPT, MORE = "> ", ". "
HELP = "/clear starts over · /exit or Ctrl+D leaves · Ctrl+C stops the answer"


def history_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "ds4mlx" / "ds4-history"


class _History:
    """readline's history in a file of the user's only; nothing where readline is missing."""

    def __init__(self, path: Path):
        self.path = path
        try:
            import readline
        except ImportError:  # e.g. Windows' Python: plain input() then
            self.readline: Any = None
            return
        self.readline = readline
        readline.set_history_length(HISTORY_LENGTH)
        with contextlib.suppress(OSError):
            readline.read_history_file(path)

    def save(self) -> None:
        if self.readline is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.path.touch(mode=0o600)
            self.readline.write_history_file(self.path)
            self.path.chmod(0o600)
        except OSError:
            pass  # a history is a convenience: a read-only data folder must not end the chat


def read_message(read: Callable[[str], str] = input) -> str:
    """One message: a line, lines joined by a trailing ``\\``, or a ``\"\"\"`` block. EOFError
    at Ctrl+D, KeyboardInterrupt at Ctrl+C."""
    line = read(PROMPT)
    if line.strip() == BLOCK:
        lines: list[str] = []
        while (line := read(MORE)).strip() != BLOCK:
            lines.append(line)
        return "\n".join(lines)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = read(MORE)
    return "\n".join([*lines, line])


class _Interrupts:
    """While an answer streams, Ctrl+C sets ``stop`` instead of raising, so the stream is
    closed at its next event (between two prefill chunks at worst) and the session stays
    whole."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        self.stop.clear()
        previous = signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def run_repl(
    model: LoadedModel,
    *,
    system: str | None,
    max_tokens: int,
    max_context: int,
    sampling: SamplingOptions,
    drafter: Drafter | None,
    speculation: SpeculationConfig,
    info: Callable[[str], None],
    verbose: bool,
) -> int:
    """The chat; returns the exit code."""
    if model.chat_format is None:
        info(f"ds4: error: {model.path.name} has no chat template; give a prompt with -p")
        return 1
    service = ChatService(model, drafter, speculation, max_context=max_context)
    opening = [{"role": "system", "content": system}] if system is not None else []
    messages = list(opening)
    history = _History(history_path())
    interrupts = _Interrupts()
    info(f"ds4: chat with {model.path.stem} · {HELP}")
    try:
        while True:
            try:
                text = read_message()
            except EOFError:
                print(file=sys.stderr)
                return 0
            except KeyboardInterrupt:  # at the prompt: drop the line, as a shell does
                print(file=sys.stderr)
                continue
            command = text.strip()
            if command in ("/exit", "/quit"):
                return 0
            if command == "/clear":
                messages = list(opening)
                info("ds4: the conversation starts again")
                continue
            if not command:
                continue
            messages.append({"role": "user", "content": text})
            with interrupts.catching():
                answer = _answer(service, messages, max_tokens, sampling, interrupts, info, verbose)
            if answer is None:
                messages.pop()  # the turn did not happen
            else:  # all of it, or what came before Ctrl+C: the session holds that much
                messages.append({"role": "assistant", "content": answer})
    finally:
        history.save()


def _answer(
    service: ChatService,
    messages: list[dict[str, str]],
    max_tokens: int,
    sampling: SamplingOptions,
    interrupts: _Interrupts,
    info: Callable[[str], None],
    verbose: bool,
) -> str | None:
    """Stream the model's answer to stdout; its text (what was said until Ctrl+C), None when
    the request was refused."""
    answer = ""
    events = service.chat(messages, max_tokens=max_tokens, sampling=sampling, report_prefill=True)
    try:
        with contextlib.closing(events):
            for event in events:
                if interrupts.stop.is_set():
                    info("\nds4: stopped")
                    break
                if isinstance(event, PrefillProgress) and sys.stderr.isatty():
                    print(
                        f"\rds4: prefill {event.done}/{event.total} tokens, "
                        f"{event.tokens_per_second:.1f} t/s",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
                elif isinstance(event, TextDelta):
                    answer += event.text
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Finished):
                    print(flush=True)
                    if verbose:
                        info(_turn_summary(event))
    except ValueError as exc:  # the conversation no longer fits the context
        info(f"ds4: error: {exc}; /clear starts again")
        return None
    return answer


def _turn_summary(finished: Finished) -> str:
    stats = finished.stats
    return (
        f"ds4: prompt {finished.prompt_tokens} tokens ({finished.cached_tokens} cached), "
        f"prefill {stats.prefill_tps:.1f} t/s | generated {finished.completion_tokens} tokens, "
        f"decode {stats.decode_tps:.1f} t/s ({finished.finish_reason})"
    )
