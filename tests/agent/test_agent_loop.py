"""The agent loop driven by a scripted backend: tool calls run and their results go back to the
model; malformed calls, denials, the step limit, cancellation and backend errors end well."""

from __future__ import annotations

import threading
import time

from ds4mlx.agent.backend import BackendError
from ds4mlx.agent.loop import (
    Agent,
    AgentSettings,
    FilesAttached,
    MalformedToolCall,
    PermissionRequest,
    RunFinished,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from ds4mlx.agent.permissions import Decision, Permissions
from ds4mlx.agent.tool_schemas import SYSTEM_PROMPT
from ds4mlx.agent.tools import describe_call
from ds4mlx.engine.chat import ReasoningDelta, TextDelta
from ds4mlx.generation import PrefillProgress

import pytest
from scripted_backend import ScriptedBackend, SizedBackend, call, malformed, text


def make_agent(toolbox, turns, yolo=True, **settings) -> tuple[Agent, ScriptedBackend]:
    backend = ScriptedBackend(turns)
    return Agent(backend, toolbox, Permissions(yolo=yolo), AgentSettings(**settings)), backend


def finished(events) -> RunFinished:
    assert isinstance(events[-1], RunFinished)
    return events[-1]


def test_a_tool_call_runs_and_its_result_goes_back_to_the_model(toolbox):
    agent, backend = make_agent(
        toolbox,
        [
            [text("Let me look."), call("list", path="src")],
            [text("There are three files.")],
        ],
    )
    events = list(agent.run("What is in src?"))
    assert finished(events).reason == "answer"
    assert finished(events).answer == "There are three files."
    started = [e for e in events if isinstance(e, ToolStarted)]
    results = [e for e in events if isinstance(e, ToolFinished)]
    assert [e.call.name for e in started] == ["list"]
    assert "app.py" in results[0].result.output
    assert sum(isinstance(e, TurnFinished) for e in events) == 2
    # The second request carries the call and its result, linked by id.
    second = backend.requests[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[0]["content"] == SYSTEM_PROMPT
    assistant, tool = second[2], second[3]
    assert assistant["content"] == "Let me look."
    assert assistant["tool_calls"][0]["function"] == {"name": "list", "arguments": {"path": "src"}}
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert "app.py" in tool["content"]


def test_text_streams_as_it_comes(toolbox):
    agent, _ = make_agent(toolbox, [[text("Hel"), text("lo")]])
    deltas = [e.text for e in agent.run("hi") if isinstance(e, TextDelta)]
    assert deltas == ["Hel", "lo"]


def test_several_calls_in_one_turn_run_in_order(toolbox, workspace):
    agent, backend = make_agent(
        toolbox,
        [
            [call("write", path="notes.txt", content="a\n"), call("read", path="notes.txt")],
            [text("ok")],
        ],
    )
    list(agent.run("note it"))
    tools = [m for m in backend.requests[1] if m["role"] == "tool"]
    assert tools[0]["content"].startswith("wrote notes.txt")
    assert tools[1]["content"] == "    1  a"


def test_a_malformed_call_is_reported_to_the_model(toolbox):
    agent, backend = make_agent(
        toolbox,
        [
            [malformed('<｜DSML｜invoke nam="list">', "invoke tag without a name")],
            [call("list", path=".")],
            [text("fixed")],
        ],
    )
    events = list(agent.run("list"))
    assert finished(events).reason == "answer"
    bad = [e for e in events if isinstance(e, MalformedToolCall)]
    assert bad[0].error.reason == "invoke tag without a name"
    report = backend.requests[1][-1]
    assert report["role"] == "tool" and "could not be understood" in report["content"]
    assert 'nam="list"' in report["content"]


def test_tool_errors_go_back_as_results(toolbox):
    agent, backend = make_agent(toolbox, [[call("read", path="missing.py")], [text("sorry")]])
    events = list(agent.run("read it"))
    result = next(e for e in events if isinstance(e, ToolFinished)).result
    assert result.is_error and "does not exist" in backend.requests[1][-1]["content"]


def test_the_step_limit_ends_a_run(toolbox):
    agent, backend = make_agent(toolbox, [[call("list", path=".")]] * 10, max_steps=3)
    events = list(agent.run("loop forever"))
    assert finished(events).reason == "step_limit"
    assert len(backend.requests) == 3
    assert "3 model turns" in finished(events).error


def test_backend_errors_end_the_run_with_a_message(toolbox):
    class Failing(ScriptedBackend):
        def chat(self, *args, **kwargs):
            raise BackendError("server unreachable")

    agent = Agent(Failing(), toolbox)
    run = finished(list(agent.run("hello")))
    assert run.reason == "error" and run.error == "server unreachable"


def test_cancelling_during_generation(toolbox):
    agent, backend = make_agent(toolbox, [])
    backend.turns.append(
        [
            text("partial "),
            lambda: agent.stop(),
            text("never shown"),
            call("bash", command="touch should-not-exist"),
        ]
    )
    events = list(agent.run("go"))
    assert finished(events).reason == "cancelled"
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["partial "]
    assert backend.closed == 1
    last = agent.messages[-1]
    assert last == {"role": "assistant", "content": "partial "}  # no call left pending
    # The next prompt runs normally.
    backend.turns.append([text("fresh")])
    assert finished(list(agent.run("again"))).answer == "fresh"


def test_cancelling_a_running_command(toolbox):
    agent, _ = make_agent(toolbox, [[call("bash", command="sleep 30"), call("list", path=".")]])
    threading.Timer(0.5, agent.stop).start()
    started = time.monotonic()
    events = list(agent.run("wait"))
    assert time.monotonic() - started < 20  # stopped, not the 30 s run (slack for a load)
    assert finished(events).reason == "cancelled"
    results = [m["content"] for m in agent.messages if m["role"] == "tool"]
    assert "stopped by the user" in results[0] and "not run" in results[1]


def answer_each(agent: Agent, prompt: str, decisions: list[Decision]) -> list:
    """Run ``prompt``, answering permission requests with ``decisions`` in order."""
    events = []
    for event in agent.run(prompt):
        if isinstance(event, PermissionRequest):
            event.answer(decisions.pop(0))
        events.append(event)
    return events


def test_permission_denied_leaves_the_workspace_alone(toolbox, workspace):
    agent, backend = make_agent(
        toolbox, [[call("write", path="x.txt", content="x")], [text("ok")]], yolo=False
    )
    events = answer_each(agent, "write", [Decision.DENY])
    assert sum(isinstance(e, PermissionRequest) for e in events) == 1
    assert not (workspace / "x.txt").exists()
    assert "did not allow" in backend.requests[1][-1]["content"]


def test_permission_once_asks_again_next_time(toolbox, workspace):
    turns = [[call("bash", command="echo one")], [call("bash", command="echo two")], [text("ok")]]
    agent, backend = make_agent(toolbox, turns, yolo=False)
    events = answer_each(agent, "run", [Decision.ALLOW_ONCE, Decision.ALLOW_ONCE])
    assert sum(isinstance(e, PermissionRequest) for e in events) == 2
    assert backend.requests[2][-1]["content"] == "two"


def test_permission_always_is_scoped_to_the_exact_command(toolbox):
    turns = [
        [call("bash", command="echo one")],
        [call("bash", command="echo one")],
        [call("bash", command="echo two")],
        [call("edit", path="README.md", old="A demo", new="A DEMO")],
        [call("edit", path="README.md", old="A DEMO", new="A demo")],
        [text("ok")],
    ]
    agent, _ = make_agent(toolbox, turns, yolo=False)
    events = answer_each(
        agent, "run", [Decision.ALLOW_ALWAYS, Decision.ALLOW_ONCE, Decision.ALLOW_ALWAYS]
    )
    asked = [describe_call(e.call) for e in events if isinstance(e, PermissionRequest)]
    # "always" for a command never covers another command; for edit it covers the tool
    assert asked == ["bash echo one", "bash echo two", "edit README.md"]


def test_permission_prefix_covers_only_simple_commands_with_that_prefix(toolbox):
    commands = [
        "git diff --stat",
        "git diff README.md",
        "git diff; touch HIDDEN",
        "git diff > out.txt",
        "git status",
    ]
    turns = [[call("bash", command=command)] for command in commands] + [[text("ok")]]
    agent, _ = make_agent(toolbox, turns, yolo=False)
    events = answer_each(agent, "run", [Decision.ALLOW_PREFIX] + [Decision.DENY] * 3)
    asked = [e.call.arguments["command"] for e in events if isinstance(e, PermissionRequest)]
    assert asked == [
        "git diff --stat",
        "git diff; touch HIDDEN",
        "git diff > out.txt",
        "git status",
    ]


def test_reading_never_asks(toolbox):
    agent, _ = make_agent(
        toolbox,
        [[call("read", path="README.md"), call("list"), call("search", pattern="x")], [text("ok")]],
        yolo=False,
    )
    events = list(agent.run("look"))
    assert not any(isinstance(e, PermissionRequest) for e in events)


def test_an_unanswered_request_is_a_denial(toolbox, workspace):
    agent, _ = make_agent(
        toolbox, [[call("write", path="y.txt", content="y")], [text("ok")]], yolo=False
    )
    list(agent.run("write"))
    assert not (workspace / "y.txt").exists()


def test_an_edit_known_to_fail_is_failed_without_asking(toolbox, workspace):
    agent, backend = make_agent(
        toolbox,
        [[call("edit", path="README.md", old="not in the file", new="x")], [text("I see.")]],
        yolo=False,
    )
    events = list(agent.run("edit it"))
    assert not any(isinstance(e, PermissionRequest) for e in events)
    result = next(e for e in events if isinstance(e, ToolFinished)).result
    assert result.is_error and "old text was not found" in result.output
    tool = [m for m in backend.requests[1] if m["role"] == "tool"][0]
    assert "old text was not found" in tool["content"] and tool["is_error"]
    assert (workspace / "README.md").read_text() == "# demo\nA demo project.\n"
    assert finished(events).reason == "answer"


def test_a_turn_asks_for_no_more_tokens_than_the_context_has_left(toolbox):
    """A turn's budget is the per-turn setting, cut to the room the conversation leaves in
    the context (fresh6's loop_turn_not_clamped_to_the_room_left)."""
    agent, backend = make_agent(toolbox, [[text("short")], [text("again")]], max_tokens=100_000)
    list(agent.run("hello"))
    asked = backend.count_tokens(backend.requests[0], toolbox.schemas, thinking=False)
    assert backend.max_tokens[0] == backend.context_size - asked - 1 < 100_000
    agent.settings.max_tokens = 64
    list(agent.run("hello again"))
    assert backend.max_tokens[1] == 64


def test_a_conversation_one_token_short_of_the_context_starts_no_turn(toolbox):
    """The prompt plus the one token a turn needs must fit: a prompt of context - 1 tokens
    leaves no room (fresh8's loop_turn_with_no_room_left_started)."""
    backend = SizedBackend([[text("never asked")]], size=99, context_size=100)
    events = list(Agent(backend, toolbox, Permissions(yolo=True)).run("hello"))
    assert finished(events) == RunFinished(
        "context_full",
        "",
        "the conversation (99 tokens) leaves no room in the context of 100 tokens",
    )
    assert backend.requests == [] and not any(isinstance(e, TurnStarted) for e in events)


def test_a_conversation_two_tokens_short_of_the_context_gets_a_one_token_turn(toolbox):
    backend = SizedBackend([[text("y")]], size=98, context_size=100)
    events = list(Agent(backend, toolbox, Permissions(yolo=True)).run("hello"))
    assert finished(events) == RunFinished("answer", "y")
    assert backend.max_tokens == [1]


def test_calls_left_unrun_by_a_stop_go_back_as_failed(toolbox, workspace):
    """A call the user's stop kept from running is reported to the model as a failure, like a
    denial (fresh8's loop_unrun_call_results_not_errors)."""
    agent, backend = make_agent(
        toolbox,
        [[call("write", path="a.txt", content="a"), call("write", path="b.txt", content="b")]],
        yolo=False,
    )
    for event in agent.run("write both"):
        if isinstance(event, PermissionRequest):
            event.answer(Decision.DENY)
            agent.stop()
    first, second = [m for m in agent.messages if m["role"] == "tool"]
    assert first["is_error"] and "did not allow" in first["content"]
    assert second == {
        "role": "tool",
        "tool_call_id": agent.messages[-3]["tool_calls"][1]["id"],
        "content": "error: not run; the user stopped the agent",
        "is_error": True,
    }
    assert not (workspace / "a.txt").exists() and not (workspace / "b.txt").exists()


def test_a_malformed_call_goes_back_as_failed(toolbox):
    agent, backend = make_agent(toolbox, [[malformed()], [text("fixed")]])
    list(agent.run("list"))
    report = backend.requests[1][-1]
    assert report["is_error"] is True and report["role"] == "tool"


def test_each_turn_is_numbered_from_one_and_reports_its_context(toolbox):
    agent, backend = make_agent(toolbox, [[call("list", path=".")], [text("done")]])
    events = list(agent.run("look"))
    assert [e.step for e in events if isinstance(e, TurnStarted)] == [1, 2]
    for turn in [e for e in events if isinstance(e, TurnFinished)]:
        # The context after a turn holds its prompt and what it generated (5 tokens here).
        assert turn.context_tokens == turn.finished.prompt_tokens + 5
        assert turn.finished.completion_tokens == 5


def test_a_run_is_marked_running_until_it_ends(toolbox):
    agent, _ = make_agent(toolbox, [[text("hi")]])
    seen = [agent.running for _ in agent.run("hello")]
    assert seen and all(seen) and not agent.running


class ThinkingCountsMore(ScriptedBackend):
    """Reasoning makes the prompt longer: the count must be asked with the run's setting."""

    def count_tokens(self, messages, tools, *, thinking: bool) -> int:
        return super().count_tokens(messages, tools, thinking=thinking) + 1000 * thinking


def test_thinking_is_asked_of_the_model_and_counted_in_the_context(toolbox):
    backend = ThinkingCountsMore([[text("hm")]])
    agent = Agent(backend, toolbox, Permissions(yolo=True), AgentSettings(thinking=True))
    thinking_size = backend.count_tokens(agent.messages, toolbox.schemas, thinking=True)
    assert agent.context_tokens() == thinking_size
    agent.settings.max_tokens = 100_000
    list(agent.run("think"))
    assert backend.thinking == [True]
    asked = backend.count_tokens(backend.requests[0], toolbox.schemas, thinking=True)
    assert backend.max_tokens == [backend.context_size - asked - 1]


def test_reasoning_streams_and_is_kept_with_the_answer(toolbox):
    progress = PrefillProgress(done=10, total=20, seconds=0.5)
    agent, _ = make_agent(
        toolbox, [[progress, ReasoningDelta("first, "), ReasoningDelta("then"), text("ok")]]
    )
    events = list(agent.run("why?"))
    assert progress in events
    assert [e.text for e in events if isinstance(e, ReasoningDelta)] == ["first, ", "then"]
    assert agent.messages[-1] == {
        "role": "assistant",
        "content": "ok",
        "reasoning_content": "first, then",
    }


def test_text_the_markup_filter_held_back_comes_out_at_the_end(toolbox):
    agent, _ = make_agent(toolbox, [[text("a <")]])
    events = list(agent.run("hi"))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "a <"
    assert finished(events).answer == "a <" and agent.messages[-1]["content"] == "a <"


class Unfinished(ScriptedBackend):
    """A stream that ends without its Finished event (a server that hung up)."""

    def chat(self, messages, tools, *, max_tokens: int, thinking: bool):
        self.requests.append(list(messages))
        yield text("partial")
        yield call("list", path=".")


def test_a_stream_that_ends_unfinished_is_an_error_and_runs_no_call(toolbox):
    agent = Agent(Unfinished(), toolbox, Permissions(yolo=True))
    events = list(agent.run("go"))
    assert finished(events) == RunFinished(
        "error", "partial", "the model's stream ended unfinished"
    )
    assert not any(isinstance(e, (TurnFinished, ToolStarted)) for e in events)
    assert agent.messages[-1] == {"role": "assistant", "content": "partial"}


def test_two_calls_of_one_turn_get_their_own_ids(toolbox):
    agent, _ = make_agent(toolbox, [[call("list", path="."), call("list", path="src")]])
    list(agent.run("look"))
    assistant = next(m for m in agent.messages if m.get("tool_calls"))
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 2
    assert [m["tool_call_id"] for m in agent.messages if m["role"] == "tool"] == ids


def test_a_failing_tool_goes_back_flagged_as_failed(toolbox):
    agent, backend = make_agent(toolbox, [[call("read", path="missing.py")], [text("sorry")]])
    list(agent.run("read it"))
    assert backend.requests[1][-1]["is_error"] is True
    agent, backend = make_agent(toolbox, [[call("read", path="README.md")], [text("ok")]])
    list(agent.run("read it"))
    assert "is_error" not in backend.requests[1][-1]


def test_the_users_reason_for_a_denial_reaches_the_model(toolbox):
    agent, backend = make_agent(
        toolbox, [[call("write", path="x.txt", content="x")], [text("ok")]], yolo=False
    )
    for event in agent.run("write"):
        if isinstance(event, PermissionRequest):
            event.answer(Decision.DENY, "use notes.txt")
    assert backend.requests[1][-1]["content"] == (
        "error: the user did not allow this write call; the user's reason: use notes.txt"
    )


def test_mentions_that_were_all_refused_are_reported(toolbox):
    agent, backend = make_agent(toolbox, [[text("ok")]])
    events = list(agent.run("look at @missing.txt"))
    assert events[0] == FilesAttached([], ["@missing.txt: no such file in the workspace"])


@pytest.mark.parametrize(("length", "shown"), [(400, "x" * 400), (401, "x" * 400 + "...")])
def test_a_malformed_call_is_quoted_up_to_400_characters(toolbox, length, shown):
    agent, backend = make_agent(toolbox, [[malformed("x" * length)], [text("ok")]])
    list(agent.run("go"))
    assert backend.requests[1][-1]["content"].endswith("The call was:\n" + shown)


def test_a_bash_call_without_git_is_checkpointed_so_undo_names_what_it_removed(toolbox, workspace):
    agent, _ = make_agent(toolbox, [[call("bash", command="rm README.md")], [text("gone")]])
    list(agent.run("remove the readme"))
    assert not (workspace / "README.md").exists()
    said = agent.checkpoints.undo()
    assert "not restored" in said and "README.md" in said


def test_a_checkpoint_that_fails_is_noted_and_the_tool_still_runs(toolbox, workspace):
    agent, _ = make_agent(toolbox, [[call("bash", command="echo hi > made.txt")], [text("ok")]])

    def full_disk(**_):
        raise OSError("No space left on device")

    agent.checkpoints.before_tool = full_disk
    events = list(agent.run("make it"))
    assert finished(events).reason == "answer"
    assert (workspace / "made.txt").read_text() == "hi\n"
    assert agent.checkpoints.problem == "No space left on device"
