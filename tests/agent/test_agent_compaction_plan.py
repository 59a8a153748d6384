"""plan_compaction and transcript on hand-made conversations, with one size per message."""

from __future__ import annotations

from ds4mlx.agent.compaction import Budgets, plan_compaction, transcript


def msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def sized(sizes: dict[str, int]):
    return lambda message: sizes.get(message["content"], 10)


def test_budgets_scale_with_the_context_and_never_drop_below_32():
    assert Budgets.for_context(3200) == Budgets(summary=200, tail=320, task=160)
    assert Budgets.for_context(100) == Budgets(summary=32, tail=32, task=32)


def test_the_tail_keeps_recent_messages_while_they_fit():
    system = msg("system", "rules")
    body = [msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2"), msg("assistant", "a2")]
    body += [msg("user", "u3"), msg("assistant", "a3")]
    plan = plan_compaction([system, *body], Budgets(32, 25, 32), sized({}))
    assert plan.system == [system]
    assert plan.older == body[:4] and plan.tail == body[4:] and plan.task is None


def test_a_large_last_message_is_kept_and_the_request_before_it_is_the_task():
    body = [msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2"), msg("assistant", "big")]
    plan = plan_compaction(body, Budgets(32, 25, 32), sized({"big": 100}))
    assert plan.system == [] and plan.tail == [body[3]]
    assert plan.task == body[2] and plan.older == body[:2]


def test_a_tail_exactly_at_its_budget_is_kept_whole():
    body = [msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2")]
    plan = plan_compaction(body, Budgets(32, 20, 32), sized({}))
    assert plan.tail == body[1:] and plan.task is None and plan.older == [body[0]]


def test_transcript_names_each_role():
    text = transcript(
        [
            msg("user", "fix it"),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "read", "arguments": {"path": "a.py"}}}],
            },
            msg("tool", "print(1)"),
            msg("assistant", "done"),
        ]
    )
    assert text.splitlines() == [
        "User: fix it",
        "Assistant called read(path='a.py')",
        "Tool result: print(1)",
        "Assistant: done",
    ]


def test_only_a_leading_system_message_is_the_system_prompt():
    later_system = msg("system", "note")
    messages = [msg("system", "rules"), later_system, msg("user", "u1")]
    plan = plan_compaction(messages, Budgets(32, 100, 32), sized({}))
    assert plan.system == messages[:1] and plan.tail == messages[1:]
    assert plan_compaction(messages[1:][::-1], Budgets(32, 100, 32), sized({})).system == []
