"""Compaction: at 85% of the context and never before, the context shrinks below half, the
system prompt, the current task, open job state and the last turn survive, and the session
still answers."""

from __future__ import annotations

from ds4mlx.agent import compaction
from ds4mlx.agent.backend import BackendError
from ds4mlx.agent.loop import Agent, CompactionFinished, CompactionStarted, RunFinished
from ds4mlx.agent.permissions import Permissions
from ds4mlx.agent.tool_schemas import SYSTEM_PROMPT

import pytest
from scripted_backend import ScriptedBackend, SizedBackend, call, text

CONTEXT = 8192


def fill(agent: Agent, share: float) -> None:
    """Grow the conversation with realistic turns until it takes ``share`` of the context."""
    number = 0
    while agent.context_tokens() < share * CONTEXT:
        number += 1
        agent.messages.extend(
            [
                {"role": "user", "content": f"Question {number}: what does module {number} do?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": f"c{number}",
                            "type": "function",
                            "function": {"name": "read", "arguments": {"path": f"m{number}.py"}},
                        }
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": f"c{number}",
                    "content": f"    1  # module {number}\n" + "    2  x = 1\n" * 20,
                },
                {"role": "assistant", "content": f"Module {number} sets x to 1."},
            ]
        )
    # Trim back to just under the target so tests can place the conversation on either side.
    while agent.context_tokens() >= share * CONTEXT:
        agent.messages.pop()


def make_agent(toolbox) -> tuple[Agent, ScriptedBackend]:
    backend = ScriptedBackend(context_size=CONTEXT)
    return Agent(backend, toolbox, Permissions(yolo=True)), backend


def is_summary_request(messages) -> bool:
    return messages[0]["content"] == compaction.SUMMARY_INSTRUCTIONS


def test_no_compaction_below_85_percent(toolbox):
    agent, backend = make_agent(toolbox)
    fill(agent, 0.845)
    events = list(agent.run("next?"))
    request = backend.count_tokens(backend.requests[0], toolbox.schemas, thinking=False)
    assert 0.84 * CONTEXT <= request < 0.85 * CONTEXT
    assert not any(isinstance(e, CompactionStarted) for e in events)
    assert not any(is_summary_request(r) for r in backend.requests)


def test_automatic_compaction_at_85_percent(toolbox):
    agent, backend = make_agent(toolbox)
    fill(agent, 0.88)
    backend.turns.extend([[text("Modules 1 to 9 each set x to 1.")], [text("All set x.")]])
    before = agent.context_tokens()
    events = list(agent.run("Summarise what you found."))
    started = next(e for e in events if isinstance(e, CompactionStarted))
    done = next(e for e in events if isinstance(e, CompactionFinished))
    assert started.tokens == done.tokens_before >= 0.85 * CONTEXT
    assert done.tokens_after < 0.5 * done.tokens_before
    assert is_summary_request(backend.requests[0])
    # The turn after compaction sees the compacted conversation, and answers.
    assert events[-1] == RunFinished("answer", "All set x.")
    messages = agent.messages
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert messages[1]["content"].startswith(compaction.SUMMARY_HEADER)
    assert "Modules 1 to 9 each set x to 1." in messages[1]["content"]
    assert "Question 1: what does module 1 do?" in messages[1]["content"]  # requests survive
    assert messages[-2] == {"role": "user", "content": "Summarise what you found."}
    assert messages[-1]["content"] == "All set x."
    assert agent.context_tokens() < before / 2


def test_compact_command_shrinks_and_keeps_the_last_turn(toolbox):
    agent, backend = make_agent(toolbox)
    fill(agent, 0.6)
    last_turn = agent.messages[-4:]
    before = agent.context_tokens()
    backend.turns.append([text("summary of the work")])
    events = list(agent.compact())
    assert events[-1].tokens_after < before / 2 and events[-1].compacted
    assert agent.messages[0]["content"] == SYSTEM_PROMPT
    assert agent.messages[-len(last_turn) :][-1] == last_turn[-1]
    backend.turns.append([text("still here")])
    assert list(agent.run("are you there?"))[-1].answer == "still here"


def test_current_task_and_open_jobs_survive(toolbox):
    agent, backend = make_agent(toolbox)
    toolbox.run(call("bash", command="sleep 30 &").call)
    agent.messages.append({"role": "user", "content": "Refactor every module."})
    for number in range(40):  # a long tool-using turn: the request itself gets old
        agent.messages.extend(
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": f"r{number}",
                            "type": "function",
                            "function": {"name": "read", "arguments": {"path": f"m{number}.py"}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": f"r{number}", "content": "x = 1\n" * 30},
            ]
        )
    backend.turns.append([text("")])  # a model that writes no summary at all
    list(agent.compact())
    summary = agent.messages[1]["content"]
    assert "(the model wrote no summary)" in summary
    assert "job 1 running" in summary
    assert {"role": "user", "content": "Refactor every module."} in agent.messages[2:]
    # The kept tail never starts with a result separated from its call.
    kept_ids = {c["id"] for m in agent.messages for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in kept_ids for m in agent.messages if m["role"] == "tool")


def test_compaction_that_would_not_shrink_changes_nothing(toolbox):
    agent, backend = make_agent(toolbox)
    agent.messages.extend(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    )
    before = list(agent.messages)
    backend.turns.append([text("a summary far longer than the conversation " * 20)])
    events = list(agent.compact())
    assert events[-1].note == "nothing to compact" and not events[-1].compacted
    assert agent.messages == before


