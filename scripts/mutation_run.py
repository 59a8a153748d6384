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

# A device-side top-p as a refactor might write it, with the boundary flipped (``>`` where
# mlx-lm has ``>=``): a token whose mass above reaches top_p exactly is kept.
_TOP_P_FLIPPED = """ordered = mx.sort(logprobs, axis=-1)
            above = mx.cumsum(mx.exp(ordered), axis=-1, reverse=True, inclusive=False)
            total = above[..., :1] + mx.exp(ordered[..., :1])
            dropped = (above > o.top_p * total).sum(axis=-1, keepdims=True)
            cut = mx.take_along_axis(ordered, dropped, axis=-1)
            logprobs = mx.where(logprobs < cut, float("-inf"), logprobs)"""
# A device-side top-k as a threshold on the k-th largest logit: every token tied with it stays.
_TOP_K_TIES = """kth = mx.sort(logprobs, axis=-1)[..., logprobs.shape[-1] - o.top_k, None]
            logprobs = mx.where(logprobs < kth, float("-inf"), logprobs)"""

MUTATIONS: tuple[Mutation, ...] = (
    # --- sampling ---------------------------------------------------------------------------
    Mutation("min_p_never_applied", SAMPLING_PY, "if o.min_p > 0.0:", "if o.min_p > 1.0:", SAMPLER),
    Mutation(
        "top_p_boundary_flip",
        SAMPLING_PY,
        "logprobs = _sample_utils().apply_top_p(logprobs, o.top_p)",
        _TOP_P_FLIPPED,
        SAMPLER,
    ),
    Mutation(
        "top_k_keeps_ties",
        SAMPLING_PY,
        "logprobs = _sample_utils().apply_top_k(logprobs, o.top_k)",
        _TOP_K_TIES,
        SAMPLER,
    ),
    Mutation(
        "top_k_off_by_one",
        SAMPLING_PY,
        "apply_top_k(logprobs, o.top_k)",
        "apply_top_k(logprobs, o.top_k + 1)",
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
        "mx.random.categorical(row * (1 / self.options.temperature),",
        "mx.random.categorical(row,",
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
        "sampler.draw_on_device(sampler.penalized_on_device(logits[-1], window))",
        "sampler.draw_on_device(logits[-1])",
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
        "self.pooled[: pos // kpool]",
        "self.pooled[: -(-pos // kpool)]",
        SESSION,
    ),
    Mutation(
        "glm5_latent_one_long",
        "ds4mlx/models/sparse_mla.py",
        "self.latent[:pos]",
        "self.latent[: pos + 1]",
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
