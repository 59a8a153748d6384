"""Rank 0 leads, the other ranks follow: distributed serving for front ends only rank 0 sees.

``ds4 --distributed`` runs every rank through the same program (SPMD). A server or an agent
cannot: requests and keystrokes reach rank 0 alone, so the other ranks cannot know what to
compute. Here rank 0's sessions announce every operation on the target model (a new session,
a feed, a truncation, a snapshot, a restore, a batched decode step) to the followers before
running it; each follower replays it on its own shard, so that the collectives inside the two
forwards pair up. Drafting, sampling and everything user-facing stay on rank 0.

The announcements travel through ``all_sum`` as int32 arrays (the followers add zeros): MLX's
own transport, nothing home-made. Each is a fixed-size header, then its variable payload.
Both forwards evaluate everything they compute before returning, so rank 0's next
announcement never overtakes a collective of the previous operation.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import partial
from typing import Any, Protocol

from ds4mlx.distributed.group import RankGroup
from ds4mlx.engine.session import Session, Snapshot, feed_batch

import numpy as np


class DrivenModel(Protocol):
    """What leading and following need of a loaded model (``ds4mlx.loader.LoadedModel``; named
    by its shape so that this package does not import the loader, which imports it)."""

    network: Any
    session_factory: Callable[[Any], Session]


class Op(IntEnum):
    """What a follower does with an announcement (0 is never sent: the followers' zeros)."""

    STOP = 1
    NEW_SESSION = 2
    FEED = 3
    FEED_HIDDEN = 4
    TRUNCATE = 5
    SNAPSHOT = 6
    RESTORE = 7
    BATCH = 8


# op, session, argument, payload length, dropped sessions, dropped snapshots
_HEADER = 6


@dataclass(frozen=True)
class Announcement:
    op: Op
    session: int
    argument: int
    payload: np.ndarray
    dropped_sessions: np.ndarray
    dropped_snapshots: np.ndarray


class Conductor:
    """Rank 0's side: numbers sessions and snapshots and announces operations on them.

    Sessions and snapshots that rank 0 lets go of (garbage collected, from any thread) are
    announced with the next operation, so the followers free their copies too.
    """

    def __init__(self, ranks: RankGroup):
        if ranks.rank != 0:
            raise ValueError(f"rank {ranks.rank} follows; only rank 0 conducts")
        self.ranks = ranks
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._dropped: tuple[list[int], list[int]] = ([], [])
        self.stopped = False

    def new_id(self) -> int:
        return next(self._ids)

    def forget_session(self, key: int) -> None:
        with self._lock:
            self._dropped[0].append(key)

    def forget_snapshot(self, key: int) -> None:
        with self._lock:
            self._dropped[1].append(key)

    def announce(
        self, op: Op, session: int = 0, argument: int = 0, payload: Sequence[int] = ()
    ) -> None:
        if self.stopped:
            raise RuntimeError("the followers have been stopped")
        with self._lock:
            sessions, snapshots = self._dropped
            self._dropped = ([], [])
        body = np.concatenate([np.asarray(payload, np.int64), sessions, snapshots])
        self.ranks.share_ints(
            [int(op), session, argument, len(payload), len(sessions), len(snapshots)], _HEADER
        )
        if body.size:
            self.ranks.share_ints(body, body.size)

    def stop(self) -> None:
        """Lets the followers return (once; later calls do nothing)."""
        if not self.stopped:
            self.announce(Op.STOP)
            self.stopped = True


def receive(ranks: RankGroup) -> Announcement:
    """The next announcement of rank 0 (a follower's side of ``Conductor.announce``)."""
    op, session, argument, n, n_sessions, n_snapshots = ranks.share_ints(None, _HEADER).tolist()
    total = n + n_sessions + n_snapshots
    body = ranks.share_ints(None, total) if total else np.zeros(0, np.int32)
    return Announcement(
        Op(op), session, argument, body[:n], body[n : n + n_sessions], body[n + n_sessions :]
    )


@dataclass(frozen=True)
class DrivenSnapshot(Snapshot):
    key: int = 0  # the followers' copy of the same snapshot


class DrivenSession(Session):
    """A ``Session`` on rank 0 whose every operation on the model the followers replay."""

    lazy_feeds = False  # the other ranks replay each token id

    def __init__(self, model: Any, conductor: Conductor):
        super().__init__(model)
        self.conductor = conductor
        self.key = conductor.new_id()
        conductor.announce(Op.NEW_SESSION, self.key)
        weakref.finalize(self, conductor.forget_session, self.key)

    def feed_mx(self, tokens: Sequence[int], all_logits: bool = True):
        self.check_tokens(tokens)
        # The argument 1 asks for the last row's logits only, as here (``_replay``).
        self.conductor.announce(Op.FEED, self.key, int(not all_logits), payload=tokens)
        return super().feed_mx(tokens, all_logits)

    def feed_hidden(
        self, tokens: Sequence[int], capture_layers: Sequence[int] = (), all_logits: bool = True
    ):
        self.check_tokens(tokens)
        # The payload: whether every row's logits are wanted, the tokens, the captured layers.
        payload = [int(all_logits), *tokens, *capture_layers]
        self.conductor.announce(Op.FEED_HIDDEN, self.key, len(tokens), payload)
        return super().feed_hidden(tokens, capture_layers, all_logits)

    def truncate(self, n_tokens: int) -> None:
        self.conductor.announce(Op.TRUNCATE, self.key, n_tokens)
        super().truncate(n_tokens)

    def snapshot(self) -> DrivenSnapshot:
        key = self.conductor.new_id()
        self.conductor.announce(Op.SNAPSHOT, self.key, key)
        snap = DrivenSnapshot(self.state.copy(), tuple(self.tokens), key)
        weakref.finalize(snap, self.conductor.forget_snapshot, key)
        return snap

    def restore(self, snap: Snapshot) -> None:
        if not isinstance(snap, DrivenSnapshot):
            raise TypeError("a distributed session restores only its own snapshots")
        self.conductor.announce(Op.RESTORE, self.key, snap.key)
        super().restore(snap)

    def announce_batch(self, sessions: Sequence[Session], tokens: Sequence[int]) -> None:
        keys = [session.key for session in sessions if isinstance(session, DrivenSession)]
        if len(keys) != len(sessions):
            raise TypeError("a distributed batched step needs distributed sessions only")
        self.conductor.announce(Op.BATCH, argument=len(keys), payload=[*keys, *tokens])


def lead(model: DrivenModel, ranks: RankGroup) -> Conductor:
    """Makes ``model``'s sessions announce their operations to the followers (rank 0)."""
    conductor = Conductor(ranks)
    model.session_factory = partial(DrivenSession, conductor=conductor)
    return conductor


class Follower:
    """A rank other than 0: replays rank 0's operations on this rank's shard of ``model``."""

    def __init__(self, model: DrivenModel, ranks: RankGroup):
        self.model = model
        self.ranks = ranks
        self.sessions: dict[int, Session] = {}  # rank 0's session keys -> this rank's copies
        self.snapshots: dict[int, Snapshot] = {}
        self.operations = 0

    def run(self) -> int:
        """Replays until rank 0 stops; returns how many operations ran. An operation that
        fails here failed the same way on rank 0, which handles it: the follower goes on."""
        while True:
            message = receive(self.ranks)
            for key in message.dropped_sessions.tolist():
                self.sessions.pop(key, None)
            for key in message.dropped_snapshots.tolist():
                self.snapshots.pop(key, None)
            if message.op == Op.STOP:
                return self.operations
            try:
                self._replay(message)
            except (ValueError, KeyError):
                pass
            self.operations += 1

    def _replay(self, message: Announcement) -> None:
        payload, n = message.payload.tolist(), message.argument
        if message.op == Op.NEW_SESSION:
            self.sessions[message.session] = Session(self.model.network)
            return
        if message.op == Op.BATCH:
            feed_batch([self.sessions[key] for key in payload[:n]], payload[n:])
            return
        session = self.sessions[message.session]
        if message.op == Op.FEED:
            session.feed_mx(payload, all_logits=not n)
        elif message.op == Op.FEED_HIDDEN:
            session.feed_hidden(payload[1 : n + 1], payload[n + 1 :], bool(payload[0]))
        elif message.op == Op.TRUNCATE:
            session.truncate(n)
        elif message.op == Op.SNAPSHOT:
            self.snapshots[n] = session.snapshot()
        elif message.op == Op.RESTORE:
            session.restore(self.snapshots[n])
