"""DeepSeek-V4 (``deepseek4``) against llama.cpp's logits, and its incremental-state contract.

(tests/conftest.py imports ds4mlx, and so preloads BLAS, before this module imports mlx.)
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from ds4mlx import load_model
from ds4mlx.engine.session import Session
from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.kernels import linear
from ds4mlx.models import compressed_attention
from ds4mlx.models.deepseek4 import Model
from ds4mlx.models.mhc import hc_mean
from ds4mlx.models.outputs import ForwardOutput

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

ORACLE_DIR = Path(
    os.environ.get("DS4MLX_ORACLE_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "oracle"
)
MANIFEST = ORACLE_DIR / "manifest.json"


def _fixtures() -> list:
    if not MANIFEST.is_file():
        return [
            pytest.param(
                None,
                marks=pytest.mark.skip(
                    reason=f"llama.cpp oracle fixtures not found in {ORACLE_DIR} "
                    "(set DS4MLX_ORACLE_DIR)"
                ),
            )
        ]
    fixtures = json.loads(MANIFEST.read_text())["fixtures"]
    return [pytest.param(f, id=f["name"]) for f in fixtures if f["name"].startswith("deepseek4")]


FIXTURES = _fixtures()
needs_oracle = pytest.mark.skipif(
    not MANIFEST.is_file(), reason=f"llama.cpp oracle fixtures not found in {ORACLE_DIR}"
)


def nmse(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean((ours - ref) ** 2) / np.mean(ref**2))


@functools.cache
def _model(gguf_name: str):
    return load_model(ORACLE_DIR / gguf_name)


@functools.cache
def _batch_logits(gguf_name: str, tokens: tuple[int, ...]) -> np.ndarray:
    return _model(gguf_name).logits(list(tokens))


def _fixture(name: str) -> dict:
    for param in FIXTURES:
        fixture = param.values[0]
        if fixture is not None and fixture["name"] == name:
            return fixture
    pytest.skip(f"fixture {name} not in {MANIFEST}")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_batch_matches_llamacpp(fixture):
    ours = _batch_logits(fixture["gguf"], tuple(fixture["tokens"]))
    ref = np.load(ORACLE_DIR / fixture["batch_logits"])
    assert ours.shape == ref.shape
    assert nmse(ours, ref) < fixture["nmse_tolerance"]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_step_matches_llamacpp(fixture):
    """A prefill of ``step_prefill`` tokens, then one token at a time."""
    tokens, prefill = fixture["tokens"], fixture["step_prefill"]
    session = _model(fixture["gguf"]).new_session()
    rows = [session.feed(tokens[:prefill])]
    rows += [session.feed([t]) for t in tokens[prefill:]]
    ref = np.load(ORACLE_DIR / fixture["step_logits"])
    assert nmse(np.concatenate(rows), ref) < fixture["nmse_tolerance"]


@pytest.mark.parametrize(
    "fixture", [p for p in FIXTURES if not (p.id or "f16").endswith("f16")] or FIXTURES[:1]
)
def test_native_weights_match_llamacpp(fixture):
    """The file's own quantized weights (as the Metal path keeps them) through ``kernels``."""
    network = Model.from_gguf(open_gguf(ORACLE_DIR / fixture["gguf"]), weights_dtype="native")
    ours = Session(network).feed(fixture["tokens"])
    ref = np.load(ORACLE_DIR / fixture["batch_logits"])
    assert nmse(ours, ref) < fixture["nmse_tolerance"]


