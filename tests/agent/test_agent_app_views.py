"""What the app shows besides answers and tools, driven through the pilot on a scripted backend:
the status bar's every part, how a run's end is said, the thinking panel, a running command's
live output, a worker that fails, a blank prompt, Ctrl+C when idle and leaving on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

from ds4mlx.agent import app as app_module
from ds4mlx.agent.app import AgentApp
from ds4mlx.agent.loop import (
    CompactionFinished,
    CompactionStarted,
    RunFinished,
    TurnFinished,
    TurnStarted,
)
from ds4mlx.agent.widgets import ToolPanel
from ds4mlx.generation import Finished, PrefillProgress, ReasoningDelta

import pytest
from scripted_backend import call, text
from test_agent_app import answers, make_app, play, submit, texts, until
from textual.widgets import Collapsible


def status(app: AgentApp) -> str:
    return str(app.query_one("#status").content)


def turn_finished(context: int, generated: int, rate: float, tau: float | None):
    """A TurnFinished as ``_record_stats`` reads it (a real one needs a decoding run)."""
    acceptance = None if tau is None else SimpleNamespace(tau=tau)
    finished = SimpleNamespace(
        stats=SimpleNamespace(decode_tps=rate), completion_tokens=generated, acceptance=acceptance
    )
    return SimpleNamespace(finished=finished, context_tokens=context)


def test_the_status_bar_says_each_part_exactly(toolbox, store):
    app, agent = make_app(toolbox, store, yolo=False)

    async def scenario(pilot):
        # Before any prompt: the system prompt and tools already fill part of the context.
        assert agent.context_tokens() > 0
        assert status(app).startswith(f"ctx {agent.context_tokens()}/8192 (")
        app._record_stats(turn_finished(2048, 7, 12.345, 2.5))
        assert status(app) == (
            "ctx 2048/8192 (25%) │ 7 tok 12.3 t/s │ τ 2.50 │ think off │ scripted │ ready"
        )
        agent.settings.thinking = True
        app.pending.append("later")
        app._record_stats(turn_finished(8192, 1, 0.0, None))
        assert status(app) == (
            "ctx 8192/8192 (100%) │ 1 tok │ think on │ scripted │ ready │ 1 queued"
        )
        app.pending.clear()
        app._record_stats(turn_finished(8192, 1, 0.0, 0.0))  # a drafter that got nothing right
        assert "│ τ 0.00 │" in status(app)
        await app._show(CompactionStarted(8000, "full"))
        assert status(app).endswith("│ compacting…")
        await app._show(CompactionFinished(8000, 1000))
        assert app.stats.context_tokens == 1000
        await app._show(TurnStarted(1))
        assert status(app).startswith("ctx 1000/8192 (12%)") and status(app).endswith("generating…")
        await app._show(PrefillProgress(300, 1200, 2.0))
        assert status(app).endswith("│ prefill 300/1200 tokens, 150.0 t/s")

    play(app, scenario)


@pytest.mark.parametrize(
    ("run_end", "kind", "note"),
    [
        (RunFinished("cancelled"), ".note", "stopped"),
        (RunFinished("step_limit", error="20 model turns"), ".error", "step limit: 20 model turns"),
        (
            RunFinished("context_full", error="8100 of 8192 tokens"),
            ".error",
            "8100 of 8192 tokens: /compact or /new frees room",
        ),
    ],
)
def test_how_a_run_ended_is_said(toolbox, store, run_end, kind, note):
    app, _ = make_app(toolbox, store)

    async def scenario(pilot):
        before = texts(app, ".note") + texts(app, ".error")
        app._show_run_end(run_end)
        app._show_run_end(RunFinished("answer", answer="fine"))  # an answer needs no note
        await pilot.pause()
        assert texts(app, ".note") + texts(app, ".error") == [*before, note]
        assert texts(app, kind)[-1] == note

    play(app, scenario)


def test_thinking_is_shown_folded_one_panel_per_turn(toolbox, store):
    turns = [
        [ReasoningDelta("let me "), ReasoningDelta("\x1b[2Jthink"), text("Yes.")],
        [ReasoningDelta("again"), text("No.")],
    ]
    app, _ = make_app(toolbox, store, turns)

    async def scenario(pilot):
        await submit(pilot, "first")
        await until(pilot, lambda: answers(app) == ["Yes."] and not app.busy)
        await submit(pilot, "second")
        await until(pilot, lambda: answers(app) == ["Yes.", "No."] and not app.busy)
        assert texts(app, ".reasoning") == ["let me \\x1b[2Jthink", "again"]
        folded = [panel for panel in app.query(Collapsible) if panel.title == "thinking"]
        assert len(folded) == 2 and all(panel.collapsed for panel in folded)

    play(app, scenario)


class Output:
    """A running job's output as ``_show_live`` reads it."""

    def __init__(self, data: str) -> None:
        self.data = data
        self.total = len(data)
        self.asked: list[int] = []

    def text_since(self, position: int) -> tuple[str, int]:
        self.asked.append(position)
        return self.data[position:], self.total


