"""``ds4 bench``'s command line without running a benchmark: the value types of its flags, the
usage errors, the configuration the flags become, and what the command prints, writes and
returns around the suite's report (``suite.run`` replaced by a stand-in)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.bench import suite
from ds4mlx.cli import bench

import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY = ASSETS / "ds4-tiny.gguf"


# ------------------------------------------------------------------ value types


@pytest.mark.parametrize(
    ("text", "sections"),
    [
        ("decode", ("decode",)),
        (" quality , decode ,", ("quality", "decode")),
        ("decode,speculation,experts,quality", suite.SECTIONS),
    ],
)
def test_sections_are_a_comma_separated_subset(text, sections):
    assert bench._sections(text) == sections


@pytest.mark.parametrize(
    ("text", "named"),
    [("", "unknown section(s) (none);"), (" , ", "(none)"), ("decode,speed", "section(s) speed;")],
)
def test_unknown_or_no_sections_are_refused_with_the_known_ones(text, named):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        bench._sections(text)
    assert named in str(refused.value)
    assert str(refused.value).endswith("known: decode, speculation, experts, quality")


@pytest.mark.parametrize(("text", "lengths"), [("128,512", (128, 512)), ("1", (1,))])
def test_contexts_are_positive_lengths(text, lengths):
    assert bench._contexts(text) == lengths


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "prompt lengths must be positive, got '0'"),
        ("128,-1", "prompt lengths must be positive"),
        ("128,x", "expected lengths like 128,512, got '128,x'"),
        ("", "expected lengths like"),
    ],
)
def test_bad_contexts_are_refused(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        bench._contexts(text)


def test_an_empty_drafter_path_skips_the_drafter():
    args = bench.build_parser().parse_args(["--dspark-model", "", "--mtp-model", "m.gguf"])
    assert args.dspark is None and args.mtp == Path("m.gguf")
    assert not hasattr(args, "dflash")  # absent: the configuration's default stays
    assert bench.build_parser().parse_args(["--dflash-model", ""]).dflash is None


# ------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--runs", "0"], "--runs must be at least 1, got 0"),
        (["-m", "no-such.gguf"], "-m no-such.gguf: no such file"),
        (["--plot", "charts", "--sections", "decode"], "--plot charts the speculation section"),
        (["--lookup", "-1"], "--lookup must be >= 0, got -1"),
    ],
)
def test_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.main(flags)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--runs", "1"], ["--lookup", "0"], ["--plot", "charts", "--sections", "speculation"]],
)
def test_the_limits_themselves_are_accepted(flags):
    parser = bench.build_parser()
    bench._check(parser, parser.parse_args(flags))  # no SystemExit


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a ds4 bench JSON report"),
        ('{"seconds": 3}', "not a ds4 bench JSON report"),
        ('{"metrics": [1, 2]}', "its 'metrics' is not a map of numbers"),
        ('{"metrics": {"decode t/s": 9.5, "prefill t/s": "fast"}}', "its 'metrics' is not"),
    ],
)
def test_a_baseline_that_is_not_a_report_is_a_usage_error(tmp_path, content, message, capsys):
    path = tmp_path / "baseline.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as exited:
        bench._read_baseline(bench.build_parser(), path)
    assert exited.value.code == 2
    assert f"--compare {path}: {message}" in capsys.readouterr().err


def test_a_baseline_report_gives_its_metrics(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text('{"metrics": {"decode t/s": 10, "quality held-out nll": 1.5}}')
    assert bench._read_baseline(bench.build_parser(), path) == {
        "decode t/s": 10,
        "quality held-out nll": 1.5,
    }


# ------------------------------------------------------------------ configuration


def config_for(argv: list[str]) -> suite.BenchConfig:
    return bench._config(bench.build_parser().parse_args(argv), argv)


def test_the_flags_become_the_configuration():
    argv = ["--sections", "decode", "--runs", "2", "--contexts", "64", "--no-peers"]
    argv += ["--lookup", "0", "--glm", "", "--dflash-model", "d.gguf"]
    config = config_for(argv)
    assert config.sections == ("decode",) and config.runs == 2 and config.contexts == (64,)
    assert config.peers is False and config.lookup == 0 and config.glm is None
    assert config.dflash == Path("d.gguf") and config.model == suite.BenchConfig().model
    assert config.notes == {"command": shlex.join(["ds4", "bench", *argv]), "quick": False}


def test_quick_keeps_its_own_defaults_unless_a_flag_is_given():
    quick = config_for(["--quick"])
    assert quick == suite.BenchConfig.quick(notes={"command": "ds4 bench --quick", "quick": True})
    assert quick.runs == 1 and quick.peers is True
    given = config_for(["--quick", "--runs", "3", "--contexts", "32"])
    assert given.runs == 3 and given.contexts == (32,) and given.notes["quick"] is True
    assert config_for([]).runs == suite.BenchConfig().runs


# ------------------------------------------------------------------ the command


@dataclass
class Row:
    parity: bool


def fake_suite(monkeypatch, metrics: dict[str, float], parity: tuple[bool, ...] = (True,)):
    """``suite.run`` replaced: a report with ``metrics``, two sections' texts and speculation
    rows of the given parity; the configurations it was called with."""
    calls: list[suite.BenchConfig] = []

    def run(config, progress):
        calls.append(config)
        progress("bench: pretend")
        report = {"machine": "test machine", "metrics": dict(metrics)}
        return report, [("Decode", "| a |"), ("Quality", "| b |")], [Row(p) for p in parity]

    monkeypatch.setattr(bench.suite, "run", run)
    return calls


def test_the_command_prints_the_sections_and_writes_the_report(monkeypatch, tmp_path, capsys):
    calls = fake_suite(monkeypatch, {"decode t/s": 10.0})
    report = tmp_path / "report.json"
    assert bench.main(["--quick", "--json", str(report)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "machine: test machine"
    heading = f"model: {suite.BenchConfig().model}; quick: {calls[0].runs_description()}"
    assert re.fullmatch(f"{re.escape(heading)}; took [0-9]+ s", lines[1])
    assert "\n## Decode\n\n| a |\n" in out and "\n## Quality\n\n| b |\n" in out
    assert "bench: pretend\n" in err
    written = json.loads(report.read_text())
    assert written["metrics"] == {"decode t/s": 10.0} and written["machine"] == "test machine"
    assert written["seconds"] >= 0 and "comparison" not in written


def test_a_run_without_quick_says_nothing_of_quick(monkeypatch, capsys):
    fake_suite(monkeypatch, {})
    assert bench.main(["--runs", "1"]) == 0
    assert "quick" not in capsys.readouterr().out.splitlines()[1]


def test_a_drafted_run_that_lost_parity_fails_the_command(monkeypatch):
    fake_suite(monkeypatch, {}, parity=(True, False))
    assert bench.main(["--quick"]) == 1
    fake_suite(monkeypatch, {}, parity=())
    assert bench.main(["--quick"]) == 0


def write_baseline(tmp_path: Path, metrics: dict[str, float]) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"metrics": metrics}))
    return path


def test_a_regression_against_the_baseline_fails_the_command(monkeypatch, tmp_path, capsys):
    fake_suite(monkeypatch, {"decode t/s": 8.0})
    baseline = write_baseline(tmp_path, {"decode t/s": 10.0})
    report = tmp_path / "report.json"
    assert bench.main(["--quick", "--compare", str(baseline), "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert f"\n## Against {baseline}\n\n| metric |" in out
    assert out.rstrip().endswith("REGRESSION: a metric is more than 10% slower than the baseline")
    assert json.loads(report.read_text())["comparison"] == [
        {"metric": "decode t/s", "baseline": 10.0, "current": 8.0, "verdict": "regression"}
    ]


def test_a_run_within_the_baseline_passes(monkeypatch, tmp_path, capsys):
    fake_suite(monkeypatch, {"decode t/s": 9.5})
    baseline = write_baseline(tmp_path, {"decode t/s": 10.0})
    assert bench.main(["--quick", "--compare", str(baseline)]) == 0
    assert "REGRESSION" not in capsys.readouterr().out


def test_sections_left_out_of_the_run_are_not_compared(monkeypatch, tmp_path, capsys):
    """The baseline's quality metric is not 'missing' from a decode-only run: it is left out."""
    fake_suite(monkeypatch, {"decode t/s": 10.0})
    baseline = write_baseline(tmp_path, {"decode t/s": 10.0, "quality held-out nll": 1.0})
    report = tmp_path / "report.json"
    argv = ["--sections", "decode", "--compare", str(baseline), "--json", str(report)]
    assert bench.main(argv) == 0
    assert [c["metric"] for c in json.loads(report.read_text())["comparison"]] == ["decode t/s"]
    assert "quality" not in capsys.readouterr().out.split("## Against")[1]


def test_kernels_only_times_the_kernels(monkeypatch, capsys):
    monkeypatch.setattr(bench.kernel_bench, "report", lambda: "| kernel | GB/s |")
    monkeypatch.setattr(bench, "machine_description", lambda: "test machine")
    monkeypatch.setattr(bench.suite, "run", lambda *_: pytest.fail("the suite ran"))
    assert bench.main(["--kernels"]) == 0
    assert capsys.readouterr().out == "machine: test machine\n| kernel | GB/s |\n"
