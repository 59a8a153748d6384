"""The OpenAI-compatible backend against a small local server that streams scripted chunks."""

from __future__ import annotations

from ds4mlx.agent.backend import BackendError, OpenAIBackend, openai_messages
from ds4mlx.agent.loop import Agent, RunFinished, ToolFinished
from ds4mlx.agent.permissions import Permissions
from ds4mlx.engine.chat import ReasoningDelta, TextDelta, ToolCall, ToolCallComplete, ToolCallError
from ds4mlx.generation import Finished

import pytest
from scripted_server import USAGE, Server, chunk, tool_call_chunks


def test_streams_reasoning_text_and_usage():
    script = [
        [
            chunk({"role": "assistant", "reasoning_content": "hmm"}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}, "stop"),
            USAGE,
        ]
    ]
    with Server(script) as server:
        backend = OpenAIBackend(server.url, "tiny", context_size=1000)
        events = list(
            backend.chat([{"role": "user", "content": "hi"}], [], max_tokens=20, thinking=False)
        )
        request = server.requests[0]
    assert events[:3] == [ReasoningDelta("hmm"), TextDelta("Hel"), TextDelta("lo")]
    done = events[-1]
    assert isinstance(done, Finished) and done.finish_reason == "stop"
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (42, 7, 40)
    assert request["model"] == "tiny" and request["stream"] is True
    assert request["max_tokens"] == 20 and "tools" not in request


def test_tool_calls_are_assembled_from_pieces():
    with Server([tool_call_chunks(['{"path": ', '"a.py"}'])]) as server:
        backend = OpenAIBackend(server.url, "tiny")
        events = list(
            backend.chat(
                [{"role": "user", "content": "read"}],
                [{"type": "function", "function": {"name": "read"}}],
                max_tokens=20,
                thinking=True,
            )
        )
        request = server.requests[0]
    assert events[0] == ToolCallComplete(ToolCall("read", {"path": "a.py"}))
    assert events[-1].finish_reason == "tool_calls"
    assert request["tools"][0]["function"]["name"] == "read"
    assert request["thinking"] == {"type": "enabled"}


def test_bad_arguments_become_a_tool_call_error():
    with Server([tool_call_chunks(['{"path": "a.py"'])]) as server:
        events = list(OpenAIBackend(server.url, "m").chat([], [], max_tokens=5, thinking=False))
    assert isinstance(events[0], ToolCallError) and "not valid JSON" in events[0].reason


def test_an_unreachable_server_is_a_backend_error():
    backend = OpenAIBackend("http://127.0.0.1:9/v1", "m", timeout=2)
    backend.client = backend.client.with_options(max_retries=0)
    with pytest.raises(BackendError, match="127.0.0.1:9"):
        list(backend.chat([{"role": "user", "content": "hi"}], [], max_tokens=5, thinking=False))


def test_the_agent_loop_runs_on_the_openai_backend(toolbox):
    script = [
        tool_call_chunks(['{"path": "README.md"}']),
        [chunk({"content": "It is a demo."}, "stop"), USAGE],
    ]
    with Server(script) as server:
        agent = Agent(OpenAIBackend(server.url, "m"), toolbox, Permissions(yolo=True))
        events = list(agent.run("What is this project?"))
        second = server.requests[1]["messages"]
    assert any(isinstance(e, ToolFinished) for e in events)
    assert events[-1] == RunFinished("answer", "It is a demo.")
    assert second[2]["tool_calls"][0]["function"] == {
        "name": "read",
        "arguments": '{"path": "README.md"}',
    }
    assert second[3]["role"] == "tool" and "# demo" in second[3]["content"]


def test_messages_are_converted_for_strict_servers():
    messages = [
        {"role": "system", "content": "s"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "private",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "list", "arguments": {"path": "."}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "files"},
        {"role": "assistant", "content": "oops"},
        {"role": "tool", "tool_call_id": "bad", "content": "error: could not be understood"},
    ]
    converted = openai_messages(messages)
    assert "reasoning_content" not in converted[1]
    assert converted[1]["tool_calls"][0]["function"]["arguments"] == '{"path": "."}'
    assert converted[2] == {"role": "tool", "tool_call_id": "a", "content": "files"}
    assert converted[4] == {"role": "user", "content": "error: could not be understood"}


def test_print_mode_with_api_base(workspace, tmp_path, capsys):
    from ds4mlx.cli import agent as cli

    script = [
        tool_call_chunks(['{"path": "."}'], name="list"),
        [chunk({"content": "Three entries."}, "stop"), USAGE],
    ]
    with Server(script) as server:
        code = cli.main(
            [
                "--api-base",
                server.url,
                "--api-model",
                "remote",
                "--print",
                "list",
                "--workspace",
                str(workspace),
                "--data-dir",
                str(tmp_path),
            ]
        )
        model = server.requests[0]["model"]
    out, err = capsys.readouterr()
    assert code == 0 and out == "Three entries.\n" and model == "remote"
    assert "> list ." in err and ".gitignore (+5 lines)" in err


def test_an_answer_in_one_chunk_has_no_decode_rate():
    with Server([[chunk({"role": "assistant", "content": "All at once."}, "stop"), USAGE]]) as s:
        done = list(OpenAIBackend(s.url, "m").chat([], [], max_tokens=20, thinking=False))[-1]
    assert done.completion_tokens == 7
    assert done.stats.decode_seconds == 0 and done.stats.decode_tps == 0
