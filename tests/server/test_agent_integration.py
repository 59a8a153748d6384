"""``ds4-agent --api-base`` against the server: the agent's OpenAI backend streams from it, runs
the tool call it sends, and sends the result back."""

from __future__ import annotations

import json

from ds4mlx.cli.agent import main as agent_main
from ds4mlx.engine.chat import ReasoningDelta, TextDelta, ToolCall, ToolCallComplete
from ds4mlx.generation import Finished

from server.harness import ScriptedService, serve


def test_the_agent_runs_a_tool_through_the_server(engine, tmp_path, capsys):
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("remember the milk\n")
    service = ScriptedService(
        [
            ReasoningDelta("I should look around."),
            ToolCallComplete(ToolCall("list", {"path": "."})),
            Finished("tool_calls", 50, 10, 0),
        ],
        [TextDelta("There is one file: notes.txt."), Finished("stop", 80, 8, 50)],
    )
    with serve(service, engine) as base_url:
        status = agent_main(
            [
                "--api-base",
                f"{base_url}/v1",
                "--print",
                "What is here?",
                "--workspace",
                str(workspace),
                "--data-dir",
                str(tmp_path / "data"),
                "-n",
                "64",
                "--max-steps",
                "3",
            ]
        )
    assert status == 0
    assert capsys.readouterr().out.strip() == "There is one file: notes.txt."

    first, second = service.requests
    assert first["messages"][-1] == {"role": "user", "content": "What is here?"}
    assert "list" in {tool["function"]["name"] for tool in first["tools"]}
    # The second request carries the call (arguments back as JSON) and the tool's output.
    call, result = second["messages"][-2:]
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in call["tool_calls"]
    ] == [("list", {"path": "."})]
    assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert "notes.txt" in result["content"]
