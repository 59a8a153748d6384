"""Prompt-lookup drafting: propose what followed the most recent earlier occurrence of the
context's last n tokens (llama.cpp's ``lookup`` and vLLM's n-gram speculation work this way).

Coding agents copy: lines of files they read, diffs, earlier turns. Where the text is a copy, the
n-gram's continuation is the copy's next tokens, found at almost no cost (a dictionary lookup, no
network), and a verify pass accepts long runs of them. Where it is not, the lookup finds nothing
or guesses wrong, and the scheduler's backoff turns drafting off for a while.

``LookupDrafter`` alone, or ``LookupExtension`` behind a learned drafter (DSpark, MTP): the
learned block, continued by the lookup's copy past its end.
"""

from __future__ import annotations

from collections.abc import Sequence

from ds4mlx.speculation.drafter import Draft, Drafter, TargetRows

import mlx.core as mx

#: Default n-gram sizes: the longest match is tried first, down to the shortest.
DEFAULT_NGRAM = (2, 4)
#: A lookup match of this many tokens or more drafts in place of the learned block (see
#: LookupExtension).
COPY_MIN_MATCH = 3


class NgramIndex:
    """A growing token sequence and, for every n-gram of the configured sizes, where the most
    recent occurrence's continuation starts. Appending a token updates one entry per size, so
    a lookup never rescans the context, however long it grows."""

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}..{max_n}")
        self.sizes = range(max_n, min_n - 1, -1)  # longest first
        self.tokens: list[int] = []
        # An n-gram (a tuple of n ids: the length tells the sizes apart) -> the index of the
        # token that followed its latest occurrence.
        self._next: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            # The n-grams ending at the current last token now have a continuation: ``token``.
            end = len(self.tokens)
            for n in self.sizes:
                if end >= n:
                    self._next[tuple(self.tokens[end - n :])] = end
            self.tokens.append(int(token))

    def continuation(self, pending: int, max_tokens: int) -> tuple[list[int], int]:
        """What followed the latest earlier occurrence of the longest n-gram that ends with
        ``pending`` (the token after the sequence, not yet in it): up to ``max_tokens`` ids,
        and the n of the match (0 and no ids when nothing matches)."""
        tail = [*self.tokens[-(self.sizes[0] - 1) :], pending] if self.sizes[0] > 1 else [pending]
        for n in self.sizes:
            if n > len(tail):
                continue
            start = self._next.get(tuple(tail[len(tail) - n :]))
            if start is not None:
                return self._copy(start, pending, max_tokens), n
        return [], 0

    def _copy(self, start: int, pending: int, max_tokens: int) -> list[int]:
        """``max_tokens`` ids from ``start`` of the sequence, continued by the pending token and
        then by the copy itself: a copy that runs into the present repeats a pattern (such as
        "0. 0. 0."), which goes on as it went."""
        end, copied = len(self.tokens), []
        for i in range(start, start + max_tokens):
            copied.append(
                self.tokens[i] if i < end else pending if i == end else copied[i - end - 1]
            )
        return copied


class LookupDrafter:
    """The ``Drafter`` of prompt lookup over the session's tokens (prompt and generated)."""

    name = "lookup"
    capture_layers: tuple[int, ...] = ()
    #: It drafts from tokens alone: a cycle without a draft decodes as plain decoding does,
    #: pipelined, and ``observe`` gets rows without hidden states.
    needs_target_rows = False

    def __init__(self, max_draft: int, ngram: tuple[int, int] = DEFAULT_NGRAM):
        if max_draft < 1:
            raise ValueError(f"--lookup must be >= 1, got {max_draft}")
        self.max_draft = max_draft
        self.ngram = ngram
        self.last_match = 0  # the n of the last proposal's match (0: none)
        self.reset()

    def reset(self) -> None:
        self._index = NgramIndex(*self.ngram)
        self._pending: int | None = None

    def recall(self, tokens: Sequence[int]) -> None:
        """The session's tokens before the prompt the next ``observe`` brings (earlier turns of
        a conversation whose cache the session kept): copies from them count too."""
        self._index.extend(tokens)

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        self.observe_tokens(tokens, next_token)

    def observe_tokens(self, tokens: Sequence[int], next_token: int) -> None:
        """``observe``: the lookup reads tokens alone."""
        self._index.extend(tokens)
        self._pending = int(next_token)

    def propose(self, max_tokens: int) -> Draft:
        n = min(max_tokens, self.max_draft)
        if n <= 0 or self._pending is None:
            self.last_match = 0
            return Draft()
        tokens, self.last_match = self._index.continuation(self._pending, n)
        return Draft(tokens)


