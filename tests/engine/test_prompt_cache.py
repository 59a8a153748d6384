"""The prompt cache under ChatService: prefixes reused from memory and, after a restart, from
disk, with answers equal to a cold run's; bad files cost one warning and never a wrong answer;
the disk budget holds."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

import ds4mlx
from ds4mlx.engine.chat import TextDelta
from ds4mlx.engine.kvcache import DiskTier, PromptCache, model_fingerprint, write_snapshot
from ds4mlx.engine.session import Snapshot
from ds4mlx.generation import ChatService, Finished

import mlx.core as mx
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PROMPT = (
    "The quick brown fox jumps over the lazy dog while the cat watches from the wall, "
    "and the farmer counts his sheep one by one before the sun goes down. "
)
OTHER = "Write a Python function that adds two numbers and explain it briefly."


def _model(name: str):
    path = ASSETS / name
    if not path.is_file():
        pytest.skip(f"{path} is not built")
    return ds4mlx.load_model(path)


@pytest.fixture(scope="module")
def ds4():
    return _model("ds4-tiny.gguf")


@pytest.fixture(scope="module")
def glm():
    return _model("glm-tiny.gguf")


class Warnings(list):
    def __call__(self, line: str) -> None:
        assert "\n" not in line
        self.append(line)


def run(service: ChatService, prompt: str, max_tokens: int = 8) -> tuple[str, Finished]:
    events = list(service.complete(prompt, max_tokens=max_tokens))
    assert isinstance(events[-1], Finished)
    return "".join(e.text for e in events if isinstance(e, TextDelta)), events[-1]


def cache_for(
    model, folder: Path | None, budget: int = 1 << 30, warn: Warnings | None = None
) -> PromptCache:
    disk = None
    if folder is not None:
        disk = DiskTier(
            folder, budget, model_fingerprint(model), warn if warn is not None else Warnings()
        )
    return PromptCache(64 << 20, disk)


def test_a_repeated_prompt_is_restored_from_memory(ds4):
    cold_text, cold = run(ChatService(ds4, max_context=512), PROMPT)
    service = ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, None))
    run(service, PROMPT)
    run(service, OTHER)  # the one session now holds another prompt
    text, done = run(service, PROMPT)
    assert done.cached_tokens == cold.prompt_tokens - 1
    assert text == cold_text


@pytest.mark.parametrize("name", ["ds4", "glm"])
def test_a_restarted_service_continues_from_disk(name, request, tmp_path):
    model = request.getfixturevalue(name)
    first = PROMPT + " Then what happens?"
    cold_text, cold = run(ChatService(model, max_context=512), first + " And then?")
    before = ChatService(model, max_context=512, prompt_cache=cache_for(model, tmp_path))
    run(before, first)
    warnings = Warnings()
    # A new service over a new cache of the same folder: what a restarted server has.
    after = ChatService(
        model, max_context=512, prompt_cache=cache_for(model, tmp_path, warn=warnings)
    )
    text, done = run(after, first + " And then?")
    assert done.cached_tokens >= len(model.tokenizer.encode(first)) - 1
    assert text == cold_text and done.prompt_tokens == cold.prompt_tokens
    assert warnings == []


def test_an_exact_repeat_after_a_restart_reuses_all_but_the_last_token(ds4, tmp_path):
    cold_text, cold = run(ChatService(ds4, max_context=512), PROMPT)
    run(ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path)), PROMPT)
    restarted = ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path))
    text, done = run(restarted, PROMPT)
    assert done.cached_tokens == cold.prompt_tokens - 1 >= 0.9 * cold.prompt_tokens
    assert text == cold_text


def _one_file(folder: Path) -> Path:
    (path,) = folder.glob("kv-*.safetensors")
    return path


def test_corrupt_truncated_and_foreign_files_cost_one_warning_each(ds4, glm, tmp_path):
    cold_text, cold = run(ChatService(ds4, max_context=512), PROMPT)
    run(ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path)), PROMPT)
    good = _one_file(tmp_path)
    # A foreign file: a state of the GLM model.
    session = glm.new_session()
    session.feed([5, 6, 7, 8])
    foreign = tmp_path / "kv-foreign.safetensors"
    write_snapshot(foreign, session.snapshot(), model_fingerprint(glm))
    truncated = tmp_path / "kv-truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    data = bytearray(good.read_bytes())
    data[-64] ^= 0x01
    good.write_bytes(bytes(data))  # corrupt: its header still reads fine

    warnings = Warnings()
    service = ChatService(
        ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path, warn=warnings)
    )
    assert len(warnings) == 2  # the truncated and the foreign file, found when scanning
    assert any("kv-truncated" in w and "truncated" in w for w in warnings)
    assert any("kv-foreign" in w and "another model" in w for w in warnings)
    assert not truncated.exists() and foreign.exists()  # another model's files are left alone
    text, done = run(service, PROMPT)
    assert len(warnings) == 3 and "checksum" in warnings[-1]
    assert done.cached_tokens == 0 and text == cold_text
    # The corrupt file is gone and a good one replaced it: no more warnings.
    text, done = run(
        ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path, warn=warnings)),
        PROMPT,
    )
    assert len(warnings) == 4 and "kv-foreign" in warnings[-1]
    assert done.cached_tokens == cold.prompt_tokens - 1 and text == cold_text


def test_the_disk_budget_holds(ds4, tmp_path):
    probe = tmp_path / "probe"
    run(ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, probe)), PROMPT)
    one = _one_file(probe).stat().st_size
    shutil.rmtree(probe)
    budget = int(2.5 * one) + 200_000  # room for two or three snapshots of these prompts
    cache = cache_for(ds4, tmp_path / "kv", budget)
    service = ChatService(ds4, max_context=512, prompt_cache=cache)
    prompts = [f"{PROMPT} Number {i}: tell me about it." for i in range(6)]
    for prompt in prompts:
        run(service, prompt, max_tokens=2)
        files = list((tmp_path / "kv").glob("*"))
        assert sum(f.stat().st_size for f in files) <= budget
        assert cache.disk is not None and len(cache.disk) == len(files)
    assert 2 <= len(files) < len(prompts)
    # The newest prompts survived; the oldest went first.
    restarted = ChatService(
        ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path / "kv", budget)
    )
    assert run(restarted, prompts[-1], max_tokens=2)[1].cached_tokens > 0


def test_a_full_disk_costs_one_warning_and_no_answer(ds4, tmp_path, monkeypatch):
    cold_text, _ = run(ChatService(ds4, max_context=512), PROMPT)
    warnings = Warnings()
    service = ChatService(
        ds4, max_context=512, prompt_cache=cache_for(ds4, tmp_path, warn=warnings)
    )

    def full(path, *_args, **_kwargs):
        Path(path).write_bytes(b"\0" * 10)  # a part written before the disk filled up
        raise RuntimeError("[save_safetensors] No space left on device")

    monkeypatch.setattr(mx, "save_safetensors", full)
    for prompt in (PROMPT, OTHER, PROMPT + " again"):
        text, _ = run(service, prompt)
    assert len(warnings) == 1 and "No space left" in warnings[0]
    assert list(tmp_path.iterdir()) == []
    assert run(service, PROMPT)[0] == cold_text


def test_warnings_go_to_the_log_by_default(ds4, tmp_path, caplog):
    (tmp_path / "kv-bad.safetensors").write_bytes(b"not a snapshot")
    with caplog.at_level(logging.WARNING, logger="ds4mlx.kvcache"):
        DiskTier(tmp_path, 1 << 20, model_fingerprint(ds4))
    assert len(caplog.records) == 1 and "kv-bad" in caplog.records[0].getMessage()


def test_a_state_the_codec_cannot_describe_turns_the_cache_off_with_one_warning(tmp_path):
    warnings = Warnings()
    cache = PromptCache(1 << 20, DiskTier(tmp_path, 1 << 20, "f" * 64, warnings), warnings)
    odd = Snapshot([object()], (1, 2, 3))
    for _ in range(3):
        cache.remember(odd)
        cache.persist(odd)
    assert len(warnings) == 1 and "turned off" in warnings[0]
    assert len(cache.memory) == 0 and list(tmp_path.iterdir()) == []


@pytest.fixture
def usual_umask():
    """The common umask (022), under which a plain open() makes world-readable files."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_disk_states_are_readable_by_their_owner_only(ds4, tmp_path, usual_umask):
    # The files hold the prompts' token ids, i.e. their text (issue 36, item 6).
    folder = tmp_path / "cache" / "kv"
    service = ChatService(ds4, max_context=512, prompt_cache=cache_for(ds4, folder))
    run(service, PROMPT)
    files = list(folder.glob("kv-*.safetensors"))
    assert files
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {stat.S_IMODE(path.stat().st_mode) for path in files} == {0o600}


