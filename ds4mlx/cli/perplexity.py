"""``ds4 perplexity`` and ``ds4 logprobs``: how well a model predicts a text, in numbers that two
quantisations or two engines can be compared on.

``ds4 perplexity -m MODEL -f FILE [--ctx N] [--chunks K]`` follows llama.cpp's
``llama-perplexity`` (tools/perplexity/perplexity.cpp), so that the two print the same number for
the same model and text:

- the text is tokenized with the special tokens the file asks for (BOS where
  ``tokenizer.ggml.add_bos_token`` is set), and must hold at least ``2 * ctx`` tokens;
- it is cut into ``len // ctx`` non-overlapping chunks of ``ctx`` tokens (at most ``--chunks``),
  each evaluated from an empty context; where the vocabulary adds BOS, each chunk's first token
  is replaced by BOS for its evaluation;
- in each chunk the first half (``ctx // 2`` tokens) is context only; the logits at positions
  ``ctx // 2 .. ctx - 2`` score the token that follows each, so ``ctx - 1 - ctx // 2`` tokens a
  chunk;
- perplexity is ``exp`` of the mean negative log-likelihood over all scored tokens, printed
  after each chunk as ``[i]value``, then as ``Final estimate: PPL = value +/- error`` (the error
  from the standard deviation of the per-token NLL, as llama.cpp computes it).

``ds4 logprobs -m MODEL -f FILE`` writes one JSON object a line for every token after the first:
its position, id and text, its log-probability given the tokens before it, and optionally the
``--top`` most likely tokens there. The text is evaluated from an empty context, as one sequence
of at most ``--ctx`` tokens (longer texts are refused: cut them, or score them with
``ds4 perplexity``).

``--ids`` reads the file as whitespace-separated token ids instead of text (models without a
tokenizer, such as llama.cpp's test models, or exactly the tokens another engine saw).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ds4mlx.cli.options import add_model_flags, model_options
from ds4mlx.generation import GGUFError, TokenizerError

import numpy as np

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel

#: Tokens fed to the model at once: long chunks are fed in pieces, so that only one piece's
#: logits [rows, vocab] exist at a time (a quarter of llama.cpp's default ``n_batch``: a
#: DeepSeek vocabulary's 512 rows are 0.26 GB of float32).
FEED_BATCH = 512


@dataclass
class Perplexity:
    """Scored tokens so far: the sums llama.cpp keeps, and the running value after each chunk."""

    nll: float = 0.0
    nll_squared: float = 0.0
    count: int = 0
    after_chunk: list[float] = field(default_factory=list)

    def add(self, logprobs: np.ndarray) -> None:
        self.nll -= float(np.sum(logprobs))
        self.nll_squared += float(np.sum(np.square(logprobs)))
        self.count += int(logprobs.size)
        self.after_chunk.append(self.value)

    @property
    def value(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def error(self) -> float:
        """The standard error of the perplexity (0 with fewer than two tokens)."""
        mean = self.nll / self.count
        variance = self.nll_squared / self.count - mean * mean
        if self.count < 2 or variance <= 0:
            return 0.0
        return math.sqrt(variance / (self.count - 1)) * self.value


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """Per row, ``log(sum(exp(logits)))`` [rows] in float64 (the sums in float64 too), without
    a float64 copy of the rows: a log-probability is a logit minus its row's value."""
    peak = logits.max(axis=-1, keepdims=True)
    sums = np.exp(logits - peak).sum(axis=-1, dtype=np.float64)
    return peak[:, 0].astype(np.float64) + np.log(sums)


