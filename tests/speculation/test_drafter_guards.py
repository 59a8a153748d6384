"""The refusals and small contracts of the drafting layer, each at its edge: the speculation
settings a command line builds, the drafter files checked from their headers before a model
loads, drafters fed rows that do not match their tokens, and the counters a report reads."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.generation import SamplingOptions, TokenEvent, generate
from ds4mlx.gguf import GGUFError
from ds4mlx.speculation import DrafterKind, SpeculationConfig, check_drafter_files
from ds4mlx.speculation.config import DEFAULT_MTP_MARGIN
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.lookup import LookupDrafter, LookupExtension, NgramIndex
from ds4mlx.speculation.loop import SpeculativeStats
from ds4mlx.speculation.nextn import NextNDrafter
from ds4mlx.speculation.probe import ProbeStats, greedy_continuation, probe_greedy, rows_between
from ds4mlx.speculation.support_gguf import FULL_HASH_BYTES, HASH_WINDOW_BYTES, _windows

import mlx.core as mx
import pytest

from .conftest import ScriptedDrafter

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TARGET = ASSETS / "ds4-tiny.gguf"
DSPARK = ASSETS / "ds4-tiny-dspark.gguf"
MTP = ASSETS / "ds4-tiny-mtp.gguf"
GLM = ASSETS / "glm-tiny.gguf"


# --- SpeculationConfig: every bound, on both sides ------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": DrafterKind.DSPARK}, "--dspark needs the support file"),
        ({"kind": DrafterKind.DSPARK, "support_path": DSPARK, "mtp_draft": 2}, "drop --mtp-draft"),
        ({"kind": DrafterKind.MTP}, "--mtp-draft needs the MTP file"),
        ({"mtp_draft": 0}, "--mtp-draft must be >= 1, got 0"),
        ({"lookup": -1}, "--lookup must be >= 0, got -1"),
        ({"lookup_ngram": (0, 2)}, "got 0..2"),
        ({"lookup_ngram": (3, 2)}, "got 3..2"),
        ({"confidence": -0.01}, "--dspark-confidence must be in [0, 1], got -0.01"),
        ({"confidence": 1.01}, "--dspark-confidence must be in [0, 1], got 1.01"),
    ],
)
def test_settings_out_of_range_are_refused_by_flag(settings, message):
    with pytest.raises(ValueError) as refused:
        SpeculationConfig(**settings)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "settings",
    [
        {"kind": DrafterKind.DSPARK, "support_path": DSPARK, "mtp_draft": 1},
        {"kind": DrafterKind.MTP, "support_path": MTP, "mtp_draft": 3},
        {"mtp_draft": 1, "lookup": 0, "confidence": 0.0},
        {"lookup": 1, "lookup_ngram": (1, 1), "confidence": 1.0},
        {"lookup_ngram": (2, 2)},
    ],
)
def test_settings_at_their_bounds_are_accepted(settings):
    SpeculationConfig(**settings)


# --- check_drafter_files: what is refused before the model loads --------------------------


def test_no_drafter_opens_no_file(tmp_path):
    # Not even the model: nothing to check without a drafter.
    check_drafter_files(SpeculationConfig(), tmp_path / "missing.gguf")


def test_the_model_s_own_draft_block_must_exist():
    with pytest.raises(GGUFError) as refused:
        check_drafter_files(SpeculationConfig(DrafterKind.NEXTN), TARGET, nextn_flag="--mtp")
    assert "--mtp needs the MTP draft block inside the model" in str(refused.value)
    assert "(deepseek4) has none" in str(refused.value)
    check_drafter_files(SpeculationConfig(DrafterKind.NEXTN), GLM)


def test_a_missing_support_file_is_named():
    config = SpeculationConfig(DrafterKind.DSPARK, ASSETS / "no-such-dspark.gguf")
    with pytest.raises(GGUFError, match=r"--mtp-model .*no-such-dspark.gguf: no such file"):
        check_drafter_files(config, TARGET)


def test_a_support_file_without_a_path_is_refused_naming_its_flag():
    config = SpeculationConfig(DrafterKind.MTP, MTP, mtp_draft=2)
    object.__setattr__(config, "support_path", None)  # as a caller that skipped the checks
    with pytest.raises(GGUFError, match=r"--mtp-draft 2 needs its drafter file"):
        check_drafter_files(config, TARGET)


def test_a_folder_given_as_the_support_file_is_no_such_file(tmp_path):
    config = SpeculationConfig(DrafterKind.DSPARK, tmp_path)
    with pytest.raises(GGUFError, match=r"--mtp-model .*: no such file"):
        check_drafter_files(config, TARGET)


@pytest.mark.parametrize(
    ("kind", "flag", "expected"),
    [
        (
            DrafterKind.DSPARK,
            "--dspark",
            "ds4's DSpark support file ('deepseek4-dspark'), llama.cpp's DSpark drafter ('dflash')",
        ),
        (
            DrafterKind.MTP,
            "--mtp-draft 1",
            "ds4's MTP support file ('deepseek4-mtp'), ds4's MTP support file ('deepseek4')",
        ),
    ],
)
def test_a_model_file_given_as_the_drafter_is_refused(kind, flag, expected):
    with pytest.raises(GGUFError) as refused:
        check_drafter_files(SpeculationConfig(kind, GLM), TARGET)
    assert f"is a 'glm5-next' file, not a drafter for {flag}: expected {expected}" in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("kind", "support"), [(DrafterKind.DSPARK, DSPARK), (DrafterKind.MTP, MTP)]
)
def test_deepseek_drafters_refuse_another_target(kind, support):
    with pytest.raises(
        GGUFError, match=r"drafts for DeepSeek-V4 \(deepseek4\) models; .* glm5-next"
    ):
        check_drafter_files(SpeculationConfig(kind, support), GLM)
    check_drafter_files(SpeculationConfig(kind, support), TARGET)


# --- drafters fed rows that do not match their tokens ---------------------------------------


@pytest.fixture(scope="module")
def ds4_tiny():
    return ds4mlx.load_model(TARGET)


def _rows(model, tokens: list[int], capture: tuple[int, ...]) -> TargetRows:
    out = model.new_session().feed_hidden(tokens, capture)
    return rows_between(out, 0, len(tokens))


@pytest.mark.parametrize("kind", [DrafterKind.DSPARK, DrafterKind.MTP])
def test_rows_and_tokens_of_different_lengths_are_refused(ds4_tiny, kind):
    support = DSPARK if kind is DrafterKind.DSPARK else MTP
    drafter = ds4mlx.speculation.load_drafter(SpeculationConfig(kind, support), ds4_tiny)
    rows = _rows(ds4_tiny, [5, 6, 7], drafter.capture_layers)
    with pytest.raises(ValueError, match="2 tokens but 3 target rows"):
        drafter.observe([5, 6], 8, rows)


def test_mtp_is_loaded_with_the_configured_draft_length_and_margin(ds4_tiny):
    config = SpeculationConfig(DrafterKind.MTP, MTP, mtp_draft=3, mtp_margin=1.5)
    drafter = ds4mlx.speculation.load_drafter(config, ds4_tiny)
    assert (drafter.name, drafter.max_draft, drafter.margin) == ("mtp", 3, 1.5)


@pytest.mark.parametrize("lookup", [0, 3])
def test_each_request_tells_mtp_whether_it_is_greedy(ds4_tiny, lookup):
    """The loop's prefill tells the drafter (behind a lookup too) whether the request decodes
    greedily: without a margin given, MTP then drafts without one, and a sampled request
    takes ds4's."""
    config = SpeculationConfig(DrafterKind.MTP, MTP, mtp_draft=3, lookup=lookup)
    drafter = ds4mlx.speculation.load_drafter(config, ds4_tiny)
    mtp_drafter = drafter.learned if lookup else drafter
    prompt = ds4_tiny.tokenizer.encode("def add(a, b):")
    for temperature, margin in ((0.0, 0.0), (0.8, DEFAULT_MTP_MARGIN), (0.0, 0.0)):
        sampling = SamplingOptions(temperature=temperature, seed=1)
        events = generate(
            ds4_tiny.new_session(), prompt, 4, sampling, drafter=drafter, config=config
        )
        assert len([e for e in events if isinstance(e, TokenEvent)]) == 4
        assert mtp_drafter._request_margin == margin


