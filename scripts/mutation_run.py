"""Mutation run: apply each of a list of small, plausible bugs alone, run the tests meant to
catch it, restore the file. Every mutation must make some test fail.

    python scripts/mutation_run.py              # all mutations, after a baseline run
    python scripts/mutation_run.py --list
    python scripts/mutation_run.py --only exact_bonus_from_last_draft_row top_p_boundary_flip
    python scripts/mutation_run.py --report mutation-report.md

A mutation is (file, old text, new text): the old text must occur exactly once, so a mutation
that no longer matches the code is reported as stale instead of silently testing nothing. The
original file is written back in a ``finally`` (also on Ctrl-C and SIGTERM) with its original
modification time, and each mutated version gets a distinct modification time, so Python never
runs a stale cached bytecode file of either. Exit status: 0 when every mutation was caught.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SAMPLER = ("tests/engine/test_sampler_filters.py", "tests/engine/test_penalties.py")
PIPELINED = ("tests/engine/test_pipelined_sampling.py",)
ACCEPTANCE = ("tests/speculation/test_exact_acceptance.py", "tests/speculation/test_acceptance.py")
SCHEDULER = ("tests/speculation/test_scheduler.py",)
SESSION = ("tests/engine/test_session_rollback.py", "tests/engine/test_session.py")
ROUTING = ("tests/models/test_model_pieces.py",)
GGUF = ("tests/gguf/test_gguf_hostile.py", "tests/gguf/test_gguf_partial_overlap.py")
# The guards users trust (issue 37): each area's edge tests.
SERVER_GUARDS = ("tests/server/test_server_guards.py",)
AGENT_GUARDS = ("tests/agent/test_agent_guards.py",)
AGENT_EDGES = ("tests/agent/test_agent_tool_edges.py",)
KVCACHE_GUARDS = ("tests/engine/test_prompt_cache_order.py",)
SPECIAL_TOKENS = ("tests/engine/test_special_tokens_stay_text.py",)
STAGING = ("tests/experts/test_staging_room.py",)
GGUF_EDGES = ("tests/gguf/test_gguf_edges.py",)


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


SAMPLING_PY = "ds4mlx/engine/sampling.py"
GENERATE_PY = "ds4mlx/engine/generate.py"
ACCEPTANCE_PY = "ds4mlx/speculation/acceptance.py"
SCHEDULER_PY = "ds4mlx/speculation/scheduler.py"
SESSION_PY = "ds4mlx/engine/session.py"
DEEPSEEK4_PY = "ds4mlx/models/deepseek4.py"
GLM5_PY = "ds4mlx/models/glm5_next.py"
MOE_PY = "ds4mlx/models/moe.py"
COMPRESSED_PY = "ds4mlx/models/compressed_attention.py"
KDA_PY = "ds4mlx/models/kda.py"
POOL_INDEXER_PY = "ds4mlx/models/pool_indexer.py"
VALIDATE_PY = "ds4mlx/gguf/validate.py"

# A top-k as a threshold on the k-th largest value: every token tied with it stays.
_TOP_K_TIES = """kth = mx.where(ranks < k, logprobs, mx.inf).min(axis=-1, keepdims=True)
    return mx.where(logprobs >= kth, logprobs, -mx.inf)"""

MUTATIONS: tuple[Mutation, ...] = (
    # --- sampling ---------------------------------------------------------------------------
    Mutation("min_p_never_applied", SAMPLING_PY, "if o.min_p > 0.0:", "if o.min_p > 1.0:", SAMPLER),
    Mutation(
        "top_p_boundary_flip",
        SAMPLING_PY,
        "kept = before < top_p * probs.sum(axis=-1, keepdims=True)",
        "kept = before <= top_p * probs.sum(axis=-1, keepdims=True)",
        SAMPLER,
    ),
    Mutation(
        "top_k_keeps_ties",
        SAMPLING_PY,
        "return mx.where(ranks < k, logprobs, -mx.inf)",
        _TOP_K_TIES,
        SAMPLER,
    ),
    Mutation(
        "top_k_off_by_one",
        SAMPLING_PY,
        "_top_k(logprobs, mx.array(o.top_k, dtype=mx.int32))",
        "_top_k(logprobs, mx.array(o.top_k + 1, dtype=mx.int32))",
        SAMPLER,
    ),
    Mutation(
        "top_k_at_vocabulary_reaches_mlx_lm",
        SAMPLING_PY,
        "if 0 < o.top_k < logprobs.shape[-1]:",
        "if 0 < o.top_k <= logprobs.shape[-1]:",
        SAMPLER,
    ),
    Mutation(
        "probabilities_filter_the_tempered_distribution",
        SAMPLING_PY,
        "mx.softmax(self.filtered_logprobs(logits) / self.options.temperature, axis=-1)",
        "mx.softmax(self.filtered_logprobs(logits / self.options.temperature), axis=-1)",
        SAMPLER,
    ),
    Mutation(
        "device_draw_filters_the_tempered_distribution",
        SAMPLING_PY,
        "row = self.filtered_logprobs(logits[None])",
        "row = self.filtered_logprobs(logits[None] / self.options.temperature) "
        "* self.options.temperature",
        SAMPLER,
    ),
    Mutation(
        "seeded_draw_ignores_temperature",
        SAMPLING_PY,
        "inverse_temperature = _scalar(1 / self.options.temperature)",
        "inverse_temperature = _scalar(1.0)",
        SAMPLER,
    ),
    Mutation(
        "seeded_key_reused",
        SAMPLING_PY,
        "self._key, key = mx.random.split(self._key)",
        "key = self._key",
        SAMPLER,
    ),
    Mutation(
        "repeat_penalty_direction_swapped",
        SAMPLING_PY,
        "mx.where(row <= 0, row * o.repeat_penalty, row / o.repeat_penalty)",
        "mx.where(row <= 0, row / o.repeat_penalty, row * o.repeat_penalty)",
        SAMPLER,
    ),
    Mutation(
        "presence_penalty_per_occurrence",
        SAMPLING_PY,
        "penalties - counts * o.frequency_penalty - o.presence_penalty",
        "penalties - counts * (o.frequency_penalty + o.presence_penalty)",
        SAMPLER,
    ),
    Mutation(
        "verify_row_penalised_by_its_own_draft_token",
        SAMPLING_PY,
        "[*recent, *draft[:i]]",
        "[*recent, *draft[: i + 1]]",
        SAMPLER,
    ),
    Mutation(
        "logit_bias_subtracted",
        SAMPLING_PY,
        "row[ids] = row[ids] + mx.array(",
        "row[ids] = row[ids] - mx.array(",
        SAMPLER,
    ),
    # --- sampling on the device, in pipelined decoding -------------------------------------
    Mutation(
        "pipelined_window_keeps_the_oldest_tokens",
        GENERATE_PY,
        "window = mx.concatenate([window, sampled])[-last_n:]",
        "window = mx.concatenate([window, sampled])[:last_n]",
        PIPELINED,
    ),
    Mutation(
        "pipelined_draws_unpenalised",
        GENERATE_PY,
        "row = sampler.masked_on_device(sampler.penalized_on_device(logits[-1], window))",
        "row = sampler.masked_on_device(logits[-1])",
        PIPELINED,
    ),
    Mutation(
        "pipelined_stop_rollback_one_short",
        GENERATE_PY,
        "session.truncate(pos + 1 + stop_at)",
        "session.truncate(pos + 2 + stop_at)",
        PIPELINED,
    ),
    # --- acceptance -------------------------------------------------------------------------
    Mutation(
        "exact_bonus_from_last_draft_row",
        ACCEPTANCE_PY,
        "                return Verdict(i, int(replacement[0]))\n"
        "        return Verdict(len(draft), sampler.draw(logits[-1]))",
        "                return Verdict(i, int(replacement[0]))\n"
        "        return Verdict(len(draft), sampler.draw(logits[len(draft) - 1]))",
        ACCEPTANCE,
    ),
    Mutation(
        "exact_residual_keeps_the_draft",
        ACCEPTANCE_PY,
        "residual = mx.put_along_axis(probs, drafts[:, None], mx.array(0.0), axis=-1)",
        "residual = probs",
        ACCEPTANCE,
    ),
    Mutation(
        "exact_accept_test_flipped",
        ACCEPTANCE_PY,
        "mx.random.uniform(shape=p_draft.shape) < p_draft",
        "mx.random.uniform(shape=p_draft.shape) > p_draft",
        ACCEPTANCE,
    ),
    Mutation(
        "exact_rejection_counts_the_rejected_token",
        ACCEPTANCE_PY,
        "return Verdict(i, int(replacement[0]))",
        "return Verdict(i + 1, int(replacement[0]))",
        ACCEPTANCE,
    ),
    Mutation(
        "exact_judges_with_the_next_row",
        ACCEPTANCE_PY,
        "sampler.probabilities(logits[i : i + 1])",
        "sampler.probabilities(logits[i + 1 : i + 2])",
        ACCEPTANCE,
    ),
    Mutation(
        "exact_ignores_the_sampling_filters",
        ACCEPTANCE_PY,
        "sampler.probabilities(logits[i : i + 1])",
        "mx.softmax(logits[i : i + 1], axis=-1)",
        ACCEPTANCE,
    ),
    Mutation(
        "opportunistic_mismatch_sampled_from_next_row",
        ACCEPTANCE_PY,
        "return Verdict(i, sampler.draw(logits[i]))",
        "return Verdict(i, sampler.draw(logits[i + 1]))",
        ACCEPTANCE,
    ),
    Mutation(
        "greedy_correction_from_previous_row",
        ACCEPTANCE_PY,
        "return Verdict(n, targets[n])",
        "return Verdict(n, targets[max(n - 1, 0)])",
        ACCEPTANCE,
    ),
    # --- scheduler --------------------------------------------------------------------------
    Mutation(
        "scheduler_budget_boundary",
        SCHEDULER_PY,
        "return remaining_budget - 1 < min(MIN_TAIL_DRAFT, self.max_draft)",
        "return remaining_budget - 1 <= min(MIN_TAIL_DRAFT, self.max_draft)",
        SCHEDULER,
    ),
    Mutation(
        "scheduler_no_draft_share_strict",
        SCHEDULER_PY,
        "if no_draft >= MAX_NO_DRAFT_SHARE * len(window):",
        "if no_draft > MAX_NO_DRAFT_SHARE * len(window):",
        SCHEDULER,
    ),
    Mutation(
        "scheduler_no_draft_streak_never_reset",
        SCHEDULER_PY,
        "        self._no_draft_streak = 0\n        threshold",
        "        threshold",
        SCHEDULER,
    ),
    Mutation(
        "scheduler_threshold_max",
        SCHEDULER_PY,
        "threshold = min(MIN_MEAN_ACCEPTED,",
        "threshold = max(MIN_MEAN_ACCEPTED,",
        SCHEDULER,
    ),
    # --- sessions ---------------------------------------------------------------------------
    Mutation(
        "restore_shares_the_snapshot_state",
        SESSION_PY,
        "self.state = snap.state.copy()",
        "self.state = snap.state",
        SESSION,
    ),
    Mutation(
        "snapshot_shares_the_session_state",
        SESSION_PY,
        "return Snapshot(self.state.copy(),",
        "return Snapshot(self.state,",
        SESSION,
    ),
    Mutation(
        "restore_keeps_only_a_count",
        SESSION_PY,
        "self.tokens = list(snap.tokens)",
        "del self.tokens[snap.n_tokens :]",
        SESSION,
    ),
    Mutation(
        "truncate_tokens_off_by_one",
        SESSION_PY,
        "del self.tokens[n_tokens:]",
        "del self.tokens[n_tokens + 1 :]",
        SESSION,
    ),
    Mutation(
        "deepseek4_window_cut_one_short",
        COMPRESSED_PY,
        "self.window[: self.window.shape[0] - cut]",
        "self.window[: self.window.shape[0] - cut + 1]",
        SESSION,
    ),
    Mutation(
        "deepseek4_partial_block_kept",
        COMPRESSED_PY,
        "blocks = pos // ratio if ratio else 0",
        "blocks = -(-pos // ratio) if ratio else 0",
        SESSION,
    ),
    Mutation(
        "deepseek4_pending_rows_one_long",
        COMPRESSED_PY,
        "return PendingRows(self.start, self.kv[: pos - self.start], "
        "self.score[: pos - self.start])",
        "return PendingRows(self.start, self.kv[: pos - self.start + 1], "
        "self.score[: pos - self.start + 1])",
        SESSION,
    ),
    Mutation(
        "glm5_conv_rows_not_cut",
        KDA_PY,
        "conv=self.conv[:, : self.conv.shape[1] - cut],",
        "conv=self.conv,",
        SESSION,
    ),
    Mutation(
        "glm5_partial_pool_kept",
        POOL_INDEXER_PY,
        "keep_rows(self.pooled, pos // kpool)",
        "keep_rows(self.pooled, -(-pos // kpool))",
        SESSION,
    ),
    Mutation(
        "glm5_latent_one_long",
        "ds4mlx/models/sparse_mla.py",
        "keep_rows(self.latent, pos)",
        "keep_rows(self.latent, pos + 1)",
        SESSION,
    ),
    # --- routing ----------------------------------------------------------------------------
    Mutation(
        "route_selection_bias_ignored",
        MOE_PY,
        "scores = probs if bias is None else probs + bias",
        "scores = probs",
        ROUTING,
    ),
    Mutation(
        "route_weights_biased",
        MOE_PY,
        "weights = mx.take_along_axis(probs, selected, axis=-1)",
        "weights = mx.take_along_axis(probs if bias is None else probs + bias, selected, axis=-1)",
        ROUTING,
    ),
    Mutation(
        "route_skips_the_best_expert",
        MOE_PY,
        "mx.argsort(-scores, axis=-1)[:, :n_used]",
        "mx.argsort(-scores, axis=-1)[:, 1 : n_used + 1]",
        ROUTING,
    ),
    # --- GGUF validation --------------------------------------------------------------------
    Mutation("gguf_duplicate_keys_not_recorded", VALIDATE_PY, "        keys.add(key)\n", "", GGUF),
    Mutation(
        "gguf_zero_alignment_accepted",
        VALIDATE_PY,
        "if alignment == 0 or alignment & (alignment - 1):",
        "if alignment & (alignment - 1):",
        GGUF,
    ),
    Mutation(
        "gguf_one_dimension_too_many",
        VALIDATE_PY,
        "if not 1 <= n_dims <= MAX_TENSOR_DIMS:",
        "if not 1 <= n_dims <= MAX_TENSOR_DIMS + 1:",
        GGUF,
    ),
    Mutation(
        "gguf_block_size_checked_on_the_outer_dimension",
        VALIDATE_PY,
        "if info.ggml_dims[0] % block_size:",
        "if info.ggml_dims[-1] % block_size:",
        GGUF,
    ),
    Mutation(
        "gguf_tensor_may_end_past_eof",
        VALIDATE_PY,
        "if start + nbytes > cursor.size:",
        "if start > cursor.size:",
        GGUF,
    ),
    Mutation(
        "gguf_overlap_check_off_by_one",
        VALIDATE_PY,
        "if before.file_offset + before.nbytes > after.file_offset:",
        "if before.file_offset + before.nbytes > after.file_offset + 32:",
        GGUF,
    ),
)


ACCESS_PY = "ds4mlx/server/access.py"
LIMITS_PY = "ds4mlx/server/limits.py"
BODY_PY = "ds4mlx/server/body.py"
UTILITY_PY = "ds4mlx/server/utility_routes.py"
WORKSPACE_PY = "ds4mlx/agent/workspace.py"
PERMISSIONS_PY = "ds4mlx/agent/permissions.py"
JOBS_PY = "ds4mlx/agent/jobs.py"
TOOLS_PY = "ds4mlx/agent/tools.py"
CHECKPOINTS_PY = "ds4mlx/agent/checkpoints.py"
PROMPT_CACHE_PY = "ds4mlx/engine/kvcache/prompt_cache.py"
STREAMED_PY = "ds4mlx/experts/streamed.py"
DEEPSEEK4_CHAT_PY = "ds4mlx/engine/chat/deepseek4.py"
GLM5_CHAT_PY = "ds4mlx/engine/chat/glm5.py"
_SHELL_SYNTAX = r"[;&|<>`$(){}\n\r\\*?\[\]!#~]"


def _without(character: str) -> str:
    """The permission rules' shell-syntax set with one character dropped."""
    return _SHELL_SYNTAX.replace(character, "", 1)


