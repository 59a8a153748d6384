"""Permission rules beyond bash prefixes: per-tool "always" answers and how rules are listed."""

from __future__ import annotations

from ds4mlx.agent.permissions import Decision, Permissions, Rule, command_prefix, rule_for
from ds4mlx.generation import ToolCall

import pytest

WRITE = ToolCall("write", {"path": "a.txt", "content": "x"})
EDIT = ToolCall("edit", {"path": "a.txt", "old": "x", "new": "y"})


def test_always_for_a_tool_covers_that_tool_only():
    permissions = Permissions()
    assert permissions.must_ask(WRITE) and permissions.must_ask(EDIT)
    permissions.record(WRITE, Decision.ALLOW_ALWAYS)
    assert permissions.rules == [Rule("write")]
    assert not permissions.must_ask(WRITE)
    assert permissions.must_ask(EDIT)
    assert permissions.must_ask(ToolCall("bash", {"command": "ls"}))


def test_tools_without_consent_are_never_asked_about():
    permissions = Permissions()
    for name in ("read", "list", "search"):
        assert not permissions.must_ask(ToolCall(name, {"path": "."}))


def test_yolo_asks_nothing():
    assert not Permissions(yolo=True).must_ask(ToolCall("bash", {"command": "rm -rf x"}))


@pytest.mark.parametrize("decision", [Decision.ALLOW_ONCE, Decision.DENY])
@pytest.mark.parametrize("call", [WRITE, ToolCall("bash", {"command": "git diff --stat"})])
def test_once_and_deny_record_no_rule(decision, call):
    permissions = Permissions()
    permissions.record(call, decision)
    assert permissions.rules == [] and permissions.must_ask(call)


def test_the_same_answer_twice_keeps_one_rule():
    permissions = Permissions()
    permissions.record(WRITE, Decision.ALLOW_ALWAYS)
    permissions.record(WRITE, Decision.ALLOW_ALWAYS)
    assert permissions.rules == [Rule("write")]


def test_prefix_answer_for_a_file_tool_records_nothing():
    assert rule_for(WRITE, Decision.ALLOW_PREFIX) is None


def test_rules_describe_themselves_as_the_user_wrote_them():
    assert Rule("bash", command="ls -l").describe() == "bash(ls -l)"
    assert Rule("bash", prefix="git diff").describe() == "bash(git diff:*)"
    assert Rule("write").describe() == "write"


def test_a_command_shlex_cannot_split_gets_no_prefix_and_no_prefix_rule_covers_it():
    unbalanced = ToolCall("bash", {"command": 'git diff "src'})
    assert command_prefix('git diff "src') is None
    assert rule_for(unbalanced, Decision.ALLOW_PREFIX) is None
    assert not Rule("bash", prefix="git diff").allows(unbalanced)


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        ("ls -l -a", None),  # one plain word and its options: the command is its own prefix
        ("ls -l -a src", None),  # two plain words and nothing after them
        ("ls -l -a src docs", "ls -l -a src"),
        ("make -j8 all install", "make -j8 all"),
        ("-x a b c", "-x a b"),
    ],
)
def test_a_prefix_keeps_options_up_to_the_second_plain_word(command, prefix):
    assert command_prefix(command) == prefix
