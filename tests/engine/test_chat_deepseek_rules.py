"""DeepSeek-V4's template and DSML parser, rule by rule: which turns keep their reasoning or get
the assistant prefix, how several tools and calls are laid out, and what the parser does with
lenient or broken markup. The golden conversations are in ``test_chat.py``."""

from __future__ import annotations

from ds4mlx.engine.chat import DEEPSEEK_V4, AssistantTurn, NamedTool, TextDelta, ToolCall
from ds4mlx.engine.chat.deepseek4 import DSML, parse_assistant, render_chat
from ds4mlx.engine.chat.events import ToolCallComplete, ToolCallError

import pytest

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
D = DSML


def tool(name: str, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description}}


def calls_with_ids(*ids: str) -> list[dict]:
    return [{"id": i, "function": {"name": f"f{n}", "arguments": {}}} for n, i in enumerate(ids)]


def results(*answers: tuple[str | None, str]) -> list[dict]:
    """Tool messages answering the calls of these ids (None: naming none)."""
    return [{"role": "tool", "tool_call_id": i, "content": text} for i, text in answers]


def block(*invokes: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


# --------------------------------------------------------------------------- the template


def test_two_tools_are_listed_one_schema_a_line():
    prompt = render_chat([{"role": "user", "content": "x"}], [tool("a"), tool("b", "ü")])
    assert '{"name": "a", "description": ""}\n{"name": "b", "description": "ü"}\n\n' in prompt


def test_results_follow_the_calls_of_the_last_assistant_turn_that_called():
    messages = [
        {"role": "assistant", "content": "", "tool_calls": calls_with_ids("a", "b")},
        {"role": "assistant", "content": "still working"},
        *results(("b", "B"), ("a", "A")),
    ]
    assert render_chat(messages).endswith(
        "<｜User｜><tool_result>A</tool_result>\n\n<tool_result>B</tool_result>"
        "<｜Assistant｜></think>"
    )


def test_a_result_naming_no_call_is_not_matched_to_a_call_without_an_id():
    messages = [
        {"role": "assistant", "content": "", "tool_calls": calls_with_ids("a", "")},
        *results((None, "X"), ("a", "A")),
    ]
    assert render_chat(messages).endswith(
        "<｜User｜><tool_result>X</tool_result>\n\n<tool_result>A</tool_result>"
        "<｜Assistant｜></think>"
    )


def test_json_arguments_of_past_calls_keep_non_ascii_text():
    call = {"function": {"name": "tag", "arguments": {"tags": ["é"], "note": "ü"}}}
    prompt = render_chat([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert prompt.endswith(
        f'<{D}parameter name="tags" string="false">["é"]</{D}parameter>\n'
        f'<{D}parameter name="note" string="true">ü</{D}parameter>\n</{D}invoke>\n'
        f"</{D}tool_calls>{EOS}"
    )


def test_a_message_without_content_renders_as_empty_text():
    messages = [{"role": "user", "content": None}, {"role": "assistant"}]
    assert render_chat(messages) == f"{BOS}<｜User｜><｜Assistant｜></think>{EOS}"


def test_developer_messages_stay_without_thinking_whatever_their_place():
    messages = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
    ]
    assert render_chat(messages) == (
        f"{BOS}<｜User｜>rules<｜User｜>q<｜Assistant｜></think>a{EOS}<｜User｜>q2"
        "<｜Assistant｜></think>"
    )
    # In thinking mode the developer message before the last user message goes, as
    # earlier reasoning does [enc].
    assert render_chat(messages, thinking=True) == (
        f"{BOS}<｜User｜>q<｜Assistant｜></think>a{EOS}<｜User｜>q2<｜Assistant｜><think>"
    )


@pytest.mark.parametrize("thinking", [False, True])
def test_a_developer_message_at_the_end_gets_the_assistant_prefix(thinking):
    messages = [{"role": "user", "content": "q"}, {"role": "developer", "content": "d"}]
    ending = "<think>" if thinking else "</think>"
    assert render_chat(messages, thinking=thinking) == (
        f"{BOS}<｜User｜>q<｜User｜>d<｜Assistant｜>{ending}"
    )


def test_a_developer_message_counts_as_the_last_user_turn_for_reasoning():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "developer", "content": "d"},
    ]
    assert render_chat(messages, thinking=True) == (
        f"{BOS}<｜User｜>q<｜Assistant｜></think>a{EOS}<｜User｜>d<｜Assistant｜><think>"
    )


