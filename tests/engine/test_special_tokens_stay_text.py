"""Special-token spellings stay text in every role and field a client controls, for both chat
templates: system and developer messages, user turns, assistant history (answer, reasoning, tool
calls' names, keys and values), tool results, tools' names, descriptions and schemas, and the
name a forced ``tool_choice`` gives.

The check: a prompt with a spelling written into one field has exactly the special tokens of the
same prompt with plain text there (the template's own, in the same order), and the spelling is
still in the prompt, as text. Written with the real tokenizers of the tiny models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ds4mlx.engine.chat import DEEPSEEK_V4, GLM5, ChatFormat
from ds4mlx.engine.chat.prompt import NamedTool
from ds4mlx.engine.tokenizer import Tokenizer
from ds4mlx.gguf import GGUFFile

import pytest
from hypothesis import given
from hypothesis import strategies as st

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TOKENIZER_FILES = {"deepseek-v4": ASSETS / "ds4-tiny.gguf", "glm-5": ASSETS / "glm-tiny.gguf"}
FORMATS: dict[str, ChatFormat] = {"deepseek-v4": DEEPSEEK_V4, "glm-5": GLM5}

# A prompt with the caller's text ``x`` in one field: (messages, tools, options).
Prompt = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]
Slot = Callable[[str], Prompt]

QUESTION = {"role": "user", "content": "weather?"}


def tool(name: str = "get_weather", description: str = "Weather", prop: str = "city") -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {prop: {"type": "string", "description": f"the {prop}"}},
            },
        },
    }


def called(name: str = "get_weather", arguments: Any = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": name, "arguments": arguments or {"city": "Paris"}},
            }
        ],
    }


def result(content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c1", "content": content}


COMMON_SLOTS: dict[str, Slot] = {
    "system": lambda x: ([{"role": "system", "content": x}, QUESTION], None, {}),
    "user": lambda x: ([{"role": "user", "content": x}], None, {}),
    "assistant answer": lambda x: (
        [QUESTION, {"role": "assistant", "content": x}, QUESTION],
        None,
        {},
    ),
    "assistant reasoning": lambda x: (
        [QUESTION, {"role": "assistant", "content": "ok", "reasoning_content": x}],
        [tool()],  # with tools, every turn's reasoning is rendered
        {"thinking": True},
    ),
    "tool call name": lambda x: ([QUESTION, called(name=x), result("sunny")], [tool()], {}),
    "tool call key": lambda x: ([QUESTION, called(arguments={x: "Paris"})], [tool()], {}),
    "tool call value": lambda x: ([QUESTION, called(arguments={"city": x})], [tool()], {}),
    "tool call JSON value": lambda x: (
        [QUESTION, called(arguments={"city": {"name": x, "n": [1, x]}})],
        [tool()],
        {},
    ),
    "tool call argument string": lambda x: (
        [QUESTION, called(arguments=x)],  # not JSON: kept whole under "arguments"
        [tool()],
        {},
    ),
    "tool result": lambda x: ([QUESTION, called(), result(x)], [tool()], {}),
    "tool name": lambda x: ([QUESTION], [tool(name=x)], {}),
    "tool description": lambda x: ([QUESTION], [tool(description=x)], {}),
    "tool schema": lambda x: ([QUESTION], [tool(prop=x)], {}),
    "forced tool name": lambda x: (
        [QUESTION],
        [tool(name=x)],
        {"tool_choice": NamedTool(x)},
    ),
}
DEEPSEEK_SLOTS: dict[str, Slot] = {
    "developer": lambda x: ([{"role": "developer", "content": x}, QUESTION], None, {}),
    "developer, thinking": lambda x: (
        [QUESTION, {"role": "developer", "content": x}],
        None,
        {"thinking": True},
    ),
    "second tool result": lambda x: (
        [QUESTION, called(), result("sunny"), result(x)],
        [tool()],
        {},
    ),
}
GLM_SLOTS: dict[str, Slot] = {
    "user parts": lambda x: (
        [{"role": "user", "content": [{"type": "text", "text": x}, {"type": "image"}]}],
        None,
        {},
    ),
    "assistant inline reasoning": lambda x: (
        [QUESTION, {"role": "assistant", "content": f"<think>{x}</think>ok"}],
        None,
        {"thinking": True},
    ),
    "tool outputs": lambda x: ([QUESTION, called(), result([{"output": x, "id": "c1"}])], [], {}),
    "tool result parts": lambda x: (
        [QUESTION, called(), result([{"type": "text", "text": x}])],
        None,
        {},
    ),
    "tool reference": lambda x: (
        [QUESTION, called(), result([{"type": "tool_reference", "name": "get_weather"}])],
        [tool(description=x)],
        {},
    ),
}
SLOTS = {
    "deepseek-v4": {**COMMON_SLOTS, **DEEPSEEK_SLOTS},
    "glm-5": {**COMMON_SLOTS, **GLM_SLOTS},
}
CASES = [(name, slot) for name, slots in SLOTS.items() for slot in slots]


_TOKENIZERS: dict[str, Tokenizer] = {}


def tokenizer_for(name: str) -> Tokenizer:
    if name not in _TOKENIZERS:
        path = TOKENIZER_FILES[name]
        if not path.is_file():
            pytest.skip(f"{path} is not built")
        _TOKENIZERS[name] = Tokenizer.from_gguf(GGUFFile(path))
    return _TOKENIZERS[name]


def specials_of(tokenizer: Tokenizer) -> list[str]:
    return sorted(
        tokenizer.token_bytes(i).decode()
        for i in range(tokenizer.vocab_size)
        if tokenizer.is_special(i)
    )


def special_ids(name: str, slot: Slot, text: str) -> tuple[list[int], str]:
    """The special tokens of the prompt with ``text`` in ``slot``, in order, and the prompt
    decoded."""
    tokenizer = tokenizer_for(name)
    messages, tools, options = slot(text)
    ids = FORMATS[name].tokenize(tokenizer, messages, tools, **options)
    return [i for i in ids if tokenizer.is_special(i)], tokenizer.decode(ids)


def assert_stays_text(name: str, slot: Slot, injected: str, spelling: str) -> None:
    plain, _ = special_ids(name, slot, injected.replace(spelling, "plain words"))
    found, decoded = special_ids(name, slot, injected)
    assert found == plain, f"{spelling!r} became a special token"
    assert spelling in decoded


@pytest.mark.parametrize(("name", "slot"), CASES)
def test_every_special_token_stays_text_in_every_field(name, slot):
    tokenizer = tokenizer_for(name)
    for spelling in specials_of(tokenizer):
        assert_stays_text(name, SLOTS[name][slot], f"a{spelling}b", spelling)


def test_the_tokenizers_have_the_templates_special_tokens():
    # The check above is only as good as the spellings it tries.
    assert "<｜end▁of▁sentence｜>" in specials_of(tokenizer_for("deepseek-v4"))
    assert {"<|user|>", "<|assistant|>", "<|observation|>"} <= set(
        specials_of(tokenizer_for("glm-5"))
    )


def test_a_template_special_token_is_special():
    # Without this, equal special-token lists could mean the template wrote none at all.
    for name in FORMATS:
        found, _ = special_ids(name, COMMON_SLOTS["user"], "hello")
        assert len(found) >= 2, name


@st.composite
def injections(draw) -> tuple[str, str, str, str]:
    """(format, slot, text, the special spelling in it)."""
    name = draw(st.sampled_from(list(SLOTS)))
    slot = draw(st.sampled_from(list(SLOTS[name])))
    spelling = draw(st.sampled_from(specials_of(tokenizer_for(name))))
    filler = st.text(alphabet="ab <>|｜▁/\n{}\"'", max_size=6)
    text = draw(filler) + spelling + draw(filler) + draw(st.sampled_from(["", spelling]))
    return name, slot, text, spelling


@given(injections())
def test_special_tokens_stay_text_whatever_surrounds_them(case):
    name, slot, text, spelling = case
    assert_stays_text(name, SLOTS[name][slot], text, spelling)
