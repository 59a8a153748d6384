"""The shared command-line flags (``cli.options``) parsed without a model: each value type's
bounds and messages, the defaults, and the dataclasses the flags become."""

from __future__ import annotations

import argparse
from pathlib import Path

from ds4mlx.cli import options
from ds4mlx.generation import DEFAULT_NGRAM, DrafterKind, GGUFError

import pytest


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(exit_on_error=False)
    options.add_model_flags(built)
    options.add_sampling_flags(built)
    options.add_speculation_flags(built)
    options.add_distributed_flags(built)
    return built


def parse(*flags: str) -> argparse.Namespace:
    return parser().parse_args(list(flags))


def refused(parse_one, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        parse_one(text)
    return str(caught.value)


def test_positive_integers():
    assert options._positive_int("1") == 1
    assert refused(options._positive_int, "x") == "expected a positive integer, got 'x'"
    assert refused(options._positive_int, "-3") == "expected a positive integer, got -3"


def test_non_negative_integers():
    assert options._non_negative_int("0") == 0
    assert refused(options._non_negative_int, "1.5") == "expected an integer, got '1.5'"
    assert refused(options._non_negative_int, "-1") == "must be >= 0, got -1"


@pytest.mark.parametrize(
    ("low_open", "text", "message"),
    [
        (False, "-0.5", "expected a value in [0.0, 1.0], got -0.5"),
        (False, "1.5", "expected a value in [0.0, 1.0], got 1.5"),
        (True, "0", "expected a value in (0.0, 1.0], got 0.0"),
        (True, "many", "expected a number, got 'many'"),
    ],
)
def test_numbers_outside_their_range_name_the_range(low_open, text, message):
    assert refused(options._float_in(0.0, 1.0, low_open=low_open), text) == message


def test_range_ends_are_inside_unless_open():
    closed = options._float_in(0.0, 1.0)
    assert (closed("0"), closed("1")) == (0.0, 1.0)
    assert options._float_in(0.0, 1.0, low_open=True)("1e-9") == 1e-9


@pytest.mark.parametrize(
    ("text", "pair"),
    [("5=-100", (5, -100.0)), ("0=100", (0, 100.0)), ("7=0.5", (7, 0.5))],
)
def test_logit_bias_pairs(text, pair):
    assert options._logit_bias(text) == pair


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5", "expected TOKEN_ID=BIAS, got '5'"),
        ("x=1", "expected TOKEN_ID=BIAS, got 'x=1'"),
        ("-1=2", "a token id >= 0 and a bias in [-100, 100], got '-1=2'"),
        ("5=100.5", "a token id >= 0 and a bias in [-100, 100], got '5=100.5'"),
        ("5=-100.5", "a token id >= 0 and a bias in [-100, 100], got '5=-100.5'"),
        ("5=nan", "a token id >= 0 and a bias in [-100, 100], got '5=nan'"),
    ],
)
def test_bad_logit_biases(text, message):
    assert message in refused(options._logit_bias, text)


@pytest.mark.parametrize(("text", "sizes"), [("3", (3, 3)), ("2..4", (2, 4)), ("1..1", (1, 1))])
def test_ngram_sizes(text, sizes):
    assert options._ngram_sizes(text) == sizes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "expected 1 <= MIN <= MAX, got '0'"),
        ("0..2", "expected 1 <= MIN <= MAX, got '0..2'"),
        ("4..2", "expected 1 <= MIN <= MAX, got '4..2'"),
        ("2..", "expected MIN..MAX (e.g. 2..4), got '2..'"),
        ("a..b", "expected MIN..MAX (e.g. 2..4), got 'a..b'"),
    ],
)
def test_bad_ngram_sizes(text, message):
    assert refused(options._ngram_sizes, text) == message


def test_cache_budget_flag():
    assert options._cache_budget("auto") is None
    assert options._cache_budget("3g") == 3.0
    assert "expected GiB" in refused(options._cache_budget, "lots")
    assert "positive number of GiB" in refused(options._cache_budget, "0")