@needs_oracle
@pytest.mark.parametrize("chunk", [1, 7, 33])
def test_any_chunking_equals_batch(chunk):
    # -b exercises every cache: the window, both compressors and a real indexer top-k.
    fixture = _fixture("deepseek4-b-f16")
    tokens = fixture["tokens"]
    batch = _batch_logits(fixture["gguf"], tuple(tokens))
    session = _model(fixture["gguf"]).new_session()
    fed = np.concatenate(
        [session.feed(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    )
    assert np.max(np.abs(fed - batch)) <= 1e-5 * np.max(np.abs(batch))


@needs_oracle
def test_query_blocks_equal_one_block(monkeypatch):
    """Long prefills attend in query blocks; the result must not depend on the block size."""
    fixture = _fixture("deepseek4-b-f16")
    tokens = fixture["tokens"]
    batch = _batch_logits(fixture["gguf"], tuple(tokens))
    monkeypatch.setattr(compressed_attention, "SCORE_BUDGET", 1 << 16)  # ~10 query rows per block
    blocked = _model(fixture["gguf"]).logits(tokens)
    assert np.max(np.abs(blocked - batch)) <= 1e-5 * np.max(np.abs(batch))


@needs_oracle
def test_snapshot_restore_is_exact():
    fixture = _fixture("deepseek4-b-f16")
    tokens = fixture["tokens"]
    session = _model(fixture["gguf"]).new_session()
    session.feed(tokens[:130])  # mid-block for both compressors, a full window
    snap = session.snapshot()
    expected = session.feed(tokens[130:140])
    for _ in range(2):  # a snapshot can be restored more than once
        session.restore(snap)
        session.feed([5, 9, 77, 3, 3, 120])  # junk that crosses CSA block boundaries
        session.feed([1])
        session.restore(snap)
        assert session.n_tokens == 130
        np.testing.assert_array_equal(session.feed(tokens[130:140]), expected)


@needs_oracle
def test_hidden_capture():
    fixture = _fixture("deepseek4-b-f16")
    network: Model = _model(fixture["gguf"]).network
    tokens = mx.array(fixture["tokens"][:20], dtype=mx.int32)
    last = network.args.num_layers - 1
    out = network.forward(tokens, network.new_state(), capture_layers=(0, last), return_hidden=True)
    assert isinstance(out, ForwardOutput)
    d, hc = network.args.hidden_size, network.args.hc_mult
    assert set(out.layers) == {0, last}
    assert out.layers[0].shape == (20, d)
    assert out.head_input.shape == (20, hc, d)
    np.testing.assert_allclose(np.array(out.layers[last]), np.array(hc_mean(out.head_input)))
    np.testing.assert_allclose(
        np.array(linear(out.final_hidden, network.output)),
        np.array(out.logits),
        rtol=1e-5,
        atol=1e-5,
    )
    plain = network.forward(tokens, network.new_state())
    np.testing.assert_array_equal(np.array(plain), np.array(out.logits))
    with pytest.raises(ValueError):
        network.forward(tokens, network.new_state(), capture_layers=(0,))


def _rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    drop_key: str | None = None,
    set_uint32: dict[str, int] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
) -> None:
    """Copy ``src`` to ``dst``, dropping or setting metadata keys and replacing or adding
    tensors (written as given)."""
    set_uint32, tensors = set_uint32 or {}, tensors or {}
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", drop_key):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY and not field.data:
            continue  # GGUFWriter refuses empty arrays; no deepseek4 key needs one
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = set_uint32.get(field.name, field.contents())
        writer.add_key_value(field.name, value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.name not in tensors:
            writer.add_tensor(
                tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type
            )
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@needs_oracle
def test_wrong_tensor_shape_is_a_gguf_error(tmp_path):
    src = ORACLE_DIR / _fixture("deepseek4-b-f16")["gguf"]
    bad = tmp_path / "bad-shape.gguf"
    _rewrite_gguf(
        src, bad, tensors={"blk.2.attn_compressor_kv.weight": np.zeros((96, 512), np.float32)}
    )
    with pytest.raises(GGUFError) as err:
        Model.from_gguf(open_gguf(bad))
    message = str(err.value)
    assert str(bad) in message
    assert "blk.2.attn_compressor_kv.weight" in message
    assert "[96, 512]" in message and "[128, 512]" in message


@needs_oracle
def test_missing_metadata_is_a_gguf_error(tmp_path):
    src = ORACLE_DIR / _fixture("deepseek4-b-f16")["gguf"]
    bad = tmp_path / "no-key.gguf"
    _rewrite_gguf(src, bad, drop_key="deepseek4.attention.compress_ratios")
    with pytest.raises(GGUFError, match="deepseek4.attention.compress_ratios"):
        Model.from_gguf(open_gguf(bad))


@needs_oracle
def test_hash_routed_layers(tmp_path):
    """Layers below ``hash_layer_count`` take their experts from the token's table row."""
    fixture = _fixture("deepseek4-b-f16")
    src = ORACLE_DIR / fixture["gguf"]
    reader = open_gguf(src)
    n_expert = reader.get("deepseek4.expert_count")
    n_used = reader.get("deepseek4.expert_used_count")
    vocab = reader.tensor_shape("token_embd.weight")[0]
    table = np.random.default_rng(3).integers(0, n_expert, (vocab, n_used)).astype(np.int32)
    path = tmp_path / "hash.gguf"
    _rewrite_gguf(
        src,
        path,
        set_uint32={"deepseek4.hash_layer_count": 2},
        tensors={f"blk.{i}.ffn_gate_tid2eid.weight": table for i in range(2)},
    )
    network = Model.from_gguf(open_gguf(path), weights_dtype="f32")
    assert np.isfinite(Session(network).feed(fixture["tokens"][:40])).all()

    g = open_gguf(path)
    w = {
        n: g.dequantize(f"blk.0.{n}.weight")
        for n in (
            "ffn_gate_inp",
            "ffn_gate_exps",
            "ffn_up_exps",
            "ffn_down_exps",
            "ffn_gate_shexp",
            "ffn_up_shexp",
            "ffn_down_shexp",
        )
    }
    limit = 10.0  # the fixture's swiglu_clamp_exp / _shexp

    def ffn(x, gate, up, down):
        a = np.minimum(x @ gate.T, limit)
        return (a / (1 + np.exp(-a)) * np.clip(x @ up.T, -limit, limit)) @ down.T

    x = np.random.default_rng(4).standard_normal((3, w["ffn_gate_inp"].shape[1]))
    x = x.astype(np.float32)
    tokens = np.array([5, 17, 100])
    logits = x @ w["ffn_gate_inp"].T
    probs = np.sqrt(np.where(logits > 20, logits, np.log1p(np.exp(logits))))
    expected = ffn(x, w["ffn_gate_shexp"], w["ffn_up_shexp"], w["ffn_down_shexp"])
    for t, token in enumerate(tokens):
        chosen = table[token]
        weights = probs[t, chosen] / probs[t, chosen].sum()
        for e, weight in zip(chosen, weights, strict=True):
            expected[t] += weight * ffn(
                x[t], w["ffn_gate_exps"][e], w["ffn_up_exps"][e], w["ffn_down_exps"][e]
            )
    ours = network.blocks[0].moe(mx.array(x), mx.array(tokens, dtype=mx.int32))
    np.testing.assert_allclose(np.array(ours), expected, rtol=1e-4, atol=1e-4)