def test_a_lookup_behind_dspark_drafts_a_copy_of_three_tokens_in_its_place(ds4_tiny):
    config = SpeculationConfig(DrafterKind.DSPARK, DSPARK, lookup=4)
    drafter = ds4mlx.speculation.load_drafter(config, ds4_tiny)
    assert (drafter.name, drafter.min_match, drafter.max_draft) == ("dspark+lookup", 3, 5)


def test_target_rows_take_the_first_rows_of_every_field():
    rows = TargetRows(
        3,
        {0: mx.arange(8).reshape(4, 2), 2: mx.arange(8, 16).reshape(4, 2)},
        mx.arange(16).reshape(4, 2, 2),
        mx.arange(4).reshape(4, 1),
    )
    first = rows.take(2)
    assert first.pos0 == 3 and first.n_rows == 2
    assert {i: h.tolist() for i, h in first.layers.items()} == {
        0: [[0, 1], [2, 3]],
        2: [[8, 9], [10, 11]],
    }
    assert first.head_input.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert first.final_hidden.tolist() == [[0], [1]]


def test_dspark_drafts_nothing_before_it_observes(ds4_tiny):
    drafter = ds4mlx.speculation.load_drafter(
        SpeculationConfig(DrafterKind.DSPARK, DSPARK), ds4_tiny
    )
    with pytest.raises(ValueError, match="nothing observed yet"):
        drafter.block()


