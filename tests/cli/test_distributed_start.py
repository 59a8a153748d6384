"""What the front ends do with ``--distributed`` (``ds4mlx.cli.distributed``), on a stand-in
group instead of mlx.launch's: the shared seed, which rank keeps stdout, and the life of a rank
that follows rank 0 under a server or an agent."""

from __future__ import annotations

import signal
import sys

from ds4mlx.cli import distributed
from ds4mlx.cli.options import ModelOptions
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.experts import ExpertOptions

import mlx.core as mx
import pytest


class Ranks:
    """A group seen from ``rank``: ``all_sum`` adds what the other ranks contribute."""

    def __init__(self, rank: int, others: int = 0, size: int = 2):
        self.rank, self.size, self.others = rank, size, others
        self.sums = 0

    def all_sum(self, x: mx.array) -> mx.array:
        self.sums += 1
        return x + self.others


def never_drawn(_: int) -> int:
    raise AssertionError("a seed was drawn")


@pytest.mark.parametrize("seed", [0, 1234])
def test_a_given_seed_is_kept_without_asking_the_group(monkeypatch, seed):
    monkeypatch.setattr(distributed.secrets, "randbelow", never_drawn)
    ranks = Ranks(rank=1)
    assert distributed.shared_seed(ranks, seed) == seed and ranks.sums == 0


def test_rank_0_draws_the_seed_every_rank_uses(monkeypatch):
    drawn: list[int] = []

    def randbelow(limit: int) -> int:
        drawn.append(limit)
        return 4321

    monkeypatch.setattr(distributed.secrets, "randbelow", randbelow)
    assert distributed.shared_seed(Ranks(rank=0), None) == 4321 and drawn == [2**31]
    # Another rank adds nothing of its own: the sum is rank 0's draw.
    monkeypatch.setattr(distributed.secrets, "randbelow", never_drawn)
    assert distributed.shared_seed(Ranks(rank=1, others=4321), None) == 4321


def test_without_distributed_no_group_is_joined(monkeypatch):
    monkeypatch.setattr(distributed, "init_group", lambda: pytest.fail("joined a group"))
    assert distributed.join_ranks(False) is None
    sampling = SamplingOptions(temperature=0.7)
    assert distributed.start_ranks(False, sampling) == (None, sampling)


def test_only_rank_0_writes_to_stdout(monkeypatch):
    stdout = sys.stdout
    monkeypatch.setattr(distributed, "init_group", lambda: Ranks(rank=0))
    assert distributed.join_ranks(True).rank == 0 and sys.stdout is stdout
    monkeypatch.setattr(distributed, "init_group", lambda: Ranks(rank=1))
    monkeypatch.setattr(sys, "stdout", stdout)  # restored after the test
    assert distributed.join_ranks(True).rank == 1
    silenced = sys.stdout
    assert silenced is not stdout and silenced.name == "/dev/null"
    silenced.close()


def test_every_rank_samples_with_the_shared_seed(monkeypatch):
    monkeypatch.setattr(distributed, "init_group", lambda: Ranks(rank=0))
    monkeypatch.setattr(distributed.secrets, "randbelow", lambda _: 99)
    sampling = SamplingOptions(temperature=0.7, top_k=5)
    ranks, shared = distributed.start_ranks(True, sampling)
    assert ranks.rank == 0 and shared == SamplingOptions(temperature=0.7, top_k=5, seed=99)
    _, given = distributed.start_ranks(True, SamplingOptions(seed=7))
    assert given.seed == 7


# ------------------------------------------------------------------ a following rank


class Model:
    closed = False

    def close(self) -> None:
        self.closed = True


OPTIONS = ModelOptions("m.gguf", ctx=4096, weights_dtype="f32", experts=ExpertOptions())


@pytest.fixture
def follower(monkeypatch):
    """The rank's model loads (its loading's arguments recorded); the Follower's ``run`` does
    what ``follower.outcome`` says: a count of operations, or an exception to raise."""
    state = {"loaded": [], "model": Model(), "outcome": 7}

    def load_model(path, **kwargs):
        state["loaded"].append((path, kwargs))
        if isinstance(state["outcome"], OSError):
            raise state["outcome"]
        return state["model"]

    class Follower:
        def __init__(self, model, ranks):
            assert model is state["model"]

        def run(self) -> int:
            if isinstance(state["outcome"], Exception):
                raise state["outcome"]
            return state["outcome"]

    monkeypatch.setattr("ds4mlx.loader.load_model", load_model)
    monkeypatch.setattr("ds4mlx.generation.ranks.Follower", Follower)
    handler = signal.getsignal(signal.SIGINT)
    yield state
    signal.signal(signal.SIGINT, handler)


def test_a_following_rank_replays_until_rank_0_stops(follower, capsys):
    ranks = Ranks(rank=2, size=3)
    assert distributed.follow_rank_0("ds4-server", OPTIONS, ranks) == 0
    assert capsys.readouterr().err == "ds4-server: rank 2: done after 7 model operations\n"
    assert follower["loaded"] == [
        ("m.gguf", {"weights_dtype": "f32", "experts": ExpertOptions(), "ranks": ranks})
    ]
    assert follower["model"].closed
    # Ctrl-C reaches every rank: a follower leaves it to rank 0 to stop it.
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_following_rank_whose_peer_drops_fails_and_closes_its_model(follower, capsys):
    follower["outcome"] = RuntimeError("connection reset")
    assert distributed.follow_rank_0("ds4-agent", OPTIONS, Ranks(rank=1)) == 1
    assert capsys.readouterr().err == (
        "ds4-agent: rank 1: error: rank 0 stopped answering (connection reset)\n"
    )
    assert follower["model"].closed


def test_a_following_rank_that_cannot_load_its_shard_fails(follower, capsys):
    follower["outcome"] = OSError("no such file")
    assert distributed.follow_rank_0("ds4-server", OPTIONS, Ranks(rank=1)) == 1
    assert capsys.readouterr().err == "ds4-server: rank 1: error: no such file\n"