def _chat(name: str, file: str, old: str, new: str) -> Mutation:
    return Mutation(name, file, old, new, SPECIAL_TOKENS)


GUARD_MUTATIONS: tuple[Mutation, ...] = (
    # --- server: keys, origins, body size, context and vocabulary ----------------------------
    Mutation(
        "server_key_prefix_accepted",
        ACCESS_PY,
        "secrets.compare_digest(given.encode(), key)",
        "key.startswith(given.encode())",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_key_extension_accepted",
        ACCESS_PY,
        "secrets.compare_digest(given.encode(), key)",
        "given.encode().startswith(key)",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_any_authorization_scheme",
        ACCESS_PY,
        'scheme.lower() == "bearer"',
        'scheme.lower() != "basic"',
        SERVER_GUARDS,
    ),
    Mutation(
        "server_stats_open",
        ACCESS_PY,
        'OPEN_PATHS = frozenset({"/health", "/v1/health"})',
        'OPEN_PATHS = frozenset({"/health", "/v1/health", "/stats"})',
        SERVER_GUARDS,
    ),
    Mutation(
        "server_origin_prefix_is_own",
        ACCESS_PY,
        "urlsplit(origin).netloc.lower() == host.lower()",
        "host.lower().startswith(urlsplit(origin).netloc.lower())",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_refusal_shape_by_wrong_path",
        ACCESS_PY,
        'if path.startswith("/v1/messages"):',
        'if path.startswith("/v1/messages/"):',
        SERVER_GUARDS,
    ),
    Mutation(
        "server_declared_body_at_limit_refused",
        BODY_PY,
        "int(declared) > limit",
        "int(declared) >= limit",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_streamed_body_at_limit_refused",
        BODY_PY,
        "if len(body) > limit:",
        "if len(body) >= limit:",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_tokenize_default_limit",
        UTILITY_PY,
        "read_parsed(request, TokenizeRequest, self.max_body_bytes)",
        "read_parsed(request, TokenizeRequest)",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_detokenize_default_limit",
        UTILITY_PY,
        "read_parsed(request, DetokenizeRequest, self.max_body_bytes)",
        "read_parsed(request, DetokenizeRequest)",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_count_tokens_default_limit",
        UTILITY_PY,
        "read_parsed(request, CountTokensRequest, self.max_body_bytes)",
        "read_parsed(request, CountTokensRequest)",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_text_bound_strict",
        LIMITS_PY,
        "if at_least >= self.max_context:",
        "if at_least > self.max_context:",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_text_bound_rounds_down",
        LIMITS_PY,
        "at_least = -(-characters // self.bytes_per_token)",
        "at_least = characters // self.bytes_per_token",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_token_bound_strict",
        LIMITS_PY,
        "if count >= self.max_context:",
        "if count > self.max_context:",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_logit_bias_past_vocabulary",
        LIMITS_PY,
        "token_id >= self.vocab_size",
        "token_id > self.vocab_size",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_detokenize_past_vocabulary",
        UTILITY_PY,
        "token_id >= size)",
        "token_id > size)",
        SERVER_GUARDS,
    ),
    Mutation(
        "server_detokenize_negative_id",
        UTILITY_PY,
        "if token_id < 0 or",
        "if token_id < -1 or",
        SERVER_GUARDS,
    ),
    # --- agent: confinement, permission prefixes, bounded output, undo -----------------------
    Mutation(
        "agent_lookalike_sibling_is_inside",
        WORKSPACE_PY,
        "if not resolved.is_relative_to(self.root):",
        "if not str(resolved).startswith(str(self.root)):",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_walk_lists_links_to_a_lookalike",
        WORKSPACE_PY,
        "return target.exists() and target.is_relative_to(self.root)",
        "return target.exists() and str(target).startswith(str(self.root))",
        AGENT_GUARDS,
    ),
    *(
        Mutation(
            f"agent_{name}_is_not_shell_syntax",
            PERMISSIONS_PY,
            _SHELL_SYNTAX,
            _without(c),
            AGENT_GUARDS,
        )
        for name, c in (
            ("semicolon", ";"),
            ("pipe", "|"),
            ("ampersand", "&"),
            ("redirection", ">"),
            ("newline", "\\n"),
            ("substitution", "$"),
            ("backquote", "`"),
        )
    ),
    Mutation(
        "agent_prefix_compared_by_characters",
        PERMISSIONS_PY,
        "return words is not None and words[: len(allowed)] == allowed",
        'return words is not None and " ".join(words).startswith(self.prefix)',
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_prefix_of_one_word",
        PERMISSIONS_PY,
        "_PREFIX_WORDS = 2",
        "_PREFIX_WORDS = 1",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_prefix_counts_options",
        PERMISSIONS_PY,
        'plain += not word.startswith("-")',
        "plain += 1",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_exact_rule_unstripped",
        PERMISSIONS_PY,
        'return Rule("bash", command=str(call.arguments.get("command", "")).strip())',
        'return Rule("bash", command=str(call.arguments.get("command", "")))',
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_tool_rule_covers_every_tool",
        PERMISSIONS_PY,
        "if call.name != self.tool:",
        "if call.name == self.tool and False:",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_clip_keeps_two_thirds_head",
        TOOLS_PY,
        "head = limit // 3",
        "head = limit * 2 // 3",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_tail_read_skips_a_byte",
        JOBS_PY,
        "last = bytes(self.tail[max(0, position - tail_start) :])",
        "last = bytes(self.tail[max(1, position - tail_start) :])",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_tail_keeps_the_oldest",
        JOBS_PY,
        "del self.tail[: len(self.tail) - self.tail_limit]",
        "del self.tail[self.tail_limit :]",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_overflowing_one_late",
        JOBS_PY,
        "return len(self.tail) >= self.tail_limit",
        "return len(self.tail) > self.tail_limit",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_limited_read_overshoots_a_short_tail",
        JOBS_PY,
        "keep_last = min(len(last), limit - min(len(first), limit // 3))",
        "keep_last = limit - min(len(first), limit // 3)",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_undo_keeps_the_middle_version",
        CHECKPOINTS_PY,
        "if path not in self._current.originals:",
        "if path not in self._current.originals or True:",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_session_diff_from_the_last_copy",
        CHECKPOINTS_PY,
        "self._session_originals.setdefault(path, original)",
        "self._session_originals[path] = original",
        AGENT_GUARDS,
    ),
    Mutation(
        "agent_search_cap_one_early",
        TOOLS_PY,
        "if len(self.matches) > MAX_SEARCH_MATCHES:",
        "if len(self.matches) >= MAX_SEARCH_MATCHES:",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_match_line_one_long",
        TOOLS_PY,
        "line.strip()[:MAX_MATCH_LINE_CHARS]",
        "line.strip()[: MAX_MATCH_LINE_CHARS + 1]",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_list_cap_one_late",
        TOOLS_PY,
        "if len(lines) == MAX_LIST_ENTRIES:",
        "if len(lines) == MAX_LIST_ENTRIES + 1:",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_list_one_level_short",
        TOOLS_PY,
        "if len(relative.parts) > LIST_DEPTH:",
        "if len(relative.parts) >= LIST_DEPTH:",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_read_limit_exclusive",
        "ds4mlx/agent/files.py",
        "if info.st_size > limit:",
        "if info.st_size >= limit:",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_last_line_past_the_end",
        TOOLS_PY,
        "if lines and start > len(lines):",
        "if lines and start >= len(lines):",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_more_stops_a_line_early",
        TOOLS_PY,
        "if position.next_line > len(lines):",
        "if position.next_line >= len(lines):",
        AGENT_EDGES,
    ),
    Mutation(
        "agent_and_and_backgrounded",
        TOOLS_PY,
        'command.endswith("&") and not command.endswith("&&")',
        'command.endswith("&")',
        AGENT_EDGES,
    ),
    # --- KV / prompt cache ------------------------------------------------------------------
    Mutation(
        "kvcache_read_does_not_refresh",
        PROMPT_CACHE_PY,
        "        self._entries.move_to_end(tokens)\n",
        "",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_evicts_the_newest",
        PROMPT_CACHE_PY,
        "self._entries.popitem(last=False)",
        "self._entries.popitem(last=True)",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_memory_budget_strict",
        PROMPT_CACHE_PY,
        "while self.used + size > self.budget:",
        "while self.used + size >= self.budget:",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_entry_of_the_whole_budget_dropped",
        PROMPT_CACHE_PY,
        "if size > self.budget:\n            return",
        "if size >= self.budget:\n            return",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_file_name_without_fingerprint",
        PROMPT_CACHE_PY,
        "digest = hashlib.sha256(self.fingerprint.encode())",
        "digest = hashlib.sha256()",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_disk_read_does_not_refresh",
        PROMPT_CACHE_PY,
        "os.utime(path)  # most recently used",
        "os.stat(path)  # most recently used",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_disk_evicts_the_newest",
        PROMPT_CACHE_PY,
        "key=lambda f: (f[0], f[2].name)",
        "key=lambda f: (-f[0], f[2].name)",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_rollback_one_short",
        PROMPT_CACHE_PY,
        "return share if len(entry) - share <= MAX_CUT else None",
        "return share if len(entry) - share < MAX_CUT else None",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_share_includes_the_last_token",
        PROMPT_CACHE_PY,
        "share = common_prefix(entry, prompt[:-1])",
        "share = common_prefix(entry, prompt)",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_one_token_state_cached",
        PROMPT_CACHE_PY,
        "len(snapshot.tokens) > 1",
        "len(snapshot.tokens) > 0",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_disk_entry_replaces_memory",
        PROMPT_CACHE_PY,
        "share > longer_than and tokens not in found:",
        "share > longer_than:",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_share_bound_inclusive",
        PROMPT_CACHE_PY,
        "share is not None and share > longer_than",
        "share is not None and share >= longer_than",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_fresh_temporary_removed",
        PROMPT_CACHE_PY,
        "if now - temporary.stat().st_mtime > _STALE_TEMPORARY_SECONDS:",
        "if now - temporary.stat().st_mtime < _STALE_TEMPORARY_SECONDS:",
        KVCACHE_GUARDS,
    ),
    Mutation(
        "kvcache_common_prefix_one_long",
        PROMPT_CACHE_PY,
        "return int(differ[0]) if differ.size else n",
        "return int(differ[0]) + 1 if differ.size else n",
        KVCACHE_GUARDS,
    ),
    # --- streamed experts: the staging room --------------------------------------------------
    Mutation(
        "experts_staging_one_over",
        STREAMED_PY,
        "if pool.staged() >= pool.staging:",
        "if pool.staged() > pool.staging:",
        STAGING,
    ),
    Mutation(
        "experts_draining_reads_not_counted",
        STREAMED_PY,
        "return len(self.inflight) + len(self.draining)",
        "return len(self.inflight)",
        STAGING,
    ),
    Mutation(
        "experts_staging_outside_the_budget",
        STREAMED_PY,
        "                    slots -= staging\n",
        "",
        STAGING,
    ),
    Mutation(
        "experts_reserved_outside_the_budget",
        STREAMED_PY,
        "                slots -= reserved\n",
        "",
        STAGING,
    ),
    # --- GGUF validation at its edges ------------------------------------------------------
    Mutation(
        "gguf_data_offset_aligned_down",
        VALIDATE_PY,
        "data_offset = -(-cursor.position // alignment) * alignment",
        "data_offset = cursor.position // alignment * alignment",
        GGUF_EDGES,
    ),
    Mutation(
        "gguf_data_offset_always_padded",
        VALIDATE_PY,
        "data_offset = -(-cursor.position // alignment) * alignment",
        "data_offset = (cursor.position // alignment + 1) * alignment",
        GGUF_EDGES,
    ),
    Mutation(
        "gguf_field_may_not_end_at_eof",
        VALIDATE_PY,
        "if nbytes > self.remaining:",
        "if nbytes >= self.remaining:",
        GGUF_EDGES,
    ),
    Mutation(
        "gguf_string_may_not_end_at_eof",
        VALIDATE_PY,
        "if length > self.remaining:",
        "if length >= self.remaining:",
        GGUF_EDGES,
    ),
    Mutation(
        "gguf_count_may_not_fill_the_file",
        VALIDATE_PY,
        "if count * min_entry_bytes > self.remaining:",
        "if count * min_entry_bytes >= self.remaining:",
        GGUF_EDGES,
    ),
    Mutation(
        "gguf_touching_tensors_overlap",
        VALIDATE_PY,
        "if before.file_offset + before.nbytes > after.file_offset:",
        "if before.file_offset + before.nbytes >= after.file_offset:",
        GGUF_EDGES,
    ),
    # --- special tokens stay text in every client field ----------------------------------
    _chat(
        "chat_deepseek_developer_message_as_template",
        DEEPSEEK4_CHAT_PY,
        "out.template(USER)\n                out.caller(turn.content)",
        "out.template(USER)\n                out.template(turn.content)",
    ),
    _chat(
        "chat_deepseek_tool_result_as_template",
        DEEPSEEK4_CHAT_PY,
        'out.template("<tool_result>")\n            out.caller(text)',
        'out.template("<tool_result>")\n            out.template(text)',
    ),
    _chat(
        "chat_deepseek_tool_schemas_as_template",
        DEEPSEEK4_CHAT_PY,
        "out.caller(schemas)",
        "out.template(schemas)",
    ),
    _chat(
        "chat_deepseek_call_name_as_template",
        DEEPSEEK4_CHAT_PY,
        "out.caller(call.name)",
        "out.template(call.name)",
    ),
    _chat(
        "chat_deepseek_call_key_as_template",
        DEEPSEEK4_CHAT_PY,
        "out.caller(key)",
        "out.template(key)",
    ),
    _chat(
        "chat_deepseek_reasoning_as_template",
        DEEPSEEK4_CHAT_PY,
        "out.caller(turn.reasoning)",
        "out.template(turn.reasoning)",
    ),
    _chat(
        "chat_glm_tool_response_as_template",
        GLM5_CHAT_PY,
        "    _caller_text(out, value)\n",
        "    out.template(_visible_text(value))\n",
    ),
    _chat(
        "chat_glm_tool_schemas_as_template",
        GLM5_CHAT_PY,
        "out.caller(schemas)\n            out.template(_TOOLS_FOOTER)",
        "out.template(schemas)\n            out.template(_TOOLS_FOOTER)",
    ),
    _chat(
        "chat_glm_call_value_as_template",
        GLM5_CHAT_PY,
        "out.caller(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))",
        "out.template(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))",
    ),
    _chat(
        "chat_glm_assistant_answer_as_template",
        GLM5_CHAT_PY,
        "out.caller(content.strip())",
        "out.template(content.strip())",
    ),
    _chat(
        "chat_glm_text_parts_as_template",
        GLM5_CHAT_PY,
        "out.caller(_visible_text([item]))",
        "out.template(_visible_text([item]))",
    ),
    _chat(
        "chat_forced_tool_name_as_template",
        "ds4mlx/engine/chat/base.py",
        "out.caller(name)",
        "out.template(name)",
    ),
)

