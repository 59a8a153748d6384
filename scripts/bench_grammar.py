#!/usr/bin/env python3
"""What constrained decoding costs per token, next to a decode step of the same model, in one run.

For each constraint (a JSON schema, a forced DSML/GLM tool call, the ban of call markup when no
tools are offered) it decodes greedily with and without the constraint, then replays the
constrained tokens through a fresh constraint and times the mask alone: llguidance's mask for
the next token plus its application to a logits row on the device. Prints the median (of
``--runs``) per-token cost of each and their ratio; issue 38 asks for a mask <= 10% of a step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import ds4mlx
from ds4mlx.engine.constraints import CallConstraint, Constraint, JsonConstraint
from ds4mlx.engine.generate import Decoder, DoneEvent, run_alone, stepped_generate

import mlx.core as mx

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "tags", "role"],
    "additionalProperties": False,
}
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


def decode(model, prompt, n, constraint: Constraint | None, pipeline: int) -> tuple[list, float]:
    decoder = Decoder()
    decoder.pipeline = pipeline
    session = model.new_session()
    session.feed(prompt[:-1])  # the prefill is not what is measured
    start = time.perf_counter()
    events = run_alone(
        stepped_generate(
            session,
            prompt[-1:],
            n,
            stop_tokens=model.tokenizer.stop_ids,
            decoder=decoder,
            constraint=constraint,
        )
    )
    tokens = [event.token for event in events if not isinstance(event, DoneEvent)]
    return tokens, (time.perf_counter() - start) / max(len(tokens), 1)


def mask_cost(make: Callable[[], Constraint], tokens: list[int], vocab: int) -> float:
    """Seconds per token of the mask alone (computed, applied to a row, evaluated)."""
    constraint = make()
    row = mx.zeros((vocab,))
    mx.eval(row)
    start = time.perf_counter()
    for token in tokens:
        mask = constraint.mask()
        if mask is not None:
            mx.eval(mx.where(mask, row, -mx.inf))
        constraint.advance(token)
    return (time.perf_counter() - start) / max(len(tokens), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="assets/ds4-tiny.gguf")
    parser.add_argument("-n", "--n-decode", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    model = ds4mlx.load_model(args.model)
    chat, tokenizer = model.chat_format, model.tokenizer
    question = [{"role": "user", "content": "Describe the user and the weather in Paris."}]
    plain_prompt = chat.tokenize(tokenizer, question)
    forced_prompt = chat.tokenize(tokenizer, question, [WEATHER], tool_choice="required")
    cases = {
        "json_schema": (plain_prompt, lambda: JsonConstraint(tokenizer, PERSON)),
        "tool call (required)": (
            forced_prompt,
            lambda: CallConstraint(
                tokenizer, chat.call_marker, chat.call_syntax([WEATHER], "required")
            ),
        ),
        "no tools (markup banned)": (
            plain_prompt,
            lambda: CallConstraint(tokenizer, chat.call_marker),
        ),
    }
    print(f"model: {args.model}; {args.n_decode} tokens, median of {args.runs}\n")
    print("| constraint | decode step (ms) | constrained step (ms) | mask (ms) | mask / step |")
    print("|---|---:|---:|---:|---:|")
    for name, (prompt, make) in cases.items():
        decode(model, prompt, 4, make(), 1)  # warm-up: compiled graphs, grammar vocabulary
        steps, constrained, masks = [], [], []
        for _ in range(args.runs):
            steps.append(decode(model, prompt, args.n_decode, None, 1)[1])
            tokens, seconds = decode(model, prompt, args.n_decode, make(), 1)
            constrained.append(seconds)
            masks.append(mask_cost(make, tokens, model.args.vocab_size))
        step, mask = statistics.median(steps), statistics.median(masks)
        print(
            f"| {name} | {1e3 * step:.2f} | {1e3 * statistics.median(constrained):.2f} "
            f"| {1e3 * mask:.3f} | {100 * mask / step:.1f}% |"
        )


if __name__ == "__main__":
    main()
