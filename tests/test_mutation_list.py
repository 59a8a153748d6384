"""``scripts/mutation_run.py`` finds each of its mutations' text exactly once in the tree, and
counts a mutation caught only by a test that passes without it.

The mutation run takes 25 minutes and is not part of the suite, so a refactor that moves or
rewrites the code a mutation targets would otherwise only show up there, as STALE, long after
(seven of them had drifted so once). This keeps every mutation pointed at live code.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation_run.py"


def _mutation_run():
    spec = importlib.util.spec_from_file_location("mutation_run", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutation_run", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutation_targets_text_found_once():
    run = _mutation_run()
    assert run.MUTATIONS
    stale = {m.name: run.stale(m) for m in run.MUTATIONS if run.stale(m)}
    assert not stale


def test_every_mutation_names_test_files_that_exist():
    run = _mutation_run()
    root = SCRIPT.parents[1]
    missing = {
        m.name: path
        for m in run.MUTATIONS
        for path in m.tests
        if not (root / path.split("::")[0]).exists()
    }
    assert not missing


def test_a_catch_by_a_test_that_fails_unmutated_is_flaky(tmp_path, monkeypatch):
    """A starved timing test fails with or without the mutation: that is no catch."""
    run = _mutation_run()
    (tmp_path / "code.py").write_text("LIMIT = 1\n")
    mutation = run.Mutation("limit", "code.py", "LIMIT = 1", "LIMIT = 2", ("tests/t.py",))
    monkeypatch.setattr(run, "ROOT", tmp_path)
    seen: list[tuple[tuple[str, ...], str]] = []

    def scripted(unmutated_code):
        def run_tests(tests, timeout):
            seen.append((tuple(tests), (tmp_path / "code.py").read_text()))
            if len(seen) % 2:  # the mutated run: one parametrization fails
                return 1, "FAILED tests/t.py::test_limit[a b] - assert 2 == 1\n"
            return unmutated_code, ""

        return run_tests

    monkeypatch.setattr(run, "run_tests", scripted(1))
    outcome = run.apply_and_test(mutation, timeout=5.0)
    assert outcome.status == "FLAKY" and outcome.failed == ["tests/t.py::test_limit[a"]
    # The confirming run had the failed test's function alone (every parametrization: the
    # summary line cut the id at its space), on the restored file.
    assert seen == [(("tests/t.py",), "LIMIT = 2\n"), (("tests/t.py::test_limit",), "LIMIT = 1\n")]
    monkeypatch.setattr(run, "run_tests", scripted(0))
    assert run.apply_and_test(mutation, timeout=5.0).status == "caught"
    monkeypatch.setattr(run, "run_tests", scripted(4))  # pytest found no such test
    assert run.apply_and_test(mutation, timeout=5.0).status == "ERROR"