def test_glm_nextn_refuses_mismatched_rows_and_a_model_without_its_block():
    glm = ds4mlx.load_model(GLM)
    drafter = NextNDrafter(glm.network)
    rows = _rows(glm, [5, 6, 7], ())
    with pytest.raises(ValueError, match="2 tokens but 3 target rows"):
        drafter.observe([5, 6], 8, rows)
    network = glm.network
    block, network.mtp = network.mtp, None
    try:
        with pytest.raises(ValueError, match="the model has no NextN"):
            NextNDrafter(network)
    finally:
        network.mtp = block


# --- counters --------------------------------------------------------------------------------


def test_tau_and_acceptance_count_drafted_passes_only():
    stats = SpeculativeStats()
    assert stats.tau == 0.0 and stats.acceptance_rate == 0.0
    stats.drafted_passes, stats.drafted_tokens, stats.accepted_tokens = 4, 20, 6
    assert stats.tau == pytest.approx(2.5)  # (6 accepted + 4 target tokens) / 4 passes
    assert stats.acceptance_rate == pytest.approx(0.3)


def test_probe_stats_add_every_counter():
    total = ProbeStats(cycles=1, drafted=5, accepted=2)
    total.add(ProbeStats(cycles=3, drafted=7, accepted=4))
    assert (total.cycles, total.drafted, total.accepted) == (4, 12, 6)
    assert total.acceptance_rate == pytest.approx(0.5)
    assert ProbeStats().acceptance_rate == 0.0


# --- prompt lookup behind a learned drafter --------------------------------------------------


def test_the_longest_ngram_the_history_holds_is_tried_first():
    index = NgramIndex(2, 3)
    # "1 2 3" was followed by 10; "2 3", more recently, by 11: the 3-gram wins.
    index.extend([1, 2, 3, 10, 9, 2, 3, 11, 1, 2])
    assert index.continuation(3, 2) == ([10, 9], 3)
    short = NgramIndex(2, 3)
    short.extend([1])  # too short a history for any n-gram: no match, no error
    assert short.continuation(1, 2) == ([], 0)


