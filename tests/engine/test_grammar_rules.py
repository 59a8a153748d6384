"""Grammars on a real vocabulary without decoding: what compiles and what is refused, a token
that breaks the grammar, rollbacks that cross stop tokens, and the defaults of a constraint."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.constraints import (
    Constraint,
    Grammar,
    GrammarError,
    JsonConstraint,
    JsonFormat,
    check_json_format,
    grammar_vocabulary,
)
from ds4mlx.engine.tokenizer import NumericTokenizer

import mlx.core as mx
import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"


@pytest.fixture(scope="module")
def tokenizer():
    return ds4mlx.load_model(TINY).tokenizer


def _allowed(constraint) -> int:
    return int(np.array(constraint.mask()).sum())


def test_a_schema_that_does_not_compile_is_refused_before_any_request():
    check_json_format(JsonFormat({"type": "integer"}))
    check_json_format(JsonFormat(None))
    with pytest.raises(GrammarError, match="Invalid type: nonsense"):
        check_json_format(JsonFormat({"type": "nonsense"}))


def test_a_grammar_that_does_not_compile_is_refused(tokenizer):
    with pytest.raises(GrammarError, match='^the grammar does not compile: .*"nonsense_rule"'):
        Grammar(tokenizer, "start: nonsense_rule")


def test_grammars_need_a_vocabulary():
    with pytest.raises(GrammarError, match="needs a tokenizer with a vocabulary"):
        grammar_vocabulary(NumericTokenizer(None))


def test_a_token_outside_the_grammar_is_refused_by_id(tokenizer):
    constraint = JsonConstraint(tokenizer, {"type": "integer"})
    constraint.advance(tokenizer.encode("12")[0])
    letter = tokenizer.encode("x")[0]
    with pytest.raises(GrammarError, match=f"^token {letter} breaks the grammar"):
        constraint.advance(letter)


def test_rolling_back_a_stop_token_leaves_the_grammar_where_it_was(tokenizer):
    constraint = JsonConstraint(tokenizer, {"type": "integer"})
    start = _allowed(constraint)
    constraint.advance(tokenizer.encode("12")[0])
    after_digits = np.array(constraint.mask())
    (stop,) = tokenizer.stop_ids
    constraint.advance(stop)  # not consumed by the matcher
    constraint.rollback(0)
    constraint.rollback(1)  # only the stop token: the digits stay
    assert np.array_equal(np.array(constraint.mask()), after_digits)
    constraint.rollback(1)
    assert _allowed(constraint) == start
    # A stop token ends the output wherever it comes: the matcher never sees it.
    constraint.advance(stop)
    assert _allowed(constraint) == start


def test_a_json_answer_after_reasoning_is_free_until_the_reasoning_ends(tokenizer):
    plain = JsonConstraint(tokenizer, None)
    reasoning = JsonConstraint(tokenizer, None, reasoning_end="</think>")
    assert _allowed(reasoning) > 10 * _allowed(plain)  # any text first
    for token in tokenizer.encode("hmm</think>", parse_special=False):
        reasoning.advance(token)
    assert np.array_equal(np.array(reasoning.mask()), np.array(plain.mask()))


class _Free(Constraint):
    """A constraint that never masks."""

    vocab_size = 3

    def mask(self):
        return None

    def advance(self, token: int) -> None:
        pass

    def rollback(self, count: int) -> None:
        pass


def test_a_constraint_that_masks_nothing_gives_no_masks_and_queues_nothing():
    free = _Free()
    assert free.masks_along([1, 2]) is None
    assert free.allowed_prefix([1, 2, 0]) == 3
    assert free.static is False and free.cut_tokens == frozenset()


class _FirstFree(_Free):
    """No mask for the first row, then only token 1."""

    def __init__(self) -> None:
        self.taken = 0

    def mask(self):
        return None if self.taken == 0 else mx.array([False, True, False])

    def advance(self, token: int) -> None:
        self.taken += 1

    def rollback(self, count: int) -> None:
        self.taken -= count


def test_rows_without_a_mask_allow_every_token_beside_masked_ones():
    constraint = _FirstFree()
    masks = constraint.masks_along([2])
    assert masks.tolist() == [[True, True, True], [False, True, False]]
    assert constraint.taken == 0
    assert constraint.allowed_prefix([2, 1, 0]) == 2 and constraint.taken == 0
