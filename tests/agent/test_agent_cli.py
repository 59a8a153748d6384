"""``ds4-agent --print``: one non-interactive run on a real model, answer on stdout."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.cli import agent as cli

import pytest


def test_print_mode_runs_on_the_chat_model(chat_model_path, workspace, tmp_path, capsys):
    code = cli.main(
        [
            "-m",
            str(chat_model_path),
            "--print",
            "List the files.",
            "--workspace",
            str(workspace),
            "--data-dir",
            str(tmp_path / "data"),
            "-n",
            "8",
            "--max-steps",
            "1",
            # The test model says its own context is 256 tokens, less than the system prompt.
            "-c",
            "4096",
        ]
    )
    out, err = capsys.readouterr()
    # Random weights: the text is gibberish, but one full turn ran and its answer was printed.
    assert code == 0
    assert out.strip(), err
    assert list((tmp_path / "data").glob("chat-*.json"))  # saved, for --continue


def test_flags_are_checked(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["-m", str(tmp_path / "missing.gguf"), "--print", "hi"])
    assert "not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--workspace", str(tmp_path / "nowhere"), "--print", "hi"])
    assert "not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--max-steps", "0", "--print", "hi"])


def test_a_drafter_that_cannot_serve_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the drafter was checked")

    monkeypatch.setattr("ds4mlx.loader.load_model", no_loading)
    missing = tmp_path / "missing-drafter.gguf"
    with pytest.raises(SystemExit) as exited:
        cli.main(["--dspark", "--mtp-model", str(missing), "--print", "hi"])
    assert exited.value.code == 2
    assert str(missing) in capsys.readouterr().err


def test_the_default_model_is_the_tiny_model():
    args = cli.build_parser().parse_args([])
    assert Path(args.model) == cli.DEFAULT_MODEL
    assert cli.DEFAULT_MODEL.name == "ds4-tiny.gguf"


@pytest.mark.skipif(not cli.DEFAULT_MODEL.is_file(), reason="assets/ds4-tiny.gguf not built yet")
def test_the_tiny_model_lists_files_with_a_tool_call(workspace, tmp_path, capsys):
    code = cli.main(
        [
            "--print",
            "List the files.",
            "--workspace",
            str(workspace),
            "--data-dir",
            str(tmp_path / "data"),
            "--max-steps",
            "3",
            "-n",
            "128",
        ]
    )
    out, err = capsys.readouterr()
    assert "> list" in err, err  # a well-formed call ran and its result went back
    assert code == 0 and out.strip()


@pytest.mark.skipif(not cli.DEFAULT_MODEL.is_file(), reason="assets/ds4-tiny.gguf not built yet")
def test_the_default_context_is_the_models_own_capped_by_memory(monkeypatch):
    from ds4mlx import memory
    from ds4mlx.load_plan import HEADROOM, RUNTIME_BYTES, USABLE_SHARE, plan_model
    from ds4mlx.loader import resolve_weights_dtype

    # The weights as the CLI loads this model by default (float32 on the CPU: a small model).
    plan = plan_model(cli.DEFAULT_MODEL, resolve_weights_dtype("auto", cli.DEFAULT_MODEL))
    assert plan.trained_ctx == 4096
    assert cli._parse(["--print", "x"]).ctx == plan.trained_ctx
    assert cli._parse(["--print", "x", "-c", "1000"]).ctx == 1000
    # Memory for the weights and the KV cache of 2048 tokens, and no more.
    kv = plan.kv_fixed_bytes + plan.kv_bytes_per_1k * 2
    needed = ((plan.dense_bytes + plan.routed_bytes + kv) * HEADROOM + RUNTIME_BYTES) / USABLE_SHARE
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: int(needed) + 1)
    assert 2040 <= cli._parse(["--print", "x"]).ctx <= 2048
