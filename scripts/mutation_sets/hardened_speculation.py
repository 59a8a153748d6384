"""Mutations of the drafting layer's refusals and small contracts, written with the tests that
catch them (session 17: a coverage pass of ``ds4mlx/speculation`` by ``tests/speculation``,
93% -> 99% of lines and branches): the speculation settings at both sides of each bound, the
drafter files checked from their headers before a model loads, rows that do not match their
tokens, the dflash layout's metadata checks, the lookup's longest n-gram first and its extension
of a learned drafter's block, and the offline probe's counters and confidence cut. Each was
applied by hand and failed ``tests/speculation/test_drafter_guards.py`` or
``test_dspark_layout.py``; none repeats an earlier set's file and line."""

from __future__ import annotations

from mutation_sets.base import (
    DSPARK_LAYOUT_PY,
    DSPARK_PY,
    LOOKUP_PY,
    NEXTN_PY,
    PROBE_PY,
    SPECULATION_CONFIG_PY,
    Mutation,
)
from mutation_sets.base import in_speculation_folder as _speculation

SPECULATION_INIT_PY = "ds4mlx/speculation/__init__.py"
SPECULATION_LOOP_PY = "ds4mlx/speculation/loop.py"

MUTATIONS: tuple[Mutation, ...] = (
    _speculation(
        "config_zero_mtp_draft_tokens_accepted",
        SPECULATION_CONFIG_PY,
        "if self.mtp_draft < 1:",
        "if self.mtp_draft < 0:",
    ),
    _speculation(
        "config_equal_ngram_sizes_refused",
        SPECULATION_CONFIG_PY,
        "if not 1 <= low <= high:",
        "if not 1 <= low < high:",
    ),
    _speculation(
        "config_two_mtp_tokens_stacked_on_dspark",
        SPECULATION_CONFIG_PY,
        "if self.kind is DrafterKind.DSPARK and self.mtp_draft > 1:",
        "if self.kind is DrafterKind.DSPARK and self.mtp_draft > 2:",
    ),
    _speculation(
        "drafter_files_deepseek_drafter_for_a_glm_target",
        SPECULATION_INIT_PY,
        "if target.arch != DEEPSEEK_TARGET:",
        "if target.arch == DEEPSEEK_TARGET:",
    ),
    _speculation(
        "drafter_files_any_architecture_as_drafter",
        SPECULATION_INIT_PY,
        "if support.arch not in LAYOUTS:",
        "if support.arch in ():",
    ),
    _speculation(
        "lookup_longest_ngram_skipped_at_the_history_length",
        LOOKUP_PY,
        "if n > len(tail):",
        "if n >= len(tail):",
    ),
    _speculation(
        "lookup_extension_tokens_not_told_to_the_lookup",
        LOOKUP_PY,
        "        self.learned.observe_tokens(tokens, next_token)\n"
        "        self.lookup.observe_tokens(tokens, next_token)\n",
        "        self.learned.observe_tokens(tokens, next_token)\n",
    ),
    _speculation(
        "lookup_extension_keeps_stale_sources_without_a_block",
        LOOKUP_PY,
        "            self._record(0, 0)\n            return None\n",
        "            return None\n",
    ),
    _speculation(
        "stats_tau_without_the_target_token",
        SPECULATION_LOOP_PY,
        "return (self.accepted_tokens + self.drafted_passes) / self.drafted_passes",
        "return self.accepted_tokens / self.drafted_passes",
    ),
    _speculation(
        "nextn_mismatched_rows_accepted",
        NEXTN_PY,
        "        if len(tokens) != rows.n_rows:\n"
        '            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")\n'
        "        if rows.pos0 != self._next_pos:",
        "        if rows.pos0 != self._next_pos:",
    ),
    _speculation(
        "dspark_mismatched_rows_accepted",
        DSPARK_PY,
        "        if len(tokens) != rows.n_rows:\n"
        '            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")\n'
        "        self.observe_taps(",
        "        self.observe_taps(",
    ),
    _speculation(
        "probe_confidence_cut_ignored",
        PROBE_PY,
        "if draft.confidences is not None and confidence_threshold:",
        "if draft.confidences is not None and confidence_threshold > 1:",
    ),
    _speculation(
        "dflash_zero_stages_accepted",
        DSPARK_LAYOUT_PY,
        "if stages < 1:",
        "if stages < 0:",
    ),
    _speculation(
        "dflash_zero_window_accepted",
        DSPARK_LAYOUT_PY,
        "if window < 1:",
        "if window < 0:",
    ),
    _speculation(
        "dflash_zero_output_groups_divide_by_zero",
        DSPARK_LAYOUT_PY,
        "if groups < 1 or heads % groups:",
        "if heads % groups:",
    ),
    _speculation(
        "dflash_anchor_text_read_inverted",
        DSPARK_LAYOUT_PY,
        'return value == "true"',
        'return value == "false"',
    ),
    _speculation(
        "dflash_value_length_unchecked",
        DSPARK_LAYOUT_PY,
        'if int(opt("attention.value_length", head_dim)) != head_dim:',
        'if int(opt("attention.value_length", head_dim)) < head_dim:',
    ),
    _speculation(
        "dflash_any_gating_accepted",
        DSPARK_LAYOUT_PY,
        "if gating != GatingFunc.SQRT_SOFTPLUS:",
        "if gating > GatingFunc.SQRT_SOFTPLUS:",
    ),
    _speculation(
        "dflash_vocabulary_mismatch_accepted",
        DSPARK_LAYOUT_PY,
        "if vocab != target.vocab_size:",
        "if vocab > target.vocab_size:",
    ),
    _speculation(
        "ds4_layout_zero_stages_accepted",
        DSPARK_LAYOUT_PY,
        "if config.stage_count < 1:",
        "if config.stage_count < 0:",
    ),
    _speculation(
        "ds4_layout_markov_rank_without_its_tensor",
        DSPARK_LAYOUT_PY,
        "if config.markov_rank and not gguf.has_tensor(w1):",
        "if not config.markov_rank and not gguf.has_tensor(w1):",
    ),
)