class _Learned:
    """A learned drafter's stand-in: records what it is told, proposes ``block``."""

    name = "learned"
    max_draft = 5
    capture_layers = (0,)
    window = 16

    def __init__(self, block: list[int] | None):
        self.block = block
        self.told: list[tuple[str, list[int], int]] = []

    def reset(self) -> None: ...

    def observe(self, tokens, next_token, rows) -> None:
        self.told.append(("rows", list(tokens), next_token))

    def observe_tokens(self, tokens, next_token) -> None:
        self.told.append(("tokens", list(tokens), next_token))

    def propose(self, max_tokens: int) -> Draft:
        return Draft(list(self.block or [])[:max_tokens])

    def propose_on_device(self, max_tokens: int) -> mx.array | None:
        if self.block is None:
            return None
        return mx.array(self.block[:max_tokens], dtype=mx.int32)


def test_the_extension_hands_tokens_alone_to_both_drafters_and_recalls_history():
    learned, lookup = _Learned([1]), LookupDrafter(4)
    both = LookupExtension(learned, lookup)
    assert both.window == 16
    both.recall([1, 2, 3, 1, 2])
    both.observe_tokens([3], 1)
    assert learned.told == [("tokens", [3], 1)]
    # The lookup saw the recalled history and the observed token: "1 2 3 1" came before.
    assert lookup.propose(2).tokens == [2, 3]


def test_a_learned_block_queued_on_the_device_is_extended_and_nothing_is_none():
    lookup = LookupDrafter(4)
    lookup.observe_tokens([4, 5, 6, 7, 4, 5], 6)  # a copy in progress: 6 -> 7 4 5 6
    both = LookupExtension(_Learned([7]), lookup)
    queued = both.propose_on_device(4)
    assert queued.tolist() == [7, 4, 5, 6]
    assert both.last_sources == [("learned", 1), ("lookup", 3)]
    silent = LookupExtension(_Learned(None), lookup)
    assert silent.propose_on_device(4) is None
    assert silent.last_sources == [("learned", 0), ("lookup", 0)]


def test_a_learned_drafter_without_device_drafts_is_extended_on_the_host():
    class HostOnly(_Learned):
        propose_on_device = None  # type: ignore[assignment]

    lookup = LookupDrafter(4)
    lookup.observe_tokens([4, 5, 6, 7, 4, 5], 6)
    both = LookupExtension(HostOnly([7, 4]), lookup)
    assert both.propose_on_device(4).tolist() == [7, 4, 5, 6]
    assert LookupExtension(HostOnly([]), LookupDrafter(4)).propose_on_device(4) is None


# --- the offline probe's confidence cut ------------------------------------------------------


@pytest.mark.parametrize(("threshold", "expected"), [(0.0, (2, 10, 10)), (0.6, (3, 9, 9))])
def test_the_probe_cuts_drafts_at_the_first_low_confidence(ds4_tiny, threshold, expected):
    prompt, continuation = [5, 17, 33, 2], [8, 90, 12, 12, 71, 3, 40, 61, 5, 9, 2, 7]
    # Confidences 1.0, 0.85, 0.70, 0.55, 0.40: a 0.6 threshold keeps three tokens a draft.
    drafter = ScriptedDrafter(prompt, continuation, vocab=100, error_rate=0.0, confidences=True)
    stats = probe_greedy(ds4_tiny, drafter, prompt, continuation, confidence_threshold=threshold)
    assert (stats.cycles, stats.drafted, stats.accepted) == expected


def test_the_probe_counts_no_cycle_for_a_draft_of_nothing(ds4_tiny):
    prompt, continuation = [5, 17, 33, 2], [8, 90, 12, 12, 71, 3]
    drafter = ScriptedDrafter(prompt, continuation, vocab=100, max_draft=0, error_rate=0.0)
    stats = probe_greedy(ds4_tiny, drafter, prompt, continuation)
    assert (stats.cycles, stats.drafted, stats.accepted) == (0, 0, 0)


