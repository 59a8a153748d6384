"""GLM-5.3-Flash (``glm5-next``) against llama.cpp's logits, its incremental-state contract, and
the NextN (MTP) head.

Variants of the oracle fixture (other top-k, no selected tail, softplus decay, more layers with a
shared indexer) are written with ``gguf.writer`` and checked against llama.cpp itself when
``llama-cpp-python`` is installed. (tests/conftest.py imports ds4mlx, and so preloads BLAS, before
this module imports mlx.)
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any

from ds4mlx import load_model
from ds4mlx.bench.llamacpp_peer import LlamaCppModel, llamacpp_available
from ds4mlx.engine.session import Session
from ds4mlx.gguf import GGUFError, GGUFFile, open_gguf
from ds4mlx.gguf.writer import MetaValue, TensorToWrite, write_gguf
from ds4mlx.models import glm5_next
from ds4mlx.models.glm5_next import Model
from ds4mlx.models.kda import kda_scan
from ds4mlx.models.outputs import ForwardOutput

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFValueType

ARCH = "glm5-next"
K = f"{ARCH}."
# The variants are built from this fixture's layout: layer 0 MLA with a dense FFN, layer 1 KDA
# with routed experts; n_embd 128, one head, key_length_mla 192, 2 of 2 experts used.
BASE = "glm5-next-a-f32"
D = 128


def oracle_dir() -> Path:
    """Where tests/conftest.py's ``oracle`` fixture reads the manifest from."""
    default = Path(__file__).resolve().parents[2].parent / "shared" / "oracle"
    return Path(os.environ.get("DS4MLX_ORACLE_DIR", default))


def nmse(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean((ours - ref) ** 2) / np.mean(ref**2))


@pytest.fixture(scope="module")
def fixtures(oracle) -> list[dict]:
    """The manifest's glm5-next entries."""
    found = [f for f in oracle["fixtures"] if open_gguf(oracle_dir() / f["gguf"]).arch == ARCH]
    if not found:
        pytest.skip(f"no {ARCH} fixture in {oracle_dir()}")
    return found


@pytest.fixture(scope="module")
def fixture(fixtures) -> dict:
    """The fixture the variants are made from."""
    for entry in fixtures:
        if entry["name"] == BASE:
            return entry
    pytest.skip(f"{BASE} is not in the manifest")


@functools.cache
def _model(path: Path):
    return load_model(path)


def _step_logits(model, tokens: list[int], prefill: int) -> np.ndarray:
    session = model.new_session()
    rows = [session.feed(tokens[:prefill])] + [session.feed([t]) for t in tokens[prefill:]]
    return np.concatenate(rows)


def test_matches_llamacpp_batch_and_step(fixtures):
    for fixture in fixtures:
        model = _model(oracle_dir() / fixture["gguf"])
        tokens, tolerance = fixture["tokens"], fixture["nmse_tolerance"]
        batch = nmse(model.logits(tokens), np.load(oracle_dir() / fixture["batch_logits"]))
        step = nmse(
            _step_logits(model, tokens, fixture["step_prefill"]),
            np.load(oracle_dir() / fixture["step_logits"]),
        )
        assert batch < tolerance, f"{fixture['name']} batch NMSE {batch:.2e}"
        assert step < tolerance, f"{fixture['name']} step NMSE {step:.2e}"


# --------------------------------------------------------------------------------------------
# Fixture variants
# --------------------------------------------------------------------------------------------


def _metadata(gguf: GGUFFile) -> dict[str, Any]:
    """The file's metadata with its GGUF types (write_gguf would otherwise guess them)."""
    out = {}
    for name, field in gguf.reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            if not field.data:
                continue
            vtype = field.types[-1]
        out[name] = MetaValue(field.contents(), vtype)
    return out


