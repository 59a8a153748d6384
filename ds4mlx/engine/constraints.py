"""Constrained decoding: which tokens may come next, as a mask on the logits.

A ``Constraint`` follows the committed tokens (``advance``, and ``rollback`` for speculative
rows) and says which tokens the next one may be (``mask``: a bool row [vocab] on the device, or
None for any). The sampler applies it after the logit biases and penalties, so greedy decoding,
sampling, speculative verification and the reported logprobs all see the same distribution.

The grammars run on llguidance (chosen by measuring; docs/architecture.md): a Lark grammar with
JSON schemas inside, computed token by token on the host, with no index to build per grammar.

- ``JsonConstraint``: the whole output one JSON value (``response_format``), after the
  reasoning block when the prompt opened one.
- ``CallConstraint``: free text in which the tokens that would open a tool call are banned, or,
  with tools on offer, open a call held to the chat format's call syntax (``CallSyntax``).
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ds4mlx.engine.chat.call_grammar import CallSyntax, json_lexeme, literal
from ds4mlx.engine.tokenizer import TextTokenizer

import mlx.core as mx
import numpy as np

_VOCABULARIES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class GrammarError(ValueError):
    """A grammar (or JSON schema) llguidance cannot compile."""


@dataclass(frozen=True)
class JsonFormat:
    """Output that must be one JSON value: held to ``schema``, or any JSON object when None
    (OpenAI's ``json_object``)."""

    schema: Mapping[str, Any] | None = None


class _TokenizerView:
    """What llguidance reads of a tokenizer: each token's bytes, the special ones, and how text
    tokenizes (for the tokens a grammar forces)."""

    is_tokenizer_wrapper = True

    def __init__(self, tokenizer: TextTokenizer, size: int):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(token) for token in range(size)]
        is_special = getattr(tokenizer, "is_special", lambda token: False)
        self.special_token_ids = [token for token in range(size) if is_special(token)]

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.encode(text, parse_special=False)


def grammar_vocabulary(tokenizer: TextTokenizer):
    """llguidance's view of ``tokenizer`` (built once per tokenizer: a real vocabulary takes a
    noticeable fraction of a second), every stop token an end of the grammar."""
    vocabulary = _VOCABULARIES.get(tokenizer)
    if vocabulary is None:
        import llguidance

        size = tokenizer.vocab_size
        if size is None:
            raise GrammarError("constrained decoding needs a tokenizer with a vocabulary")
        vocabulary = llguidance.LLTokenizer(
            _TokenizerView(tokenizer, size), n_vocab=size, eos_token=list(tokenizer.stop_ids)
        )
        _VOCABULARIES[tokenizer] = vocabulary
    return vocabulary


def _json_lark(schema: Mapping[str, Any] | None, reasoning_end: str | None = None) -> str:
    value = json_lexeme(schema if schema is not None else {"type": "object"})
    if reasoning_end is None:
        return f"start: {value}"
    return f"start: reasoning {value}\nreasoning[suffix={literal(reasoning_end)}]: /(?s:.*)/"


def check_json_format(output: JsonFormat) -> None:
    """Raise GrammarError when ``output``'s schema cannot be compiled (before a request is
    queued: its answer is a clear error, not a failed generation)."""
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(_json_lark(output.schema))
    )
    if failed:
        raise GrammarError(messages[0] if messages else "the schema does not compile")


class Grammar:
    """One llguidance matcher over a Lark grammar: the tokens it allows next, as a device mask,
    and the tokens it has taken, which can be rolled back."""

    def __init__(self, tokenizer: TextTokenizer, lark: str):
        import llguidance

        self.vocab_size = int(tokenizer.vocab_size or 0)
        self._matcher = llguidance.LLMatcher(
            grammar_vocabulary(tokenizer), llguidance.LLMatcher.grammar_from_lark(lark), log_level=0
        )
        if self._matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {self._matcher.get_error()}")
        self._stop_ids = frozenset(tokenizer.stop_ids)
        # Per advanced token, whether the matcher took it: a stop token ends the output, and the
        # matcher does not count one it is allowed (rolling it back must not undo another).
        self._taken: list[bool] = []

    def mask(self) -> mx.array:
        """The tokens allowed next, bool [vocab] (only the stop tokens once it is complete)."""
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return mx.array(np.unpackbits(words, bitorder="little")[: self.vocab_size].astype(bool))

    def advance(self, token: int) -> None:
        taken = token not in self._stop_ids
        if taken and not self._matcher.consume_token(token):
            raise GrammarError(f"token {token} breaks the grammar: {self._matcher.get_error()}")
        self._taken.append(taken)

    def rollback(self, count: int) -> None:
        if not count:
            return
        taken = sum(self._taken[-count:])
        del self._taken[-count:]
        if taken and not self._matcher.rollback(taken):
            raise GrammarError(f"cannot roll the grammar back {taken} tokens")