def logit_pieces(
    model: LoadedModel, tokens: Sequence[int], first: int = 0
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``tokens`` fed from an empty context in pieces of ``FEED_BATCH``; per piece, from
    position ``first`` on: its first position, its logits [rows, vocab] and their logsumexp
    [rows]. Only one piece's logits exist at a time."""
    session = model.new_session()
    for start in range(0, len(tokens), FEED_BATCH):
        piece = [int(t) for t in tokens[start : start + FEED_BATCH]]
        logits = session.feed(piece)
        keep = max(first - start, 0)
        if keep < len(piece):
            rows = logits[keep:]
            yield start + keep, rows, logsumexp(rows)


def bos_for_chunks(model: LoadedModel) -> int | None:
    """The token that starts every chunk, as llama.cpp's ``llama_vocab_get_add_bos``: BOS where
    the file asks for it, else None (the chunk's own first token)."""
    tokenizer = model.tokenizer
    if getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None:
        return int(tokenizer.bos_id)
    return None


def chunk_count(n_tokens: int, ctx: int, chunks: int | None) -> int:
    """How many chunks ``n_tokens`` give; ValueError where they are fewer than ``2 * ctx``."""
    if n_tokens < 2 * ctx:
        raise ValueError(
            f"the text has {n_tokens} tokens; a context of {ctx} needs at least {2 * ctx} "
            f"(two chunks): give more text or a smaller --ctx"
        )
    most = n_tokens // ctx
    return most if chunks is None else min(chunks, most)


def perplexity(
    model: LoadedModel,
    tokens: Sequence[int],
    ctx: int,
    chunks: int | None = None,
    bos: int | None = None,
) -> Iterator[Perplexity]:
    """llama-perplexity's measure of ``tokens`` (see the module's text); yields the running
    result after each chunk. ``bos``: the token that replaces each chunk's first one."""
    n_chunks = chunk_count(len(tokens), ctx, chunks)
    first = ctx // 2
    result = Perplexity()
    for chunk in range(n_chunks):
        ids = np.array(tokens[chunk * ctx : (chunk + 1) * ctx])
        if bos is not None:
            ids[0] = bos
        scored = []
        for position, logits, norms in logit_pieces(model, ids, first):
            # Each row scores the token after it; the chunk's last row would score past it.
            n = min(len(logits), ctx - 1 - position)
            following = ids[position + 1 : position + 1 + n]
            scored.append(logits[np.arange(n), following].astype(np.float64) - norms[:n])
        result.add(np.concatenate(scored))
        yield result


def token_logprobs(
    model: LoadedModel, tokens: Sequence[int], top: int = 0
) -> Iterator[dict[str, object]]:
    """``ds4 logprobs``' records: every token after the first, scored given those before it."""
    tokenizer = model.tokenizer
    for start, logits, norms in logit_pieces(model, tokens):
        # The last row predicts past the text: zip stops at the last token.
        for row, norm, position in zip(logits, norms, range(start + 1, len(tokens)), strict=False):
            token = int(tokens[position])
            record: dict[str, object] = {
                "position": position,
                "token": token,
                "text": _text(tokenizer, token),
                "logprob": float(row[token]) - norm,
            }
            if top:
                best = np.argsort(-row, kind="stable")[:top]
                record["top_logprobs"] = [
                    {
                        "token": int(t),
                        "text": _text(tokenizer, int(t)),
                        "logprob": float(row[t]) - norm,
                    }
                    for t in best
                ]
            yield record


def _text(tokenizer, token: int) -> str:
    return tokenizer.token_bytes(token).decode("utf-8", errors="replace")


def read_tokens(model: LoadedModel, path: Path, ids: bool) -> list[int]:
    """The file's tokens: its text tokenized with the special tokens the model's file asks for
    (as llama.cpp's ``common_tokenize(..., add_special=true)``), or its ids with ``ids``."""
    text = path.read_text(encoding="utf-8")
    if not ids:
        return model.tokenizer.encode(text, add_special=True)
    try:
        tokens = [int(word) for word in text.split()]
    except ValueError as exc:
        raise ValueError(f"{path}: --ids expects whitespace-separated token ids ({exc})") from None
    vocab = model.args.vocab_size
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        raise ValueError(
            f"{path}: token id {outside[0]} is outside the vocabulary (0..{vocab - 1})"
        )
    return tokens


def build_parser(command: str) -> argparse.ArgumentParser:
    if command == "perplexity":
        description = (
            "Perplexity of a text as llama.cpp's llama-perplexity computes it: non-overlapping "
            "chunks of --ctx tokens, the second half of each scored."
        )
    else:
        description = "Per-token log-probabilities of a text, one JSON object a line."
    parser = argparse.ArgumentParser(prog=f"ds4 {command}", description=description)
    add_model_flags(parser)
    parser.add_argument("-f", "--file", type=Path, required=True, help="the text to score")
    parser.add_argument(
        "--ids", action="store_true", help="FILE holds whitespace-separated token ids, not text"
    )
    if command == "perplexity":
        parser.add_argument(
            "--chunks", type=int, help="score at most this many chunks (default: all)"
        )
    else:
        parser.add_argument(
            "--top", type=int, default=0, help="also list the N most likely tokens (default 0)"
        )
        parser.add_argument(
            "-o", "--output", type=Path, help="write the JSONL here (default: stdout)"
        )
    return parser


def main(command: str, argv: list[str]) -> int:
    """``ds4 perplexity`` / ``ds4 logprobs`` (``command``) with ``argv``; the exit status."""
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if getattr(args, "chunks", None) is not None and args.chunks < 1:
        parser.error(f"--chunks must be at least 1, got {args.chunks}")
    if getattr(args, "top", 0) < 0:
        parser.error(f"--top must be >= 0, got {args.top}")
    if not args.file.is_file():
        parser.error(f"-f {args.file}: no such file")
    try:
        options = model_options(args)
    except ValueError as exc:
        parser.error(str(exc))
    from ds4mlx.loader import load_model

    try:
        model = load_model(
            options.model, weights_dtype=options.weights_dtype, experts=options.experts
        )
    except (GGUFError, TokenizerError, OSError, ValueError) as exc:
        print(f"ds4 {command}: error: {exc}", file=sys.stderr)
        return 1
    try:
        tokens = read_tokens(model, args.file, args.ids)
        if command == "perplexity":
            return _print_perplexity(model, tokens, args.ctx, args.chunks, sys.stdout)
        return _write_logprobs(model, tokens, args)
    except BrokenPipeError:
        raise  # the reader left (``| head``); ``ds4`` ends quietly
    except (TokenizerError, ValueError, OSError) as exc:
        print(f"ds4 {command}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        model.close()


def _print_perplexity(
    model: LoadedModel, tokens: list[int], ctx: int, chunks: int | None, out: TextIO
) -> int:
    bos = bos_for_chunks(model)
    n_chunks = chunk_count(len(tokens), ctx, chunks)
    print(
        f"ds4 perplexity: {len(tokens)} tokens, {n_chunks} chunks of {ctx}, "
        f"scoring the last {ctx - 1 - ctx // 2} of each"
        + (f", BOS {bos} first" if bos is not None else ""),
        file=sys.stderr,
    )
    result = Perplexity()
    for index, result in enumerate(perplexity(model, tokens, ctx, chunks, bos), start=1):
        out.write(f"[{index}]{result.value:.4f},")
        out.flush()
    out.write(f"\nFinal estimate: PPL = {result.value:.4f} +/- {result.error:.5f}\n")
    return 0


def _write_logprobs(model: LoadedModel, tokens: list[int], args: argparse.Namespace) -> int:
    if len(tokens) < 2:
        raise ValueError(f"{args.file}: fewer than two tokens, nothing to score")
    if len(tokens) > args.ctx:
        raise ValueError(
            f"{args.file}: {len(tokens)} tokens, more than the context of {args.ctx} "
            "(raise --ctx or cut the text)"
        )
    out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
    try:
        for record in token_logprobs(model, tokens, args.top):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        if args.output:
            out.close()
    return 0