def write_variant(
    src: Path,
    dst: Path,
    *,
    keys: dict[str, Any] | None = None,
    drop_keys: tuple[str, ...] = (),
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """A copy of ``src`` with metadata ``keys`` set (given Python values; a list keeps the
    original item type) or dropped, and ``tensors`` added or replaced (float32)."""
    gguf = open_gguf(src)
    metadata = _metadata(gguf)
    for name, value in (keys or {}).items():
        old = metadata.get(name)
        if old is not None and not isinstance(value, MetaValue):
            value = MetaValue(value, old.value_type)
        metadata[name] = value
    for name in drop_keys:
        del metadata[name]
    arrays = {name: gguf.dequantize(name) for name in gguf.tensor_names()}
    arrays |= tensors or {}
    write_gguf(
        dst,
        gguf.arch,
        metadata,
        [TensorToWrite(name, np.ascontiguousarray(a)) for name, a in arrays.items()],
    )
    return dst


def _copy_layer(
    gguf: GGUFFile, src: int, dst: int, rng: np.random.Generator, keep: Any
) -> dict[str, np.ndarray]:
    """Layer ``src``'s tensors accepted by ``keep(suffix)`` as layer ``dst``'s, perturbed so
    that a mix-up of layers shows."""
    out = {}
    prefix = f"blk.{src}."
    for name in gguf.tensor_names():
        suffix = name.removeprefix(prefix)
        if suffix == name or not keep(suffix):
            continue
        a = gguf.dequantize(name)
        if a.size > 8:
            a = a * (1 + 0.1 * rng.standard_normal(a.shape)).astype(np.float32)
        out[f"blk.{dst}.{suffix}"] = a
    return out


def deeper_variant(src: Path, dst: Path, *, top_k: int = 131072) -> Path:
    """Four layers: MLA (full indexer, dense FFN), KDA, MLA sharing layer 0's indexer, KDA
    (all with routed experts after layer 0)."""
    gguf, rng = open_gguf(src), np.random.default_rng(7)
    tensors = {}

    def mla_part(suffix: str) -> bool:  # layer 0's attention side, without its indexer
        return (
            not suffix.startswith(("ffn_", "indexer"))
            and ".scale" not in suffix
            and ".input_scale" not in suffix
        )

    def moe_part(suffix: str) -> bool:
        return suffix.startswith(("ffn_", "exp_probs_b")) and "scale" not in suffix

    tensors |= _copy_layer(gguf, 0, 2, rng, mla_part)
    tensors |= _copy_layer(gguf, 1, 2, rng, moe_part)
    tensors |= _copy_layer(gguf, 1, 3, rng, lambda s: "scale" not in s or s.startswith("hc_"))
    return write_variant(
        src,
        dst,
        tensors=tensors,
        keys={
            K + "block_count": 4,
            K + "attention.head_count_kv": [1, 0, 1, 0],
            K + "attention.indexer.types": MetaValue([1, 0, 0, 0], GGUFValueType.UINT32),
            K + "attention.indexer.top_k": top_k,
            K + "swiglu_clamp_exp": [0.0] * 4,
            K + "swiglu_clamp_shexp": [0.0] * 4,
        },
    )


def nextn_tensors(src: Path, rng: np.random.Generator, layer: int = 2) -> dict[str, np.ndarray]:
    """Random NextN block tensors for ``src``'s dims (as layer ``layer``)."""
    shapes = glm5_next.tensor_shapes(glm5_next.ModelArgs.from_gguf(open_gguf(src)))

    def of_layer(layer: int) -> dict[str, tuple[int, ...]]:
        return {
            name.removeprefix(f"blk.{layer}."): s
            for name, s in shapes.items()
            if name.startswith(f"blk.{layer}.")
        }

    ffn = ("ffn_", "exp_probs_b")
    block = {n: s for n, s in of_layer(0).items() if not n.startswith(("hc_", *ffn))}
    block |= {n: s for n, s in of_layer(1).items() if n.startswith(ffn)}  # routed experts
    block |= {
        "nextn.eh_proj.weight": (D, 2 * D),
        "nextn.enorm.weight": (D,),
        "nextn.hnorm.weight": (D,),
        "nextn.shared_head_norm.weight": (D,),
    }
    out = {}
    for suffix, shape in block.items():
        if suffix.endswith("norm.weight") or suffix.endswith("k_norm.weight"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(shape[-1])
        out[f"blk.{layer}.{suffix}"] = a.astype(np.float32)
    return out


def nextn_variant(src: Path, dst: Path) -> Path:
    return write_variant(
        src,
        dst,
        tensors=nextn_tensors(src, np.random.default_rng(11)),
        keys={
            K + "block_count": 3,
            K + "nextn_predict_layers": 1,
            K + "attention.head_count_kv": [1, 0, 1],
            K + "swiglu_clamp_exp": [0.0] * 3,
            K + "swiglu_clamp_shexp": [0.0] * 3,
        },
    )


VARIANTS = {
    # Real pool selection (2 and 1 pools per query), and without the query's own tail.
    "topk8": lambda src, dst: write_variant(src, dst, keys={K + "attention.indexer.top_k": 8}),
    "topk4-notail": lambda src, dst: write_variant(
        src,
        dst,
        keys={K + "attention.indexer.top_k": 4, K + "attention.indexer.kpool_select_tail": False},
    ),
    # Without a lower bound the decay is softplus(...) * A.
    "softplus-decay": lambda src, dst: write_variant(
        src, dst, drop_keys=(K + "kda.gate_lower_bound",)
    ),
    "deeper-topk8": lambda src, dst: deeper_variant(src, dst, top_k=8),
    # The NextN block must not change the trunk.
    "with-nextn": nextn_variant,
}


@pytest.fixture(scope="module")
def variants(fixture, tmp_path_factory) -> dict[str, Path]:
    src, root = oracle_dir() / fixture["gguf"], tmp_path_factory.mktemp("glm5-variants")
    return {name: make(src, root / f"{name}.gguf") for name, make in VARIANTS.items()}


@pytest.mark.skipif(
    not llamacpp_available(), reason="llama-cpp-python is not installed (pip install -e '.[bench]')"
)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_matches_live_llamacpp(name, variants, fixture):
    path, tokens = variants[name], fixture["tokens"][:120]
    peer = LlamaCppModel(str(path), n_ctx=256)
    try:
        ref = peer.eval(tokens)
    finally:
        peer.close()
    model = load_model(path)
    assert nmse(model.logits(tokens), ref) < fixture["nmse_tolerance"]
    # Decoding one token at a time must agree with the prefill of the same model.
    step = _step_logits(model, tokens, 100)
    assert nmse(step, ref) < fixture["nmse_tolerance"]


# --------------------------------------------------------------------------------------------
# Incremental state
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, 33])
@pytest.mark.parametrize("variant", ["topk8", "topk4-notail"])
def test_any_chunking_equals_batch(chunk, variant, variants, fixture):
    # Real pool selection, so the indexer's pending rows and pooled keys are exercised; with
    # and without the query's own incomplete pool (decode tiles attend it as a window).
    model = _model(variants[variant])
    tokens = fixture["tokens"]
    batch = model.logits(tokens)
    session = model.new_session()
    fed = np.concatenate(
        [session.feed(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    )
    assert np.max(np.abs(fed - batch)) <= 1e-5 * np.max(np.abs(batch))


def test_snapshot_restore_is_exact(variants, fixture):
    tokens = fixture["tokens"]
    session = _model(variants["topk8"]).new_session()
    session.feed(tokens[:101])  # mid-pool, with conv and recurrent state
    snap = session.snapshot()
    expected = session.feed(tokens[101:110])
    for _ in range(2):  # a snapshot can be restored more than once
        session.restore(snap)
        session.feed([5, 9, 77, 3, 3, 120])  # junk that completes pools
        session.feed([1])
        session.restore(snap)
        assert session.n_tokens == 101
        np.testing.assert_array_equal(session.feed(tokens[101:110]), expected)


def _kda_reference(q, k, v, g, beta, state):
    """ggml_compute_forward_gated_delta_net (KDA gates), token by token, in float64."""
    heads, tokens, _ = q.shape
    state = state.astype(np.float64).copy()
    out = np.zeros((heads, tokens, v.shape[-1]))
    for h in range(heads):
        for t in range(tokens):
            state[h] *= np.exp(g[h, t])[:, None]
            delta = (v[h, t] - state[h].T @ k[h, t]) * beta[h, t]
            state[h] += np.outer(k[h, t], delta)
            out[h, t] = state[h].T @ q[h, t] / math.sqrt(v.shape[-1])
    return out, state


@pytest.mark.parametrize("tokens", [1, 5, 16, 37])
def test_chunked_kda_equals_token_recurrence(tokens):
    rng = np.random.default_rng(tokens)
    heads, dim = 3, 32

    def unit(a):
        return a / np.linalg.norm(a, axis=-1, keepdims=True)

    q, k = unit(rng.standard_normal((2, heads, tokens, dim)))
    v = rng.standard_normal((heads, tokens, dim))
    g = -5.0 / (1 + np.exp(-rng.standard_normal((heads, tokens, dim))))
    beta = 1 / (1 + np.exp(-rng.standard_normal((heads, tokens))))
    state = 0.3 * rng.standard_normal((heads, dim, dim))
    ref_out, ref_state = _kda_reference(q, k, v, g, beta, state)
    out, new_state = kda_scan(*(mx.array(a.astype(np.float32)) for a in (q, k, v, g, beta, state)))
    np.testing.assert_allclose(np.array(out), ref_out, atol=2e-5 * np.abs(ref_out).max())
    np.testing.assert_allclose(np.array(new_state), ref_state, atol=2e-5 * np.abs(ref_state).max())


def test_hidden_capture(fixture):
    network: Model = _model(oracle_dir() / fixture["gguf"]).network
    tokens = mx.array(fixture["tokens"][:20], dtype=mx.int32)
    out = network.forward(tokens, network.new_state(), capture_layers=(0, 1), return_hidden=True)
    assert isinstance(out, ForwardOutput)
    assert out.layers[1].shape == (20, D) and out.head_input.shape == (20, 4, D)
    np.testing.assert_array_equal(
        np.array(out.logits), np.array(network.forward(tokens, network.new_state()))
    )


# --------------------------------------------------------------------------------------------
# Loading errors
# --------------------------------------------------------------------------------------------


def test_wrong_tensor_shape_is_a_gguf_error(fixture, tmp_path):
    bad = write_variant(
        oracle_dir() / fixture["gguf"],
        tmp_path / "bad.gguf",
        tensors={"blk.1.ssm_f_b.weight": np.zeros((96, 128), np.float32)},
    )
    with pytest.raises(GGUFError) as err:
        Model.from_gguf(open_gguf(bad))
    message = str(err.value)
    assert str(bad) in message and "blk.1.ssm_f_b.weight" in message
    assert "[96, 128]" in message and "[128, 128]" in message


def test_missing_metadata_is_a_gguf_error(fixture, tmp_path):
    bad = write_variant(
        oracle_dir() / fixture["gguf"],
        tmp_path / "no-key.gguf",
        drop_keys=(K + "attention.indexer.kpool",),
    )
    with pytest.raises(GGUFError, match="glm5-next.attention.indexer.kpool"):
        Model.from_gguf(open_gguf(bad))


# --------------------------------------------------------------------------------------------
# NextN (MTP)
# --------------------------------------------------------------------------------------------


def _rms(x, w, eps=1e-5):
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * w


def _nextn_reference(g: GGUFFile, hidden: np.ndarray, next_tokens: np.ndarray) -> np.ndarray:
    """The NextN formula in numpy (top_k selects every visible pool, the tail is on: causal)."""

    def t(name):
        return g.dequantize(name).astype(np.float64)

    p = "blk.2."
    e = _rms(t("token_embd.weight")[next_tokens], t(p + "nextn.enorm.weight"))
    x = np.concatenate([e, _rms(hidden, t(p + "nextn.hnorm.weight"))], -1)
    x = x @ t(p + "nextn.eh_proj.weight").T
    a = _rms(x, t(p + "attn_norm.weight"))
    qr = _rms(a @ t(p + "attn_q_a.weight").T, t(p + "attn_q_a_norm.weight"))
    q = qr @ t(p + "attn_q_b.weight").T  # one head of 192
    kv = _rms(a @ t(p + "attn_kv_a_mqa.weight").T, t(p + "attn_kv_a_norm.weight"))
    q_abs = q @ t(p + "attn_k_b.weight")[0].T  # [1 head, kv_lora, 192]
    scores = q_abs @ kv.T / math.sqrt(192)
    scores = np.where(np.tri(len(x), dtype=bool), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    x = x + ((probs @ kv) @ t(p + "attn_v_b.weight")[0].T) @ t(p + "attn_output.weight").T

    def swiglu(h, gate, up, down):
        a = h @ gate.T
        return (a / (1 + np.exp(-a)) * (h @ up.T)) @ down.T

    f = _rms(x, t(p + "ffn_norm.weight"))
    probs = 1 / (1 + np.exp(-(f @ t(p + "ffn_gate_inp.weight").T)))
    chosen = np.argsort(-(probs + t(p + "exp_probs_b.bias")), axis=-1)[:, :2]  # 2 used
    out = swiglu(
        f,
        t(p + "ffn_gate_shexp.weight"),
        t(p + "ffn_up_shexp.weight"),
        t(p + "ffn_down_shexp.weight"),
    )
    experts = [t(p + f"ffn_{w}_exps.weight") for w in ("gate", "up", "down")]
    for row in range(len(f)):
        for e_id in chosen[row]:
            out[row] += probs[row, e_id] * swiglu(f[row], *(w[e_id] for w in experts))
    x = x + out
    return _rms(x, t(p + "nextn.shared_head_norm.weight")) @ t("output.weight").T


def test_nextn_predictor(variants, fixture):
    path = variants["with-nextn"]
    model = load_model(path)
    network: Model = model.network
    assert network.args.num_layers == 2 and network.mtp is not None
    tokens = fixture["tokens"][:41]
    # The trunk ignores the NextN block.
    plain = _model(oracle_dir() / fixture["gguf"]).logits(tokens)
    np.testing.assert_array_equal(model.logits(tokens), plain)

    out = network.forward(mx.array(tokens, dtype=mx.int32), network.new_state(), return_hidden=True)
    hidden, following = out.final_hidden[:-1], mx.array(tokens[1:], dtype=mx.int32)
    state = network.new_mtp_state()
    whole = np.array(network.mtp_logits(hidden, following, state))
    assert state.pos == len(tokens) - 1
    ref = _nextn_reference(
        open_gguf(path), np.array(hidden, dtype=np.float64), np.array(tokens[1:])
    )
    assert nmse(whole, ref) < 1e-9
    # Fed in pieces (its MLA and indexer caches carried over) it gives the same rows.
    state, rows = network.new_mtp_state(), []
    for a, b in ((0, 1), (1, 8), (8, 40)):
        rows.append(np.array(network.mtp_logits(hidden[a:b], following[a:b], state)))
    np.testing.assert_allclose(np.concatenate(rows), whole, rtol=1e-5, atol=1e-5)
    # A drafter's cycles feed one or two rows as compiled decode tiles: the same rows, and the
    # caches they leave carry on as the chunk path's.
    state, rows, a = network.new_mtp_state(), [], 0
    for b in (1, 3, 5, 7, 14, 16, 17, 19, 20, 22, 40):
        rows.append(np.array(network.mtp_logits(hidden[a:b], following[a:b], state, tiled=True)))
        a = b
    assert state.pos == len(tokens) - 1
    np.testing.assert_allclose(np.concatenate(rows), whole, rtol=1e-5, atol=1e-5)


def test_no_nextn_block(fixture):
    network: Model = _model(oracle_dir() / fixture["gguf"]).network
    assert network.mtp is None
    with pytest.raises(ValueError, match="NextN"):
        network.new_mtp_state()
    assert isinstance(Session(network).state.layers[1], glm5_next.KDACache)
