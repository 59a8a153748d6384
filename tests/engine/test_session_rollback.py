"""Session truncate, snapshot and restore against a fresh session fed the same tokens, on both
architectures (deepseek4: ds4-tiny, glm5: glm-tiny).

A session that fed tokens it later dropped (a speculative verify's rejected rows, a discarded
branch) must continue exactly as a session that never saw them: the same logits, bit for bit,
since both feed the kept tokens in decode tiles whose rows do not depend on the chunk. The walks
roll back 1..k tokens at every position across the boundaries where the caches change shape:
deepseek4's 64-token sliding window, its 4-token CSA blocks and its 128-token HCA block, and
glm5's 4-token indexer pools (also past the 64 pools where its indexer starts to select) and
per-position recurrent (KDA) states.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import ds4mlx
from ds4mlx.engine.session import Session
from ds4mlx.models import deepseek4, glm5_next
from ds4mlx.models.base import VERIFY_ROWS
from ds4mlx.models.pool_indexer import PoolIndexer

import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MODELS = {"deepseek4": ASSETS / "ds4-tiny.gguf", "glm5": ASSETS / "glm-tiny.gguf"}
ROLLBACK_LIMIT = {"deepseek4": deepseek4.ROLLBACK_DEPTH, "glm5": glm5_next.TILE_ROLLBACK}
# VERIFY_ROWS: rows of a verify chunk; glm5 keeps per-position recurrent states only of those.


@cache
def model(arch: str):
    """The architecture's tiny model; ``glm5-narrow``: glm-tiny with an indexer that selects
    its top 2 pools from the third pool on (glm-tiny's own selects 64, past 256 positions), so
    that a rollback which leaves a stale pool key behind changes what is attended."""
    loaded = ds4mlx.load_model(MODELS[base(arch)])
    if arch == "glm5-narrow":
        for module in loaded.network.modules():
            if isinstance(module, PoolIndexer):
                module.top_pools = 2
    return loaded


def base(arch: str) -> str:
    return arch.removesuffix("-narrow")


@dataclass(frozen=True)
class Walk:
    """A prefill of ``prefill`` tokens, then ``steps`` tokens decoded one at a time."""

    arch: str
    prefill: int
    steps: int

    @property
    def tokens(self) -> list[int]:
        vocab = model(self.arch).network.args.vocab_size
        rng = np.random.default_rng(self.prefill)
        return rng.integers(4, vocab, self.prefill + self.steps + 3).tolist()

    def junk(self, n: int, salt: int) -> list[int]:
        vocab = model(self.arch).network.args.vocab_size
        return np.random.default_rng(10_000 + salt).integers(4, vocab, n).tolist()

    def session(self, decoded: int = 0) -> Session:
        """A session holding the prefill and the first ``decoded`` tokens after it."""
        session = model(self.arch).new_session()
        session.feed(self.tokens[: self.prefill])
        for token in self.tokens[self.prefill : self.prefill + decoded]:
            session.feed([token])
        return session


@cache
def reference(walk: Walk) -> np.ndarray:
    """The logits of a fresh session fed the walk's tokens, one at a time after the prefill:
    row j follows token ``prefill + j``."""
    session = walk.session()
    tokens = walk.tokens[walk.prefill :]
    return np.concatenate([session.feed([token]) for token in tokens])


WALKS = [
    Walk("deepseek4", prefill=50, steps=24),  # the window fills at 64; CSA blocks of 4
    Walk("deepseek4", prefill=118, steps=20),  # the first HCA block completes at 128
    Walk("glm5", prefill=29, steps=24),  # indexer pools of 4, recurrent states
    # past 64 pools of 4 the indexer selects its top 64 (index_topk 256): the pool keys count
    Walk("glm5", prefill=250, steps=16),
    Walk("glm5-narrow", prefill=29, steps=24),
]
IDS = [f"{w.arch}-{w.prefill}" for w in WALKS]
SHORT = {"deepseek4": WALKS[0], "glm5": WALKS[2]}


def feed_in_chunks(session: Session, tokens: list[int], rows: int) -> np.ndarray:
    return np.concatenate([session.feed(tokens[i : i + rows]) for i in range(0, len(tokens), rows)])


@pytest.mark.parametrize("walk", WALKS, ids=IDS)
def test_rollback_at_every_position_equals_a_fresh_session(walk):
    """At each position: feed k junk tokens (1..k, one at a time or as verify chunks), roll
    back over them and over up to two committed tokens, feed the committed ones again as one
    chunk: their logits equal the fresh session's, and so do the session's tokens."""
    limit = ROLLBACK_LIMIT[base(walk.arch)]
    tokens, ref = walk.tokens, reference(walk)
    session = walk.session()
    for j in range(walk.steps):
        n = walk.prefill + j
        back = min(j % 3, j)  # committed tokens dropped too (fed in earlier chunks)
        k = 1 + j % (limit - 2)
        junk = walk.junk(k, salt=j)
        feed_in_chunks(session, junk, 1 if j % 2 else VERIFY_ROWS)
        assert session.n_tokens == n + k
        session.truncate(n - back)
        assert session.tokens == tokens[: n - back]
        got = session.feed(tokens[n - back : n + 1])
        np.testing.assert_array_equal(
            got, ref[j - back : j + 1], err_msg=f"after rolling back {k + back} to {n - back}"
        )


@pytest.mark.parametrize("walk", WALKS, ids=IDS)
def test_cutting_a_verify_chunk_to_its_accepted_prefix(walk):
    """A verify chunk of the next committed tokens cut back to each accepted length continues
    exactly as a session that fed only the accepted ones."""
    tokens, ref = walk.tokens, reference(walk)
    j0 = walk.steps - VERIFY_ROWS - 1  # a chunk that ends past the walk's boundary
    start = walk.prefill + j0
    for accepted in range(VERIFY_ROWS):
        session = walk.session(decoded=j0)
        verify = session.feed(tokens[start : start + VERIFY_ROWS])
        np.testing.assert_array_equal(verify, ref[j0 : j0 + VERIFY_ROWS])
        session.truncate(start + accepted)
        assert session.n_tokens == start + accepted
        got = session.feed([tokens[start + accepted]])
        np.testing.assert_array_equal(
            got,
            ref[j0 + accepted : j0 + accepted + 1],
            err_msg=f"accepted {accepted} of {VERIFY_ROWS}",
        )


@pytest.mark.parametrize("walk", WALKS, ids=IDS)
def test_snapshot_restore_equals_a_fresh_session(walk):
    """A snapshot is an independent copy: whatever the session feeds after it (a long chunk
    across every boundary, decode steps, a rollback), restoring it, any number of times, gives
    back the session as a fresh one fed the same tokens."""
    tokens, ref = walk.tokens, reference(walk)
    j = 6
    n = walk.prefill + j
    session = walk.session(decoded=j)
    snap = session.snapshot()
    detours = [
        lambda: session.feed(walk.junk(40, salt=1)),  # past the rollback limit and boundaries
        lambda: [session.feed([t]) for t in walk.junk(5, salt=2)],
        lambda: (session.feed(walk.junk(3, salt=3)), session.truncate(n - 1)),
    ]
    for detour in detours:
        detour()
        session.restore(snap)
        assert session.n_tokens == n and session.tokens == tokens[:n]
        got = np.concatenate([session.feed([t]) for t in tokens[n : n + 3]])
        np.testing.assert_array_equal(got, ref[j : j + 3])
        session.restore(snap)


@pytest.mark.parametrize("arch", MODELS)
def test_restoring_a_later_snapshot_after_going_back(arch):
    """Snapshots taken at two points restore in either order, each with its own tokens."""
    walk = SHORT[arch]
    tokens, ref = walk.tokens, reference(walk)
    session = walk.session(decoded=2)
    early = session.snapshot()
    for token in tokens[walk.prefill + 2 : walk.prefill + 5]:
        session.feed([token])
    late = session.snapshot()
    session.restore(early)
    session.feed(walk.junk(4, salt=4))  # a branch of the same length as the late snapshot's
    session.restore(late)
    n = walk.prefill + 5
    assert session.n_tokens == n and session.tokens == tokens[:n]
    np.testing.assert_array_equal(session.feed([tokens[n]]), ref[5:6])


@pytest.mark.parametrize("arch", MODELS)
def test_a_refused_rollback_leaves_the_session_as_it_was(arch):
    walk = SHORT[arch]
    tokens, ref = walk.tokens, reference(walk)
    j = ROLLBACK_LIMIT[arch] + 2
    n = walk.prefill + j
    session = walk.session(decoded=j)
    for bad in (n - ROLLBACK_LIMIT[arch] - 1, n + 1, -1):
        with pytest.raises(ValueError, match="cannot roll back"):
            session.truncate(bad)
        assert session.tokens == tokens[:n]
    session.truncate(n - ROLLBACK_LIMIT[arch])  # the limit itself is allowed
    got = feed_in_chunks(session, tokens[n - ROLLBACK_LIMIT[arch] : n + 1], 1)
    np.testing.assert_array_equal(got, ref[j - ROLLBACK_LIMIT[arch] : j + 1])