def test_compaction_that_would_leave_the_size_unchanged_changes_nothing(toolbox):
    """A compacted conversation of exactly the size it had is no gain: the turns are kept
    verbatim (fresh8's loop_compaction_of_equal_size_kept)."""
    backend = SizedBackend(size=500, context_size=CONTEXT)
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    for number in range(4):
        agent.messages.extend(
            [
                {"role": "user", "content": f"Question {number}?"},
                {"role": "assistant", "content": f"Answer {number}."},
            ]
        )
    before = list(agent.messages)
    backend.turns.append([text("a summary")])
    events = list(agent.compact())
    assert events[-1] == CompactionFinished(500, 500, "nothing to compact")
    assert agent.messages == before and len(before) == 9


def test_a_huge_last_tool_result_is_clipped(toolbox):
    agent, backend = make_agent(toolbox)
    fill(agent, 0.3)
    agent.messages.extend(
        [
            {"role": "user", "content": "show the log"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "big",
                        "type": "function",
                        "function": {"name": "bash", "arguments": {"command": "cat log"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "big", "content": "log line\n" * 2500},
        ]
    )
    before = agent.context_tokens()
    backend.turns.append([text("summary")])
    list(agent.compact())
    assert agent.context_tokens() < before / 2
    assert agent.messages[-1]["tool_call_id"] == "big"
    assert "dropped at compaction" in agent.messages[-1]["content"]


def test_strip_drops_tool_outputs(toolbox):
    agent, _ = make_agent(toolbox)
    fill(agent, 0.5)
    before = agent.context_tokens()
    assert agent.strip_tool_outputs() > 0
    assert agent.context_tokens() < before
    assert agent.strip_tool_outputs() == 0


@pytest.mark.parametrize(("tokens", "expected"), [(849, False), (850, True), (1000, True)])
def test_threshold(tokens, expected):
    assert compaction.should_compact(tokens, 1000) is expected


def test_the_turn_after_automatic_compaction_gets_the_room_compaction_made(toolbox):
    agent, backend = make_agent(toolbox)
    agent.settings.max_tokens = 100_000
    fill(agent, 0.88)
    backend.turns.extend([[text("the summary")], [text("answer")]])
    events = list(agent.run("go on"))
    assert next(e for e in events if isinstance(e, CompactionStarted)).reason == (
        "the context is 85% full"
    )
    asked = backend.count_tokens(backend.requests[1], toolbox.schemas, thinking=False)
    assert asked < 0.5 * CONTEXT and backend.max_tokens[1] == CONTEXT - asked - 1


def test_a_stop_while_the_summary_is_written_ends_the_run_unchanged(toolbox):
    agent, backend = make_agent(toolbox)
    fill(agent, 0.88)
    backend.turns.append([text("Modules "), agent.stop, text("1 to 9.")])
    kept = list(agent.messages)
    events = list(agent.run("go on"))
    assert events[-2:] == [
        CompactionFinished(events[-2].tokens_before, events[-2].tokens_before, "cancelled"),
        RunFinished("cancelled", ""),
    ]
    assert len(backend.requests) == 1 and backend.closed == 1  # the summary stopped there
    assert agent.messages == [*kept, {"role": "user", "content": "go on"}]


def test_a_summary_that_fails_leaves_the_conversation_as_it_was(toolbox):
    agent, backend = make_agent(toolbox)
    fill(agent, 0.6)
    kept = list(agent.messages)

    def fail():
        raise BackendError("server gone")

    backend.turns.append([text("partial"), fail])
    events = list(agent.compact())
    before = events[0].tokens
    assert events[-1] == CompactionFinished(before, before, "the summary failed: server gone")
    assert agent.messages == kept


class SummaryCounted(ScriptedBackend):
    """A summary request counts one token a character of its transcript, plus ``extra``:
    places it exactly at the context's end."""

    extra = 0

    def count_tokens(self, messages, tools, *, thinking: bool) -> int:
        if is_summary_request(messages):
            return len(messages[1]["content"]) + self.extra
        return super().count_tokens(messages, tools, thinking=thinking)


def summarised_transcript(agent: Agent, backend: ScriptedBackend) -> str:
    budgets = compaction.Budgets.for_context(CONTEXT)
    plan = compaction.plan_compaction(
        agent.messages, budgets, lambda m: backend.count_tokens([m], (), thinking=False)
    )
    return compaction.transcript(plan.older)


@pytest.mark.parametrize("over", [0, -1])
def test_a_summary_request_must_leave_room_for_the_summary(toolbox, over):
    """The request plus the summary's budget must stay below the context: exactly at it, the
    oldest fifth of the transcript is cut; one token less, it goes whole."""
    backend = SummaryCounted(context_size=CONTEXT)
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    fill(agent, 0.6)
    whole = summarised_transcript(agent, backend)
    summary_budget = compaction.Budgets.for_context(CONTEXT).summary
    backend.extra = CONTEXT - summary_budget - len(whole) + over
    backend.turns.append([text("Modules 1 to 9 "), text("set x.")])
    assert list(agent.compact())[-1].compacted
    sent = backend.requests[0][1]["content"]
    assert sent == (whole if over < 0 else whole[len(whole) - int(len(whole) * 0.8) :])
    assert backend.max_tokens == [summary_budget] and backend.thinking == [False]
    assert "Modules 1 to 9 set x." in agent.messages[1]["content"]


def test_a_short_transcript_is_sent_whole_even_when_it_does_not_fit(toolbox):
    backend = SummaryCounted(context_size=CONTEXT)
    backend.extra = CONTEXT  # never fits
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    agent.messages.extend(
        [
            {"role": "user", "content": "first question " * 5},
            {"role": "assistant", "content": "first answer " * 5},
            {"role": "user", "content": "second question"},
            {"role": "assistant", "content": "a long second answer " * 200},
        ]
    )
    whole = summarised_transcript(agent, backend)
    assert 100 < len(whole) < 200
    backend.turns.append([text("summary")])
    list(agent.compact())
    assert backend.requests[0][1]["content"] == whole