def test_defaults():
    args = parse()
    assert (args.model, args.ctx, args.weights_dtype, args.verbose) == (
        str(options.DEFAULT_MODEL),
        4096,
        "auto",
        False,
    )
    assert options.DEFAULT_MODEL.name == "ds4-tiny.gguf"
    assert (args.ssd_stream, args.expert_cache, args.expert_hotlist) == (False, None, None)
    assert not args.save_expert_hotlist and not args.distributed
    assert (args.temp, args.top_p, args.top_k, args.min_p, args.seed) == (0.0, 1.0, 0, 0.0, None)
    assert (args.repeat_penalty, args.presence_penalty, args.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (args.repeat_last_n, args.logit_bias) == (64, [])
    assert (args.mtp_model, args.dspark, args.dspark_confidence, args.dspark_strict) == (
        None,
        False,
        None,
        False,
    )
    assert (args.quality, args.mtp_draft, args.mtp_margin, args.mtp, args.mtp_timing) == (
        False,
        1,
        None,
        False,
        False,
    )
    assert (args.lookup, args.lookup_ngram, args.mtp_exact_sampling) == (0, DEFAULT_NGRAM, False)


@pytest.mark.parametrize(
    "flags",
    [
        ["--temp", "100"],
        ["--min-p", "0.999"],
        ["--presence-penalty", "-2"],
        ["--frequency-penalty", "2"],
        ["--repeat-penalty", "10"],
        ["--mtp-margin", "1000"],
        ["--dspark-confidence", "1"],
        ["--top-p", "1"],
        # the lower ends
        ["--temp", "0"],
        ["--min-p", "0"],
        ["--presence-penalty", "2"],
        ["--frequency-penalty", "-2"],
        ["--mtp-margin", "0"],
        ["--dspark-confidence", "0"],
        ["--top-p", "0.001"],
        ["--repeat-penalty", "0.01"],
    ],
)
def test_sampling_values_at_the_end_of_their_range_are_taken(flags):
    parse(*flags)


@pytest.mark.parametrize(
    "flags",
    [
        ["--temp", "100.5"],
        ["--min-p", "1"],
        ["--presence-penalty", "-2.5"],
        ["--frequency-penalty", "2.5"],
        ["--repeat-penalty", "0"],
        ["--mtp-margin", "-1"],
        ["--dspark-confidence", "1.5"],
        ["--weights-dtype", "f16"],
        ["--ctx", "0"],
        ["--repeat-last-n", "0"],
        ["--lookup", "-1"],
        ["--top-p", "0"],
        ["--top-p", "1.01"],
        ["--temp", "-0.1"],
        ["--min-p", "-0.1"],
        ["--presence-penalty", "2.5"],
        ["--frequency-penalty", "-2.5"],
        ["--dspark-confidence", "-0.1"],
    ],
)
def test_sampling_values_past_their_range_are_refused(flags):
    with pytest.raises(argparse.ArgumentError):
        parse(*flags)


def test_sampling_options_carry_each_flag_to_its_field():
    args = parse(
        *("--temp", "0.7", "--top-p", "0.9", "--top-k", "40", "--min-p", "0.05"),
        *("--seed", "11", "--repeat-penalty", "1.1", "--presence-penalty", "0.3"),
        *("--frequency-penalty", "0.4", "--repeat-last-n", "32"),
        *("--logit-bias", "5=1", "--logit-bias", "9=-100", "--logit-bias", "5=2"),
    )
    sampling = options.sampling_options(args)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        0.7,
        0.9,
        40,
        0.05,
    )
    assert (sampling.seed, sampling.repeat_penalty, sampling.repeat_last_n) == (11, 1.1, 32)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.3, 0.4)
    assert sampling.logit_bias == ((5, 2.0), (9, -100.0))  # a token's last bias wins


def test_top_k_zero_is_off_and_negative_is_refused():
    assert options.sampling_options(parse("--top-k", "0")).top_k == 0
    with pytest.raises(SystemExit, match="error: --top-k must be >= 0, got -1"):
        options.sampling_options(parse("--top-k", "-1"))


