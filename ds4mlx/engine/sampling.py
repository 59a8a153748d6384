"""Token sampling: logit biases and repetition penalties (llama.cpp's), then top-p, min-p,
top-k and the temperature, in mlx-lm's order.

The filtered distribution is exposed (``probabilities``) because exact speculative acceptance
needs the very distribution that ordinary sampling draws from. Penalties depend on the tokens
that came before, so a sampler keeps the recent ones (``record``), and ``penalized`` scores the
rows of a speculative verify pass as if each draft token before a row had been committed.

A ``Constraint`` (``engine.constraints``: a JSON schema, tool-call syntax) masks the logits after
the biases and penalties: every path that scores a row (plain, pipelined, batched, speculative
verification) applies it there. The log-probabilities a client can ask for (``logprobs``) are
of that same row: after biases, penalties and the mask, before temperature and the top-k/top-p/
min-p filters (what OpenAI documents), so they do not depend on how the token was decoded.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import mlx.core as mx

if TYPE_CHECKING:
    from ds4mlx.engine.constraints import Constraint

#: The most alternatives a token's log-probability may come with (OpenAI's ``top_logprobs``).
MAX_TOP_LOGPROBS = 20

# The filters and the draw are compiled once per logits shape: their parameters are arrays, so a
# request with a new temperature or top-p reuses the compiled graph. (mlx-lm's samplers take them
# as Python floats, which ``mx.compile`` treats as constants: every new value compiled afresh,
# seconds per request on a busy machine.)


@mx.compile
def _top_p(logprobs: mx.array, top_p: mx.array) -> mx.array:
    """Keeps the smallest set of most likely tokens whose probability reaches ``top_p`` of the
    mass left: a token stays while the tokens more likely than it hold less than that."""
    descending = -mx.sort(-logprobs, axis=-1)
    probs = mx.exp(descending)
    before = mx.cumsum(probs, axis=-1) - probs
    kept = before < top_p * probs.sum(axis=-1, keepdims=True)
    least_kept = mx.where(kept, descending, mx.inf).min(axis=-1, keepdims=True)
    return _below_to_inf(logprobs, least_kept)


@mx.compile
def _min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    """Keeps the tokens at least ``min_p`` times as likely as the most likely one."""
    return _below_to_inf(logprobs, logprobs.max(axis=-1, keepdims=True) + log_min_p)


@mx.compile
def _top_k(logprobs: mx.array, k: mx.array) -> mx.array:
    """Keeps the ``k`` most likely tokens, exactly k of them when some tie at the k-th."""
    order = mx.argsort(-logprobs, axis=-1)
    positions = mx.broadcast_to(mx.arange(logprobs.shape[-1], dtype=mx.int32), logprobs.shape)
    ranks = mx.put_along_axis(mx.zeros_like(positions), order, positions, axis=-1)
    return mx.where(ranks < k, logprobs, -mx.inf)


def _below_to_inf(logprobs: mx.array, threshold: mx.array) -> mx.array:
    return mx.where(logprobs < threshold, -mx.inf, logprobs)


@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def _categorical(logprobs: mx.array, inverse_temperature: mx.array) -> mx.array:
    """A draw from the global generator (its state is an input and an output: compiled without
    it, every draw would repeat the first)."""
    return mx.random.categorical(logprobs * inverse_temperature).astype(mx.int32)


@mx.compile
def _categorical_keyed(
    logprobs: mx.array, inverse_temperature: mx.array, key: mx.array
) -> mx.array:
    return mx.random.categorical(logprobs * inverse_temperature, key=key).astype(mx.int32)


def _scalar(value: float) -> mx.array:
    return mx.array(value, dtype=mx.float32)


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    #: llama.cpp's penalties over the last ``repeat_last_n`` tokens (prompt included): a seen
    #: token's logit is divided by ``repeat_penalty`` (multiplied when negative), then lowered by
    #: ``frequency_penalty`` per occurrence and by ``presence_penalty`` once.
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    #: (token id, bias) pairs added to those tokens' logits before the penalties (OpenAI's
    #: ``logit_bias``; -100 in practice bans a token, +100 forces it).
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: Report each sampled token's log-probability with this many most likely alternatives
    #: (0 to MAX_TOP_LOGPROBS); None reports none.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < 1:
            raise ValueError(f"repeat_last_n must be >= 1, got {self.repeat_last_n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        ids = [token for token, _ in self.logit_bias]
        if any(token < 0 for token in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"logit_bias needs distinct token ids >= 0, got {sorted(ids)}")

    @property
    def penalizes(self) -> bool:
        return (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _masked(rows: mx.array, mask: mx.array) -> mx.array:
    """``rows`` [..., V] with the tokens ``mask`` [..., V'] forbids at -inf; rows wider than
    the tokenizer's vocabulary (padded embeddings) have the padding forbidden too."""
    pad = rows.shape[-1] - mask.shape[-1]
    if pad > 0:
        mask = mx.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=False)
    return mx.where(mask, rows, -mx.inf)


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the most likely tokens at its step, best first
    (see the module notes for which distribution)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """Draws tokens from rows of logits; seeded once so that runs are reproducible.

    Penalties apply to the raw logits first (``penalized``; greedy decoding takes the argmax of
    the penalised logits). Filters apply to the untempered log-probabilities in mlx-lm's order
    (top-p, min-p, top-k), then the temperature scales what is left.
    """

    def __init__(self, options: SamplingOptions, constraint: Constraint | None = None):
        self.options = options
        self.constraint = constraint
        #: Log-probabilities of the tokens drawn and not yet taken (``take_logprob``), in order.
        self.logprobs: deque[TokenLogprob] = deque()
        self._recent: deque[int] = deque(maxlen=options.repeat_last_n)
        # A seeded sampler draws from its own key, so that its tokens do not depend on other
        # generations drawing in between (batched sessions interleave). The global seed still
        # makes speculative acceptance, which draws from the global generator, reproducible.
        self._key: mx.array | None = None
        if options.seed is not None:
            mx.random.seed(options.seed)
            self._key = mx.random.key(options.seed)

    def record(self, tokens: Iterable[int]) -> None:
        """Tokens the penalties look back on: the prompt, then each committed token."""
        self._recent.extend(int(t) for t in tokens)

    def commit(self, token: int) -> None:
        """A generated token is final: the penalties see it, the constraint moves past it."""
        self.record([token])
        if self.constraint is not None:
            self.constraint.advance(token)

    def penalized(self, rows: mx.array, draft: Sequence[int] = ()) -> mx.array:
        """Logits rows [N, V] with the logit biases, the penalties and the constraint's mask
        applied; row i as if ``draft[:i]`` had been committed after the recorded tokens (the
        rows of a verify pass). Unchanged without any."""
        rows = self._biased(rows, draft)
        masks = self.constraint.masks_along(draft) if self.constraint is not None else None
        return rows if masks is None else _masked(rows, masks)

    def masked_on_device(self, row: mx.array) -> mx.array:
        """``row`` [V] under the constraint's present mask (the pipelined decoder's rows, which
        share one mask while the constraint is ``static``)."""
        mask = self.constraint.mask() if self.constraint is not None else None
        return row if mask is None else _masked(row, mask)

    def _biased(self, rows: mx.array, draft: Sequence[int]) -> mx.array:
        o = self.options
        if not (o.logit_bias or o.penalizes):
            return rows
        recent = list(self._recent)
        return mx.stack(
            [
                self.penalized_on_device(
                    rows[i], mx.array([*recent, *draft[:i]][-o.repeat_last_n :], dtype=mx.int32)
                )
                for i in range(rows.shape[0])
            ]
        )

    def recent_tokens(self) -> mx.array:
        """The recorded tokens the penalties look back on, int32 [n] (n <= repeat_last_n)."""
        return mx.array(list(self._recent), dtype=mx.int32)

    def penalized_on_device(self, row: mx.array, window: mx.array) -> mx.array:
        """``penalized`` of one row [V] given its look-back tokens ``window`` (int32 [n], the
        last ``repeat_last_n``), which need not be known on the host (pipelined decoding): the
        logit biases, then each seen token's logit divided by ``repeat_penalty`` (multiplied
        when negative) once and lowered by ``frequency_penalty`` per occurrence and by
        ``presence_penalty`` once."""
        o = self.options
        if not (o.logit_bias or o.penalizes):
            return row
        row = row.astype(mx.float32)
        if o.logit_bias:
            ids = mx.array([token for token, _ in o.logit_bias])
            row[ids] = row[ids] + mx.array([bias for _, bias in o.logit_bias], mx.float32)
        if not o.penalizes or window.size == 0:
            return row
        counts = mx.zeros(row.shape, mx.float32).at[window].add(1.0)
        penalties = mx.where(row <= 0, row * o.repeat_penalty, row / o.repeat_penalty)
        penalties = penalties - counts * o.frequency_penalty - o.presence_penalty
        return mx.where(counts > 0, penalties, row)

    def filtered_logprobs(self, logits: mx.array) -> mx.array:
        """Log-probabilities [..., vocab] with filtered-out tokens at -inf (untempered)."""
        logits = logits.astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        o = self.options
        if 0.0 < o.top_p < 1.0:
            logprobs = _top_p(logprobs, _scalar(o.top_p))
        if o.min_p > 0.0:
            logprobs = _min_p(logprobs, _scalar(math.log(o.min_p)))
        # A top-k at or above the vocabulary filters nothing (llama.cpp).
        if 0 < o.top_k < logprobs.shape[-1]:
            logprobs = _top_k(logprobs, mx.array(o.top_k, dtype=mx.int32))
        return logprobs

    def probabilities(self, logits: mx.array) -> mx.array:
        """The distribution ``draw`` samples from, for penalised rows (point mass on the argmax
        when greedy)."""
        if self.options.greedy:
            best = mx.argmax(logits, axis=-1, keepdims=True)
            return mx.put_along_axis(mx.zeros(logits.shape), best, mx.array(1.0), axis=-1)
        return mx.softmax(self.filtered_logprobs(logits) / self.options.temperature, axis=-1)

    def __call__(self, logits: mx.array) -> int:
        """One token from a single row of logits [vocab], penalised by the recorded tokens and
        masked by the constraint; its log-probability noted when asked for."""
        row = self.penalized(logits[None])[0]
        token = self.draw(row)
        self.note_logprobs(row[None], [token])
        return token

    # ------------------------------------------------------------------ log-probabilities

    def logprob_arrays(self, rows: mx.array, tokens: mx.array) -> tuple[mx.array, ...] | None:
        """On the device, for scored rows [N, V] and their tokens int32 [N]: each token's
        log-probability [N] and the top alternatives' ids and log-probabilities [N, k]; None
        when no log-probabilities are asked for."""
        top = self.options.logprobs
        if top is None:
            return None
        rows = rows.astype(mx.float32)
        logprobs = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(logprobs, tokens.reshape(-1, 1), axis=-1)[:, 0]
        if not top:
            return (chosen,)
        best = mx.argpartition(-logprobs, top - 1, axis=-1)[:, :top]
        return chosen, best, mx.take_along_axis(logprobs, best, axis=-1)

    def keep_logprobs(self, arrays: tuple[mx.array, ...] | None, tokens: Sequence[int]) -> None:
        """Note evaluated ``logprob_arrays`` for the committed ``tokens`` (a prefix of their
        rows), best alternatives first and impossible (masked) ones left out."""
        if arrays is None:
            return
        chosen = arrays[0].tolist()
        ids = arrays[1].tolist() if len(arrays) > 1 else [[] for _ in tokens]
        values = arrays[2].tolist() if len(arrays) > 1 else [[] for _ in tokens]
        for index, token in enumerate(tokens):
            pairs = sorted(zip(ids[index], values[index], strict=True), key=lambda p: -p[1])
            top = tuple((int(i), float(v)) for i, v in pairs if v != float("-inf"))
            self.logprobs.append(TokenLogprob(int(token), float(chosen[index]), top))

    def note_logprobs(self, rows: mx.array, tokens: Sequence[int]) -> None:
        """Note the log-probabilities of ``tokens``, drawn from the scored ``rows`` [N, V]."""
        if self.options.logprobs is None:
            return
        arrays = self.logprob_arrays(rows[: len(tokens)], mx.array(list(tokens), mx.int32))
        self.keep_logprobs(arrays, tokens)

    def take_logprob(self) -> TokenLogprob | None:
        """The oldest noted log-probability (the next committed token's), if any."""
        return self.logprobs.popleft() if self.logprobs else None

    def draw(self, logits: mx.array) -> int:
        """One token from a row of logits [vocab] that is already penalised."""
        return int(self.draw_on_device(logits)[0])

    def draw_on_device(self, logits: mx.array) -> mx.array:
        """``draw`` left on the device: the token as an unevaluated int32 [1]."""
        if self.options.greedy:
            return mx.argmax(logits, keepdims=True).astype(mx.int32)
        row = self.filtered_logprobs(logits[None])
        inverse_temperature = _scalar(1 / self.options.temperature)
        if self._key is None:
            return _categorical(row, inverse_temperature)
        self._key, key = mx.random.split(self._key)
        return _categorical_keyed(row, inverse_temperature, key)
