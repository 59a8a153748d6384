"""The fused KDA decode tile (``kernels.kda_tile``) against its twin (``twins.kda_tile``): the
native CPU primitive here, the Metal kernel (metal/kda_tile.metal) through the CPU emulator
here and for real on a Mac; and the dispatch that sends a GLM decode step's KDA layers to it."""

from __future__ import annotations

import math
from pathlib import Path

import ds4mlx
from ds4mlx import kernels
from ds4mlx.diagnostics.graph import primitive_names
from ds4mlx.diagnostics.metal_graph import metal_configuration
from ds4mlx.kernels import metal, metal_fused, twins
from ds4mlx.kernels.native import native_ops
from ds4mlx.models.kda import KDA

import mlx.core as mx
import numpy as np
import pytest
from emulator import build_emulator, run

NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"
ASSETS = Path(__file__).resolve().parents[2] / "assets"
# Two heads of 128 channels (a real KDA head's width), glm's conv kernel and rollback (7).
HEADS, DIM, KERNEL, ROLLBACK = 2, 128, 4, 7
KEEP_ROWS, RING = KERNEL - 1 + ROLLBACK, ROLLBACK + 1
TOKENS, EPS = 8, 1e-5
# (real rows, cached conv rows, the ring's slot of the state to continue): a decode row on a
# steady cache, a ragged verify tile on a young one, a verify tile from the ring's last slot, a
# whole tile from its middle.
CASES = [(1, KEEP_ROWS, 5), (3, KERNEL - 1, 0), (3, KEEP_ROWS, RING - 1), (8, KEEP_ROWS, 3)]
BOUNDS = (-5.0, -math.inf)  # glm's lower bound, and the softplus decay without one


def tile_case(cached_rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inner = HEADS * DIM

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "q": normal(TOKENS, inner),
        "k": normal(TOKENS, inner),
        "v": normal(TOKENS, inner),
        "beta": normal(TOKENS, HEADS),
        "decay": normal(TOKENS, inner),
        "gate": normal(TOKENS, inner),
        "dt_bias": normal(inner),
        "a": -np.exp(normal(HEADS)),
        "conv_rows": normal(3, cached_rows, inner),
        "conv_w": normal(3, inner, KERNEL, scale=0.5),
        "states": normal(RING, HEADS, DIM, DIM, scale=0.1),
        "norm_weight": normal(DIM),
    }


def tile_args(
    case: dict[str, np.ndarray], n_real: int, newest: int, lower_bound: float = -5.0
) -> tuple:
    """``kernels.kda_tile``'s arguments for a case continuing from the ring's slot
    ``newest``: the weights, then the tile's arrays."""
    c = {name: mx.array(value) for name, value in case.items()}
    weights = kernels.KDAWeights(
        dt_bias=c["dt_bias"],
        a=c["a"],
        conv=c["conv_w"],
        norm_weight=c["norm_weight"],
        eps=EPS,
        lower_bound=lower_bound,
        keep_rows=KEEP_ROWS,
    )
    rows = (c[n] for n in ("beta", "decay", "gate", "conv_rows", "states"))
    slot = mx.array([newest], dtype=mx.int32)
    return weights, [c["q"], c["k"], c["v"]], *rows, slot, n_real


def tile_twin(
    case: dict[str, np.ndarray], n_real: int, newest: int, lower_bound: float
) -> list[np.ndarray]:
    return [np.array(a) for a in twins.kda_tile(*tile_args(case, n_real, newest, lower_bound))]


def assert_matches_twin(
    got: list[np.ndarray], want: list[np.ndarray], n_real: int, rtol: float = 1e-5
) -> None:
    """Float rounding apart (the exp and sigmoid of another library, sums in another order):
    the output, the states; the kept conv rows are copies, and the padding rows zeros. Only
    the real rows' new states come out (the ring they continue from is not copied)."""
    out, rows, states = got
    assert [a.shape for a in got] == [a.shape for a in want]
    assert states.shape == (n_real, HEADS, DIM, DIM)
    np.testing.assert_allclose(out, want[0], rtol=rtol, atol=rtol / 10)
    assert not out[n_real:].any()
    np.testing.assert_array_equal(rows, want[1])
    np.testing.assert_allclose(states, want[2], rtol=rtol, atol=rtol / 100)


@pytest.mark.parametrize("lower_bound", BOUNDS)
@pytest.mark.parametrize("n_real, cached_rows, newest", CASES)
def test_native_kda_tile_matches_twin(n_real, cached_rows, newest, lower_bound):
    case = tile_case(cached_rows, seed=n_real + newest)
    with kernels.inference():
        got = kernels.kda_tile(*tile_args(case, n_real, newest, lower_bound))
    assert primitive_names(*got) == ["DS4KdaTile"]
    want = tile_twin(case, n_real, newest, lower_bound)
    assert_matches_twin([np.array(a) for a in got], want, n_real)


@pytest.mark.parametrize("newest", [0, RING - 1])
def test_native_kda_tile_continues_from_the_newest_slot(newest):
    """The tile reads the state of the slot it is given, whatever the other slots hold: a
    ring whose other slots are garbage gives the same bits."""
    case = tile_case(KEEP_ROWS, seed=5)
    garbage = dict(case, states=case["states"] * 0 + 1e3)
    garbage["states"][newest] = case["states"][newest]
    with kernels.inference():
        want = kernels.kda_tile(*tile_args(case, 2, newest))
        got = kernels.kda_tile(*tile_args(garbage, 2, newest))
    assert all(mx.array_equal(a, b).item() for a, b in zip(got, want, strict=True))


