"""GLM-5.3-Flash's template, rule by rule: media placeholders in every kind of content, which
tool results are sorted into the calls' order, where reasoning and roles go, and the generation
prompt's ending. The golden renderings of whole conversations are in ``test_chat_glm.py``."""

from __future__ import annotations

from ds4mlx.engine.chat import GLM5, NamedTool

import pytest

PREFIX = "[gMASK]<sop><|system|>Reasoning Effort: Max"
IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"
VIDEO = "<|begin_of_video|><|video|><|end_of_video|>"
AUDIO = "<|begin_of_audio|><|end_of_audio|>"
MEDIA = [
    ("image", IMAGE),
    ("image_url", IMAGE),
    ("video", VIDEO),
    ("video_url", VIDEO),
    ("audio", AUDIO),
    ("audio_url", AUDIO),
    ("input_audio", AUDIO),
]


def render(messages, tools=None, **options):
    options.setdefault("add_generation_prompt", False)
    return GLM5.render(messages, tools, **options)


def calls_with_ids(*ids: str) -> list[dict]:
    return [{"id": i, "function": {"name": f"f{n}", "arguments": {}}} for n, i in enumerate(ids)]


def results(*answers: tuple[str, str]) -> list[dict]:
    """Tool messages answering the calls of these ids."""
    return [{"role": "tool", "tool_call_id": i, "content": text} for i, text in answers]


