"""The prompt-cache flags of ds4-server and ds4-agent (``cli.kv_options``): sizes in GiB, the
disk folder's checks, and the cache the flags ask for."""

from __future__ import annotations

import argparse
import os
import stat

from ds4mlx.cli import kv_options

import pytest


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser()
    kv_options.add_kv_cache_flags(built)
    return built


def checked(*flags: str) -> argparse.Namespace:
    built = parser()
    args = built.parse_args(list(flags))
    kv_options.check_kv_cache_flags(built, args)
    return args


def test_sizes_are_gib_of_at_least_zero():
    assert kv_options._gib("0") == 0.0
    assert kv_options._gib("1.5") == 1.5
    for bad in ("-0.5", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"at least 0, got {bad}"):
            kv_options._gib(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size in GiB, got 'lots'"):
        kv_options._gib("lots")


def test_defaults_keep_two_gib_in_memory_and_nothing_on_disk():
    args = checked()
    assert (args.kv_memory_space, args.kv_disk_dir, args.kv_disk_space) == (2.0, None, 16.0)
    help_text = " ".join(parser().format_help().split())
    assert "(default 2; 0: only the sessions' own)" in help_text
    assert "(default 16)" in help_text


def test_a_disk_folder_is_made_owner_only(tmp_path):
    folder = tmp_path / "a" / "kv"
    args = checked("--kv-disk-dir", str(folder))
    assert args.kv_disk_dir == folder and folder.is_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_an_existing_folder_is_used_as_it_is(tmp_path):
    assert checked("--kv-disk-dir", str(tmp_path)).kv_disk_dir == tmp_path


def refusal(capsys, *flags: str) -> str:
    with pytest.raises(SystemExit):
        checked(*flags)
    return capsys.readouterr().err


def test_a_file_is_not_a_folder(tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("x")
    assert f"--kv-disk-dir {file} is not a folder" in refusal(capsys, "--kv-disk-dir", str(file))


def test_a_folder_under_a_file_cannot_be_created(tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("x")
    err = refusal(capsys, "--kv-disk-dir", str(file / "kv"))
    assert f"--kv-disk-dir {file / 'kv'} cannot be created: " in err


def test_no_disk_space_with_a_folder_is_refused(tmp_path, capsys):
    flags = ("--kv-disk-dir", str(tmp_path / "kv"), "--kv-disk-space", "0")
    assert "--kv-disk-space must be positive with --kv-disk-dir" in refusal(capsys, *flags)
    assert not (tmp_path / "kv").exists()
    assert checked("--kv-disk-space", "0").kv_disk_space == 0.0  # no folder: no disk tier


def test_a_folder_that_cannot_be_written_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kv_options.os, "access", lambda path, mode: mode != os.W_OK | os.X_OK)
    assert f"--kv-disk-dir {tmp_path} is not writable" in refusal(
        capsys, "--kv-disk-dir", str(tmp_path)
    )


@pytest.fixture
def fingerprint(monkeypatch):
    monkeypatch.setattr(kv_options, "model_fingerprint", lambda model: f"fp-{model}")


def test_no_memory_and_no_folder_is_no_cache(fingerprint):
    assert kv_options.prompt_cache_for(checked("--kv-memory-space", "0"), "m") is None


def test_the_cache_holds_the_memory_budget_in_bytes(fingerprint):
    cache = kv_options.prompt_cache_for(checked("--kv-memory-space", "0.5"), "m")
    assert (cache.memory.budget, cache.disk) == (2**29, None)


def test_a_disk_folder_alone_is_a_cache(fingerprint, tmp_path):
    args = checked("--kv-memory-space", "0", "--kv-disk-dir", str(tmp_path), "--kv-disk-space", "1")
    cache = kv_options.prompt_cache_for(args, "m")
    assert (cache.memory.budget, cache.disk.budget) == (0, 2**30)
    assert (cache.disk.folder, cache.disk.fingerprint) == (tmp_path, "fp-m")
