"""Mutation run: apply each of a list of small, plausible bugs alone, run the tests meant to
catch it, restore the file. Every mutation must make some test fail.

    python scripts/mutation_run.py              # all mutations, after a baseline run
    python scripts/mutation_run.py --list
    python scripts/mutation_run.py --only exact_bonus_from_last_draft_row top_p_boundary_flip
    python scripts/mutation_run.py --set fresh3      # one set (or several) of mutations
    python scripts/mutation_run.py --report mutation-report.md

A mutation is (file, old text, new text): the old text must occur exactly once, so a mutation
that no longer matches the code is reported as stale instead of silently testing nothing. The
original file is written back in a ``finally`` (also on Ctrl-C and SIGTERM) with its original
modification time, and each mutated version gets a distinct modification time, so Python never
runs a stale cached bytecode file of either. A catch is confirmed: the tests that failed run
again on the restored tree, and a test that fails there too (a timing test starved by a loaded
machine) makes the outcome FLAKY, not caught. Exit status: 0 when every mutation was caught.

The mutations live in ``scripts/mutation_sets``, one module per set (``SETS``): each fresh run
over the guards users trust is a set of its own, so its first-pass result can be measured apart.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutation_sets import MUTATIONS, SETS, Mutation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    mutation: Mutation
    status: str  # caught | SURVIVED | FLAKY | STALE | ERROR | TIMEOUT
    failed: list[str]
    seconds: float
    tail: str = ""


def pytest_command(tests: Sequence[str]) -> list[str]:
    # -x: the first failing test is enough to call the mutation caught.
    return [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", *tests]


def failed_tests(output: str) -> list[str]:
    return re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)


def run_tests(tests: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """pytest's exit status (None on timeout) and its output."""
    try:
        done = subprocess.run(
            pytest_command(tests), cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out
    return done.returncode, done.stdout + done.stderr


def stale(mutation: Mutation) -> str | None:
    text = (ROOT / mutation.file).read_text()
    count = text.count(mutation.old)
    if count != 1:
        return f"old text found {count} times in {mutation.file} (expected once)"
    return None


def apply_and_test(mutation: Mutation, timeout: float) -> Outcome:
    path = ROOT / mutation.file
    original = path.read_bytes()
    times = os.stat(path)
    start = time.perf_counter()
    try:
        path.write_bytes(original.replace(mutation.old.encode(), mutation.new.encode(), 1))
        # A distinct mtime per mutation (seconds ahead, by its name): a cached .pyc of
        # another version of the file never matches, even one of the same size.
        bumped = times.st_mtime_ns + (zlib.crc32(mutation.name.encode()) % 10**6 + 1) * 10**9
        os.utime(path, ns=(bumped, bumped))
        code, output = run_tests(mutation.tests, timeout)
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    seconds = time.perf_counter() - start
    if code is None:
        return Outcome(mutation, "TIMEOUT", [], seconds, output[-2000:])
    if code == 0:
        return Outcome(mutation, "SURVIVED", [], seconds)
    if code == 1:
        failed = failed_tests(output)
        # The failed tests' functions, every parametrization (an id's parameters may hold
        # spaces, which end it in pytest's summary line).
        functions = list(dict.fromkeys(test.split("[", 1)[0] for test in failed))
        unmutated, again = run_tests(functions, timeout) if functions else (0, "")
        if unmutated == 1:
            return Outcome(mutation, "FLAKY", failed, seconds, again[-2000:])
        if unmutated != 0:
            return Outcome(mutation, "ERROR", failed, seconds, again[-2000:])
        return Outcome(mutation, "caught", failed, seconds)
    return Outcome(mutation, "ERROR", [], seconds, output[-2000:])


def baseline(mutations: Sequence[Mutation], timeout: float) -> bool:
    """Each test selection passes on the unmutated tree (else every mutation looks caught)."""
    ok = True
    for tests in dict.fromkeys(m.tests for m in mutations):
        code, output = run_tests(tests, timeout)
        print(f"baseline {' '.join(tests)}: {'ok' if code == 0 else 'FAILS'}", flush=True)
        if code != 0:
            print(output[-3000:])
            ok = False
    return ok


def report(outcomes: Sequence[Outcome]) -> str:
    lines = ["| mutation | file | status | caught by |", "|---|---|---|---|"]
    for o in outcomes:
        caught_by = ", ".join(o.failed) or "-"
        lines.append(f"| {o.mutation.name} | {o.mutation.file} | {o.status} | {caught_by} |")
    return "\n".join(lines) + "\n"


def selected(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Mutation]:
    """The mutations ``--set`` and ``--only`` name (all of them without either)."""
    mutations = [m for name in args.set for m in SETS[name]] if args.set else list(MUTATIONS)
    if args.only:
        unknown = set(args.only) - {m.name for m in mutations}
        if unknown:
            parser.error(f"unknown mutations: {', '.join(sorted(unknown))}")
        mutations = [m for m in mutations if m.name in args.only]
    return mutations


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument(
        "--set", nargs="+", choices=sorted(SETS), help="run only the mutations of these sets"
    )
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmutated run of each test selection"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds per test run; a run past it counts as TIMEOUT",
    )
    parser.add_argument("--report", type=Path, help="write a markdown table of the outcomes")
    args = parser.parse_args(argv)

    mutations = selected(parser, args)
    if args.list:
        for m in mutations:
            print(f"{m.name:50} {m.file:34} {stale(m) or 'ok'}")
        return 0

    # SIGTERM and SIGHUP unwind like Ctrl-C, so the finally blocks restore the files.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)

    outcomes: list[Outcome] = []
    runnable = []
    for m in mutations:
        problem = stale(m)
        if problem:
            outcomes.append(Outcome(m, "STALE", [], 0.0, problem))
            print(f"STALE    {m.name}: {problem}", flush=True)
        else:
            runnable.append(m)
    if runnable and not args.no_baseline and not baseline(runnable, args.timeout):
        print("the unmutated tests fail; fix that first", file=sys.stderr)
        return 2
    for m in runnable:
        outcome = apply_and_test(m, args.timeout)
        outcomes.append(outcome)
        print(
            f"{outcome.status:8} {m.name} ({outcome.seconds:.0f} s) {', '.join(outcome.failed)}",
            flush=True,
        )
        if outcome.tail:
            print(outcome.tail)

    table = report(outcomes)
    print(table)
    if args.report:
        args.report.write_text(table)
    caught = sum(o.status == "caught" for o in outcomes)
    print(f"{caught} of {len(outcomes)} mutations caught")
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
