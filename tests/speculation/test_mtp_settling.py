"""Legacy MTP's ``settle_followed``: the block runs on the rows followed since the last draft
but the last advance's, which the next proposal runs as it runs a drafted cycle's rows."""

from __future__ import annotations

from ds4mlx.speculation import mtp
from ds4mlx.speculation.probe import rows_between

import numpy as np

from .test_mtp import files, recorded  # noqa: F401  (files: a fixture)
from .tiny_targets import TINY


def test_settling_runs_the_block_on_all_but_the_last_advance(files):  # noqa: F811
    target, _, _, root = files
    prompt = [(7 * i + 3) % TINY.vocab_size for i in range(13)]
    settling = mtp.load_mtp(target, root / "mtp.gguf", max_draft=3, margin=0.0)
    unsettled = mtp.load_mtp(target, root / "mtp.gguf", max_draft=3, margin=0.0)
    calls = recorded(settling)
    out = target.new_session().feed_hidden(prompt)
    for drafter in (settling, unsettled):
        drafter.observe(prompt[:5], prompt[5], rows_between(out, 0, 5))  # the prompt
        for start, end in ((5, 9), (9, 13)):  # two plain advances of four tokens
            following = prompt[end] if end < len(prompt) else 7
            drafter.observe(prompt[start:end], following, rows_between(out, start, end))
    settling.settle_followed()
    assert calls == [(9, 1)]  # 13 rows observed; the last advance's 4 are left
    settling.settle_followed()
    assert calls == [(9, 1)]
    assert settling.propose(3) == unsettled.propose(3)
    assert calls[1] == (4, 1)
    np.testing.assert_allclose(settling._logits, unsettled._logits, atol=1e-4)
