"""``ds4 bench``: how fast and how correct this build is, in one run (see ``ds4mlx.bench.suite``).

Markdown tables go to stdout, progress to stderr. Exit status: 0; 1 when a drafted run's greedy
output differs from the target's own (parity) or when ``--compare`` finds a regression (> 10%
slower than the baseline); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ds4mlx.bench import compare, suite
from ds4mlx.bench.machine import machine_description
from ds4mlx.diagnostics import kernels as kernel_bench


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in suite.SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(unknown) or '(none)'}; known: "
            f"{', '.join(suite.SECTIONS)}"
        )
    return names


def _contexts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lengths like 128,512, got '{text}'") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"prompt lengths must be positive, got '{text}'")
    return values


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


class _Renamed(argparse.Action):
    """An old spelling of a flag, refused with its new name: ``ds4 bench --dspark FILE`` took
    the file that ``ds4 --dspark`` (a switch) takes from ``--mtp-model``."""

    def __init__(self, option_strings: list[str], dest: str, new_name: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new_name = new_name

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(
            f"{option_string} FILE is now {self.new_name} FILE (in ds4, --dspark and --mtp are "
            "switches: DSpark with the file of --mtp-model, and GLM's built-in MTP block)"
        )


def build_parser() -> argparse.ArgumentParser:
    defaults = suite.BenchConfig()
    parser = argparse.ArgumentParser(
        prog="ds4 bench", description="Benchmark speed, speculation, experts and quality."
    )
    parser.add_argument(
        "-m",
        "--model",
        type=Path,
        default=defaults.model,
        help="target GGUF (default: the shipped tiny model)",
    )
    # The drafters' files have names of their own: in ds4, --dspark and --mtp are switches
    # (DSpark with the file given by --mtp-model; GLM's built-in MTP block).
    parser.add_argument(
        "--dspark-model",
        dest="dspark",
        type=_optional_path,
        default=defaults.dspark,
        metavar="FILE",
        help="DSpark support file ('' to skip)",
    )
    # No default here: absent means "the config's default", which --quick turns off.
    parser.add_argument(
        "--dflash-model",
        dest="dflash",
        type=_optional_path,
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="DSpark in llama.cpp's dflash layout (default "
        f"{defaults.dflash}, off in --quick; '' to skip)",
    )
    parser.add_argument(
        "--mtp-model",
        dest="mtp",
        type=_optional_path,
        default=defaults.mtp,
        metavar="FILE",
        help="legacy MTP support file, as ds4's --mtp-draft N --mtp-model FILE ('' to skip)",
    )
    for old, new in (
        ("--dspark", "--dspark-model"),
        ("--dflash", "--dflash-model"),
        ("--mtp", "--mtp-model"),
    ):
        parser.add_argument(
            old,
            nargs="?",
            action=_Renamed,
            new_name=new,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
    parser.add_argument(
        "--lookup",
        type=int,
        default=defaults.lookup,
        metavar="N",
        help="prompt lookup's longest draft in the 'lookup' and "
        f"'dspark+lookup' rows (default {defaults.lookup}; 0 to skip)",
    )
    parser.add_argument(
        "--glm",
        type=_optional_path,
        default=defaults.glm,
        help="a glm5-next GGUF with its NextN layer ('' to skip)",
    )
    parser.add_argument(
        "--sections",
        type=_sections,
        default=suite.SECTIONS,
        help=f"comma-separated subset of {','.join(suite.SECTIONS)}",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer prompts, tokens and runs (about a minute on 2 cores)",
    )
    parser.add_argument("--runs", type=int, help="timed runs per measurement (default 3, quick 1)")
    parser.add_argument(
        "--contexts",
        type=_contexts,
        help="comma-separated prompt lengths for prefill (default "
        f"{','.join(map(str, defaults.contexts))}, quick 128,512)",
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="do not measure llama.cpp beside ds4mlx"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="BASELINE",
        help="a report written by --json: flag > 5%% slower as 'investigate', "
        "> 10%% as 'regression' (exit status 1)",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="only time each kernel against the MLX code it replaces, with its GB/s and, on a "
        "Mac, its share of the chip's bandwidth",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="write PNG charts of the speculation section to DIR",
    )
    return parser


def _read_baseline(parser: argparse.ArgumentParser, path: Path) -> dict[str, float]:
    """The metrics of a report ``--json`` wrote; a usage error for anything else."""
    try:
        baseline = json.loads(path.read_text())["metrics"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"--compare {path}: not a ds4 bench JSON report ({exc})")
    if not isinstance(baseline, dict) or not all(
        isinstance(v, (int, float)) for v in baseline.values()
    ):
        parser.error(f"--compare {path}: its 'metrics' is not a map of numbers")
    return baseline


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors the parser cannot see on its own."""
    if args.runs is not None and args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if not args.model.is_file():
        parser.error(f"-m {args.model}: no such file")
    if args.plot is not None and "speculation" not in args.sections:
        parser.error("--plot charts the speculation section; include it in --sections")
    if args.lookup < 0:
        parser.error(f"--lookup must be >= 0, got {args.lookup}")


def _config(args: argparse.Namespace, argv: list[str]) -> suite.BenchConfig:
    """The run the arguments ask for: given flags over the (quick) defaults."""
    overrides = {
        "model": args.model,
        "dspark": args.dspark,
        "mtp": args.mtp,
        "glm": args.glm,
        "lookup": args.lookup,
        "sections": args.sections,
        "peers": not args.no_peers,
        "notes": {"command": shlex.join(["ds4", "bench", *argv]), "quick": args.quick},
    }
    if args.runs is not None:
        overrides["runs"] = args.runs
    if args.contexts is not None:
        overrides["contexts"] = args.contexts
    if hasattr(args, "dflash"):
        overrides["dflash"] = args.dflash
    return suite.BenchConfig.quick(**overrides) if args.quick else suite.BenchConfig(**overrides)


def _compare(
    report: dict, baseline: dict[str, float], config: suite.BenchConfig, baseline_path: Path
) -> bool:
    """Prints and records the comparison with ``baseline``; True on a regression."""
    # Sections left out of this run are not compared: their metrics are not missing.
    baseline = {
        name: value for name, value in baseline.items() if suite.section_of(name) in config.sections
    }
    comparisons = compare.compare(baseline, report["metrics"])
    report["comparison"] = [
        {"metric": c.metric, "baseline": c.baseline, "current": c.current, "verdict": c.verdict}
        for c in comparisons
    ]
    print(f"\n## Against {baseline_path}\n\n{compare.markdown_table(comparisons)}")
    if compare.has_regression(comparisons):
        print("\nREGRESSION: a metric is more than 10% slower than the baseline")
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kernels:
        print(f"machine: {machine_description()}\n{kernel_bench.report()}")
        return 0
    baseline = None if args.compare is None else _read_baseline(parser, args.compare)
    _check(parser, args)
    config = _config(args, argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    report, texts, spec_results = suite.run(config, progress)
    report["seconds"] = time.perf_counter() - started
    print(f"machine: {report['machine']}")
    print(
        f"model: {config.model}; {'quick: ' if args.quick else ''}"
        f"{config.runs_description()}; took {report['seconds']:.0f} s"
    )
    for title, text in texts:
        print(f"\n## {title}\n\n{text}")

    status = 0 if all(r.parity for r in spec_results) else 1
    if baseline is not None and _compare(report, baseline, config, args.compare):
        status = 1
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot is not None and spec_results:
        from ds4mlx.bench.plot import plot_speculation

        for path in plot_speculation(spec_results, args.plot):
            progress(f"bench: wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
