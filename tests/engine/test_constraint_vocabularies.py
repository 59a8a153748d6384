"""Tool-call and JSON constraints over vocabularies that hold the awkward tokens: a token that
starts with the call marker and goes on, one that ends the reasoning and goes on, tokens that
hold what opens a call somewhere other than at their end, and a grammar's text that spells a
special token (issue 37, the fifth fresh mutation run: ``scripts/mutation_sets/fresh5.py``).

The tiny model's vocabulary has no token of the first two kinds: those tests build a vocabulary
of every byte plus the pieces they need. Each test was checked against the mutation of
``ds4mlx/engine/constraints.py`` its docstring names.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import ds4mlx
from ds4mlx.engine.chat import DEEPSEEK_V4, GLM5
from ds4mlx.engine.chat.deepseek4 import EOS, THINK_END
from ds4mlx.engine.constraints import CallConstraint, JsonConstraint
from ds4mlx.generation import DSML

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


class PieceTokenizer:
    """Every byte is a token of its own (ids 0-255), then ``pieces``, then an end token: enough
    of a vocabulary for the marker scans and the call grammar. Text encodes byte by byte."""

    def __init__(self, pieces: Sequence[str]):
        self._pieces = [bytes([byte]) for byte in range(256)]
        self._pieces += [piece.encode() for piece in pieces] + [b"<end>"]
        self.vocab_size = len(self._pieces)
        self.eos_id = self.vocab_size - 1
        self.bos_id = None
        self.stop_ids = (self.eos_id,)

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        return self._pieces[token_id]

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def piece(self, text: str) -> int:
        return self._pieces.index(text.encode())


def call_constraint(tokenizer, reasoning_end: str | None = None) -> CallConstraint:
    return CallConstraint(
        tokenizer, DSML, DEEPSEEK_V4.call_syntax([TOOL]), reasoning_end=reasoning_end
    )


def allowed(constraint: CallConstraint | JsonConstraint) -> np.ndarray:
    return np.array(constraint.mask())


def test_only_the_markers_own_token_opens_a_call_not_a_longer_one():
    """A token that starts with the marker and goes on would open the call with text the call
    grammar never saw: it stays banned where the marker's own token may open a call
    (``constraints_opening_token_any_starting_with_marker``)."""
    tokenizer = PieceTokenizer([DSML, f"{DSML}tool_calls"])
    constraint = call_constraint(tokenizer)
    for token in tokenizer.encode(f"Sure. {DEEPSEEK_V4.call_syntax([TOOL]).opens_after}"):
        constraint.advance(token)
    mask = allowed(constraint)
    assert mask[tokenizer.piece(DSML)]
    assert not mask[tokenizer.piece(f"{DSML}tool_calls")]


def test_the_reasoning_ends_at_a_token_that_holds_its_end_and_goes_on():
    """A token such as ``</think>`` followed by a blank line ends the reasoning: a call may
    open after it (``constraints_reasoning_end_only_at_the_end``)."""
    tokenizer = PieceTokenizer([DSML, f"{THINK_END}\n\n"])
    thinking = call_constraint(tokenizer, reasoning_end=THINK_END)
    opens_after = DEEPSEEK_V4.call_syntax([TOOL]).opens_after
    for token in tokenizer.encode(f"Hmm. {opens_after}"):
        thinking.advance(token)
    assert not allowed(thinking)[tokenizer.piece(DSML)]  # still reasoning
    thinking.advance(tokenizer.piece(f"{THINK_END}\n\n"))
    for token in tokenizer.encode(f"Sure. {opens_after}"):
        thinking.advance(token)
    assert allowed(thinking)[tokenizer.piece(DSML)]


@cache
def tiny_tokenizer():
    if not TINY.is_file():
        pytest.skip(f"{TINY} is not built")
    return ds4mlx.load_model(TINY).tokenizer


def test_a_call_never_opens_after_a_token_holding_the_opener_before_its_end():
    """Only a token that *ends* with what opens a call may open one: after ``</`` or ``<think>``
    the marker stays banned (``constraints_openers_contain_the_prefix_anywhere``)."""
    tokenizer = tiny_tokenizer()
    opens_after = DEEPSEEK_V4.call_syntax([TOOL]).opens_after.encode()
    inner = [
        token
        for token in range(tokenizer.vocab_size)
        if opens_after in (piece := tokenizer.token_bytes(token))
        and not piece.endswith(opens_after)
        and DSML.encode() not in piece
    ]
    assert len(inner) > 5  # "</", "<think>", "(</", ...
    (marker,) = tokenizer.encode(DSML, parse_special=False)
    constraint = call_constraint(tokenizer)
    for token in inner:
        constraint.advance(token)
        assert not allowed(constraint)[marker], tokenizer.token_bytes(token)
        constraint.rollback(1)


def test_grammar_text_that_spells_a_special_token_is_written_as_text():
    """A schema's constant holding the end-of-sentence spelling is forced as its text, never as
    the special token itself, which would end the output there
    (``constraints_grammar_tokenizes_special_text``)."""
    tokenizer = tiny_tokenizer()
    schema = {"type": "object", "properties": {"x": {"const": EOS}}, "required": ["x"]}
    constraint = JsonConstraint(tokenizer, schema)
    for token in tokenizer.encode('{"x": "', parse_special=False):
        constraint.advance(token)
    mask = allowed(constraint)
    assert not mask[tokenizer.token_to_id(EOS)]
    assert all(EOS.encode().startswith(tokenizer.token_bytes(t)) for t in np.flatnonzero(mask))
    assert mask.any()


def test_json_values_are_laid_out_as_the_templates_render_them():
    """Inside a constrained JSON value, items are separated by ", " and keys by ": ", with no
    other whitespace: the layout the chat templates render arguments in (fresh6's
    ``call_grammar_items_without_space``)."""
    tokenizer = PieceTokenizer([])
    schema = {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
    }
    constraint = JsonConstraint(tokenizer, schema)

    def after(text: str) -> np.ndarray:
        for token in tokenizer.encode(text):
            constraint.advance(token)
        return allowed(constraint)

    mask = after('{"xs"')
    assert mask[ord(":")] and not mask[ord(" ")]
    mask = after(": [1,")
    assert mask[ord(" ")] and not mask[ord("2")]
    mask = after(" 2")
    assert mask[ord("]")] and mask[ord(",")] and not mask[ord(" ")]


def test_a_marker_that_may_open_a_call_anywhere_opens_one_after_any_text():
    """GLM's ``<tool_call>`` needs nothing before it: its token opens a call after any text,
    not only after an opener (fresh6's ``constraints_marker_anywhere_never_opens_a_call``)."""
    marker = "<tool_call>"
    tokenizer = PieceTokenizer([marker])
    syntax = GLM5.call_syntax([TOOL])
    assert syntax.marker == marker and syntax.opens_after == ""
    constraint = CallConstraint(tokenizer, marker, syntax)
    for text in ("", "Let me check", " the weather."):
        for token in tokenizer.encode(text):
            constraint.advance(token)
        assert allowed(constraint)[tokenizer.piece(marker)], text
