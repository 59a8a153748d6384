"""Speculative decoding: drafters (DSpark, legacy MTP, GLM nextn), verification, acceptance and
the drafting scheduler. ``generate`` is the one generation entry point the faces use: it runs the
speculative loop when a drafter is configured and plain decoding otherwise."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence

from ds4mlx.engine.generate import DecodeStep, DoneEvent, TokenEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import Session
from ds4mlx.speculation.config import DrafterKind, SpeculationConfig
from ds4mlx.speculation.drafter import Draft, Drafter, TargetRows
from ds4mlx.speculation.loop import DrafterLease, SpeculativeDecoder, SpeculativeStats

import mlx.core as mx

__all__ = [
    "Draft",
    "Drafter",
    "DrafterKind",
    "DrafterLease",
    "SpeculationConfig",
    "SpeculativeStats",
    "TargetRows",
    "generate",
    "load_drafter",
    "stepped",
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


def stepped(
    session: Session,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    drafter: Drafter | None = None,
    config: SpeculationConfig | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
    lease: DrafterLease | None = None,
) -> Generator[TokenEvent | DoneEvent | DecodeStep, mx.array | None, None]:
    """``generate`` in stepped form (see ``engine.generate.DecodeStep``): a step decoded on its
    own drafts with ``drafter`` (unless the config is strict), a batched one does not.
    ``lease`` tracks which generation the shared drafter follows."""
    config = config or SpeculationConfig()
    decoder = (
        None
        if drafter is None or config.strict
        else SpeculativeDecoder(drafter, config.loop_options, lease)
    )
    return stepped_generate(
        session, prompt, max_tokens, sampling, stop_tokens, max_context, decoder
    )


def generate(
    session: Session,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    drafter: Drafter | None = None,
    config: SpeculationConfig | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
) -> Iterator[TokenEvent | DoneEvent]:
    """Generate after ``prompt``: speculatively with ``drafter`` unless none is given or the
    config is strict (target-only, for comparisons)."""
    return run_alone(
        stepped(session, prompt, max_tokens, sampling, drafter, config, stop_tokens, max_context)
    )
