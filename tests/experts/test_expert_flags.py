"""--ssd-stream, --expert-cache, --expert-hotlist, --save-expert-hotlist: parsed once, shared by
ds4, ds4-agent and ds4-server."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.cli import agent, main, server
from ds4mlx.cli.options import model_options
from ds4mlx.experts import parse_cache_budget

import pytest


@pytest.mark.parametrize("build", [main.build_parser, agent.build_parser, server.build_parser])
def test_every_command_takes_the_expert_flags(build):
    argv = [
        "--ssd-stream",
        "--expert-cache",
        "1.5",
        "--expert-hotlist",
        "hot.json",
        "--save-expert-hotlist",
        "--verbose",
    ]
    if build is main.build_parser:
        argv += ["-p", "hi"]
    options = model_options(build().parse_args(argv))
    assert options.experts.stream and options.experts.cache_gib == 1.5
    assert options.experts.hotlist == Path("hot.json") and options.experts.save_hotlist
    assert options.verbose


def test_cache_budget_values():
    assert parse_cache_budget("auto") is None
    assert parse_cache_budget("0.25") == 0.25
    # An infinite budget (however spelled, or a number past float range) is no budget.
    for bad in ("-1", "0", "lots", "nan", "inf", "Infinity", "1e999G"):
        with pytest.raises(ValueError):
            parse_cache_budget(bad)


def test_contradicting_flags_are_errors():
    parser = main.build_parser()
    with pytest.raises(ValueError, match="--ssd-stream only"):
        model_options(parser.parse_args(["-p", "x", "--expert-cache", "2"]))
    with pytest.raises(ValueError, match="--ssd-stream only"):
        model_options(parser.parse_args(["-p", "x", "--expert-hotlist", "hot.json"]))
    with pytest.raises(ValueError, match="needs --expert-hotlist"):
        model_options(parser.parse_args(["-p", "x", "--ssd-stream", "--save-expert-hotlist"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["-p", "x", "--expert-cache", "many"])


@pytest.mark.parametrize("verbose", ["--verbose", "-v"])
def test_ds4_prints_expert_counters(capsys, verbose):
    assert (
        main.main(["-p", "hello", "-n", "3", "--ssd-stream", "--expert-cache", "0.005", verbose])
        == 0
    )
    err = capsys.readouterr().err
    assert "experts: streamed" in err and "hit)" in err