def test_model_options_carry_the_expert_and_model_flags():
    args = parse(
        *("-m", "m.gguf", "-c", "128", "--weights-dtype", "native", "-v", "--distributed"),
        *("--ssd-stream", "--expert-cache", "2", "--expert-hotlist", "hot.json"),
        "--save-expert-hotlist",
    )
    model = options.model_options(args)
    assert (model.model, model.ctx, model.weights_dtype, model.verbose, model.distributed) == (
        "m.gguf",
        128,
        "native",
        True,
        True,
    )
    experts = model.experts
    assert (experts.stream, experts.cache_gib, experts.hotlist, experts.save_hotlist) == (
        True,
        2.0,
        Path("hot.json"),
        True,
    )
    no_rank_flag = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "distributed"})
    assert options.model_options(no_rank_flag).distributed is False


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        ([], DrafterKind.NONE),
        (["--mtp-draft", "1"], DrafterKind.NONE),
        (["--mtp-draft", "2", "--mtp-model", "d.gguf"], DrafterKind.MTP),
        (["--dspark", "--mtp-model", "d.gguf"], DrafterKind.DSPARK),
        (["--dspark-strict", "--mtp-model", "d.gguf"], DrafterKind.DSPARK),
        (["--dspark-confidence", "0", "--mtp-model", "d.gguf"], DrafterKind.DSPARK),
        (["--mtp"], DrafterKind.NEXTN),
        (["--mtp-timing"], DrafterKind.NEXTN),
        (["--mtp-timing", "--lookup", "3"], DrafterKind.NONE),
        (["--mtp", "--lookup", "3"], DrafterKind.NEXTN),
    ],
)
def test_the_drafter_the_flags_choose(flags, kind):
    assert options.speculation_config(parse(*flags)).kind is kind


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mtp-model", "d.gguf"], "--mtp-model given without --dspark or --mtp-draft N"),
        (["--mtp", "--mtp-model", "d.gguf"], "drop --mtp-model"),
        (["--mtp-timing", "--mtp-model", "d.gguf"], "drop --mtp-model"),
        (["--mtp-timing", "--lookup", "2", "--mtp-model", "d.gguf"], "--mtp-model given without"),
    ],
)
def test_contradicting_drafter_flags(flags, message):
    with pytest.raises(ValueError, match=message):
        options.speculation_config(parse(*flags))


def test_speculation_config_carries_each_flag_to_its_field():
    config = options.speculation_config(
        parse(
            *("--dspark-confidence", "0.25", "--mtp-model", "d.gguf", "--mtp-margin", "3"),
            *("--mtp-exact-sampling", "--mtp-timing", "--lookup", "4", "--lookup-ngram", "2..5"),
        )
    )
    assert (config.support_path, config.confidence, config.strict, config.mtp_draft) == (
        Path("d.gguf"),
        0.25,
        False,
        1,
    )
    assert (config.mtp_margin, config.exact_sampling, config.timing) == (3.0, True, True)
    assert (config.lookup, config.lookup_ngram) == (4, (2, 5))
    plain = options.speculation_config(parse())
    assert (plain.support_path, plain.confidence, plain.strict) == (None, 0.0, False)


@pytest.mark.parametrize(
    ("flags", "strict"),
    [
        (["--quality"], True),
        (["--dspark-strict", "--mtp-model", "d.gguf"], True),
        (["--dspark", "--mtp-model", "d.gguf"], False),
    ],
)
def test_quality_or_dspark_strict_decode_with_the_target_alone(flags, strict):
    assert options.speculation_config(parse(*flags)).strict is strict


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--mtp"], "--mtp"), (["--mtp-timing"], "--mtp-timing without another drafter")],
)
def test_check_drafter_names_the_flag_and_turns_file_errors_into_value_errors(
    monkeypatch, flags, named
):
    seen = []

    def check(speculation, model, flag):
        seen.append((speculation.kind, model, flag))
        raise GGUFError("no draft block")

    monkeypatch.setattr(options, "check_drafter_files", check)
    args = parse("-m", "target.gguf", *flags)
    with pytest.raises(ValueError, match="^no draft block$"):
        options.check_drafter(args, options.speculation_config(args))
    assert seen == [(DrafterKind.NEXTN, "target.gguf", named)]
