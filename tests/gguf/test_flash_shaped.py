"""A reduced DeepSeek-V4-Flash-shaped file (real widths, 3 layers, 8 experts, a small vocabulary)
from ``scripts/make_flash_shaped.py``: its header is the real model's, it loads with streamed
native experts and decodes, the memory plan's numbers are the file's own tensor bytes, and a
truncated copy fails fast with a GGUFError naming the tensor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ds4mlx
from ds4mlx.engine.chat.deepseek4 import ASSISTANT, BOS, USER
from ds4mlx.engine.tokenizer import load_tokenizer
from ds4mlx.experts import ExpertOptions
from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.gguf.quants import host_weight, resident_nbytes
from ds4mlx.load_plan import plan_memory

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from make_flash_shaped import write_flash_shaped  # noqa: E402

VOCAB = 1024


@pytest.fixture(scope="module")
def flash(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("flash") / "flash3.gguf"
    written = write_flash_shaped(path, layers=3, experts=8, vocab=VOCAB, seed=1)
    assert written.disk_bytes < written.apparent_bytes / 10, "the file should be mostly holes"
    return path


def test_header_has_the_real_shapes_and_types(flash):
    gguf = open_gguf(flash)
    assert gguf.arch == "deepseek4"
    for key, value in [
        ("embedding_length", 4096),
        ("attention.head_count", 64),
        ("attention.key_length", 512),
        ("attention.q_lora_rank", 1024),
        ("attention.output_lora_rank", 1024),
        ("attention.indexer.top_k", 512),
        ("expert_feed_forward_length", 2048),
        ("hash_layer_count", 3),
        ("expert_count", 8),
        ("expert_used_count", 6),
        ("block_count", 3),
    ]:
        assert gguf.get(f"deepseek4.{key}") == value, key
    assert gguf.get("deepseek4.attention.compress_ratios") == [0, 0, 4]
    assert gguf.tensor_shape("blk.2.ffn_gate_exps.weight") == (8, 2048, 4096)
    assert gguf.tensor_shape("blk.0.attn_output_a.weight") == (8, 1024, 4096)
    assert gguf.tensor_shape("blk.2.indexer.attn_q_b.weight") == (64 * 128, 1024)
    assert gguf.tensor_shape("output.weight") == (VOCAB, 4096)
    types = {
        name: gguf.tensor_type(name)
        for name in (
            "blk.1.ffn_gate_exps.weight",
            "blk.1.ffn_up_exps.weight",
            "blk.1.ffn_down_exps.weight",
            "blk.1.attn_q_b.weight",
            "blk.1.ffn_gate_inp.weight",
            "blk.1.attn_norm.weight",
            "blk.1.ffn_gate_tid2eid.weight",
        )
    }
    assert list(types.values()) == [T.IQ2_XXS, T.IQ2_XXS, T.Q2_K, T.Q8_0, T.F32, T.F32, T.I32]


def test_tokenizer_has_the_vocabulary_size_and_deepseek_specials(flash):
    tokenizer = load_tokenizer(open_gguf(flash))
    assert tokenizer.vocab_size == VOCAB
    assert tokenizer.token_to_id(BOS) == 0 and tokenizer.bos_id == 0
    assert tokenizer.token_to_id(USER) is not None and tokenizer.token_to_id(ASSISTANT)
    text = "Hello world, the capital of France"
    ids = tokenizer.encode(text, add_special=True)
    assert ids[0] == 0 and tokenizer.decode(ids[1:]) == text
    assert len(ids) < len(text)  # merged tokens, not one per character


def test_hash_tables_route_every_token_to_distinct_experts(flash):
    table = np.asarray(open_gguf(flash).raw("blk.0.ffn_gate_tid2eid.weight")).reshape(VOCAB, 6)
    assert all(len(set(row)) == 6 for row in table.tolist())
    assert len(np.unique(table)) == 8  # every expert is some token's


def test_loads_streamed_decodes_and_matches_the_plan(flash):
    gguf = open_gguf(flash)
    tensors = gguf.layout.tensors
    plan = plan_memory(gguf, "native")
    routed = {n: t for n, t in tensors.items() if "_exps." in n}
    assert plan.routed_file_bytes == sum(t.nbytes for t in routed.values())
    assert plan.dense_file_bytes == sum(t.nbytes for n, t in tensors.items() if n not in routed)
    assert plan.n_used == 6 and plan.moe_layers == 3 and plan.n_experts == 8

    model = ds4mlx.load_model(
        flash, weights_dtype="native", experts=ExpertOptions(stream=True, cache_gib=0.1)
    )
    try:
        session = model.new_session()
        prompt = model.tokenizer.encode("Hello world", add_special=True)
        token = int(np.argmax(session.feed(prompt)[-1]))
        logits = session.feed([token])
        assert logits.shape == (1, VOCAB) and np.isfinite(logits).all()
        stats = model.expert_stats()
        # Seeded routers and hash tables spread the tokens over the experts.
        assert stats.misses > 6
        assert stats.routed_bytes == plan.routed_bytes
        assert model.experts.pools[0].slab.slot_bytes == plan.expert_bytes
        assert stats.capacity_bytes <= stats.budget_bytes
    finally:
        model.close()


def test_resident_bytes_are_what_the_loader_holds(flash):
    gguf = open_gguf(flash)
    names = [
        "blk.2.attn_q_b.weight",
        "blk.0.attn_output_a.weight",
        "blk.1.ffn_gate_inp.weight",
        "blk.2.attn_norm.weight",
        "blk.0.ffn_gate_tid2eid.weight",
    ]
    for name in names:
        info = gguf.layout.tensors[name]
        for mode in ("native", "f32"):
            raw = np.asarray(gguf.raw(name))
            if info.qtype == T.I32:  # tables stay as stored
                held = raw.nbytes
            else:
                held = host_weight(raw, info.qtype, info.shape, mode).nbytes
            assert resident_nbytes(info.qtype, info.shape, mode) == held, (name, mode)


def header_bytes(path: Path, n: int) -> bytes:
    with open(path, "rb") as file:  # not read_bytes(): the whole sparse file would be read
        return file.read(n)


def first_tensor_past(tensors, size: int) -> str:
    return next(t.name for t in tensors.values() if t.file_offset + t.nbytes > size)


def test_a_truncated_file_fails_fast_naming_the_tensor(flash, tmp_path):
    layout = open_gguf(flash).layout
    size = flash.stat().st_size
    path = tmp_path / "cut.gguf"
    path.write_bytes(header_bytes(flash, layout.data_offset))  # metadata and tensor infos
    rng = np.random.default_rng(0)
    # Cuts anywhere in the data, from the end down (each truncates the same sparse file).
    cuts = sorted(
        {size - 1, layout.data_offset + 1, *rng.integers(layout.data_offset, size, 6)}, reverse=True
    )
    with open(path, "r+b") as file:
        file.truncate(size)
    for cut in cuts:
        with open(path, "r+b") as file:
            file.truncate(int(cut))
        with pytest.raises(GGUFError) as error:
            open_gguf(path)
        expected = first_tensor_past(layout.tensors, int(cut))
        assert f"tensor '{expected}'" in str(error.value) and "truncated" in str(error.value)


def test_a_cut_in_the_header_names_the_key_or_tensor_it_falls_in(flash, tmp_path):
    header = header_bytes(flash, open_gguf(flash).layout.data_offset)
    rng = np.random.default_rng(1)
    first_key = 24  # after magic, version and the two counts
    for cut in sorted({first_key + 10, *rng.integers(first_key + 10, len(header), 8)}):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(header[:cut])
        with pytest.raises(GGUFError, match="truncated") as error:
            open_gguf(path)
        # Too short for the counts the header declares, or cut inside a key or tensor info.
        assert "metadata" in str(error.value) or "tensor" in str(error.value)


def test_ds4_refuses_a_truncated_file_with_the_tensor_name(flash, tmp_path):
    layout = open_gguf(flash).layout
    last = list(layout.tensors.values())[-1]
    path = tmp_path / "short.gguf"
    path.write_bytes(header_bytes(flash, layout.data_offset))
    with open(path, "r+b") as file:
        file.truncate(last.file_offset + 10)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds4mlx.cli.main",
            "-m",
            str(path),
            "-p",
            "hi",
            "-n",
            "1",
            "--ssd-stream",
            "--weights-dtype",
            "native",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 1
    assert f"tensor '{last.name}'" in result.stderr and result.stdout == ""


def test_the_script_reports_sizes_and_refuses_bad_arguments(tmp_path, capsys):
    from make_flash_shaped import MIN_VOCAB, main

    out = tmp_path / "one.gguf"
    assert main([str(out), "--layers", "1", "--experts", "6", "--vocab", str(MIN_VOCAB)]) == 0
    report = capsys.readouterr().out
    assert "apparent size" in report and "on disk (du)" in report
    assert open_gguf(out).get("deepseek4.block_count") == 1
    assert main([str(tmp_path / "x.gguf"), "--vocab", "100", "--layers", "1"]) == 1
    assert "too small" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "y.gguf"), "--layers", "0"])
