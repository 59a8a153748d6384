"""GLM NextN's ``settle_followed``: the block runs on the rows followed since the last draft
but the last cycle's worth (two rows), with the draft and cache of one pass over them all."""

from __future__ import annotations

from ds4mlx.speculation.nextn import load_nextn
from ds4mlx.speculation.probe import rows_between

import numpy as np

from .test_nextn import PROMPTS, models, paths  # noqa: F401  (models, paths: fixtures)


def test_settling_runs_the_block_on_all_but_the_last_cycles_rows(models):  # noqa: F811
    model = models["nextn"]
    prompt = PROMPTS[2]
    n = len(prompt) - 1
    out = model.new_session().feed_hidden(prompt)
    whole, settling = load_nextn(model), load_nextn(model)
    whole.observe(prompt[:-1], prompt[-1], rows_between(out, 0, n))
    settling.observe(prompt[:4], prompt[4], rows_between(out, 0, 4))  # the prompt
    for start in range(4, n, 3):  # plain advances of three tokens
        end = min(start + 3, n)
        settling.observe(prompt[start:end], prompt[end], rows_between(out, start, end))
    last = n - start
    settling.settle_followed()
    assert settling.mtp_state.pos == n - min(last, 2)
    assert settling.propose(1).tokens == whole.propose(1).tokens
    assert settling.mtp_state.pos == whole.mtp_state.pos == n
    np.testing.assert_allclose(
        np.array(settling.mtp_state.layers[0].latent),
        np.array(whole.mtp_state.layers[0].latent),
        atol=1e-5,
    )
