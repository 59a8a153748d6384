"""Which drafter a run uses and how its drafts are accepted: parsed once from flags, handed down."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ds4mlx.speculation.acceptance import AcceptanceMode
from ds4mlx.speculation.lookup import DEFAULT_NGRAM
from ds4mlx.speculation.loop import SpeculationOptions

DEFAULT_MTP_MARGIN = 3.0

__all__ = ["DEFAULT_MTP_MARGIN", "DEFAULT_NGRAM", "DrafterKind", "SpeculationConfig"]


class DrafterKind(str, Enum):
    NONE = "none"
    DSPARK = "dspark"  # --dspark --mtp-model SUPPORT.gguf
    MTP = "mtp"  # --mtp-model MTP.gguf --mtp-draft N (N > 1)
    NEXTN = "nextn"  # --mtp: the draft block inside the main GGUF (GLM)


@dataclass(frozen=True)
class SpeculationConfig:
    kind: DrafterKind = DrafterKind.NONE
    support_path: Path | None = None
    #: DSpark: cut drafts at the first token under this confidence (0: keep the whole block).
    confidence: float = 0.0
    #: Load the drafter but decode with the target alone (--dspark-strict / --quality).
    strict: bool = False
    mtp_draft: int = 1
    #: Legacy MTP's top-1 logit margin (``MTPDrafter.margin``); None: ds4's
    #: ``DEFAULT_MTP_MARGIN`` for sampled requests, none for greedy ones.
    mtp_margin: float | None = None
    exact_sampling: bool = False
    timing: bool = False
    #: Prompt lookup: the longest lookup draft (0: off), alone or in front of the drafter above.
    lookup: int = 0
    #: Prompt lookup's n-gram sizes, (min, max): the longest match is tried first.
    lookup_ngram: tuple[int, int] = DEFAULT_NGRAM

    def __post_init__(self) -> None:
        if self.kind is DrafterKind.DSPARK and self.support_path is None:
            raise ValueError("--dspark needs the support file: --mtp-model FILE")
        if self.kind is DrafterKind.DSPARK and self.mtp_draft > 1:
            raise ValueError(
                "--dspark replaces legacy MTP; drop --mtp-draft (they are never stacked)"
            )
        if self.kind is DrafterKind.MTP and self.support_path is None:
            raise ValueError("--mtp-draft needs the MTP file: --mtp-model FILE")
        if self.mtp_draft < 1:
            raise ValueError(f"--mtp-draft must be >= 1, got {self.mtp_draft}")
        if self.lookup < 0:
            raise ValueError(f"--lookup must be >= 0, got {self.lookup}")
        low, high = self.lookup_ngram
        if not 1 <= low <= high:
            raise ValueError(
                f"--lookup-ngram must be MIN..MAX with 1 <= MIN <= MAX, got {low}..{high}"
            )
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"--dspark-confidence must be in [0, 1], got {self.confidence}")

    @property
    def loop_options(self) -> SpeculationOptions:
        mode = AcceptanceMode.EXACT if self.exact_sampling else AcceptanceMode.OPPORTUNISTIC
        return SpeculationOptions(mode=mode, confidence_threshold=self.confidence)
