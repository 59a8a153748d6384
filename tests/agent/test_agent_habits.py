"""What users of other coding agents reach for first, through Textual's pilot on the scripted
backend: project instructions (AGENTS.md, CLAUDE.md), @path mentions, a reason given with a
denial, and quitting with background jobs running."""

from __future__ import annotations

import asyncio

from ds4mlx.agent.app import AgentApp
from ds4mlx.agent.instructions import MAX_INSTRUCTION_CHARS
from ds4mlx.agent.loop import Agent
from ds4mlx.agent.mentions import MAX_ATTACHED_CHARS, attach_mentions, mentioned_paths
from ds4mlx.agent.permissions import Permissions
from ds4mlx.agent.tool_schemas import SYSTEM_PROMPT
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.widgets import PermissionScreen, QuitScreen
from ds4mlx.agent.workspace import Workspace

import pytest
from processes import processes_with, sleeper
from scripted_backend import ScriptedBackend, call, text
from test_agent_app import until
from textual.widgets import Static


def notes(app: AgentApp, kind: str = ".note") -> list[str]:
    return [str(widget.content) for widget in app.query(kind).results(Static)]


def make_app(workspace, store, turns=(), yolo=True) -> tuple[AgentApp, Agent]:
    toolbox = ToolBox(Workspace(workspace), bash_timeout=5.0)
    agent = Agent(ScriptedBackend(turns), toolbox, Permissions(yolo=yolo))
    return AgentApp(lambda: agent, store), agent


def play(app: AgentApp, scenario) -> None:
    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await until(pilot, lambda: app.agent is not None and not app.busy)
            await scenario(pilot)
        app.agent.toolbox.close()

    asyncio.run(main())


def texts_of_user(app: AgentApp) -> list[str]:
    return notes(app, ".user")


async def submit(pilot, line: str) -> None:
    pilot.app.query_one("#prompt").value = line
    await pilot.press("enter")


# ---------------------------------------------------------------- project instructions


def test_agents_md_reaches_the_models_first_request(workspace, store):
    (workspace / "AGENTS.md").write_text("Run tests with `make check`.\n")
    (workspace / "CLAUDE.md").write_text("Not this one.\n")
    app, agent = make_app(workspace, store)
    bare = Agent(ScriptedBackend(), ToolBox(Workspace(workspace.parent)), Permissions())

    async def scenario(pilot):
        await submit(pilot, "how do I test?")
        await until(pilot, lambda: agent.backend.requests and not app.busy)
        system = agent.backend.requests[0][0]["content"]
        assert system.startswith(SYSTEM_PROMPT)
        assert "Run tests with `make check`." in system and "Not this one." not in system
        shown = [n for n in notes(app) if "AGENTS.md" in n]
        assert shown == ["project instructions from AGENTS.md (1 line) are in the context"]
        # Counted in the context meter: the system prompt with them is larger.
        assert agent.context_tokens() > bare.context_tokens()

    play(app, scenario)


def test_claude_md_is_read_when_there_is_no_agents_md(workspace, store):
    (workspace / "CLAUDE.md").write_text("x" * (MAX_INSTRUCTION_CHARS + 100))
    _, agent = make_app(workspace, store)
    system = agent.messages[0]["content"]
    assert "from CLAUDE.md" in system and "[... CLAUDE.md cut here ...]" in system
    assert "x" * (MAX_INSTRUCTION_CHARS + 1) not in system


def test_no_instructions_file_leaves_the_system_prompt_alone(workspace, store):
    _, agent = make_app(workspace, store)
    assert agent.instructions is None and agent.messages[0]["content"] == SYSTEM_PROMPT


# ---------------------------------------------------------------- a reason with a denial


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        (["n", *"use the Makefile instead", "enter"], "use the Makefile instead"),
        (["n", "enter"], ""),
        (["n", *"never mind", "escape"], ""),
        (["escape"], ""),
    ],
)
def test_a_deny_reason_reaches_the_model(workspace, store, keys, reason):
    turns = [[call("bash", command="touch DENIED")], [text("Understood.")]]
    app, agent = make_app(workspace, store, turns, yolo=False)

    async def scenario(pilot):
        await submit(pilot, "build it")
        await until(pilot, lambda: isinstance(app.screen, PermissionScreen) and app.screen.armed)
        await pilot.press(*keys)
        await until(pilot, lambda: len(agent.backend.requests) == 2 and not app.busy)
        result = [m for m in agent.backend.requests[1] if m["role"] == "tool"][0]["content"]
        assert result.startswith("error: the user did not allow this bash call")
        if reason:
            assert result.endswith(f"; the user's reason: {reason}")
        else:
            assert "reason" not in result
        assert not (workspace / "DENIED").exists()

    play(app, scenario)


