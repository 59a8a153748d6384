"""The mutation sets of ``scripts/mutation_run.py``, by name, in the order they were written."""

from __future__ import annotations

from mutation_sets import (
    core,
    fresh2,
    fresh3,
    fresh4,
    fresh5,
    fresh6,
    fresh7,
    fresh8,
    fresh9,
    fresh10,
    guards,
    hardened2_ag_loop,
    hardened2_ag_ui,
    hardened2_eng,
    hardened2_gguf_spec,
    hardened2_sv_api,
    hardened2_sv_turn,
    hardened_agent,
    hardened_cli,
    hardened_engine,
    hardened_experts,
    hardened_gguf,
    hardened_server,
    hardened_speculation,
)
from mutation_sets.base import Mutation

SETS: dict[str, tuple[Mutation, ...]] = {
    "core": core.MUTATIONS,
    "guards": guards.MUTATIONS,
    "fresh2": fresh2.MUTATIONS,
    "fresh3": fresh3.MUTATIONS,
    "fresh4": fresh4.MUTATIONS,
    "fresh5": fresh5.MUTATIONS,
    "fresh6": fresh6.MUTATIONS,
    "fresh7": fresh7.MUTATIONS,
    "hardened_agent": hardened_agent.MUTATIONS,
    "hardened_experts": hardened_experts.MUTATIONS,
    "hardened_gguf": hardened_gguf.MUTATIONS,
    "hardened_cli": hardened_cli.MUTATIONS,
    "hardened_engine": hardened_engine.MUTATIONS,
    "hardened_server": hardened_server.MUTATIONS,
    "hardened_speculation": hardened_speculation.MUTATIONS,
    "fresh8": fresh8.MUTATIONS,
    "hardened2_gguf_spec": hardened2_gguf_spec.MUTATIONS,
    "hardened2_sv_api": hardened2_sv_api.MUTATIONS,
    "hardened2_ag_ui": hardened2_ag_ui.MUTATIONS,
    "hardened2_sv_turn": hardened2_sv_turn.MUTATIONS,
    "hardened2_eng": hardened2_eng.MUTATIONS,
    "hardened2_ag_loop": hardened2_ag_loop.MUTATIONS,
    "fresh9": fresh9.MUTATIONS,
    "fresh10": fresh10.MUTATIONS,
}
MUTATIONS: tuple[Mutation, ...] = tuple(m for mutations in SETS.values() for m in mutations)

__all__ = ["MUTATIONS", "SETS", "Mutation"]