@pytest.mark.parametrize("choice", ["required", NamedTool("f0")])
def test_without_a_generation_prompt_a_forced_choice_opens_no_call(choice):
    messages = [{"role": "user", "content": "q"}]
    prompt = render_chat(messages, [tool("f0")], add_generation_prompt=False, tool_choice=choice)
    assert prompt.endswith("<｜User｜>q")


def test_a_named_choice_opens_the_invoke_up_to_its_newline():
    prompt = render_chat(
        [{"role": "user", "content": "q"}], [tool("f0")], tool_choice=NamedTool("f0")
    )
    assert prompt.endswith(f'<｜Assistant｜></think>\n\n<{D}tool_calls>\n<{D}invoke name="f0">\n')


# --------------------------------------------------------------------------- parsing markup


@pytest.mark.parametrize(
    ("tag", "reason"),
    [
        # Attributes need whitespace between them, and nothing else may sit in the tag.
        ('name="a"string="true"', "parameter tag without a name"),
        ('name="a" junk', "parameter tag without a name"),
        ('name="a" string="yes"', "parameter 'a' has string='yes'"),
        ('name="a" string="TRUE"', "parameter 'a' has string='TRUE'"),
    ],
)
def test_a_parameter_tag_out_of_shape_is_an_error(tag, reason):
    invoke = f'<{D}invoke name="f"><{D}parameter {tag}>1</{D}parameter></{D}invoke>'
    turn = parse_assistant(f"<{D}tool_calls>{invoke}</{D}tool_calls>")
    assert turn == AssistantTurn(errors=[ToolCallError(invoke, reason)])


def test_every_problem_of_an_invoke_is_reported_together():
    invoke = (
        f'<{D}invoke name="f"><{D}parameter string="true">1</{D}parameter>'
        f'<{D}parameter name="a" string="false">{{</{D}parameter></{D}invoke>'
    )
    turn = parse_assistant(f"<{D}tool_calls>{invoke}</{D}tool_calls>")
    assert turn.errors == [
        ToolCallError(
            invoke,
            "parameter tag without a name; "
            "parameter 'a' is marked string=\"false\" but is not JSON",
        )
    ]


def test_a_block_whose_invokes_are_complete_but_unclosed_reports_nothing_more():
    text = f'<{D}tool_calls>\n<{D}invoke name="f"></{D}invoke>\n'
    assert parse_assistant(text) == AssistantTurn(tool_calls=[ToolCall("f", {})])
    assert parse_assistant(text + EOS) == AssistantTurn(tool_calls=[ToolCall("f", {})])


def test_the_end_of_sentence_ends_reasoning_too():
    assert parse_assistant(f"thought{EOS}after", thinking=True) == AssistantTurn(
        reasoning="thought"
    )


def test_nothing_is_read_after_the_end_of_sentence_that_follows_a_block():
    parser = DEEPSEEK_V4.stream_parser()
    events = parser.feed(block(f'<{D}invoke name="f"></{D}invoke>') + f"ok{EOS}")
    events += parser.feed("ignored") + parser.finish()
    assert events == [ToolCallComplete(ToolCall("f", {})), TextDelta("ok")]


@pytest.mark.parametrize("cut", [f"\n\n<{D}tool_ca", "<｜DS", "<DSML｜t", "<｜"])
def test_with_tool_choice_none_a_cut_off_block_opening_is_text(cut):
    # "<｜" is held back until the end (it may start the end of sentence), then released.
    parser = DEEPSEEK_V4.stream_parser(tool_choice="none")
    events = parser.feed("Hi" + cut) + parser.finish()
    assert AssistantTurn.from_events(events) == AssistantTurn(content="Hi" + cut)


def test_a_forced_call_is_parsed_without_reasoning_first():
    parser = DEEPSEEK_V4.stream_parser(thinking=True, tool_choice="required")
    events = parser.feed(f'f">\n</{D}invoke>\n</{D}tool_calls>done') + parser.finish()
    assert events == [ToolCallComplete(ToolCall("f", {})), TextDelta("done")]