class Constraint(ABC):
    """See the module notes. ``static`` tells the pipelined decoder that the mask stays the same
    until a token in ``cut_tokens`` is committed, so that it can queue several steps with it."""

    vocab_size: int = 0

    @abstractmethod
    def mask(self) -> mx.array | None:
        """The tokens allowed next, bool [vocab_size]; None when any is."""

    @abstractmethod
    def advance(self, token: int) -> None:
        """``token`` is committed (or drafted, to be rolled back)."""

    @abstractmethod
    def rollback(self, count: int) -> None:
        """Forget the last ``count`` advanced tokens."""

    @property
    def static(self) -> bool:
        return False

    @property
    def cut_tokens(self) -> frozenset[int]:
        return frozenset()

    def allowed_prefix(self, draft: Sequence[int]) -> int:
        """How many of ``draft`` (tokens after the committed ones) the constraint allows: a
        speculative draft ends at the first token it forbids."""
        taken = 0
        for token in draft:
            mask = self.mask()
            if mask is not None and not bool(mask[token]):
                break
            self.advance(token)
            taken += 1
        self.rollback(taken)
        return taken

    def masks_along(self, draft: Sequence[int]) -> mx.array | None:
        """The masks of the rows of a verify pass [len(draft) + 1, vocab]: row i as if
        ``draft[:i]`` were committed; None when nothing is masked."""
        masks = []
        for token in draft:
            masks.append(self.mask())
            self.advance(token)
        masks.append(self.mask())
        self.rollback(len(draft))
        if all(mask is None for mask in masks):
            return None
        full = mx.ones((self.vocab_size,), dtype=mx.bool_)
        return mx.stack([full if mask is None else mask for mask in masks])


