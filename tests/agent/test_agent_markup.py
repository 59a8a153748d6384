"""Tool-call markup never shows as the answer; the OpenAI backend's context size and token
count follow the server."""

from __future__ import annotations

from ds4mlx.agent.backend import OpenAIBackend
from ds4mlx.agent.loop import Agent, MalformedToolCall, RunFinished, TurnFinished
from ds4mlx.agent.markup import MarkupFilter
from ds4mlx.agent.permissions import Permissions
from ds4mlx.engine.chat import TextDelta, ToolCallError
from ds4mlx.engine.chat.deepseek4 import DSML

import pytest
from scripted_backend import ScriptedBackend, text
from scripted_server import USAGE, Server, chunk

BLOCK = (
    f'<{DSML}tool_calls>\n<{DSML}invoke name="read">\n<{DSML}parameter name="path" '
    f'string="true">a.py</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>'
)


def filtered(pieces: list[str]) -> tuple[str, list[ToolCallError]]:
    markup = MarkupFilter()
    out = [event for piece in pieces for event in markup.feed(piece)] + markup.finish()
    return (
        "".join(e.text for e in out if isinstance(e, TextDelta)),
        [e for e in out if isinstance(e, ToolCallError)],
    )


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_markup_block_is_cut_from_the_text_in_any_split(size):
    whole = f"Let me read it.{BLOCK}\nThat was all."
    shown, errors = filtered([whole[i : i + size] for i in range(0, len(whole), size)])
    assert shown == "Let me read it.\nThat was all."
    assert len(errors) == 1 and errors[0].raw == BLOCK


def test_a_stray_closing_tag_is_dropped_and_a_cut_off_block_reported():
    assert filtered([f"done</{DSML}tool_calls> here"]) == ("done here", [])
    assert filtered([f"done‹/{DSML[1:]}tool_calls>"]) == ("done", [])
    shown, errors = filtered([f"start <{DSML}tool_calls>\n<{DSML}invoke name="])
    assert shown == "start " and "cut-off" in errors[0].reason


def test_text_that_only_looks_like_markup_stays():
    assert filtered(["a < b and <｜ c and <DSM"]) == ("a < b and <｜ c and <DSM", [])


def test_markup_in_the_answer_becomes_a_malformed_call(toolbox):
    backend = ScriptedBackend(
        [[text("Reading."), text(BLOCK[:20]), text(BLOCK[20:])], [text("Sorry.")]]
    )
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    events = list(agent.run("read a.py"))
    malformed = [e for e in events if isinstance(e, MalformedToolCall)]
    assert len(malformed) == 1 and "not delivered as a tool call" in malformed[0].error.reason
    assert agent.messages[2]["content"] == "Reading."
    assert "could not be understood" in backend.requests[1][-1]["content"]
    assert events[-1] == RunFinished("answer", "Sorry.")


def test_raw_markup_from_an_openai_server_is_not_the_answer(toolbox):
    script = [
        [chunk({"role": "assistant", "content": "I will look." + BLOCK}), chunk({}, "stop"), USAGE],
        [chunk({"content": "Done."}, "stop"), USAGE],
    ]
    with Server(script) as server:
        agent = Agent(OpenAIBackend(server.url, "m"), toolbox, Permissions(yolo=True))
        events = list(agent.run("look"))
    assert any(isinstance(e, MalformedToolCall) for e in events)
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert DSML not in shown and shown == "I will look.Done."


def test_the_context_size_comes_from_the_server(workspace, tmp_path):
    from ds4mlx.cli import agent as cli

    card = {"id": "m", "object": "model", "created": 0, "owned_by": "x", "max_model_len": 32768}
    with Server([], models=card) as server:
        assert OpenAIBackend(server.url, "m").server_context_size() == 32768
        base = ["--api-base", server.url, "--api-model", "m", "--workspace", str(workspace)]
        args = cli.build_parser().parse_args(base)
        args.ctx_given = False
        assert cli.load_backend(args).context_size == 32768
        args = cli.build_parser().parse_args([*base, "--ctx", "2048"])
        args.ctx_given = True
        assert cli.load_backend(args).context_size == 2048
    with Server([]) as server:  # a server that reports nothing
        assert OpenAIBackend(server.url, "m").server_context_size() is None


def test_the_token_estimate_follows_the_server_usage(toolbox):
    long_question = "Explain this code base in detail. " * 40
    with Server([[chunk({"content": "Short."}, "stop"), USAGE]]) as server:
        agent = Agent(OpenAIBackend(server.url, "m"), toolbox, Permissions(yolo=True))
        events = list(agent.run(long_question))
    reported = [e for e in events if isinstance(e, TurnFinished)][0].context_tokens
    # the usage said 42 + 7; the estimate afterwards stays next to it instead of jumping to
    # the four-characters-a-token guess (hundreds of tokens for this prompt)
    assert reported == 49
    assert abs(agent.context_tokens() - reported) <= 10
    agent.backend.chars_per_token = 4.0
    assert agent.context_tokens() > 5 * reported  # what it showed before


def spelled(lt: str, dsml: str) -> str:
    return (
        f'{lt}{dsml}tool_calls>\n{lt}{dsml}invoke name="x">y'
        f"{lt}/{dsml}invoke>{lt}/{dsml}tool_calls>"
    )


# Each spelling of a whole block, and an invoke block alone (it runs to its closing tag too).
WHOLE_BLOCKS = [
    *(spelled(lt, dsml) for lt in ("<", "‹") for dsml in (DSML, DSML[1:])),
    f'<{DSML}invoke name="read">\n<{DSML}parameter name="path">a.py'
    f"</{DSML}parameter>\n</{DSML}invoke>",
]


@pytest.mark.parametrize("block", WHOLE_BLOCKS)
def test_a_whole_block_is_cut_in_every_spelling(block):
    shown, errors = filtered([f"a {block} b"])
    assert shown == "a  b" and [e.raw for e in errors] == [block]


def test_a_lone_tag_ends_at_its_bracket_and_a_stray_closing_invoke_is_reported():
    tag = f'<{DSML}parameter name="path">'
    shown, errors = filtered([f"a{tag}b"])
    assert shown == "ab" and [e.raw for e in errors] == [tag]
    assert errors[0].reason == (
        "tool-call markup in the answer text (it was not delivered as a tool call)"
    )
    shown, errors = filtered([f"a</{DSML}invoke>b"])
    assert shown == "ab" and [e.raw for e in errors] == [f"</{DSML}invoke>"]


def test_a_block_cut_off_inside_its_tag_is_reported_whole():
    shown, errors = filtered([f"a<{DSML}tool_ca"])
    assert shown == "a"
    assert [(e.raw, e.reason) for e in errors] == [
        (f"<{DSML}tool_ca", "cut-off tool call: the answer ended inside tool-call markup")
    ]


def test_a_block_ends_at_its_first_closing_tag_in_either_spelling():
    """The text between a block's closing tag and a later closing tag in the other spelling
    (a stray one, only dropped) is answer text."""
    block = f"<{DSML}tool_calls>x</{DSML}tool_calls>"
    shown, errors = filtered([f"a {block} between ‹/{DSML}tool_calls> after"])
    assert shown == "a  between  after" and [e.raw for e in errors] == [block]
