"""Speculative decoding: drafters (DSpark, legacy MTP, GLM nextn, prompt lookup), verification,
acceptance and the drafting scheduler. The faces generate through ``ds4mlx.generation``, which
runs the verify loop here when a drafter is configured and plain decoding otherwise."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.gguf import GGUFError, open_gguf
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
    "check_drafter_files",
    "load_drafter",
]

#: The architecture of the targets DSpark and legacy MTP draft for.
DEEPSEEK_TARGET = "deepseek4"


def check_drafter_files(
    config: SpeculationConfig, model_path: str | Path, nextn_flag: str = "--mtp"
) -> None:
    """Refuse, from the files' headers alone, what ``load_drafter`` would refuse only after the
    model has loaded (minutes for a large one): a drafter file that is missing or of another
    kind (a GLM model given as DSpark's support file), a target the drafter does not draft for,
    a target without the draft block that ``nextn_flag`` (the flag that chose it) uses. Raises
    GGUFError naming the flags. Whose drafter a support file is (its recorded target identity)
    is checked on load: it reads the loaded weights."""
    if config.kind is DrafterKind.NONE:
        return
    target = open_gguf(model_path)
    if config.kind is DrafterKind.NEXTN:
        if not any(name.endswith(".nextn.eh_proj.weight") for name in target.layout.tensors):
            raise GGUFError(
                f"{nextn_flag} needs the MTP draft block inside the model (GLM's nextn), and "
                f"{model_path} ({target.arch}) has none; draft with --dspark --mtp-model FILE, "
                "--mtp-draft N --mtp-model FILE or --lookup N instead"
            )
        return
    if config.kind is DrafterKind.DSPARK:
        from ds4mlx.speculation.dspark_layout import LAYOUTS

        flag = "--dspark"
    else:
        from ds4mlx.speculation.mtp import LAYOUTS

        flag = f"--mtp-draft {config.mtp_draft}"
    if config.support_path is None:
        raise GGUFError(f"{flag} needs its drafter file: --mtp-model FILE")
    if not Path(config.support_path).is_file():
        raise GGUFError(f"--mtp-model {config.support_path}: no such file")
    support = open_gguf(config.support_path)
    if support.arch not in LAYOUTS:
        expected = ", ".join(f"{what} ('{arch}')" for arch, what in LAYOUTS.items())
        raise GGUFError(
            f"--mtp-model {config.support_path} is a '{support.arch}' file, not a drafter for "
            f"{flag}: expected {expected}"
        )
    if target.arch != DEEPSEEK_TARGET:
        raise GGUFError(
            f"{flag} drafts for DeepSeek-V4 ({DEEPSEEK_TARGET}) models; {model_path} is a "
            f"{target.arch} model (a GLM model drafts with its own MTP block: --mtp)"
        )


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
