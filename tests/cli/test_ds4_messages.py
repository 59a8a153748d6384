"""``ds4``'s stderr lines built without a model: loading progress, the messages of each rank of
a distributed run, throughput and the speculation summary."""

from __future__ import annotations

import io

from ds4mlx.cli import main
from ds4mlx.cli.main import Messages, progress_line, rate, speculation_summary
from ds4mlx.cli.options import ModelOptions
from ds4mlx.experts import ExpertOptions
from ds4mlx.speculation.loop import SpeculativeStats
from ds4mlx.speculation.scheduler import SchedulerStats

import pytest


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_redrawn_in_place_on_a_terminal_and_ends_its_line_when_done(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(main.sys, "stderr", terminal)
    progress_line("loading 50.0%")
    progress_line("loading 100.0%")
    assert terminal.getvalue() == "\rloading 50.0%\rloading 100.0%\n"


def test_progress_is_one_line_per_update_in_a_file(capsys):
    progress_line("loading 50.0%")
    assert capsys.readouterr().err == "loading 50.0%\n"


def test_rank_zero_says_everything(capsys):
    say = Messages()
    say.info("loaded")
    say.progress("10.0%")
    say.error("broken")
    assert capsys.readouterr().err == "loaded\n10.0%\nds4: error: broken\n"


def test_other_ranks_say_only_their_errors_marked_with_their_rank(capsys):
    say = Messages(rank=2)
    say.info("loaded")
    say.progress("10.0%")
    say.error("broken")
    assert capsys.readouterr().err == "ds4: rank 2: error: broken\n"


@pytest.mark.parametrize(
    ("tps", "text"),
    [
        (0.0, "0.0 t/s"),
        (0.05, "0.0500 t/s (20 s/token)"),
        (0.0999, "0.0999 t/s (10 s/token)"),
        (0.1, "0.1 t/s"),
        (12.34, "12.3 t/s"),
    ],
)
def test_rates_under_a_tenth_of_a_token_a_second_also_give_seconds_per_token(tps, text):
    assert rate(tps) == text


def speculative_stats(by_drafter: dict[str, list[int]]) -> SpeculativeStats:
    return SpeculativeStats(
        drafted_passes=4,
        drafted_tokens=10,
        accepted_tokens=5,
        verify_passes=6,
        draft_seconds=0.012,
        verify_seconds=0.034,
        accept_seconds=0.005,
        scheduler=SchedulerStats(
            cycles=7,
            pauses=3,
            no_draft_pauses=2,
            paused_cycles=9,
            tail_cycles=1,
            cost_pauses=8,
            plain_advances=11,
        ),
        by_drafter=by_drafter,
    )


def test_the_speculation_line_counts_drafts_and_acceptance():
    stats = speculative_stats({"lookup": [4, 10, 5]})
    line = speculation_summary(stats, detailed=False)
    assert line == "ds4: speculation: 4 drafts, 10 drafted, 5 accepted (50%), tau 2.25"


def test_the_detailed_summary_adds_timing_and_one_line_per_drafter_of_several():
    one = speculation_summary(speculative_stats({"lookup": [4, 10, 5]}), detailed=True)
    assert "ds4: lookup:" not in one
    assert one.endswith(
        "\nds4: timing: draft 12 ms, verify 34 ms in 6 passes, accept 5 ms | scheduler: 7 "
        "cycles, 3 pauses (2 for missing drafts), 9 paused, 1 in the budget tail, 8 cost "
        "pauses (11 plain advances)"
    )
    two = speculation_summary(
        speculative_stats({"lookup": [1, 2, 1], "dspark": [3, 8, 4]}), detailed=True
    )
    assert (
        "\nds4: lookup: 1 drafts, 2 drafted, 1 accepted (50%)"
        "\nds4: dspark: 3 drafts, 8 drafted, 4 accepted (50%)\nds4: timing:" in two
    )


@pytest.mark.parametrize(
    "options",
    [
        ModelOptions("huge.gguf", 4096, "auto", experts=ExpertOptions(stream=True)),
        ModelOptions("huge.gguf", 4096, "auto", distributed=True),
    ],
)
def test_streamed_or_distributed_models_are_never_refused_as_too_large(options):
    assert main.refuse_oversized(options) is None


def refusal_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as caught:
        main.main(argv)
    assert caught.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("n", ["0", "-1"])
def test_no_tokens_to_generate_is_refused(capsys, n):
    assert f"--n-predict must be positive, got {n}" in refusal_of(["-p", "x", "-n", n], capsys)


def test_a_contradiction_between_flags_is_a_usage_error(capsys):
    err = refusal_of(["-p", "x", "--mtp-model", "d.gguf"], capsys)
    assert "ds4: error: --mtp-model given without --dspark or --mtp-draft N" in err


def test_without_a_prompt_outside_a_terminal_ds4_asks_for_one(capsys):
    assert "give a prompt: -p TEXT, -f FILE, or -p -" in refusal_of([], capsys)


def test_the_chat_of_a_terminal_is_not_distributed(capsys, monkeypatch):
    monkeypatch.setattr(main.sys, "stdin", Terminal())
    monkeypatch.setattr(main.sys, "stdout", Terminal())
    err = refusal_of(["--distributed"], capsys)
    assert "the chat runs in one process; give a prompt with --distributed" in err
