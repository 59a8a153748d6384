"""Prompt text that remembers who wrote each piece, and its tokenization.

A chat template writes special tokens (turn boundaries, the end of a turn); the caller's text
(system, user and tool messages, earlier assistant turns, tool schemas) must never become one,
or a user could close their own turn and write the assistant's. :class:`PromptText` keeps the
template's pieces apart from the caller's, and :func:`encode_prompt` turns the special-token
spellings into special tokens only where the template wrote them: everything else is encoded as
plain text (llama.cpp's ``parse_special = false``). For a prompt whose caller text holds no
special-token spelling the ids are exactly those of encoding the whole text at once, since a
byte-level BPE tokenizer splits its input at special tokens before it merges anything.

:func:`max_token_bytes` bounds how few tokens a text can be: no token covers more bytes than the
longest vocabulary entry, so a text of C characters is at least C / max_token_bytes tokens,
which lets a server refuse a prompt far over its context without tokenizing it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from ds4mlx.engine.tokenizer import NumericTokenizer, TextTokenizer, Tokenizer


@dataclass(frozen=True)
class NamedTool:
    """A ``tool_choice`` that forces a call of this function."""

    name: str


#: What the model may do with the offered tools: decide ("auto"), write no call ("none": the
#: tools are not rendered and tool-call markup in the output is text), or call one ("required")
#: or a named one (the prompt ends with the opening of that call).
ToolChoice = Literal["auto", "none", "required"] | NamedTool


@dataclass
class PromptText:
    """A rendered prompt as pieces, each marked as the template's or the caller's."""

    pieces: list[tuple[str, bool]] = field(default_factory=list)  # (text, template wrote it)

    def template(self, *texts: str) -> None:
        """Text the template writes; special-token spellings in it are special tokens."""
        self.pieces.extend((text, True) for text in texts if text)

    def caller(self, *texts: str) -> None:
        """The caller's text: always plain text, whatever it spells."""
        self.pieces.extend((text, False) for text in texts if text)

    def __str__(self) -> str:
        return "".join(text for text, _ in self.pieces)

    @property
    def caller_characters(self) -> int:
        return sum(len(text) for text, from_template in self.pieces if not from_template)


def encode_prompt(tokenizer: TextTokenizer, prompt: PromptText) -> list[int]:
    """Token ids of ``prompt``: special tokens only where the template wrote them."""
    ids: list[int] = []
    for text, special in _segments(tokenizer, prompt):
        ids += tokenizer.encode(text, add_special=False, parse_special=special)
    return ids


def _segments(tokenizer: TextTokenizer, prompt: PromptText) -> Iterator[tuple[str, bool]]:
    """(text, is a special token) runs: the template's special tokens one by one, and all the
    text between them (the template's and the caller's together) as one plain run, so that BPE
    merges across a piece boundary exactly as it would in the joined text."""
    pattern = _special_token_pattern(tokenizer)
    plain: list[str] = []
    for text, from_template in prompt.pieces:
        if not from_template or pattern is None:
            plain.append(text)
            continue
        position = 0
        for match in pattern.finditer(text):
            plain.append(text[position : match.start()])
            if any(plain):
                yield "".join(plain), False
            plain = []
            yield match.group(), True
            position = match.end()
        plain.append(text[position:])
    if any(plain):
        yield "".join(plain), False


@lru_cache(maxsize=8)
def _special_token_pattern(tokenizer: TextTokenizer) -> re.Pattern[str] | None:
    """A regex finding the tokenizer's special-token spellings, longest first where several
    start at one place (as the tokenizer matches them); None when it has none."""
    if not isinstance(tokenizer, Tokenizer):
        return None
    spellings = {
        tokenizer.token_bytes(token_id).decode("utf-8", "replace")
        for token_id in range(tokenizer.vocab_size)
        if tokenizer.is_special(token_id)
    }
    spellings.discard("")
    if not spellings:
        return None
    return re.compile("|".join(re.escape(s) for s in sorted(spellings, key=len, reverse=True)))


@lru_cache(maxsize=8)
def max_token_bytes(tokenizer: TextTokenizer) -> int | None:
    """The most bytes one token of ``tokenizer`` stands for; None when unknown."""
    if isinstance(tokenizer, NumericTokenizer):
        return NumericTokenizer._CHUNK_BYTES  # one id per chunk of that many bytes
    if not isinstance(tokenizer, Tokenizer):
        return None
    return max(len(tokenizer.token_bytes(token_id)) for token_id in range(tokenizer.vocab_size))
