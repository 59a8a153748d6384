"""Speculative decoding: drafters (DSpark, legacy MTP, GLM nextn, prompt lookup), verification,
acceptance and the drafting scheduler. The faces generate through ``ds4mlx.generation``, which
runs the verify loop here when a drafter is configured and plain decoding otherwise."""

from __future__ import annotations

from ds4mlx.speculation.config import DrafterKind, SpeculationConfig
from ds4mlx.speculation.drafter import Draft, Drafter, TargetRows
from ds4mlx.speculation.loop import DrafterLease, SpeculativeStats

__all__ = [
    "Draft",
    "Drafter",
    "DrafterKind",
    "DrafterLease",
    "SpeculationConfig",
    "SpeculativeStats",
    "TargetRows",
    "load_drafter",
]


def load_drafter(config: SpeculationConfig, target) -> Drafter | None:
    """The drafter ``config`` asks for, loaded against ``target`` (a LoadedModel); None for
    target-only decoding. Mismatched files raise GGUFError. With ``config.lookup`` prompt
    lookup drafts alone or extends the learned drafter's blocks (``lookup.LookupExtension``)."""
    learned = _learned_drafter(config, target)
    if not config.lookup:
        return learned
    from ds4mlx.speculation.lookup import COPY_MIN_MATCH, LookupDrafter, LookupExtension

    lookup = LookupDrafter(config.lookup, config.lookup_ngram)
    return lookup if learned is None else LookupExtension(learned, lookup, COPY_MIN_MATCH)


def _learned_drafter(config: SpeculationConfig, target) -> Drafter | None:
    if config.kind is DrafterKind.DSPARK:
        from ds4mlx.speculation.dspark import load_dspark

        return load_dspark(config.support_path, target)
    if config.kind is DrafterKind.MTP:
        from ds4mlx.speculation.mtp import load_mtp

        return load_mtp(
            target, config.support_path, max_draft=config.mtp_draft, margin=config.mtp_margin
        )
    if config.kind is DrafterKind.NEXTN:
        from ds4mlx.speculation.nextn import load_nextn

        return load_nextn(target)
    return None
