"""``ds4`` without a prompt on a terminal: a chat driven through a pseudo-terminal. Two turns,
the second reusing the first's KV cache (``--verbose`` reports the cached tokens), a multi-line
message, /clear, history kept between runs, Ctrl+D leaving."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ds4mlx.cli.options import DEFAULT_MODEL
from ds4mlx.cli.repl import read_message

import pytest
from pseudo_terminal import PseudoTerminal

ROOT = Path(__file__).parents[2]


class Chat(PseudoTerminal):
    """``ds4 -n 6 --verbose`` on the tiny model, in a pseudo-terminal."""

    timeout = 240.0  # the model loads first

    def __init__(self, data_home: Path):
        super().__init__(
            "ds4mlx.cli.main", ["-n", "6", "--verbose"], env={"XDG_DATA_HOME": str(data_home)}
        )

    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r", "")

    def turns(self) -> list[tuple[int, int]]:
        """(prompt tokens, cached tokens) of each turn so far."""
        found = re.findall(r"ds4: prompt (\d+) tokens \((\d+) cached\)", self.text())
        return [(int(prompt), int(cached)) for prompt, cached in found]


@pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="needs assets/ds4-tiny.gguf")
def test_two_turns_the_second_reusing_the_cache(tmp_path):
    chat = Chat(tmp_path)
    try:
        chat.wait_for(lambda: "ds4: chat with" in chat.text() and chat.text().endswith("> "))
        chat.type("List the files.\r")
        chat.wait_for(lambda: len(chat.turns()) == 1)
        chat.type('"""\rline one\rline two\r"""\r')
        chat.wait_for(lambda: len(chat.turns()) == 2)
        chat.type("/clear\r")
        chat.wait_for(lambda: "the conversation starts again" in chat.text())
        chat.type("List the files.\r")
        chat.wait_for(lambda: len(chat.turns()) == 3)
        chat.type("\x04")  # Ctrl+D
        chat.process.wait(60)
    finally:
        chat.close()
    (first, first_cached), (second, second_cached), (third, _) = chat.turns()
    assert first_cached == 0
    # The second turn's prompt holds the first turn: all of that came from the cache.
    assert second > first and second_cached >= first - 2
    assert third == first  # /clear: the conversation started again
    assert chat.process.returncode == 0
    history = tmp_path / "ds4mlx" / "ds4-history"
    assert "List the files." in history.read_text()
    assert history.stat().st_mode & 0o077 == 0


def test_a_message_can_span_lines():
    lines = iter(["first \\", "second", '"""', "a", "", "b", '"""'])

    def read(_prompt: str) -> str:
        return next(lines)

    assert read_message(read) == "first \nsecond"
    assert read_message(read) == "a\n\nb"


def test_without_a_prompt_and_a_terminal_ds4_asks_for_one():
    result = subprocess.run(
        [sys.executable, "-m", "ds4mlx.cli.main"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "give a prompt" in result.stderr