# ---------------------------------------------------------------- quitting with jobs


@pytest.mark.parametrize("quit_with", [["ctrl+q"], "/quit"])
def test_quitting_with_a_running_job_asks(workspace, store, quit_with):
    turns = [[call("bash", command=f"{sleeper(4263)} &")], [text("Started.")]]
    app, agent = make_app(workspace, store, turns)

    async def scenario(pilot):
        await submit(pilot, "start it")
        await until(pilot, lambda: not app.busy and agent.toolbox.jobs.running_jobs())

        async def ask_to_quit():
            if quit_with == "/quit":
                await submit(pilot, "/quit")
            else:
                await pilot.press(*quit_with)
            await until(pilot, lambda: isinstance(app.screen, QuitScreen))

        await ask_to_quit()
        assert sleeper(4263) in " ".join(app.screen.jobs)
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
        assert app.is_running and agent.toolbox.jobs.running_jobs()
        await ask_to_quit()
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running)

    play(app, scenario)
    assert not agent.toolbox.jobs.running_jobs()
    assert processes_with(sleeper(4263)) == []


def test_quitting_without_jobs_does_not_ask(workspace, store):
    app, _ = make_app(workspace, store)

    async def scenario(pilot):
        await pilot.press("ctrl+q")
        await until(pilot, lambda: not app.is_running)

    play(app, scenario)


# ---------------------------------------------------------------- @path mentions


def test_a_mention_attaches_the_file_and_a_climb_out_is_refused(workspace, store, outside):
    app, agent = make_app(workspace, store)

    async def scenario(pilot):
        await submit(pilot, "explain @src/app.py, and @../outside/secret.txt.")
        await until(pilot, lambda: agent.backend.requests and not app.busy)
        sent = agent.backend.requests[0][-1]["content"]
        assert sent.startswith("explain @src/app.py, and @../outside/secret.txt.\n\n")
        source = (workspace / "src" / "app.py").read_text()
        assert f'<file path="src/app.py">\n{source.rstrip()}\n</file>' in sent
        assert "top secret" not in sent
        assert "attached src/app.py (10 lines)" in notes(app)
        refused = notes(app, ".error")
        assert len(refused) == 1 and "@../outside/secret.txt: " in refused[0]
        assert "'..' is refused" in refused[0]
        assert texts_of_user(app) == ["explain @src/app.py, and @../outside/secret.txt."]

    play(app, scenario)


def test_a_large_mentioned_file_is_cut_with_a_marker(workspace, store):
    (workspace / "big.txt").write_text("".join(f"line {n}\n" for n in range(5000)))
    result = attach_mentions("look at @big.txt", Workspace(workspace))
    assert len(result.message) < MAX_ATTACHED_CHARS + 500
    assert "[... cut: big.txt goes on; read it from line" in result.message
    assert result.attached == [f"big.txt (5000 lines, cut to {MAX_ATTACHED_CHARS} characters)"]


@pytest.mark.parametrize(
    ("prompt", "paths"),
    [
        ("mail me at a@b.com", []),
        ("@README.md: what is it?", ["README.md"]),
        ("(see @src/app.py)", ["src/app.py"]),
        ('("@a.py")', ["a.py"]),
        ("see @src/app.py) and @src/app.py", ["src/app.py"]),
    ],
)
def test_what_counts_as_a_mention(prompt, paths):
    assert mentioned_paths(prompt) == paths


def test_tab_completes_a_mentioned_path_inside_the_workspace(workspace, store):
    app, agent = make_app(workspace, store)

    async def scenario(pilot):
        prompt = app.query_one("#prompt")
        await pilot.press(*"read @sr", "tab")
        assert prompt.text == "read @src/"
        await pilot.press(*"ap", "tab")
        assert prompt.text == "read @src/app.py"
        await pilot.press(" ", "@", ".", ".", "/", "tab")  # nothing outside is offered
        assert prompt.text == "read @src/app.py @../"

    play(app, scenario)
