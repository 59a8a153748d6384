"""Speculative decoding at the end of the context, an edge the fourth fresh mutation run found
untested (issue 37, ``scripts/mutation_sets/fresh4.py``, ``draft_room_overshoots_the_context``):
a draft never takes the session past the context, and what it commits is what plain decoding
commits within that context: every token up to the one that fills it (a pipelined or verified
advance once ended the generation when it fed ahead, dropping the tokens it had not yielded).
"""

from __future__ import annotations

from ds4mlx.generation import generate

import pytest

from .conftest import ScriptedDrafter, record_asks
from .test_loop import PROMPTS, run


@pytest.mark.parametrize("max_context", [6, 7, 9, 12])
def test_a_draft_never_takes_the_session_past_the_context(ds4_model, max_context):
    prompt = PROMPTS[2]
    plain, _ = run(generate(ds4_model.new_session(), prompt, 20))
    limited, _ = run(generate(ds4_model.new_session(), prompt, 20, max_context=max_context))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    session = ds4_model.new_session()
    spec, stats = run(generate(session, prompt, 20, drafter=drafter, max_context=max_context))
    assert stats.stop_reason == "context"
    assert session.n_tokens <= max_context
    # The context holds the prompt and every generated token but the last, never fed.
    assert len(limited) == max_context - len(prompt) + 1
    assert spec == limited


@pytest.mark.parametrize("max_context", [4, 10])
def test_the_context_s_last_token_is_decoded_without_asking_for_a_draft(ds4_model, max_context):
    """Once the context has room for the next token alone, no draft can fit: the drafter is not
    asked for one, and the scheduler counts no cycle without a draft."""
    prompt = PROMPTS[2]
    plain, _ = run(generate(ds4_model.new_session(), prompt, 20))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    asked = record_asks(drafter)
    spec, stats = run(
        generate(ds4_model.new_session(), prompt, 20, drafter=drafter, max_context=max_context)
    )
    assert len(spec) == max_context - len(prompt) + 1
    assert all(n >= 1 for n in asked)
    assert stats.scheduler.no_draft_cycles == 0
