"""A long local prefill through Textual's pilot on the tiny model: the status bar shows its
progress (tokens done / total, t/s), Ctrl+C stops it within one chunk, and the next prompt
reuses the prefix it had prefilled."""

from __future__ import annotations

import asyncio
import re

import ds4mlx
from ds4mlx.agent.app import AgentApp
from ds4mlx.agent.backend import LocalBackend
from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.loop import Agent
from ds4mlx.agent.permissions import Permissions
from ds4mlx.cli.options import DEFAULT_MODEL
from ds4mlx.generation import PREFILL_CHUNK, ChatService, Finished

import pytest
from test_agent_app import until
from textual.widgets import Static

pytestmark = pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="needs assets/ds4-tiny.gguf")


# Seconds to wait for the tiny model's prefill on a loaded machine.
LONG = 240.0
PROGRESS = re.compile(r"prefill (\d+)/(\d+) tokens")


class RecordingBackend(LocalBackend):
    """The local backend, keeping each turn's Finished (its cached tokens)."""

    def __init__(self, service: ChatService):
        super().__init__(service)
        self.finished: list[Finished] = []

    def chat(self, messages, tools, *, max_tokens, thinking):
        for event in super().chat(messages, tools, max_tokens=4, thinking=thinking):
            if isinstance(event, Finished):
                self.finished.append(event)
            yield event


def test_a_long_prefill_shows_progress_and_ctrl_c_stops_it_within_a_chunk(toolbox, tmp_path):
    service = ChatService(ds4mlx.load_model(DEFAULT_MODEL), max_context=8192)
    backend = RecordingBackend(service)
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    app = AgentApp(lambda: agent, ConversationStore(tmp_path / "conversations"))
    long_prompt = "Summarise: " + " ".join(f"w{n}" for n in range(1500))
    fed: list[int] = []

    def status() -> str:
        return str(app.query_one("#status", Static).content)

    async def scenario(pilot):
        await until(pilot, lambda: app.agent is not None and not app.busy, LONG)
        app.query_one("#prompt").value = long_prompt
        await pilot.press("enter")
        # The status bar may skip a chunk's line when a chunk is quick: any progress will do.
        await until(pilot, lambda: PROGRESS.search(status()) is not None, LONG)
        shown = PROGRESS.search(status())
        assert shown is not None and " t/s" in status().split("prefill ")[1]
        done, prompt_total = int(shown[1]), int(shown[2])
        assert done % PREFILL_CHUNK == 0 and done < prompt_total
        assert prompt_total >= 4500  # about 5,000 tokens, the system prompt's included
        await pilot.press("ctrl+c")
        fed.append(service._slots[0].session.n_tokens)  # the chunk in flight included
        await until(pilot, lambda: not app.busy, LONG)
        assert any("stopped" in str(w.content) for w in app.query(".note").results(Static))
        stopped_at = service._slots[0].session.n_tokens
        fed.append(stopped_at)
        assert stopped_at <= fed[0] + PREFILL_CHUNK  # within one chunk
        assert stopped_at < prompt_total and not backend.finished
        app.query_one("#prompt").value = "go on"
        await pilot.press("enter")
        await until(pilot, lambda: backend.finished and not app.busy, LONG)

    async def main():
        async with app.run_test(size=(100, 30)) as pilot:
            await scenario(pilot)

    asyncio.run(main())
    # The next prompt started from what the stopped prefill had fed.
    assert backend.finished[0].cached_tokens >= fed[1] - 8
