"""The quality gate: held-out negative log-likelihood, and logprob agreement between the paths
that compute the same logits.

NLL: mean nats per token of the target on fixed held-out snippets (``tests/data/
quality_snippets.json``), each cut to ``max_tokens`` tokens; a stored baseline catches a change
that makes the model worse (a wrong dequantization, a broken attention mask) even when greedy
output still looks plausible.

Agreement: the same tokens' log-probabilities computed as one batched prefill (the reference),
one token at a time (plain decoding), in draft-sized chunks after a prefilled prefix (the
speculative verify passes), and with routed experts streamed from the file instead of resident.
Each path is reported as the largest absolute log-probability difference from the reference.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel

SNIPPETS = Path(__file__).resolve().parents[2] / "tests" / "data" / "quality_snippets.json"
MAX_TOKENS = 48


def load_snippets(path: Path = SNIPPETS) -> list[str]:
    return [s["text"] for s in json.loads(path.read_text(encoding="utf-8"))["snippets"]]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def snippet_ids(model: LoadedModel, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    return model.tokenizer.encode(text)[:max_tokens]


def snippet_nll(model: LoadedModel, text: str, max_tokens: int = MAX_TOKENS) -> float:
    """Mean NLL (nats/token) of the snippet's tokens after its first."""
    ids = snippet_ids(model, text, max_tokens)
    if len(ids) < 2:
        raise ValueError(f"snippet encodes to {len(ids)} token(s); need at least 2")
    logprobs = log_softmax(model.logits(ids[:-1]))
    return float(-np.mean(logprobs[np.arange(len(ids) - 1), ids[1:]]))


@dataclass
class NLLReport:
    per_snippet: list[float]

    @property
    def mean(self) -> float:
        return float(np.mean(self.per_snippet))

    def as_json(self) -> dict:
        return {"mean": self.mean, "per_snippet": self.per_snippet}


def heldout_nll(
    model: LoadedModel, snippets: Sequence[str], max_tokens: int = MAX_TOKENS
) -> NLLReport:
    return NLLReport([snippet_nll(model, text, max_tokens) for text in snippets])


def _fed(model: LoadedModel, ids: Sequence[int], chunks: Sequence[int]) -> np.ndarray:
    """Logits of ``ids`` fed to one session in consecutive chunks of the given sizes."""
    session = model.new_session()
    rows, start = [], 0
    for size in chunks:
        rows.append(session.feed(ids[start : start + size]))
        start += size
    assert start == len(ids)
    return np.concatenate(rows)


def logprob_agreement(
    model: LoadedModel,
    ids: Sequence[int],
    *,
    prefix: int = 16,
    draft: int = 4,
    streamed: LoadedModel | None = None,
) -> dict[str, float]:
    """Largest |Δ logprob| against one batched prefill, per path (see the module docstring)."""
    ids = list(ids)
    if len(ids) <= prefix:
        raise ValueError(f"need more than {prefix} tokens, got {len(ids)}")
    reference = log_softmax(model.logits(ids))
    rest = len(ids) - prefix
    verify = [prefix] + [draft + 1] * (rest // (draft + 1))
    verify += [rest % (draft + 1)] if rest % (draft + 1) else []
    paths = {
        "token by token": _fed(model, ids, [1] * len(ids)),
        f"verify chunks (prefix {prefix}, draft {draft} + 1)": _fed(model, ids, verify),
    }
    if streamed is not None:
        paths["streamed experts"] = streamed.logits(ids)
    return {
        name: float(np.max(np.abs(log_softmax(logits) - reference)))
        for name, logits in paths.items()
    }


def half_expert_cache_gib(model: LoadedModel) -> float:
    """A streamed-expert cache of half the routed experts' size (in the model's weight dtype),
    so that the streamed path evicts and reads from the file while the prompt runs."""
    stats = model.expert_stats()
    if stats is None:
        raise ValueError("the model has no routed experts to stream")
    return stats.routed_bytes / 2 / 2**30


BASELINE = Path(__file__).resolve().parents[2] / "tests" / "data" / "quality_baseline.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_baseline(model_path: Path, out: Path = BASELINE) -> NLLReport:
    """Score the snippets with ``model_path`` and store the result (with the file's hash, so a
    rebuilt model is told apart from a regression). In float32 weights, the reference
    arithmetic, whatever the backend's default."""
    import ds4mlx

    model = ds4mlx.load_model(model_path, weights_dtype="f32")
    try:
        report = heldout_nll(model, load_snippets())
    finally:
        model.close()
    out.write_text(
        json.dumps(
            {
                "model": model_path.name,
                "sha256": file_sha256(model_path),
                "max_tokens": MAX_TOKENS,
                **report.as_json(),
            },
            indent=1,
        )
        + "\n"
    )
    return report


if __name__ == "__main__":  # python -m ds4mlx.bench.quality MODEL: rewrite the stored baseline
    import sys

    print(f"mean NLL {write_baseline(Path(sys.argv[1])).mean:.4f} nats/token -> {BASELINE}")
