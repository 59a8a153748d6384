"""Text on its way to the screen: control and escape sequences made visible.

Model text, tool output, file contents and commands can all carry bytes a terminal obeys: an
OSC sequence renames the window, ``ESC [2J`` clears the screen, a carriage return overwrites a
line, bidirectional overrides make code read differently from how it runs. Everything shown
passes through :func:`sanitize`, which keeps newlines and tabs and shows every other control
character as a visible escape such as ``\\x1b``.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls, and the bidirectional embeddings,
# overrides and isolates (the "Trojan Source" characters).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def sanitize(text: str) -> str:
    """``text`` safe to show: CRLF line ends become newlines, other controls visible escapes."""
    return _UNSAFE.sub(_visible, text.replace("\r\n", "\n"))
