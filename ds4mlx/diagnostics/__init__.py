"""Measurements of the internals: the kernel benchmark (``kernels``), the decode-graph profiler
(``graph``) and one rank of a measured distributed run (``distributed_probe``). They time and
count what lies below the generation API (kernels, compiled decode tiles, the rank group), so
they sit just below the faces and may import any layer; ``bench/`` and ``scripts/bench_*.py``
run them and report."""
