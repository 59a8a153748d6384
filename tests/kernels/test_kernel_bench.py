"""The kernel benchmark's report: GB/s from the bytes a kernel must move, and on a Mac the share
of the chip's published bandwidth."""

from __future__ import annotations

from ds4mlx.cli import bench as bench_cli
from ds4mlx.diagnostics import kernels as kernel_bench
from ds4mlx.diagnostics.kernels import KernelTiming

import pytest


def test_chip_bandwidth_by_name():
    assert kernel_bench.chip_bandwidth("Apple M3 Max") == 400
    assert kernel_bench.chip_bandwidth("M2 Ultra") == 800
    assert kernel_bench.chip_bandwidth("Apple M9 Hyper") is None


def test_table_gives_gb_per_s_and_the_share_of_bandwidth():
    timing = KernelTiming("Q2_K linear, 1 row", kernel_ms=0.5, naive_ms=2.0, bytes_moved=10**8)
    assert timing.gb_per_s == pytest.approx(200.0)
    row = kernel_bench.markdown_table([timing], bandwidth_gbps=400).splitlines()[-1]
    assert row == "| Q2_K linear, 1 row | 0.500 | 2.000 | 4.00x | 200.0 | 50% |"
    assert "of bandwidth" not in kernel_bench.markdown_table([timing])


def test_ds4_bench_kernels_prints_the_report(monkeypatch, capsys):
    timing = KernelTiming("sparse CSA attention", kernel_ms=1.0, naive_ms=3.0, bytes_moved=10**9)
    monkeypatch.setattr(kernel_bench, "run_all", lambda repeats, seed: [timing])
    monkeypatch.setattr(kernel_bench, "metal_chip", lambda: "Apple M4 Max")
    assert bench_cli.main(["--kernels"]) == 0
    out = capsys.readouterr().out
    assert "Apple M4 Max: 546 GB/s published bandwidth" in out
    assert "| sparse CSA attention | 1.000 | 3.000 | 3.00x | 1000.0 | 183% |" in out