class LookupExtension:
    """Prompt lookup with a learned drafter (DSpark, MTP). Each round:

    * where the context's last ``min_match`` or more tokens occurred before (a copy in
      progress), the lookup's copy is the draft, and the learned drafter's work is skipped;
    * otherwise the learned block, extended past its end by the lookup's copy where a shorter
      match has one, up to ``max_draft`` tokens in all.

    Why this rule (measured in docs/performance.md, "Prompt lookup"): a copy round costs only
    the verify pass, and a long match is accepted about as far as DSpark's block would be; a
    short match is a weak guess, so the learned block goes first and the copy only lengthens
    it; where it guessed wrong the verify rejects it like any wrong draft token. Its rows are
    not free (on a CPU a verify row of the tiny model costs about a sixth of a drafted token):
    where the positions past the block are rarely accepted (chat answers), a greedy request's
    drafts end before them (``DraftScheduler.draft_length``). Both drafters follow every
    committed row.
    """

    def __init__(self, learned: Drafter, lookup: LookupDrafter, min_match: int = 1 << 30):
        self.learned, self.lookup, self.min_match = learned, lookup, min_match
        self.name = f"{learned.name}+lookup"
        self.max_draft = max(learned.max_draft, lookup.max_draft)
        self.capture_layers = tuple(learned.capture_layers)
        #: the last draft's pieces, in order: (drafter, tokens) (counters per drafter)
        self.last_sources: list[tuple[str, int]] = []

    def reset(self) -> None:
        self.learned.reset()
        self.lookup.reset()

    def recall(self, tokens: Sequence[int]) -> None:
        self.lookup.recall(tokens)

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        self.learned.observe(tokens, next_token, rows)
        self.lookup.observe(tokens, next_token, rows)

    @property
    def window(self) -> int | None:
        """The learned drafter's (``DSparkDrafter.window``); the lookup reads only tokens."""
        return getattr(self.learned, "window", None)

    def observe_tokens(self, tokens: Sequence[int], next_token: int) -> None:
        """``DSparkDrafter.observe_tokens`` for the learned drafter."""
        self.learned.observe_tokens(tokens, next_token)
        self.lookup.observe_tokens(tokens, next_token)

    def settle_followed(self) -> None:
        """The learned drafter's (``DSparkDrafter.settle_followed``); the lookup has nothing
        to settle."""
        settle = getattr(self.learned, "settle_followed", None)
        if settle is not None:
            settle()

    def for_request(self, greedy: bool) -> None:
        """The learned drafter's (``MTPDrafter.for_request``)."""
        for_request = getattr(self.learned, "for_request", None)
        if for_request is not None:
            for_request(greedy)

    def _record(self, block: int, extension: int) -> None:
        self.last_sources = [(self.learned.name, block), (self.lookup.name, extension)]

    def _copy(self, max_tokens: int) -> tuple[list[int], bool]:
        """The lookup's copy (looked up once a round), and whether its match is long enough
        to be the whole draft."""
        copy = self.lookup.propose(max_tokens).tokens
        strong = bool(copy) and self.lookup.last_match >= self.min_match
        if strong:
            self.last_sources = [(self.lookup.name, len(copy))]
        return copy, strong

    def _extended(self, draft: Draft, copy: list[int]) -> Draft:
        """The learned ``draft`` continued by ``copy`` past its end, where the copy starts
        with the draft."""
        if not draft.tokens or copy[: len(draft.tokens)] != draft.tokens:
            self._record(len(draft.tokens), 0)
            return draft  # no copy in progress, or one the block does not follow
        extension = copy[len(draft.tokens) :]
        self._record(len(draft.tokens), len(extension))
        confidences = (
            None
            if draft.confidences is None
            else [*draft.confidences, *[draft.confidences[-1]] * len(extension)]
        )
        return Draft([*draft.tokens, *extension], confidences)

    def propose(self, max_tokens: int) -> Draft:
        copy, strong = self._copy(max_tokens)
        return Draft(copy) if strong else self._extended(self.learned.propose(max_tokens), copy)

    def propose_on_device(self, max_tokens: int) -> mx.array | None:
        """The learned block stays on the device (``DeviceDrafter``); the extension is appended
        without comparing, since the host has not read the block (the verify pass judges)."""
        copy, strong = self._copy(max_tokens)
        if strong:
            return mx.array(copy, dtype=mx.int32)
        queue = getattr(self.learned, "propose_on_device", None)
        if queue is None:
            draft = self._extended(self.learned.propose(max_tokens), copy)
            return mx.array(draft.tokens, dtype=mx.int32) if draft.tokens else None
        block = queue(max_tokens)
        if block is None:
            self._record(0, 0)
            return None
        extension = copy[block.shape[0] :]
        self._record(block.shape[0], len(extension))
        if not extension:
            return block
        return mx.concatenate([block, mx.array(extension, dtype=mx.int32)])