def test_native_kda_tile_rows_do_not_depend_on_the_tile():
    """A row's output and state are the same bits whether it is decoded alone or in a verify
    tile with others after it (what keeps speculative decoding's output plain decoding's)."""
    case = tile_case(KEEP_ROWS, seed=3)
    with kernels.inference():
        alone = kernels.kda_tile(*tile_args(case, 1, 4))
        tile = kernels.kda_tile(*tile_args(case, 5, 4))
    assert mx.array_equal(alone[0][0], tile[0][0]).item()
    assert mx.array_equal(alone[2][0], tile[2][0]).item()


def test_native_kda_tile_rejects_mismatched_shapes():
    case = tile_case(KEEP_ROWS, seed=1)
    weights, qkv, beta, decay, gate, rows, states, newest, _ = tile_args(case, 2, 0)
    wrong_norm = mx.zeros((DIM + 1,))  # the norm weight of another head width
    with pytest.raises(ValueError, match="kda_tile: expected"):
        native_ops().kda_tile(
            *qkv,
            beta,
            decay,
            gate,
            weights.dt_bias,
            weights.a,
            rows,
            weights.conv,
            states,
            wrong_norm,
            newest,
            2,
            -5.0,
            EPS,
            KEEP_ROWS,
        )


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    return build_emulator(
        tmp_path_factory.mktemp("metal-kda"),
        DS4_KDA_D=DIM,
        DS4_KDA_H=HEADS,
        DS4_KDA_KERNEL=KERNEL,
        DS4_KDA_KEEP_ROWS=KEEP_ROWS,
    )


@pytest.mark.parametrize("lower_bound", BOUNDS)
@pytest.mark.parametrize("n_real, cached_rows, newest", CASES)
def test_emulated_kda_tile_kernel_matches_twin(
    emulator: Path, tmp_path, n_real, cached_rows, newest, lower_bound
):
    case = tile_case(cached_rows, seed=10 + n_real + newest)
    lower = lower_bound > -math.inf
    sizes = [TOKENS, cached_rows, RING, n_real, int(lower), newest]
    params = [lower_bound if lower else 0.0, EPS, twins.KDA_L2_EPS / DIM, 1 / math.sqrt(DIM)]
    payload = np.array(sizes, np.int32).tobytes() + np.array(params, np.float32).tobytes()
    payload += b"".join(case[name].tobytes() for name in case)
    flat = run(emulator, ["kda_tile"], [payload], tmp_path)[0]
    want = tile_twin(case, n_real, newest, lower_bound)
    sizes_out = np.cumsum([a.size for a in want])[:-1]
    got = [part.reshape(w.shape) for part, w in zip(np.split(flat, sizes_out), want, strict=True)]
    assert_matches_twin(got, want, n_real)


def test_mac_decode_steps_run_each_kda_layer_as_one_launch_of_one_template():
    """A decode step launches the kernel once per KDA layer, with the same template arguments
    while the caches grow to their steady shapes (those are read from the inputs): a session
    compiles it once. (Once steady, a compiled tile replays its trace without calling the
    kernel's Python: the steps recorded are those up to the first steady one.)"""
    with metal_configuration() as calls:
        model = ds4mlx.load_model(ASSETS / "glm-tiny.gguf", weights_dtype="native")
        session = model.new_session()
        for token in range(4, 4 + KEEP_ROWS + 2):  # from an empty cache past the steady shapes
            session.feed([token])
    layers = [b.mixer for b in model.network.blocks if isinstance(b.mixer, KDA)]
    launches = [c for c in calls if c.name == "ds4_kda_tile"]
    # Steps on KERNEL - 1 .. KEEP_ROWS - 1 cached rows run uncompiled, then one is traced.
    assert layers and len(launches) == len(layers) * (KEEP_ROWS - (KERNEL - 1) + 1)
    assert len({c.template for c in launches}) == 1
    dim, heads = layers[0].head_dim, layers[0].heads
    template = dict(launches[0].template)
    assert (template["D"], template["H"], template["NREAL"]) == (dim, heads, 1)
    assert template["KEEP_ROWS"] == 3 + ROLLBACK
    assert launches[0].grid == (dim, heads, 1) and launches[0].threadgroup == (dim, 1, 1)
    # The cached rows grow to the kept size, then stay there; the kernel reads the current state
    # alone and writes one state a real row (the cache puts them in its ring of RING slots).
    assert launches[-1].outputs[1:] == (
        ((3, KEEP_ROWS, heads * dim), mx.float32),
        ((1, heads, dim, dim), mx.float32),
    )
    assert launches[-1].inputs[10] == ((1, heads, dim, dim), mx.float32)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("lower_bound", BOUNDS)
@pytest.mark.parametrize("n_real, cached_rows, newest", CASES)
def test_metal_kda_tile_matches_twin(n_real, cached_rows, newest, lower_bound):
    case = tile_case(cached_rows, seed=20 + n_real)
    got = metal_fused.kda_tile(*tile_args(case, n_real, newest, lower_bound))
    # Metal compiles with fast math: its exp and reciprocal square root are less precise.
    want = tile_twin(case, n_real, newest, lower_bound)
    assert_matches_twin([np.array(a) for a in got], want, n_real, rtol=1e-4)