def test_a_probe_confidence_equal_to_the_threshold_keeps_its_token(ds4_tiny):
    prompt, continuation = [5, 17, 33, 2], [8, 90, 12, 12, 71, 3, 40, 61, 5, 9, 2, 7]
    drafter = ScriptedDrafter(prompt, continuation, vocab=100, error_rate=0.0, confidences=True)
    # The third token's confidence, computed as the drafter computes it: kept, the fourth cut.
    threshold = 1.0 - 0.15 * 2
    stats = probe_greedy(ds4_tiny, drafter, prompt, continuation, confidence_threshold=threshold)
    assert (stats.cycles, stats.drafted, stats.accepted) == (3, 9, 9)


class RecordingDrafter(ScriptedDrafter):
    """Records what the probe asks for and what it commits."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[int] = []
        self.seen: list[tuple[int, list[int], int]] = []

    def observe(self, tokens, next_token, rows):
        self.seen.append((rows.pos0, list(tokens), next_token))
        super().observe(tokens, next_token, rows)

    def propose(self, max_tokens):
        self.asked.append(max_tokens)
        return super().propose(max_tokens)


def test_the_probe_asks_for_what_the_continuation_has_left_and_commits_as_the_loop(ds4_tiny):
    """Each draft may reach the continuation's last token, not past it; the probe then commits
    the accepted prefix plus the target's token, as the loop does: the drafter sees each row
    once, in order, with the token that follows."""
    prompt, continuation = [5, 17, 33], [8, 90, 12, 12, 71, 3]
    drafter = RecordingDrafter(prompt, continuation, vocab=100, max_draft=2, error_rate=0.0)
    stats = probe_greedy(ds4_tiny, drafter, prompt, continuation)
    assert drafter.asked == [5, 2]
    assert drafter.seen == [(0, [5, 17, 33], 8), (3, [8, 90, 12], 12)]
    assert (stats.cycles, stats.drafted, stats.accepted) == (2, 4, 4)


def test_a_rejected_probe_draft_commits_the_target_token_alone(ds4_tiny):
    prompt, continuation = [5, 17, 33], [8, 90, 12, 12]
    drafter = RecordingDrafter(prompt, continuation, vocab=100, max_draft=2, error_rate=1.0)
    stats = probe_greedy(ds4_tiny, drafter, prompt, continuation)
    assert drafter.asked == [3, 2, 1]
    assert drafter.seen == [(0, [5, 17, 33], 8), (3, [8], 90), (4, [90], 12), (5, [12], 12)]
    assert (stats.cycles, stats.drafted, stats.accepted) == (3, 5, 0)


def test_the_probe_s_continuation_is_plain_greedy_decoding(ds4_tiny):
    prompt = [5, 17, 33, 2]
    session = ds4_tiny.new_session()
    logits = session.feed(prompt)
    plain = []
    for _ in range(10):
        plain.append(int(logits[-1].argmax()))
        logits = session.feed([plain[-1]])
    assert greedy_continuation(ds4_tiny, prompt, 10) == plain
    assert greedy_continuation(ds4_tiny, prompt, 10, exact=False) == plain


def test_dspark_refuses_rows_that_skip_positions(ds4_tiny):
    drafter = ds4mlx.speculation.load_drafter(
        SpeculationConfig(DrafterKind.DSPARK, DSPARK), ds4_tiny
    )
    out = ds4_tiny.new_session().feed_hidden([5, 6, 7, 8, 9, 10], drafter.capture_layers)
    drafter.observe([5, 6, 7], 8, rows_between(out, 0, 3))
    with pytest.raises(ValueError, match="rows start at position 5, expected 3"):
        drafter.observe([10], 11, rows_between(out, 5, 6))


def test_a_tensor_of_exactly_one_mib_enters_the_identity_whole():
    assert _windows(FULL_HASH_BYTES) == [(0, FULL_HASH_BYTES)]
    past = FULL_HASH_BYTES + 1
    last = past - HASH_WINDOW_BYTES
    assert _windows(past) == [(last * i // 3, HASH_WINDOW_BYTES) for i in range(4)]
