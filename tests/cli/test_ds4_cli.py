"""The ds4 command: stdout carries only generated text, diagnostics go to stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_ds4(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ds4mlx.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_generates_to_stdout_and_reports_to_stderr(ds4_fixture_path):
    result = run_ds4("-m", str(ds4_fixture_path), "-p", "hello", "-n", "20")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "no generated text on stdout"
    assert "prompt" in result.stderr and "decode" in result.stderr and "t/s" in result.stderr
    assert "generated 20 tokens" in result.stderr
    assert "ds4:" not in result.stdout


def test_greedy_runs_are_byte_identical(ds4_fixture_path):
    first = run_ds4("-m", str(ds4_fixture_path), "-p", "abc", "-n", "12")
    second = run_ds4("-m", str(ds4_fixture_path), "-p", "abc", "-n", "12")
    assert first.returncode == 0 and second.returncode == 0
    assert first.stdout == second.stdout


def test_seeded_sampling_is_reproducible(ds4_fixture_path):
    flags = [
        "-m",
        str(ds4_fixture_path),
        "-p",
        "abc",
        "-n",
        "12",
        "--temp",
        "1.0",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--min-p",
        "0.01",
        "--seed",
        "7",
    ]
    assert run_ds4(*flags).stdout == run_ds4(*flags).stdout


def test_repeat_penalty_with_and_without_dspark():
    """The README's first command: the penalty changes what the tiny model writes (without it,
    it repeats a line), and DSpark drafting with the penalty writes exactly the same text."""
    assets = Path(__file__).resolve().parents[2] / "assets"
    flags = ["-p", "def fibonacci(n):", "-n", "32"]
    plain = run_ds4(*flags)
    penalized = run_ds4(*flags, "--repeat-penalty", "1.3")
    drafted = run_ds4(
        *flags,
        "--repeat-penalty",
        "1.3",
        "--dspark",
        "--mtp-model",
        str(assets / "ds4-tiny-dspark.gguf"),
        "--mtp-timing",
    )
    assert plain.returncode == penalized.returncode == drafted.returncode == 0, drafted.stderr
    assert penalized.stdout != plain.stdout
    lines = [line for line in penalized.stdout.splitlines() if line.strip()]
    assert len(set(lines)) == len(lines)  # no line written twice
    assert drafted.stdout == penalized.stdout
    assert "accepted" in drafted.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--repeat-penalty", "0"], "--repeat-penalty"),
        (["--presence-penalty", "3"], "--presence-penalty"),
        (["--repeat-last-n", "0"], "--repeat-last-n"),
        (["--logit-bias", "5=abc"], "--logit-bias"),
        (["--temp", "-1"], "--temp"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "abc"], "--top-p"),
        (["-n", "0"], "--n-predict"),
        (["-c", "-5"], "--ctx"),
        (["--weights-dtype", "int3"], "--weights-dtype"),
        (["--lookup", "-1"], "--lookup"),
        (["--lookup-ngram", "4..2"], "--lookup-ngram"),
        (["--lookup-ngram", "x"], "--lookup-ngram"),
    ],
)
def test_bad_flags_fail_with_a_message(ds4_fixture_path, flags, message):
    result = run_ds4("-m", str(ds4_fixture_path), "-p", "x", *flags)
    assert result.returncode == 2
    # The error line itself names the flag (the usage above it names every flag).
    assert message in result.stderr.strip().splitlines()[-1]
    assert result.stdout == ""


def test_missing_and_corrupt_model_files(tmp_path):
    missing = run_ds4("-m", str(tmp_path / "nope.gguf"), "-p", "x")
    assert missing.returncode == 1
    assert "nope.gguf" in missing.stderr and "Traceback" not in missing.stderr

    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x00" * 10)
    result = run_ds4("-m", str(corrupt), "-p", "x")
    assert result.returncode == 1
    assert "corrupt.gguf" in result.stderr and "Traceback" not in result.stderr


def test_context_limit_is_enforced(ds4_fixture_path):
    result = run_ds4("-m", str(ds4_fixture_path), "-p", "hello world", "-n", "50", "-c", "16")
    assert result.returncode == 0, result.stderr
    assert "(context)" in result.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dspark"], "--mtp-model"),
        (["--mtp-draft", "3"], "--mtp-model"),
        (["--mtp-model", "x.gguf"], "without --dspark or --mtp-draft"),
        (["--dspark", "--mtp-model", "x.gguf", "--mtp-draft", "3"], "never stacked"),
        (["--mtp", "--mtp-model", "x.gguf"], "inside the main model"),
        (["--dspark-confidence", "1.5"], "--dspark-confidence"),
    ],
)
def test_contradicting_speculation_flags(ds4_fixture_path, flags, message):
    result = run_ds4("-m", str(ds4_fixture_path), "-p", "x", *flags)
    assert result.returncode == 2
    assert message in result.stderr


ASSETS = Path(__file__).resolve().parents[2] / "assets"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dspark", "--mtp-model", "/nonexistent.gguf"], "--mtp-model /nonexistent.gguf"),
        (["--dspark", "--mtp-model", "{model}"], "'deepseek4' file, not a drafter for --dspark"),
        (
            ["--dspark", "--mtp-model", str(ASSETS / "glm-tiny.gguf")],
            "'glm5-next' file, not a drafter for --dspark",
        ),
        (["--mtp-draft", "2", "--mtp-model", "/nonexistent.gguf"], "no such file"),
        (["--mtp-timing"], "--mtp-timing without another drafter needs the MTP draft block"),
        (["--mtp"], "--mtp needs the MTP draft block"),
    ],
)
def test_a_drafter_that_cannot_draft_is_refused_before_loading(ds4_fixture_path, flags, message):
    # Found from the files' headers: a large model loads for minutes (issue 36, items 7, 10).
    flags = [flag.format(model=ds4_fixture_path) for flag in flags]
    result = run_ds4("-m", str(ds4_fixture_path), "-p", "x", *flags)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "loaded" not in result.stderr and "loading" not in result.stderr


@pytest.mark.skipif(not (ASSETS / "glm-tiny.gguf").is_file(), reason="glm-tiny.gguf not built")
def test_a_glm_target_is_refused_for_dspark_before_loading():
    result = run_ds4(
        "-m",
        str(ASSETS / "glm-tiny.gguf"),
        "-p",
        "x",
        "--dspark",
        "--mtp-model",
        str(ASSETS / "ds4-tiny-dspark.gguf"),
    )
    assert result.returncode == 2
    assert "glm5-next model" in result.stderr and "--mtp" in result.stderr
    assert "loaded" not in result.stderr


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("--dspark", "--dspark-model", "dspark"),
        ("--mtp", "--mtp-model", "mtp"),
        ("--dflash", "--dflash-model", "dflash"),
    ],
)
def test_bench_names_drafter_files_apart_from_ds4s_switches(capsys, old, new, field):
    # In ds4, --dspark and --mtp are switches; ds4 bench took files with them (issue 36).
    from ds4mlx.cli import bench

    with pytest.raises(SystemExit) as exited:
        bench.main([old, "x.gguf"])
    assert exited.value.code == 2
    assert f"{old} FILE is now {new} FILE" in capsys.readouterr().err
    assert getattr(bench.build_parser().parse_args([new, "x.gguf"]), field) == Path("x.gguf")
    assert getattr(bench.build_parser().parse_args([new, ""]), field) is None  # skipped


@pytest.mark.parametrize("model", ["ds4-tiny.gguf", "glm-tiny.gguf"])
def test_chat_answers_carry_no_tool_call_markup(model):
    # Issue 36 item 3: the tiny model answered ``--chat`` with DSML tool calls, verbatim.
    path = Path(__file__).resolve().parents[2] / "assets" / model
    if not path.is_file():
        pytest.skip(f"{path} is not built")
    for prompt in ("Weather in Paris?", "Find where the config is loaded."):
        result = run_ds4("-m", str(path), "--chat", "-p", prompt, "-n", "60")
        assert result.returncode == 0, result.stderr
        assert "DSML" not in result.stdout and "<tool_call>" not in result.stdout