MUTATIONS = MUTATIONS + GUARD_MUTATIONS

# --- a fresh run (issue 37's follow-up): 52 plausible bugs chosen from the code alone, none of
# them in the lists above or named in the issue, each run against its area's tests.
FRESH_SERVER = (
    "tests/server/test_access.py",
    "tests/server/test_bad_requests.py",
    "tests/server/test_server_guards.py",
    "tests/server/test_request_mapping.py",
    "tests/server/test_choices.py",
    "tests/server/test_request_edges.py",
)
FRESH_AGENT = (
    "tests/agent/test_agent_guards.py",
    "tests/agent/test_agent_tool_edges.py",
    "tests/agent/test_agent_safety.py",
    "tests/agent/test_agent_security.py",
    "tests/agent/test_agent_tools.py",
    "tests/agent/test_agent_conversations.py",
    "tests/agent/test_agent_prompt_input.py",
    "tests/robustness/test_agent_paths.py",
)
FRESH_KV = (
    "tests/engine/test_kv_snapshots.py",
    "tests/engine/test_prompt_cache.py",
    "tests/engine/test_prompt_cache_order.py",
    "tests/agent/test_agent_kv_state.py",
)
FRESH_SAMPLER = (*SAMPLER, "tests/server/test_penalties_cached.py")
FRESH_LOOKUP = ("tests/speculation/test_lookup.py",)
FRESH_DSPARK = ("tests/speculation/test_dspark_layout.py", "tests/speculation/test_dspark.py")
FRESH_GGUF = (*GGUF, *GGUF_EDGES, "tests/gguf/test_gguf_reader.py", "tests/gguf/test_gguf_fuzz.py")
FRESH_CONSTRAINED = ("tests/engine/test_constraints.py",)
GENERATION_PY = "ds4mlx/server/generation.py"
OPENAI_CHAT_PY = "ds4mlx/server/openai_chat.py"
CHOICES_PY = "ds4mlx/server/choices.py"
LOOKUP_PY = "ds4mlx/speculation/lookup.py"
DSPARK_LAYOUT_PY = "ds4mlx/speculation/dspark_layout.py"
SNAPSHOT_FILE_PY = "ds4mlx/engine/kvcache/snapshot_file.py"
CHECKPOINTS_PY = "ds4mlx/agent/checkpoints.py"
WORKSPACE_PY = "ds4mlx/agent/workspace.py"
PROMPT_INPUT_PY = "ds4mlx/agent/prompt_input.py"
CONVERSATIONS_PY = "ds4mlx/agent/conversations.py"


