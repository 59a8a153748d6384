"""Generated assistant turns rendered with each chat template and parsed back: reasoning, content
and tool calls come back as they went in. Part of the robustness suite (issue 10); the golden
prompts and hand-written parser cases live in tests/engine/test_chat*.py."""

from __future__ import annotations

from ds4mlx.engine.chat import GLM5, AssistantTurn, ToolCall
from ds4mlx.engine.chat.deepseek4 import EOS, parse_assistant, render_chat

from hypothesis import example, given, settings
from hypothesis import strategies as st

# Text with the characters markup is made of, but never a whole marker: a marker inside content
# is the model speaking markup, which the parser is right to read as markup.
DS4_MARKERS = ("｜DSML｜", "</think>", "<think>", EOS, "<｜", "｜>")
GLM_MARKERS = ("<tool_call>", "</tool_call>", "<|", "|>", "</think>", "<think>", "<arg_")
TEXT = st.text(alphabet=st.sampled_from(list("ab xyz<>/|_=\"'{}[]:,.1\n\tü🦙｜")), max_size=24)
NAMES = st.sampled_from(["f", "get_weather", "write_file", "a_b", "tool9"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(alphabet='abc xyz<>"\n{}1', max_size=10),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("pqr"), inner, max_size=3)
    ),
    max_leaves=6,
)
ARGUMENTS = st.dictionaries(
    st.sampled_from(["a", "b", "path", "city", "content"]), JSON_VALUES, max_size=4
)


def clean(markers):
    return TEXT.filter(lambda s: not any(m in s for m in markers))


@settings(max_examples=1000, deadline=None, database=None)
@given(
    thinking=st.booleans(),
    reasoning=clean(DS4_MARKERS),
    content=clean(DS4_MARKERS),
    calls=st.lists(st.tuples(NAMES, ARGUMENTS), max_size=3),
)
@example(thinking=True, reasoning="", content="", calls=[("f", {})])  # nothing but a call
@example(thinking=False, reasoning="r", content="x\n", calls=[("f", {"a": "1"})])  # digit string
def test_deepseek_v4_render_then_parse(thinking, reasoning, content, calls):
    tool_calls = [ToolCall(name, arguments) for name, arguments in calls]
    assistant = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": tool_calls,
    }
    prompt = render_chat([{"role": "user", "content": "go"}, assistant], thinking=thinking)
    output = prompt.split("<｜Assistant｜>" + ("<think>" if thinking else "</think>"), 1)[1]
    assert output.endswith(EOS)
    assert parse_assistant(output, thinking=thinking) == AssistantTurn(
        reasoning=reasoning if thinking else "", content=content, tool_calls=tool_calls
    )


# GLM types a string argument by whether its text parses as JSON, so string values here never
# do (the same convention as tests/engine/test_chat_glm.py).
GLM_VALUES = st.one_of(
    st.text(alphabet="abc xyz", min_size=1, max_size=8).filter(
        lambda s: s.strip() not in ("", "null", "true", "false")
    ),
    st.integers(-99, 99),
    st.booleans(),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from("pq"), st.integers(0, 3), max_size=2),
)


@settings(max_examples=1200, deadline=None, database=None)
@given(
    reasoning=st.one_of(st.none(), clean(GLM_MARKERS)),
    content=clean(GLM_MARKERS),
    calls=st.lists(
        st.tuples(
            NAMES, st.dictionaries(st.sampled_from(["a", "b", "city"]), GLM_VALUES, max_size=3)
        ),
        max_size=3,
    ),
)
def test_glm5_render_then_parse(reasoning, content, calls):
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [{"function": {"name": n, "arguments": a}} for n, a in calls],
    }
    prompt = GLM5.render(
        [{"role": "user", "content": "q"}, message], thinking=True, add_generation_prompt=False
    )
    turn = GLM5.parse(prompt.split("<|assistant|><think>", 1)[1] + "<|observation|>", thinking=True)
    assert turn.reasoning == (reasoning or "")
    assert turn.content == content.strip()
    assert turn.tool_calls == [ToolCall(n, a) for n, a in calls] and not turn.errors