def _small(tokens: tuple[int, ...]) -> Snapshot:
    return Snapshot([mx.arange(8, dtype=mx.float32) + tokens[0]], tokens)


def test_a_removed_entry_takes_its_file_and_unknown_tokens_load_nothing(tmp_path):
    warned: list[str] = []
    disk = DiskTier(tmp_path, 1 << 20, "f" * 64, warned.append)
    assert disk.save(_small((1, 2, 3)))
    path = disk.path_for((1, 2, 3))
    assert disk.load((1, 2)) is None and path.exists()
    disk.remove((1, 2, 3))
    assert not path.exists() and len(disk) == 0
    disk.remove((1, 2, 3))  # already gone: nothing to do
    assert warned == []


def test_a_file_whose_tokens_changed_since_it_was_indexed_is_refused(tmp_path):
    warned: list[str] = []
    disk = DiskTier(tmp_path, 1 << 20, "f" * 64, warned.append)
    assert disk.save(_small((1, 2, 3))) and disk.save(_small((4, 5, 6)))
    # Another process replaced the first file with the second's content.
    shutil.copyfile(disk.path_for((4, 5, 6)), disk.path_for((1, 2, 3)))
    assert disk.load((1, 2, 3)) is None
    assert len(warned) == 1 and warned[0].endswith("its tokens changed since it was indexed")
    assert not disk.path_for((1, 2, 3)).exists() and disk.keys() == [(4, 5, 6)]
    assert disk.load((4, 5, 6)).tokens == (4, 5, 6)


def test_a_file_corrupt_since_it_was_indexed_leaves_the_index(tmp_path):
    warned: list[str] = []
    disk = DiskTier(tmp_path, 1 << 20, "f" * 64, warned.append)
    assert disk.save(_small((1, 2, 3))) and disk.save(_small((4, 5, 6)))
    path = disk.path_for((1, 2, 3))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last array byte: the header still reads fine
    path.write_bytes(bytes(data))
    assert disk.load((1, 2, 3)) is None
    assert len(warned) == 1 and warned[0].endswith("checksum mismatch (the file is corrupt)")
    assert not path.exists() and disk.keys() == [(4, 5, 6)] and len(disk) == 1