class JsonConstraint(Constraint):
    """The output is one JSON value held to ``schema`` (None: any JSON object), then a stop
    token; with ``reasoning_end`` the reasoning block before it is free text up to that marker.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        schema: Mapping[str, Any] | None,
        reasoning_end: str | None = None,
    ):
        self.grammar = Grammar(tokenizer, _json_lark(schema, reasoning_end))
        self.vocab_size = self.grammar.vocab_size

    def mask(self) -> mx.array:
        return self.grammar.mask()

    def advance(self, token: int) -> None:
        self.grammar.advance(token)

    def rollback(self, count: int) -> None:
        self.grammar.rollback(count)


@dataclass(frozen=True)
class _MarkerTokens:
    """Where a call marker sits in a vocabulary: the tokens that contain it (``banned``, as a
    mask of what is allowed), the marker's own token(s) (``opening``), and the tokens whose
    text ends with what must come before the marker for it to open a call (``openers``; none
    when it may open one anywhere, ``anywhere``)."""

    allowed: mx.array
    open_allowed: mx.array
    opening: frozenset[int]
    openers: frozenset[int]
    anywhere: bool
    any_banned: bool


_MARKERS: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], _MarkerTokens]] = (
    weakref.WeakKeyDictionary()
)


def _marker_tokens(tokenizer: TextTokenizer, marker: str, opens_after: str) -> _MarkerTokens:
    """``_MarkerTokens`` of ``tokenizer``, found once per marker (a scan of the vocabulary)."""
    found = _MARKERS.setdefault(tokenizer, {})
    key = (marker, opens_after)
    if key not in found:
        size = int(tokenizer.vocab_size or 0)
        pieces = [tokenizer.token_bytes(token) for token in range(size)]
        banned = [token for token, piece in enumerate(pieces) if marker.encode() in piece]
        opening = frozenset(token for token in banned if pieces[token] == marker.encode())
        allowed = np.ones(size, dtype=bool)
        allowed[banned] = False
        open_allowed = allowed.copy()
        open_allowed[sorted(opening)] = True
        openers = frozenset(
            token
            for token, piece in enumerate(pieces)
            if opening and opens_after and piece.endswith(opens_after.encode())
        )
        found[key] = _MarkerTokens(
            mx.array(allowed),
            mx.array(open_allowed),
            opening,
            openers,
            not opens_after,
            bool(banned),
        )
    return found[key]


def markup_ban(tokenizer: TextTokenizer, marker: str) -> CallConstraint | None:
    """The constraint of a chat without tools: ``marker``'s tokens never sampled; None when
    the vocabulary has none (nothing to mask)."""
    constraint = CallConstraint(tokenizer, marker)
    return constraint if constraint.constrains else None


class CallConstraint(Constraint):
    """Tool-call markup in a chat answer.

    Phases, one per committed token (``_history``, so that rollback can cross them): "reasoning"
    (until ``reasoning_end`` is written), "text" and "call". Outside a call, a token containing
    the format's call ``marker`` is banned, except the marker's own token right after
    ``syntax.opens_after`` when ``syntax`` is given (tools on offer), which opens a call: from
    there on the call grammar holds the tokens until the grammar ends the turn. A forced
    ``tool_choice`` starts inside the call.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        marker: str,
        syntax: CallSyntax | None = None,
        reasoning_end: str | None = None,
    ):
        self._tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size or 0)
        self._syntax = syntax
        self._reasoning_end = reasoning_end.encode() if reasoning_end else None
        self._marker = _marker_tokens(
            tokenizer, marker, syntax.opens_after if syntax is not None else ""
        )
        # Compiled up front, so that a grammar that does not compile (a tool's schema) fails
        # the request before it starts; a call the model opens starts it from the beginning.
        self._grammar = Grammar(tokenizer, syntax.grammar) if syntax is not None else None
        # Per committed token, the state before it: (phase, last token, reasoning tail).
        self._history: list[tuple[str, int, bytes]] = []
        self._tail = b""  # the end of the reasoning written so far
        self._last = -1  # the last committed token outside a call
        if syntax is not None and syntax.forced:
            self._phase = "call"
        else:
            self._phase = "reasoning" if reasoning_end else "text"

    @property
    def constrains(self) -> bool:
        """Whether it masks anything at all (a vocabulary without the marker, no tools: no)."""
        return self._syntax is not None or self._marker.any_banned

    def _may_open(self) -> bool:
        return (
            self._phase == "text"
            and self._syntax is not None
            and (self._marker.anywhere or self._last in self._marker.openers)
        )

    @property
    def static(self) -> bool:
        """Outside a call the mask changes only after an opener (or, where the marker opens
        a call anywhere, the marker itself): those cut a pipelined run."""
        return self._phase != "call" and (self._marker.anywhere or not self._may_open())

    @property
    def cut_tokens(self) -> frozenset[int]:
        if self._syntax is None:
            return frozenset()
        return self._marker.opening if self._marker.anywhere else self._marker.openers

    def mask(self) -> mx.array | None:
        if self._phase == "call":
            assert self._grammar is not None
            return self._grammar.mask()
        return self._marker.open_allowed if self._may_open() else self._marker.allowed

    def advance(self, token: int) -> None:
        phase = self._phase
        self._history.append((phase, self._last, self._tail))
        if phase == "call":
            assert self._grammar is not None
            self._grammar.advance(token)
            return
        self._last = token
        if phase == "reasoning":
            assert self._reasoning_end is not None
            self._tail = (self._tail + self._tokenizer.token_bytes(token))[-64:]
            if self._reasoning_end in self._tail:
                self._phase = "text"
        elif token in self._marker.opening and self._syntax is not None:
            self._phase = "call"

    def rollback(self, count: int) -> None:
        for _ in range(count):
            phase, self._last, self._tail = self._history.pop()
            if phase == "call":
                assert self._grammar is not None
                self._grammar.rollback(1)
            # Rolling back the token that opened the call leaves the grammar at its start.
            self._phase = phase
