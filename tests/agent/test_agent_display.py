"""What reaches the screen: every control character a terminal obeys is shown as an escape,
at both ends of each range, and the characters just outside the ranges pass unchanged."""

from __future__ import annotations

from ds4mlx.agent.display import sanitize

import pytest

# Each end of each unsafe range, with the escape it is shown as.
UNSAFE = [
    ("\x00", "\\x00"),
    ("\x08", "\\x08"),
    ("\x0b", "\\x0b"),
    ("\x0c", "\\x0c"),
    ("\r", "\\x0d"),
    ("\x1b", "\\x1b"),
    ("\x1f", "\\x1f"),
    ("\x7f", "\\x7f"),
    ("\x80", "\\x80"),
    ("\x9b", "\\x9b"),
    ("\x9f", "\\x9f"),
    ("\u202a", "\\u202a"),
    ("\u202e", "\\u202e"),
    ("\u2066", "\\u2066"),
    ("\u2069", "\\u2069"),
]
# The neighbours of those ranges, and the two controls kept on purpose.
SAFE = ["\t", "\n", " ", "~", "\xa0", "\xff", "\u2029", "\u202f", "\u2065", "\u206a", "é"]


@pytest.mark.parametrize(("char", "shown"), UNSAFE)
def test_an_unsafe_character_is_shown_as_its_escape(char, shown):
    assert sanitize(f"a{char}b") == f"a{shown}b"


@pytest.mark.parametrize("char", SAFE)
def test_a_character_beside_the_unsafe_ranges_passes(char):
    assert sanitize(f"a{char}b") == f"a{char}b"


def test_crlf_becomes_a_newline_and_a_lone_carriage_return_stays_visible():
    assert sanitize("one\r\ntwo\rthree\n\r") == "one\ntwo\\x0dthree\n\\x0d"


def test_an_escape_sequence_is_shown_whole():
    assert sanitize("\x1b]0;pwned\x07\x1b[2J") == "\\x1b]0;pwned\\x07\\x1b[2J"
