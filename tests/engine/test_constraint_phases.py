"""Tool-call constraints across their phases, at the edges the fourth fresh mutation run found
untested (issue 37, ``scripts/mutation_sets/fresh4.py``): no call opens while the model still
reasons, the end of the reasoning is seen when its marker is split over tokens, every token
that ends with what opens a call may open one, and a verify pass's masks leave the constraint
where it was.

Each test was checked against the mutation it is named after in that set.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import ds4mlx
from ds4mlx.engine.chat.deepseek4 import THINK_END
from ds4mlx.engine.constraints import CallConstraint
from ds4mlx.generation import DSML

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@cache
def model():
    if not TINY.is_file():
        pytest.skip(f"{TINY} is not built")
    return ds4mlx.load_model(TINY)


def tokenizer():
    return model().tokenizer


def constraint(reasoning_end: str | None = None) -> CallConstraint:
    syntax = model().chat_format.call_syntax([TOOL])
    return CallConstraint(tokenizer(), DSML, syntax, reasoning_end=reasoning_end)


def marker_token() -> int:
    (token,) = tokenizer().encode(DSML, parse_special=False)
    return token


def advance(target: CallConstraint, tokens: list[int]) -> None:
    for token in tokens:
        target.advance(token)


def may_open(target: CallConstraint) -> bool:
    return bool(np.array(target.mask())[marker_token()])


def test_no_call_opens_while_the_model_reasons():
    thinking = constraint(reasoning_end=THINK_END)
    advance(thinking, tokenizer().encode("Let me see. <", parse_special=False))
    assert not may_open(thinking)
    advance(thinking, tokenizer().encode(f"{THINK_END}Sure. <", parse_special=False))
    assert may_open(thinking)


def test_the_end_of_reasoning_is_seen_when_split_over_tokens():
    pieces = [tokenizer().encode(part, parse_special=False) for part in ("</", "think", ">")]
    assert all(len(piece) == 1 for piece in pieces)  # three tokens, none the whole marker
    thinking = constraint(reasoning_end=THINK_END)
    advance(thinking, tokenizer().encode("Hmm.", parse_special=False))
    advance(thinking, [token for piece in pieces for token in piece])
    advance(thinking, tokenizer().encode(" <", parse_special=False))
    assert may_open(thinking)


def test_every_token_that_ends_with_the_opener_may_open_a_call():
    vocabulary = tokenizer()
    openers = [
        token
        for token in range(vocabulary.vocab_size)
        if vocabulary.token_bytes(token).endswith(b"<")
        and DSML.encode() not in vocabulary.token_bytes(token)
    ]
    assert len(openers) > 1  # "<" itself and pieces such as " <"
    for token in openers:
        target = constraint()
        target.advance(token)
        assert may_open(target), vocabulary.token_bytes(token)


@pytest.mark.parametrize("committed", [0, 3, 6])  # in the text, at the marker, in the call
def test_a_verify_pass_leaves_the_constraint_where_it_was(committed):
    text = 'Sure. <｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n'
    tokens = tokenizer().encode(text)
    along, one_by_one = constraint(), constraint()
    advance(along, tokens[:committed])
    advance(one_by_one, tokens[:committed])
    draft = tokens[committed:]
    masks = np.array(along.masks_along(draft))
    for row, token in enumerate(draft):
        np.testing.assert_array_equal(np.array(along.mask()), np.array(one_by_one.mask()))
        np.testing.assert_array_equal(masks[row], np.array(one_by_one.mask()))
        along.advance(token)
        one_by_one.advance(token)