def _fresh(area: tuple[str, ...], name: str, file: str, old: str, new: str) -> Mutation:
    return Mutation(name, file, old, new, area)


FRESH_MUTATIONS: tuple[Mutation, ...] = (
    # --- server: access, request validation, n > 1, logprobs, streaming, the queue
    _fresh(
        FRESH_SERVER,
        "server_models_listing_open",
        "ds4mlx/server/access.py",
        'OPEN_PATHS = frozenset({"/health", "/v1/health"})',
        'OPEN_PATHS = frozenset({"/health", "/v1/health", "/v1/models"})',
    ),
    _fresh(
        FRESH_SERVER,
        "server_required_with_empty_tools",
        GENERATION_PY,
        'if choice == "required" and not tools:',
        'if choice == "required" and tools is None:',
    ),
    _fresh(
        FRESH_SERVER,
        "server_top_p_zero_accepted",
        GENERATION_PY,
        "top_p: float | None = Field(None, gt=0.0, le=1.0)",
        "top_p: float | None = Field(None, ge=0.0, le=1.0)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_min_p_one_accepted",
        GENERATION_PY,
        "min_p: float | None = Field(None, ge=0.0, lt=1.0)",
        "min_p: float | None = Field(None, ge=0.0, le=1.0)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_unsigned_random_seed_kept",
        GENERATION_PY,
        "if self.seed in (-1, 0xFFFFFFFF):",
        "if self.seed == -1:",
    ),
    _fresh(
        FRESH_SERVER,
        "server_adaptive_thinking_off",
        GENERATION_PY,
        'return control.type != "disabled"',
        'return control.type == "enabled"',
    ),
    _fresh(
        FRESH_SERVER,
        "server_content_part_without_text",
        GENERATION_PY,
        "if part.type not in text_types or part.text is None:",
        "if part.type not in text_types:",
    ),
    _fresh(
        FRESH_SERVER,
        "server_n_zero_accepted",
        OPENAI_CHAT_PY,
        "n: int = Field(1, ge=1)",
        "n: int = Field(1, ge=0)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_top_logprobs_without_logprobs",
        OPENAI_CHAT_PY,
        "if request.top_logprobs is not None and not request.logprobs:",
        "if request.top_logprobs is not None and request.logprobs is False:",
    ),
    _fresh(
        FRESH_SERVER,
        "server_logprobs_default_one_alternative",
        OPENAI_CHAT_PY,
        "(request.top_logprobs or 0) if request.logprobs else None",
        "(request.top_logprobs or 1) if request.logprobs else None",
    ),
    _fresh(
        FRESH_SERVER,
        "server_max_tokens_over_max_completion_tokens",
        OPENAI_CHAT_PY,
        "request.max_completion_tokens or request.max_tokens",
        "request.max_tokens or request.max_completion_tokens",
    ),
    _fresh(
        FRESH_SERVER,
        "server_stream_usage_unasked",
        OPENAI_CHAT_PY,
        "bool(request.stream_options and request.stream_options.include_usage)",
        "bool(request.stream_options)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_stream_last_logprobs_dropped",
        OPENAI_CHAT_PY,
        "        if self.pending_logprobs:\n            frames.append(",
        "        if not self.pending_logprobs:\n            frames.append(",
    ),
    _fresh(
        FRESH_SERVER,
        "server_choices_share_one_seed",
        CHOICES_PY,
        "(seed + index) % SEED_MODULUS",
        "seed % SEED_MODULUS",
    ),
    _fresh(
        FRESH_SERVER,
        "server_choices_usage_counts_the_first",
        CHOICES_PY,
        "completion_tokens=sum(f.completion_tokens for f in finished)",
        "completion_tokens=first.completion_tokens",
    ),
    _fresh(
        (*FRESH_SERVER, "tests/server/test_batched_sessions.py"),
        "server_queue_admits_one_too_many",
        "ds4mlx/server/queue.py",
        "while self._waiting and len(admitted) < room:",
        "while self._waiting and len(admitted) <= room:",
    ),
    # --- constrained output and tool calls
    _fresh(
        FRESH_CONSTRAINED,
        "constrained_duplicate_tool_names",
        "ds4mlx/engine/chat/call_grammar.py",
        "if not all(names) or len(set(names)) != len(names):",
        "if not all(names):",
    ),
    _fresh(
        FRESH_CONSTRAINED,
        "constrained_forced_call_arguments_free",
        "ds4mlx/engine/chat/call_grammar.py",
        "bound = forced or is_strict(tool)",
        "bound = is_strict(tool)",
    ),
    _fresh(
        FRESH_CONSTRAINED,
        "constrained_glm_parallel_flag_inverted",
        "ds4mlx/engine/chat/glm5.py",
        'more_calls = " more_calls" if parallel else ""',
        'more_calls = " more_calls" if not parallel else ""',
    ),
    # --- agent: confinement, undo, history files
    _fresh(
        FRESH_AGENT,
        "agent_name_of_255_bytes_refused",
        WORKSPACE_PY,
        "> MAX_NAME_BYTES for part in parts",
        ">= MAX_NAME_BYTES for part in parts",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_gitignore_negation_ignored",
        WORKSPACE_PY,
        "if result.include is not None:\n                ignored = result.include",
        "if result.include:\n                ignored = True",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_prefix_rule_covers_home",
        "ds4mlx/agent/permissions.py",
        r'_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\n\r\\*?\[\]!#~]")',
        r'_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\n\r\\*?\[\]!#]")',
    ),
    _fresh(
        FRESH_AGENT,
        "agent_undo_takes_the_oldest_prompt",
        CHECKPOINTS_PY,
        "checkpoint = self.stack.pop()",
        "checkpoint = self.stack.pop(0)",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_bash_deletion_not_reported",
        CHECKPOINTS_PY,
        "if path not in checkpoint.originals and after.get(path) != state",
        "if path not in checkpoint.originals and after.get(path, state) != state",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_history_file_readable_by_others",
        PROMPT_INPUT_PY,
        "os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)",
        "os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_history_keeps_the_oldest",
        PROMPT_INPUT_PY,
        "del self.entries[:-MAX_HISTORY]",
        "del self.entries[MAX_HISTORY:]",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_fresh_conversation_temporary_removed",
        CONVERSATIONS_PY,
        "if now - path.stat().st_mtime > _STALE_TEMPORARY_SECONDS:",
        "if now - path.stat().st_mtime < _STALE_TEMPORARY_SECONDS:",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_continue_ignores_the_workspace",
        CONVERSATIONS_PY,
        "if not saved.problem and saved.workspace == workspace:",
        "if not saved.problem:",
    ),
    # --- disk KV files
    _fresh(
        FRESH_KV,
        "kvfile_trailing_bytes_accepted",
        SNAPSHOT_FILE_PY,
        "if 8 + length + end != size:",
        "if 8 + length + end > size:",
    ),
    _fresh(
        FRESH_KV,
        "kvfile_missing_version_accepted",
        SNAPSHOT_FILE_PY,
        'if metadata.get("version") != str(FORMAT_VERSION):',
        'if metadata.get("version", str(FORMAT_VERSION)) != str(FORMAT_VERSION):',
    ),
    _fresh(
        FRESH_KV,
        "kvfile_fingerprint_ignores_weights_dtype",
        SNAPSHOT_FILE_PY,
        "{model.gguf.arch} {model.weights_dtype} ",
        "{model.gguf.arch} ",
    ),
    _fresh(
        FRESH_KV,
        "kvfile_checksum_skips_the_tokens",
        SNAPSHOT_FILE_PY,
        'json.dumps({k: v for k, v in metadata.items() if k != "checksum"}, sort_keys=True)',
        'json.dumps({k: v for k, v in metadata.items() if k not in ("checksum", "tokens")}, '
        "sort_keys=True)",
    ),
    # --- sampling
    _fresh(
        FRESH_SAMPLER,
        "sampling_penalty_window_from_the_start",
        SAMPLING_PY,
        "mx.array([*recent, *draft[:i]][-o.repeat_last_n :], dtype=mx.int32)",
        "mx.array([*recent, *draft[:i]][: o.repeat_last_n], dtype=mx.int32)",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_duplicate_logit_bias_ids",
        SAMPLING_PY,
        "if any(token < 0 for token in ids) or len(set(ids)) != len(ids):",
        "if any(token < 0 for token in ids):",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_logprobs_one_alternative_short",
        SAMPLING_PY,
        "best = mx.argpartition(-logprobs, top - 1, axis=-1)[:, :top]",
        "best = mx.argpartition(-logprobs, top - 1, axis=-1)[:, : top - 1]",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_masked_alternatives_listed",
        SAMPLING_PY,
        'top = tuple((int(i), float(v)) for i, v in pairs if v != float("-inf"))',
        "top = tuple((int(i), float(v)) for i, v in pairs)",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_cached_prompt_not_penalised",
        GENERATE_PY,
        "    sampler.record(session.tokens[-sampler.options.repeat_last_n :])\n",
        "",
    ),
    # --- lookup drafting
    _fresh(
        FRESH_LOOKUP,
        "lookup_shortest_ngram_dropped",
        LOOKUP_PY,
        "self.sizes = range(max_n, min_n - 1, -1)",
        "self.sizes = range(max_n, min_n, -1)",
    ),
    _fresh(
        FRESH_LOOKUP,
        "lookup_keeps_the_first_occurrence",
        LOOKUP_PY,
        "self._next[tuple(self.tokens[end - n :])] = end",
        "self._next.setdefault(tuple(self.tokens[end - n :]), end)",
    ),
    _fresh(
        FRESH_LOOKUP,
        "lookup_draft_past_its_cap",
        LOOKUP_PY,
        "n = min(max_tokens, self.max_draft)",
        "n = max(max_tokens, self.max_draft)",
    ),
    _fresh(
        FRESH_LOOKUP,
        "lookup_strong_match_strict",
        LOOKUP_PY,
        "self.lookup.last_match >= self.min_match",
        "self.lookup.last_match > self.min_match",
    ),
    # --- DSpark files
    _fresh(
        FRESH_DSPARK,
        "dspark_d2t_may_name_the_vocabulary_size",
        DSPARK_LAYOUT_PY,
        "d2t.max() >= args.vocab_size",
        "d2t.max() > args.vocab_size",
    ),
    _fresh(
        FRESH_DSPARK,
        "dspark_target_layers_not_shifted",
        DSPARK_LAYOUT_PY,
        "int(t) - 1 if int(t) > 0 else EMBEDDING_TAP",
        "int(t) if int(t) > 0 else EMBEDDING_TAP",
    ),
    _fresh(
        FRESH_DSPARK,
        "dspark_one_token_block_without_anchor",
        DSPARK_LAYOUT_PY,
        "if not config.sample_from_anchor and config.block_size < 2:",
        "if not config.sample_from_anchor and config.block_size < 1:",
    ),
    # --- the speculation scheduler's cost rule
    _fresh(
        SCHEDULER,
        "scheduler_cost_pause_never_grows",
        SCHEDULER_PY,
        "costs.next_pause = min(2 * costs.next_pause, MAX_COST_PAUSE)",
        "costs.next_pause = min(costs.next_pause, MAX_COST_PAUSE)",
    ),
    _fresh(
        SCHEDULER,
        "scheduler_cost_margin_subtracted",
        SCHEDULER_PY,
        "if drafted.per_token <= plain.per_token * (1 + COST_MARGIN):",
        "if drafted.per_token <= plain.per_token * (1 - COST_MARGIN):",
    ),
    _fresh(
        SCHEDULER,
        "scheduler_outlier_not_clipped",
        SCHEDULER_PY,
        "seconds = min(seconds, COST_OUTLIER * self.seconds / self.weight)",
        "seconds = max(seconds, COST_OUTLIER * self.seconds / self.weight)",
    ),
    _fresh(
        SCHEDULER,
        "scheduler_stale_plain_cost_trusted",
        SCHEDULER_PY,
        "if not self._plain_measured:",
        "if self._plain_measured:",
    ),
    # --- GGUF validation
    _fresh(
        FRESH_GGUF,
        "gguf_name_of_the_limit_refused",
        VALIDATE_PY,
        "if length > MAX_NAME_BYTES:",
        "if length >= MAX_NAME_BYTES:",
    ),
    _fresh(
        FRESH_GGUF,
        "gguf_tensor_offset_aligned_to_32",
        VALIDATE_PY,
        "if info.relative_offset % alignment:",
        "if info.relative_offset % 32:",
    ),
    _fresh(
        FRESH_GGUF,
        "gguf_arrays_one_level_deeper",
        VALIDATE_PY,
        "if depth >= MAX_ARRAY_NESTING:",
        "if depth > MAX_ARRAY_NESTING:",
    ),
    _fresh(
        FRESH_GGUF,
        "gguf_reserved_kv_count_key_accepted",
        VALIDATE_PY,
        'RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})',
        'RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count"})',
    ),
)

