"""Tool-call markup that reaches the answer text is taken out of it.

A tool call the backend could not parse arrives as text: through an OpenAI-compatible server
whose parser gave up, the whole ``<｜DSML｜tool_calls>`` block is the "answer"; from the local
engine a stray closing tag can be left over. The model's answer must never show markup, and
text is never run as a call (the model may be quoting the format), so each such block becomes
a ``ToolCallError`` (shown as a "malformed tool call" line and reported to the model), a lone
closing tag is dropped, and the text around them stays.
"""

from __future__ import annotations

from ds4mlx.generation import DSML, TextDelta, ToolCallError

# Spellings seen in output: the real one and the first-bar-dropped drift; "‹" for "<" too.
_SPELLINGS = (DSML, DSML[1:])
_OPENERS = tuple(
    f"{lt}{slash}{dsml}" for lt in ("<", "‹") for slash in ("", "/") for dsml in _SPELLINGS
)
# Tags whose content runs to their closing tag; any other tag ends at its ">".
_ENCLOSING = ("tool_calls", "invoke")


def _earliest(text: str) -> tuple[int, str] | None:
    hits = [(text.find(opener), opener) for opener in _OPENERS if opener in text]
    return min(hits, key=lambda hit: (hit[0], -len(hit[1]))) if hits else None


def _holdback(text: str) -> int:
    """How much of the end of ``text`` could still become an opener."""
    longest = max(map(len, _OPENERS)) - 1
    for length in range(min(len(text), longest), 0, -1):
        if any(opener.startswith(text[-length:]) for opener in _OPENERS):
            return length
    return 0


class MarkupFilter:
    """Feed it the answer's text deltas; it returns them without markup, plus an error for
    every markup block."""

    def __init__(self) -> None:
        self._pending = ""
        self._block: str | None = None  # the markup being collected
        self._opener = ""

    def feed(self, text: str) -> list[TextDelta | ToolCallError]:
        out: list[TextDelta | ToolCallError] = []
        if self._block is not None:
            self._block += text
        else:
            self._pending += text
        while self._step(out):
            pass
        return out

    def finish(self) -> list[TextDelta | ToolCallError]:
        out: list[TextDelta | ToolCallError] = []
        if self._block is not None:
            out.append(
                ToolCallError(
                    self._block, "cut-off tool call: the answer ended inside tool-call markup"
                )
            )
        elif self._pending:
            out.append(TextDelta(self._pending))
        self._pending, self._block = "", None
        return out

    def _step(self, out: list[TextDelta | ToolCallError]) -> bool:
        if self._block is None:
            hit = _earliest(self._pending)
            if hit is None:
                keep = _holdback(self._pending)
                ready = self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(ready) :]
                if ready:
                    out.append(TextDelta(ready))
                return False
            position, self._opener = hit
            if position:
                out.append(TextDelta(self._pending[:position]))
            self._block, self._pending = self._pending[position:], ""
            return True
        return self._close_block(out)

    def _close_block(self, out: list[TextDelta | ToolCallError]) -> bool:
        assert self._block is not None
        block, opener = self._block, self._opener
        tag_end = block.find(">", len(opener))
        if tag_end < 0:
            return False
        name = (
            block[len(opener) : tag_end].split()[0] if block[len(opener) : tag_end].strip() else ""
        )
        closing = opener.startswith(("</", "‹/"))
        end = tag_end + 1
        if not closing and name in _ENCLOSING:
            dsml = opener.lstrip("<‹")
            found = [block.find(f"{lt}/{dsml}{name}>", end) for lt in ("<", "‹")]
            found = [(at, at + len(f"</{dsml}{name}>")) for at in found if at >= 0]
            if not found:
                return False
            end = min(found)[1]
        raw, rest = block[:end], block[end:]
        self._block = None
        if not (closing and name == "tool_calls"):  # a stray closing tag is only dropped
            out.append(
                ToolCallError(
                    raw, "tool-call markup in the answer text (it was not delivered as a tool call)"
                )
            )
        self._pending = rest
        return True
