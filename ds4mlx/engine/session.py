"""A Session: one sequence's caches over a loaded model, fed in any chunking."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class Snapshot:
    """An opaque, independent copy of a session's state (caches and position) and tokens."""

    state: Any
    #: The session's tokens then: restoring must bring them back too, also after the session
    #: was cut below them or went down another branch.
    tokens: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class Session:
    #: Whether ``feed_lazy`` may be used. A session whose every operation other processes replay
    #: (``ds4mlx.distributed.driven``) needs each token id on the host first.
    lazy_feeds = True

    def __init__(self, model):
        self.model = model
        self.state = model.new_state()
        self.tokens: list[int] = []

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def check_tokens(self, tokens: Sequence[int]) -> None:
        """Raises ValueError for an empty feed or a token id outside the model's vocabulary,
        before anything has been computed or announced. The range check is not optional: MLX's
        gather does not bounds-check, so an id past the embedding table would read whatever
        memory follows it and the logits would change from run to run."""
        if len(tokens) == 0:
            raise ValueError("feed() needs at least one token")
        ids = np.asarray(tokens)
        if ids.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, got {ids.dtype} values")
        vocab_size = self.model.args.vocab_size
        outside = ids[(ids < 0) | (ids >= vocab_size)]
        if outside.size:
            raise ValueError(
                f"token id {int(outside[0])} is outside the model's vocabulary "
                f"(0..{vocab_size - 1})"
            )

    def feed_mx(self, tokens: Sequence[int], all_logits: bool = True) -> mx.array:
        """Advance by ``tokens``; returns their logits [T, vocab] as an MLX array, or with
        ``all_logits=False`` the last token's alone, [1, vocab] (a prefill that only samples
        what follows: the head's product for the other rows is skipped)."""
        self.check_tokens(tokens)
        ids = mx.array(list(tokens), dtype=mx.int32)
        logits = self.model.forward(ids, self.state, all_logits=all_logits)
        self.tokens.extend(int(t) for t in tokens)
        return logits

    def feed_lazy(self, token: mx.array) -> mx.array:
        """Advance by one token the device computed (a sampler's int32 [1]) without reading it:
        the step is queued (``mx.async_eval``) and the host goes on, e.g. to build the next one.
        Returns its logits [1, vocab], unevaluated. Such a token's id is unknown here until the
        caller reads it and hands it to ``confirm``; no range check is needed, since a sampler
        draws from the vocabulary."""
        return self.model.forward(token.astype(mx.int32).reshape(-1), self.state, asynchronous=True)

    def confirm(self, tokens: Sequence[int]) -> None:
        """The ids of tokens fed by ``feed_lazy``, in order, once read."""
        self.tokens.extend(int(t) for t in tokens)

    def feed_hidden(
        self, tokens: Sequence[int], capture_layers: Sequence[int] = (), all_logits: bool = True
    ):
        """Advance by ``tokens``; returns the model's ForwardOutput (logits and hidden states of
        ``capture_layers`` and of the head), which drafters consume. With ``all_logits=False``
        the logits are the last token's alone (``feed_mx``); the hidden states every token's."""
        self.check_tokens(tokens)
        out = self.model.forward(
            mx.array(list(tokens), dtype=mx.int32),
            self.state,
            capture_layers=capture_layers,
            return_hidden=True,
            all_logits=all_logits,
        )
        self.tokens.extend(int(t) for t in tokens)
        return out

    def feed_hidden_lazy(self, tokens: mx.array, capture_layers: Sequence[int] = ()):
        """``feed_hidden`` of int32 ``tokens`` [T] the device computed (a drafter's picks after
        a committed token), queued and not read, as ``feed_lazy``; ``confirm`` their ids once
        read."""
        return self.model.forward(
            tokens.astype(mx.int32).reshape(-1),
            self.state,
            capture_layers=capture_layers,
            return_hidden=True,
            asynchronous=True,
        )

    def truncate(self, n_tokens: int) -> None:
        """Drop the last tokens so that ``n_tokens`` remain, without recomputing anything (the
        model bounds how far back: a speculative verify's rejected rows)."""
        self.model.truncate(self.state, n_tokens)
        del self.tokens[n_tokens:]

    def feed(self, tokens: Sequence[int]) -> np.ndarray:
        """Advance by ``tokens``; returns their logits as float32 numpy [T, vocab]."""
        return np.array(self.feed_mx(tokens).astype(mx.float32))

    def snapshot(self) -> Snapshot:
        return Snapshot(self.state.copy(), tuple(self.tokens))

    def restore(self, snap: Snapshot) -> None:
        # Copy again so that the same snapshot can be restored more than once.
        self.state = snap.state.copy()
        self.tokens = list(snap.tokens)

    def announce_batch(self, sessions: Sequence[Session], tokens: Sequence[int]) -> None:
        """Called before a batched step of ``sessions`` (this one first): a session whose
        operations other processes replay (``ds4mlx.distributed.driven``) tells them here."""


def supports_batched_decode(model: Any) -> bool:
    """Whether ``model`` (a network, as Session holds) can decode many sessions in one step."""
    return callable(getattr(model, "forward_batch", None))


def feed_batch(sessions: Sequence[Session], tokens: Sequence[int]) -> mx.array:
    """Advance each session by its one token in a single batched decode step (no speculation);
    returns the logits [N, vocab], row i equal to ``sessions[i].feed_mx([tokens[i]])[0]``."""
    if not sessions:
        raise ValueError("feed_batch() needs at least one session")
    model = sessions[0].model
    if any(session.model is not model for session in sessions):
        raise ValueError("a batched step needs sessions of one model")
    if not supports_batched_decode(model):
        raise ValueError(f"{type(model).__module__} has no batched decode")
    if len(tokens) != len(sessions):
        raise ValueError(f"{len(tokens)} tokens for {len(sessions)} sessions")
    sessions[0].check_tokens(tokens)
    sessions[0].announce_batch(sessions, tokens)
    logits = model.forward_batch(list(tokens), [session.state for session in sessions])
    for session, token in zip(sessions, tokens, strict=True):
        session.tokens.append(int(token))
    return logits
