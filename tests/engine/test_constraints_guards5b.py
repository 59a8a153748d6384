"""A speculative draft's allowed prefix ends at the first forbidden token and leaves the
constraint where it was."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.constraints import CallConstraint
from ds4mlx.generation import DSML

import numpy as np
import pytest

MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_the_allowed_prefix_stops_at_a_forbidden_token_and_rolls_back():
    if not MODEL.is_file():
        pytest.skip(f"{MODEL} is not built")
    model = ds4mlx.load_model(MODEL)
    tokenizer = model.tokenizer
    syntax = model.chat_format.call_syntax([TOOL])
    tokens = tokenizer.encode(
        'Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    )
    forbidden = tokenizer.encode("<｜DSML｜invoke")[1]  # "invoke" with no "<" before it
    constraint = CallConstraint(tokenizer, DSML, syntax)
    constraint.advance(tokens[0])
    before = np.array(constraint.mask())
    assert not before[forbidden]
    assert constraint.allowed_prefix([forbidden, *tokens[1:3]]) == 0
    assert constraint.allowed_prefix(tokens[1:]) == len(tokens) - 1
    np.testing.assert_array_equal(np.array(constraint.mask()), before)
