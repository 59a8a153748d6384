"""Speculative decoding under a constraint (``engine.constraints``), on the trained tiny model:
draft tokens the grammar forbids end the draft, the verify rows are masked as plain decoding
masks them, so greedy output and the reported log-probabilities equal plain constrained
decoding's, drafts right or wrong."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.constraints import CallConstraint, JsonConstraint
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import DSML, generate

import pytest

from .conftest import ScriptedDrafter

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny():
    if not TINY.is_file():
        pytest.skip(f"{TINY} is not built")
    return ds4mlx.load_model(TINY)


def _constraints(model):
    chat = model.chat_format
    return {
        "json": lambda: JsonConstraint(model.tokenizer, PERSON),
        "no_tools": lambda: CallConstraint(model.tokenizer, DSML),
        "auto_tools": lambda: CallConstraint(model.tokenizer, DSML, chat.call_syntax([WEATHER])),
        "required": lambda: CallConstraint(
            model.tokenizer, DSML, chat.call_syntax([WEATHER], "required")
        ),
    }


def _prompt(model, kind: str) -> list[int]:
    tool_choice = "required" if kind == "required" else "auto"
    tools = [WEATHER] if kind in ("auto_tools", "required") else None
    messages = [{"role": "user", "content": "Weather in Paris, as a person record?"}]
    return model.chat_format.tokenize(model.tokenizer, messages, tools, tool_choice=tool_choice)


def _run(model, prompt, constraint, drafter=None, n=48):
    options = SamplingOptions(logprobs=3)
    events = [
        event
        for event in generate(
            model.new_session(),
            prompt,
            n,
            options,
            drafter=drafter,
            stop_tokens=model.tokenizer.stop_ids,
            constraint=constraint,
        )
        if hasattr(event, "token")
    ]
    return [e.token for e in events], [e.logprob for e in events]


@pytest.fixture(scope="module")
def references(tiny):
    """Per kind of constraint, its prompt and plain decoding's output with the constraint and
    without, decoded once for the error rates that share them."""
    decoded = {}

    def reference(kind: str):
        if kind not in decoded:
            prompt = _prompt(tiny, kind)
            constrained = _run(tiny, prompt, _constraints(tiny)[kind]())
            decoded[kind] = prompt, constrained, _run(tiny, prompt, None)[0]
        return decoded[kind]

    return reference


@pytest.mark.parametrize("kind", ["json", "no_tools", "auto_tools", "required"])
@pytest.mark.parametrize("error_rate", [0.0, 0.3, 1.0])
def test_greedy_speculation_under_a_constraint_equals_plain(tiny, references, kind, error_rate):
    make = _constraints(tiny)[kind]
    prompt, (plain, plain_logprobs), unconstrained = references(kind)
    assert plain != unconstrained  # the constraint changed the output
    # The drafter proposes the unconstrained continuation (mostly forbidden under a grammar)
    # or the constrained one, corrupted at ``error_rate``.
    for reference in (unconstrained, plain):
        drafter = ScriptedDrafter(prompt, reference, tiny.args.vocab_size, error_rate=error_rate)
        spec, spec_logprobs = _run(tiny, prompt, make(), drafter)
        assert spec == plain
        assert [lp.token for lp in spec_logprobs] == plain
        for got, want in zip(spec_logprobs, plain_logprobs, strict=True):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-5)
            assert [t for t, _ in got.top] == [t for t, _ in want.top]
