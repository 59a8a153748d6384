"""plan_compaction and transcript on hand-made conversations, with one size per message."""

from __future__ import annotations

from ds4mlx.agent.compaction import (
    SUMMARY_HEADER,
    Budgets,
    assemble,
    plan_compaction,
    summary_message,
    transcript,
)


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


# Long contents are clipped at fixed sizes, keeping their beginning and saying what was dropped
# (the numbers are the module's limits written out, so a changed limit fails here).


def test_the_transcript_clips_each_message_at_1500_characters():
    exact, long = "x" * 1500, "y" * 1500 + "z" * 7
    lines = transcript([msg("user", exact), msg("tool", long), msg("assistant", long)])
    dropped = " [... 7 characters dropped at compaction]"
    assert lines.splitlines() == [
        f"User: {exact}",
        f"Tool result: {'y' * 1500}{dropped}",
        f"Assistant: {'y' * 1500}{dropped}",
    ]


def test_the_transcript_clips_each_call_argument_at_200_characters():
    call = {"function": {"name": "write", "arguments": {"path": "a.py", "content": "c" * 205}}}
    text = transcript([{"role": "assistant", "content": None, "tool_calls": [call]}])
    clipped = "c" * 200 + " [... 5 characters dropped at compaction]"
    assert text == f"Assistant called write(path='a.py', content={clipped!r})"


def test_the_summary_lists_earlier_requests_clipped_at_300_characters():
    older = [
        msg("user", "r" * 300),
        msg("assistant", "a" * 400),
        msg("user", "s" * 301),
        msg("user", f"{SUMMARY_HEADER}\n\nan earlier summary"),
    ]
    content = summary_message("  the summary \n", older, "job 1 running")["content"]
    assert content.split("\n\n") == [
        SUMMARY_HEADER,
        "the summary",
        "Earlier requests from the user:\n"
        f"- {'r' * 300}\n- {'s' * 300} [... 1 characters dropped at compaction]",
        "Open state:\njob 1 running",
    ]
    empty = summary_message(" ", [], "")["content"]
    assert empty == f"{SUMMARY_HEADER}\n\n(the model wrote no summary)"


def test_kept_tool_results_use_half_the_tail_budget_and_the_task_its_own():
    # Tail budget 100 tokens: a tool result keeps 50 tokens, about 200 characters; the task
    # (the last request, not in the tail) keeps its 40 tokens, about 160 characters.
    task, answer = msg("user", "t" * 170), msg("assistant", "a" * 900)
    call = {"role": "assistant", "content": "", "tool_calls": []}
    result = {"role": "tool", "tool_call_id": "1", "content": "o" * 250}
    sizes = {answer["content"]: 200}
    plan = plan_compaction([task, answer, call, result], Budgets(32, 100, 40), sized(sizes))
    assert plan.tail[0] is call and plan.tail[1]["tool_call_id"] == "1"
    assert plan.tail[1]["content"] == "o" * 200 + " [... 50 characters dropped at compaction]"
    assert plan.older == [answer]
    assert plan.task["content"] == "t" * 160 + " [... 10 characters dropped at compaction]"
    # Messages other than tool results are never clipped in the tail.
    plan = plan_compaction([msg("user", "u" * 900)], Budgets(32, 100, 40), sized({}))
    assert plan.tail == [msg("user", "u" * 900)]


def test_the_compacted_conversation_reads_system_summary_task_then_the_tail():
    """The task the model must go on with comes before the recent turns, as it came first."""
    body = [msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2"), msg("assistant", "big")]
    system = msg("system", "rules")
    plan = plan_compaction([system, *body], Budgets(32, 25, 32), sized({"big": 100}))
    summary = summary_message("done so far", plan.older, "")
    assert assemble(plan, summary) == [system, summary, body[2], body[3]]