def test_live_output_shows_the_last_lines_of_the_last_bytes(toolbox, store):
    app, agent = make_app(toolbox, store)

    async def scenario(pilot):
        panel = ToolPanel(app_module.ToolCall("bash", {"command": "make"}), "c1")
        app._mount(panel)
        agent.toolbox.jobs.current = Output("")
        app._show_live(panel)
        assert panel.collapsed  # nothing written yet: nothing shown
        short = Output("".join(f"line {n}\n" for n in range(20)))
        agent.toolbox.jobs.current = short
        app._show_live(panel)
        assert short.asked == [0]
        shown = panel.body.content.renderables[1].plain
        assert shown == "\n".join(f"line {n}" for n in range(8, 20))
        long = Output("x" * 5000)
        agent.toolbox.jobs.current = long
        app._show_live(panel)
        assert long.asked == [5000 - 2048]
        assert panel.body.content.renderables[1].plain == "x" * 2048

    play(app, scenario)


def test_a_failing_worker_leaves_an_error_and_the_app_ready(toolbox, store):
    app, _ = make_app(toolbox, store)

    def events():
        yield TurnStarted(1)
        raise RuntimeError("backend gone")

    async def scenario(pilot):
        app._drive(events())
        await until(pilot, lambda: not app.busy)
        assert texts(app, ".error") == ["error: backend gone"]
        assert status(app).endswith("│ ready")

    play(app, scenario)


def test_a_blank_prompt_is_ignored_and_ctrl_c_when_idle_clears_the_prompt(toolbox, store):
    app, agent = make_app(toolbox, store)

    async def scenario(pilot):
        prompt = app.query_one("#prompt")
        await submit(pilot, "   ")
        await pilot.pause(0.05)
        assert texts(app, ".user") == [] and not app.pending and not agent.backend.requests
        assert prompt.prompts.entries == []
        await submit(pilot, "  hello  ")
        await until(pilot, lambda: answers(app) == ["done"] and not app.busy)
        assert prompt.prompts.entries == ["hello"]  # Up brings it back, stripped
        prompt.value = "half a thought"
        await pilot.press("ctrl+c")
        assert prompt.value == "" and app.is_running

    play(app, scenario)


def test_quit_with_words_after_it_asks_about_jobs_like_ctrl_q(toolbox, store):
    app, agent = make_app(toolbox, store)
    asked = []

    async def scenario(pilot):
        app.action_quit_agent = lambda: asked.append("quit")  # where jobs are asked about
        await submit(pilot, "/quit now")
        await pilot.pause(0.05)
        assert asked == ["quit"] and app.is_running and not app.pending

    play(app, scenario)
    assert not agent.backend.requests


async def saved_then_removed(pilot, agent, prompt: str, answer: str) -> Path:
    """Run one prompt to its answer; the conversation's file, removed to see it saved again."""
    app = pilot.app
    await submit(pilot, prompt)
    await until(pilot, lambda: answers(app) == [answer] and not app.busy)
    saved = app.store.folder / f"{agent.conversation.name}.json"
    saved.unlink()
    return saved


def test_sigterm_saves_the_conversation_and_exits_with_its_signal(toolbox, store):
    app, agent = make_app(toolbox, store, [[text("Saved?")]])

    async def scenario(pilot):
        saved = await saved_then_removed(pilot, agent, "remember this", "Saved?")
        app.terminate(signal.SIGTERM)
        await until(pilot, lambda: not app.is_running)
        assert saved.exists() and "remember this" in saved.read_text()

    play(app, scenario)
    assert app.return_code == 128 + signal.SIGTERM
    assert agent.cancel.is_set()


def test_no_mention_is_completed_before_the_model_is_loaded(toolbox, store):
    app, _ = make_app(toolbox, store)
    assert app._complete_mention("@sr") is None
    app.agent = app.load_agent()
    assert app._complete_mention("@sr") == "c/"


def test_the_conversation_is_saved_after_each_turn_run_and_compaction(toolbox, store):
    app, agent = make_app(toolbox, store, [[text("Kept.")]])
    ends = [
        TurnFinished(Finished("stop", 10, 1, 0), 11),
        RunFinished("answer", answer="Kept."),
        CompactionFinished(11, 5),
    ]

    async def scenario(pilot):
        saved = await saved_then_removed(pilot, agent, "keep me", "Kept.")
        for end in ends:
            app._drive(iter([end]))
            await until(pilot, lambda: not app.busy)
            assert saved.exists(), end
            saved.unlink()

    play(app, scenario)


def test_ctrl_q_saves_the_conversation(toolbox, store):
    app, agent = make_app(toolbox, store, [[text("Kept.")]])

    async def scenario(pilot):
        saved = await saved_then_removed(pilot, agent, "keep me", "Kept.")
        await pilot.press("ctrl+q")
        await until(pilot, lambda: not app.is_running)
        assert "keep me" in saved.read_text()

    play(app, scenario)


def test_a_redrawn_turn_without_text_shows_no_empty_answer(toolbox, store):
    app, _ = make_app(toolbox, store, [[call("list", path="src")], [text("Three files.")]])

    async def scenario(pilot):
        await submit(pilot, "what is in src?")
        await until(pilot, lambda: answers(app) == ["Three files."] and not app.busy)
        app._redraw_conversation()
        await pilot.pause()
        assert answers(app) == ["Three files."]
        assert texts(app, ".user") == ["what is in src?"]
        assert [panel.title for panel in app.query(ToolPanel)] == ["✓ list src"]

    play(app, scenario)
