"""Synthetic agent conversations in the DeepSeek-V4 template, built from standard-library code.

Each sample is a complete rendered conversation (system prompt with the agent's tools, user turn,
assistant turns with DSML tool calls, tool results, final answer) so that the tiny model learns the
template and emits well-formed tool calls for list, read, search, edit and bash.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator

import ds4mlx  # noqa: F401
from ds4mlx.agent.tool_schemas import AGENT_TOOLS
from ds4mlx.engine.chat.deepseek4 import render_chat

SYSTEM = "You are ds4-agent, a coding assistant working in the user's workspace."
_FUNCTION = re.compile(r'^def (\w+)\(([^)]*)\):\n\s+"""([^\n"]+)', re.MULTILINE)


def _functions(texts: list[str]) -> list[tuple[str, str, str, str, int]]:
    """(module text, name, params, docstring first line, line number) of documented functions."""
    found = []
    for text in texts:
        for match in _FUNCTION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((text, match.group(1), match.group(2), match.group(3).strip(), line))
    return found


def _call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"name": name, "arguments": arguments}],
    }


def _lines(text: str, start: int, end: int) -> str:
    return "\n".join(
        f"{n:5d}  {line}" for n, line in enumerate(text.splitlines()[start - 1 : end], start)
    )


def _search_then_read(rng: random.Random, fn) -> list[dict]:
    text, name, params, doc, line = fn
    module = f"src/{name[:3].lower() or 'mod'}_{rng.randrange(100)}.py"
    end = min(line + rng.randrange(4, 12), len(text.splitlines()))
    return [
        {
            "role": "user",
            "content": rng.choice(
                [
                    f"What does `{name}` do?",
                    f"Explain the function {name}.",
                    f"Where is {name} defined and what is it for?",
                ]
            ),
        },
        _call("search", pattern=f"def {name}\\("),
        {"role": "tool", "content": f"{module}:{line}: def {name}({params}):"},
        _call("read", path=module, start=line, end=end),
        {"role": "tool", "content": _lines(text, line, end)},
        {
            "role": "assistant",
            "content": f"`{name}` is defined in `{module}` at line {line}. {doc}",
        },
    ]


def _list_files(rng: random.Random, fns) -> list[dict]:
    names = sorted({f"{fn[1]}.py" for fn in rng.sample(fns, rng.randrange(2, 6))})
    sizes = [rng.randrange(100, 20000) for _ in names]
    listing = "\n".join(f"{size:8d}  {name}" for name, size in zip(names, sizes, strict=True))
    largest = names[sizes.index(max(sizes))]
    return [
        {
            "role": "user",
            "content": rng.choice(
                ["What files are here?", "List the workspace.", "Which file is the largest?"]
            ),
        },
        _call("list", path="."),
        {"role": "tool", "content": listing},
        {
            "role": "assistant",
            "content": f"There are {len(names)} files; the largest is "
            f"`{largest}` ({max(sizes)} bytes).",
        },
    ]


def _run_tests(rng: random.Random, fns) -> list[dict]:
    passed, failed = rng.randrange(1, 40), rng.choice([0, 0, 1, 2])
    summary = f"{passed} passed" + (f", {failed} failed" if failed else "")
    verdict = "All tests pass." if not failed else f"{failed} test(s) fail; let me look at them."
    return [
        {"role": "user", "content": rng.choice(["Run the tests.", "Do the tests pass?"])},
        _call("bash", command="python -m pytest -q"),
        {
            "role": "tool",
            "content": f"{'.' * passed}{'F' * failed}\n{summary} in 0.{rng.randrange(10, 99)}s",
        },
        {"role": "assistant", "content": verdict},
    ]


def _rename(rng: random.Random, fn) -> list[dict]:
    _, name, params, _, _ = fn
    new_name = f"{name}_v{rng.randrange(2, 9)}"
    path = f"{name}.py"
    return [
        {"role": "user", "content": f"Rename {name} to {new_name} in {path}."},
        _call("edit", path=path, old=f"def {name}(", new=f"def {new_name}("),
        {
            "role": "tool",
            "content": f"edited {path}: 1 replacement\n-def {name}({params}):\n"
            f"+def {new_name}({params}):",
        },
        {"role": "assistant", "content": f"Renamed `{name}` to `{new_name}` in `{path}`."},
    ]


def _show_code(rng: random.Random, fn) -> list[dict]:
    text, name, _, doc, line = fn
    body = "\n".join(text.splitlines()[line - 1 : line + rng.randrange(3, 10)])
    return [
        {"role": "user", "content": f"Show me the start of {name}."},
        {"role": "assistant", "content": f"{doc}\n\n```python\n{body}\n```"},
    ]


def default_render(messages: list[dict]) -> str:
    """A conversation in the DeepSeek-V4 template, with the agent's tools."""
    return render_chat(messages, tools=AGENT_TOOLS, add_generation_prompt=False)


def render_samples(
    stdlib_texts: list[str],
    count: int,
    seed: int,
    render: Callable[[list[dict]], str] = default_render,
) -> Iterator[str]:
    """``count`` conversations, each rendered by ``render`` (other templates: the GLM model)."""
    rng = random.Random(seed)
    fns = _functions(stdlib_texts)
    for _ in range(count):
        kind = rng.randrange(5)
        if kind == 0:
            messages = _search_then_read(rng, rng.choice(fns))
        elif kind == 1:
            messages = _list_files(rng, fns)
        elif kind == 2:
            messages = _run_tests(rng, fns)
        elif kind == 3:
            messages = _rename(rng, rng.choice(fns))
        else:
            messages = _show_code(rng, rng.choice(fns))
        yield render([{"role": "system", "content": SYSTEM}, *messages])