MUTATIONS = MUTATIONS + FRESH_MUTATIONS


@dataclass
class Outcome:
    mutation: Mutation
    status: str  # caught | SURVIVED | STALE | ERROR | TIMEOUT
    failed: list[str]
    seconds: float
    tail: str = ""


def pytest_command(tests: Sequence[str]) -> list[str]:
    # -x: the first failing test is enough to call the mutation caught.
    return [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", *tests]


def failed_tests(output: str) -> list[str]:
    return re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)


def run_tests(tests: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """pytest's exit status (None on timeout) and its output."""
    try:
        done = subprocess.run(
            pytest_command(tests), cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out
    return done.returncode, done.stdout + done.stderr


def stale(mutation: Mutation) -> str | None:
    text = (ROOT / mutation.file).read_text()
    count = text.count(mutation.old)
    if count != 1:
        return f"old text found {count} times in {mutation.file} (expected once)"
    return None


def apply_and_test(mutation: Mutation, timeout: float) -> Outcome:
    path = ROOT / mutation.file
    original = path.read_bytes()
    times = os.stat(path)
    start = time.perf_counter()
    try:
        path.write_bytes(original.replace(mutation.old.encode(), mutation.new.encode(), 1))
        # A distinct mtime per mutation (seconds ahead, by its name): a cached .pyc of
        # another version of the file never matches, even one of the same size.
        bumped = times.st_mtime_ns + (zlib.crc32(mutation.name.encode()) % 10**6 + 1) * 10**9
        os.utime(path, ns=(bumped, bumped))
        code, output = run_tests(mutation.tests, timeout)
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    seconds = time.perf_counter() - start
    if code is None:
        return Outcome(mutation, "TIMEOUT", [], seconds, output[-2000:])
    if code == 0:
        return Outcome(mutation, "SURVIVED", [], seconds)
    if code == 1:
        return Outcome(mutation, "caught", failed_tests(output), seconds)
    return Outcome(mutation, "ERROR", [], seconds, output[-2000:])


def baseline(mutations: Sequence[Mutation], timeout: float) -> bool:
    """Each test selection passes on the unmutated tree (else every mutation looks caught)."""
    ok = True
    for tests in dict.fromkeys(m.tests for m in mutations):
        code, output = run_tests(tests, timeout)
        print(f"baseline {' '.join(tests)}: {'ok' if code == 0 else 'FAILS'}", flush=True)
        if code != 0:
            print(output[-3000:])
            ok = False
    return ok


def report(outcomes: Sequence[Outcome]) -> str:
    lines = ["| mutation | file | status | caught by |", "|---|---|---|---|"]
    for o in outcomes:
        caught_by = ", ".join(o.failed) or "-"
        lines.append(f"| {o.mutation.name} | {o.mutation.file} | {o.status} | {caught_by} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmutated run of each test selection"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds per test run; a run past it counts as TIMEOUT",
    )
    parser.add_argument("--report", type=Path, help="write a markdown table of the outcomes")
    args = parser.parse_args(argv)

    mutations = list(MUTATIONS)
    if args.only:
        unknown = set(args.only) - {m.name for m in mutations}
        if unknown:
            parser.error(f"unknown mutations: {', '.join(sorted(unknown))}")
        mutations = [m for m in mutations if m.name in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.name:50} {m.file:34} {stale(m) or 'ok'}")
        return 0

    # SIGTERM and SIGHUP unwind like Ctrl-C, so the finally blocks restore the files.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)

    outcomes: list[Outcome] = []
    runnable = []
    for m in mutations:
        problem = stale(m)
        if problem:
            outcomes.append(Outcome(m, "STALE", [], 0.0, problem))
            print(f"STALE    {m.name}: {problem}", flush=True)
        else:
            runnable.append(m)
    if runnable and not args.no_baseline and not baseline(runnable, args.timeout):
        print("the unmutated tests fail; fix that first", file=sys.stderr)
        return 2
    for m in runnable:
        outcome = apply_and_test(m, args.timeout)
        outcomes.append(outcome)
        print(
            f"{outcome.status:8} {m.name} ({outcome.seconds:.0f} s) {', '.join(outcome.failed)}",
            flush=True,
        )
        if outcome.tail:
            print(outcome.tail)

    table = report(outcomes)
    print(table)
    if args.report:
        args.report.write_text(table)
    caught = sum(o.status == "caught" for o in outcomes)
    print(f"{caught} of {len(outcomes)} mutations caught")
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
