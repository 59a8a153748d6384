"""Each kernel in ``ds4mlx.kernels`` timed against the naive MLX composition it replaces.

Packed GGML matmuls (Q2_K, Q6_K, IQ2_XXS) at decode and verify row counts, plain and gathered
over experts, against dequantize-then-matmul; the fused mHC Sinkhorn against its op-by-op twin;
sparse CSA attention against the model's masked formulation over every compressed row. On a Mac
the kernels are the Metal ones; elsewhere they are the twins, and the ratios say what the twins
cost next to the naive code. Each timing also says what it moved: the bytes a kernel must read and
write at least (weights, activations, keys read once), as GB/s, and on a Mac as a share of the
chip's memory bandwidth, the bound a decode kernel can reach.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from ds4mlx import kernels
from ds4mlx.gguf.quantize import quantize
from ds4mlx.gguf.quants import load_weight
from ds4mlx.kernels import twins
from ds4mlx.models.attention import sink_attention

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType

# Apple's published unified-memory bandwidth, GB/s, by chip. Binned parts with fewer memory
# channels (a 14-core M3 Max: 300) get the full part's figure, so a share is a lower bound.
CHIP_BANDWIDTH_GBPS = {
    "M1": 68,
    "M1 Pro": 200,
    "M1 Max": 400,
    "M1 Ultra": 800,
    "M2": 100,
    "M2 Pro": 200,
    "M2 Max": 400,
    "M2 Ultra": 800,
    "M3": 100,
    "M3 Pro": 150,
    "M3 Max": 400,
    "M3 Ultra": 819,
    "M4": 120,
    "M4 Pro": 273,
    "M4 Max": 546,
}


@dataclass
class KernelTiming:
    name: str
    kernel_ms: float
    naive_ms: float
    bytes_moved: int = 0  # at least: inputs read once, outputs written once

    @property
    def speedup(self) -> float:
        return self.naive_ms / self.kernel_ms if self.kernel_ms else 0.0

    @property
    def gb_per_s(self) -> float:
        return self.bytes_moved / self.kernel_ms / 1e6 if self.kernel_ms else 0.0


def chip_bandwidth(chip: str) -> float | None:
    """The published bandwidth (GB/s) of an Apple chip named like "Apple M3 Max", or None."""
    name = chip.removeprefix("Apple ").strip()
    return CHIP_BANDWIDTH_GBPS.get(name)


def metal_chip() -> str | None:
    """The GPU's name on a Mac ("Apple M3 Max"), from ``mx.metal.device_info()`` where it says,
    else from sysctl; None without Metal."""
    if not mx.metal.is_available():
        return None
    name = mx.metal.device_info().get("device_name")
    if isinstance(name, str) and name:
        return name
    result = subprocess.run(
        ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True
    )
    return result.stdout.strip() or None


def _time(function: Callable[[], mx.array], repeats: int) -> float:
    """Median milliseconds of ``function`` (evaluated), after one warm-up call."""
    mx.eval(function())
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        mx.eval(function())
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def _packed_weight(qtype: GGMLQuantizationType, shape: tuple[int, ...], rng: np.random.Generator):
    values = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    raw = quantize(values.reshape(-1, shape[-1]), qtype).reshape(*shape[:-1], -1)
    return load_weight(raw, qtype, shape, "native")


def packed_matmuls(
    out_features: int, in_features: int, n_experts: int, repeats: int, rng: np.random.Generator
) -> list[KernelTiming]:
    results = []
    for qtype in sorted(twins.PACKED_TYPES, key=lambda t: t.name):
        matrix = _packed_weight(qtype, (out_features, in_features), rng)
        experts = _packed_weight(qtype, (n_experts, out_features, in_features), rng)
        dense_matrix = kernels.dequantize(matrix)
        dense_experts = kernels.dequantize(experts)
        mx.eval(dense_matrix, dense_experts)
        for rows in (1, 4, 8):
            x = mx.array(rng.standard_normal((rows, in_features)).astype(np.float32))
            activations = x.nbytes + rows * out_features * 4
            results.append(
                KernelTiming(
                    f"{qtype.name} linear, {rows} row{'s' * (rows > 1)}",
                    _time(lambda x=x, w=matrix: kernels.linear(x, w), repeats),
                    _time(lambda x=x, w=matrix: x @ kernels.dequantize(w).T, repeats),
                    matrix.data.nbytes + activations,
                )
            )
            indices = mx.array(rng.integers(0, n_experts, (rows, 2)).astype(np.uint32))
            experts_read = len(np.unique(np.array(indices))) * experts.data.nbytes // n_experts
            xs = x[:, None, None, :]
            results.append(
                KernelTiming(
                    f"{qtype.name} gathered experts (top-2), {rows} row{'s' * (rows > 1)}",
                    _time(
                        lambda xs=xs, i=indices, w=experts: kernels.gather_linear(xs, w, i), repeats
                    ),
                    _time(
                        lambda xs=xs, i=indices, w=experts: mx.gather_mm(
                            xs, mx.swapaxes(kernels.dequantize(w), -1, -2), rhs_indices=i
                        ),
                        repeats,
                    ),
                    experts_read + 2 * activations,
                )
            )
    return results


def sinkhorn(
    tokens: int, hc: int, iters: int, repeats: int, rng: np.random.Generator
) -> KernelTiming:
    comb = mx.array(rng.standard_normal((tokens, hc, hc)).astype(np.float32))
    return KernelTiming(
        f"mHC Sinkhorn, {tokens} tokens x {iters} iterations",
        _time(lambda: kernels.sinkhorn(comb, iters, 1e-6), repeats),
        _time(lambda: twins.sinkhorn(comb, iters, 1e-6), repeats),
        2 * comb.nbytes,
    )


def sparse_attention(
    rows: int,
    heads: int,
    dim: int,
    window: int,
    n_comp: int,
    top_k: int,
    repeats: int,
    rng: np.random.Generator,
) -> KernelTiming:
    q = mx.array(rng.standard_normal((rows, heads, dim)).astype(np.float32))
    raw = mx.array(rng.standard_normal((window, dim)).astype(np.float32))
    comp = mx.array(rng.standard_normal((n_comp, dim)).astype(np.float32))
    sinks = mx.zeros((heads,))
    ranges = mx.array(np.tile([0, window], (rows, 1)).astype(np.int32))
    index = np.stack([rng.permutation(n_comp)[:top_k] for _ in range(rows)]).astype(np.int32)
    mask = np.zeros((rows, window + n_comp), bool)
    mask[:, :window] = True
    for r in range(rows):
        mask[r, window + index[r]] = True
    keys, mask_mx, index_mx = mx.concatenate([raw, comp]), mx.array(mask), mx.array(index)
    scale = dim**-0.5
    return KernelTiming(
        f"sparse CSA attention, {rows} rows, top-{top_k} of {n_comp} blocks",
        _time(
            lambda: kernels.sparse_attention(q, raw, ranges, comp, index_mx, sinks, scale), repeats
        ),
        _time(lambda: sink_attention(q, keys, mask_mx, sinks, scale), repeats),
        rows * (window + top_k) * dim * 4 + 2 * q.nbytes,  # each row's keys once
    )


def run_all(repeats: int = 20, seed: int = 0) -> list[KernelTiming]:
    """The sizes of a DeepSeek-V4-Flash layer where they are cheap enough to time anywhere;
    matmul sizes are a slice of the real ones (4096 -> 1024 rows of a 4096-wide input)."""
    rng = np.random.default_rng(seed)
    return [
        *packed_matmuls(1024, 4096, 8, repeats, rng),
        sinkhorn(1, 4, 20, repeats, rng),
        sinkhorn(512, 4, 20, repeats, rng),
        sparse_attention(1, 64, 512, 128, 2048, 512, repeats, rng),
        sparse_attention(8, 64, 512, 128, 2048, 512, repeats, rng),
    ]


def markdown_table(results: list[KernelTiming], bandwidth_gbps: float | None = None) -> str:
    """The timings as a Markdown table; with the chip's bandwidth, each kernel's share of it."""
    header = "| kernel | kernel ms | naive ms | naive / kernel | GB/s |"
    rule = "|---|---:|---:|---:|---:|"
    if bandwidth_gbps:
        header, rule = header + " of bandwidth |", rule + "---:|"
    lines = [header, rule]
    for r in results:
        line = (
            f"| {r.name} | {r.kernel_ms:.3f} | {r.naive_ms:.3f} | {r.speedup:.2f}x"
            f" | {r.gb_per_s:.1f} |"
            if r.gb_per_s >= 10
            else f" | {r.gb_per_s:.3f} |"
        )
        if bandwidth_gbps:
            line += f" {r.gb_per_s / bandwidth_gbps:.0%} |"
        lines.append(line)
    return "\n".join(lines)


def report(repeats: int = 20, seed: int = 0) -> str:
    """``ds4 bench --kernels``: the chip and its bandwidth (on a Mac), then the table."""
    chip = metal_chip()
    bandwidth = chip_bandwidth(chip) if chip else None
    if chip is None:
        about = "no Metal: the kernels are the MLX twins, GB/s is theirs"
    elif bandwidth is None:
        about = f"{chip}: bandwidth unknown"
    else:
        about = f"{chip}: {bandwidth:.0f} GB/s published bandwidth"
    return f"{about}\n\n{markdown_table(run_all(repeats, seed), bandwidth)}"