def results_after(call_ids, answers) -> str:
    """The observation turn rendered after an assistant turn calling ``call_ids``."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls_with_ids(*call_ids)},
        *results(*answers),
    ]
    return render(messages).rpartition("<|observation|>")[2]


# --------------------------------------------------------------------------- media


@pytest.mark.parametrize(("kind", "placeholder"), MEDIA, ids=[kind for kind, _ in MEDIA])
def test_every_media_part_becomes_its_placeholder_written_by_the_template(kind, placeholder):
    prompt = GLM5.prompt([{"role": "user", "content": ["see ", {"type": kind, kind: "x"}]}])
    assert str(prompt) == f"{PREFIX}<|user|>see {placeholder}<|assistant|><think></think>"
    # The placeholder's special tokens are the template's, the text beside it the caller's.
    assert (placeholder, True) in prompt.pieces and ("see ", False) in prompt.pieces


@pytest.mark.parametrize(("kind", "placeholder"), MEDIA, ids=[kind for kind, _ in MEDIA])
def test_media_in_an_assistant_turn_and_a_tool_result_become_placeholders(kind, placeholder):
    messages = [
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": kind}]},
        # A result whose first part is media is a result, not a list of tool references.
        {"role": "tool", "content": [{"type": kind}, "b"]},
    ]
    assert render(messages) == (
        f"{PREFIX}<|assistant|><think></think>a{placeholder}"
        f"<|observation|><tool_response>{placeholder}b</tool_response>"
    )


def test_a_result_list_of_text_mentioning_output_is_text_not_a_list_of_outputs():
    messages = [{"role": "tool", "content": ["output: 3 files", " done"]}]
    assert render(messages) == (
        f"{PREFIX}<|observation|><tool_response>output: 3 files done</tool_response>"
    )


def test_list_items_that_are_neither_text_nor_parts_are_left_out():
    messages = [{"role": "assistant", "content": ["a", 3, None, {"type": "text", "text": "b"}]}]
    assert render(messages) == f"{PREFIX}<|assistant|><think></think>ab"


# --------------------------------------------------------------------------- tool results


def test_results_of_some_of_the_calls_follow_the_calls_order():
    assert results_after(("a", "b", "c"), [("c", "C"), ("a", "A")]) == (
        "<tool_response>A</tool_response><tool_response>C</tool_response>"
    )


def test_a_call_without_an_id_leaves_the_results_in_their_order():
    assert results_after(("", "a", "b"), [("b", "B"), ("a", "A")]) == (
        "<tool_response>B</tool_response><tool_response>A</tool_response>"
    )


@pytest.mark.parametrize(
    "before",
    [
        [
            {"role": "assistant", "content": "", "tool_calls": calls_with_ids("a", "b")},
            {"role": "user", "content": "and?"},
        ],
        [{"role": "user", "content": "go", "tool_calls": calls_with_ids("a", "b")}],
    ],
    ids=["a user turn between", "calls of a user message"],
)
def test_only_the_calls_of_the_assistant_turn_just_before_order_the_results(before):
    assert render([*before, *results(("b", "B"), ("a", "A"))]).endswith(
        "<|observation|><tool_response>B</tool_response><tool_response>A</tool_response>"
    )


def test_results_opening_the_conversation_keep_their_order():
    # No message before them: nothing names their calls (not the last message, read as -1).
    messages = [
        *results(("b", "B"), ("a", "A")),
        {"role": "assistant", "content": "", "tool_calls": calls_with_ids("a", "b")},
    ]
    assert render(messages).startswith(
        f"{PREFIX}<|observation|><tool_response>B</tool_response><tool_response>A</tool_response>"
        "<|assistant|>"
    )


def test_a_run_of_results_ending_the_conversation_is_rendered_whole():
    assert results_after(("a", "b"), [("a", "A"), ("b", "B")]) == (
        "<tool_response>A</tool_response><tool_response>B</tool_response>"
    )


# --------------------------------------------------------------------------- roles, reasoning


def test_inline_reasoning_is_the_last_think_block_and_the_answer_follows_the_last_close():
    message = {"role": "assistant", "content": "<think>a</think>b</think>c"}
    assert render([message]) == f"{PREFIX}<|assistant|><think>a</think>c"


def test_empty_reasoning_content_is_an_empty_block_even_with_inline_reasoning():
    # reasoning_content "" is the caller's reasoning: the inline block is the answer's text.
    message = {"role": "assistant", "content": "<think>x</think>y", "reasoning_content": ""}
    assert render([message]) == f"{PREFIX}<|assistant|><think></think><think>x</think>y"


def test_cleared_reasoning_stays_out_even_when_it_is_inline():
    messages = [
        {"role": "assistant", "content": "<think>old</think>a"},
        {"role": "user", "content": "q"},
    ]
    assert render(messages, clear_thinking=True) == (
        f"{PREFIX}<|assistant|><think></think>a<|user|>q"
    )


@pytest.mark.parametrize(
    ("effort", "stated"), [(None, "Max"), ("max", "Max"), ("high", "High"), ("low", "Low")]
)
def test_the_reasoning_effort_is_stated_capitalized(effort, stated):
    prompt = render([{"role": "user", "content": "x"}], reasoning_effort=effort)
    assert prompt == f"[gMASK]<sop><|system|>Reasoning Effort: {stated}<|user|>x"


@pytest.mark.parametrize("effort", ["Max", "medium"])
def test_an_effort_the_template_lacks_is_refused_by_name(effort):
    with pytest.raises(ValueError, match=f"not {effort!r}"):
        render([], reasoning_effort=effort)


def test_an_empty_effort_is_the_templates_maximum():
    assert render([], reasoning_effort="") == PREFIX


# --------------------------------------------------------------------------- generation prompt


@pytest.mark.parametrize(("thinking", "ending"), [(True, "<think>"), (False, "<think></think>")])
def test_the_generation_prompt_opens_or_closes_the_thinking_block(thinking, ending):
    prompt = GLM5.render([{"role": "user", "content": "x"}], thinking=thinking)
    assert prompt == f"{PREFIX}<|user|>x<|assistant|>{ending}"


@pytest.mark.parametrize(
    ("choice", "opening"),
    [("required", "<tool_call>"), (NamedTool("search"), "<tool_call>search")],
)
def test_a_forced_call_closes_the_thinking_block_and_opens_the_call(choice, opening):
    prompt = GLM5.render([{"role": "user", "content": "x"}], thinking=True, tool_choice=choice)
    assert prompt == f"{PREFIX}<|user|>x<|assistant|><think></think>{opening}"


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_an_unforced_choice_writes_no_call_opening(choice):
    prompt = GLM5.render([{"role": "user", "content": "x"}], tool_choice=choice)
    assert prompt.endswith("<|assistant|><think></think>")


def test_without_a_generation_prompt_nothing_follows_the_last_message_even_when_forced():
    prompt = render([{"role": "user", "content": "x"}], tool_choice="required")
    assert prompt == f"{PREFIX}<|user|>x"
