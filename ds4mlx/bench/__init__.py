"""Benchmarks: measurement logic the ``scripts/bench_*.py`` scripts and ``ds4 bench`` share."""
