"""The server's prompt cache: a restarted ``ds4-server --kv-disk-dir`` reports a repeated
prompt as cached (OpenAI ``prompt_tokens_details.cached_tokens``, Anthropic
``cache_read_input_tokens``), and on ``--batched-session 2`` two conversations that share only
their system prompt both keep their caches."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.bench.server import server_process
from ds4mlx.cli.kv_options import prompt_cache_for
from ds4mlx.cli.server import build_parser, main
from ds4mlx.generation import ChatService

import anthropic
import openai
import pytest

from server.harness import TIMEOUT, serve_sessions

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
SYSTEM = (
    "You are ds4-agent, a coding assistant working in a repository of Python code. "
    "Answer briefly, call tools when you need to read files, and never guess paths."
)
pytestmark = pytest.mark.skipif(not TINY_MODEL.is_file(), reason=f"{TINY_MODEL} is not built")


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def test_a_restarted_server_reuses_a_repeated_prompt_from_disk(tmp_path):
    messages = [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": "List the files in the src folder, then read the "
            "one named main.py and summarise it.",
        },
    ]
    flags = [
        "-n",
        "4",
        "--temp",
        "0",
        "-c",
        "1024",
        "--kv-disk-dir",
        str(tmp_path / "kv"),
        "--kv-disk-space",
        "0.5",
    ]
    with server_process(str(TINY_MODEL), flags) as url:
        cold = openai_client(url).chat.completions.create(model="default", messages=messages)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert list((tmp_path / "kv").glob("kv-*.safetensors"))
    with server_process(str(TINY_MODEL), flags) as url:
        warm = openai_client(url).chat.completions.create(model="default", messages=messages)
        anthropic_usage = (
            anthropic.Anthropic(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0)
            .messages.create(model="default", max_tokens=4, system=SYSTEM, messages=messages[1:])
            .usage
        )
    prompt = warm.usage.prompt_tokens
    assert prompt == cold.usage.prompt_tokens > 40
    assert warm.usage.prompt_tokens_details.cached_tokens >= 0.9 * prompt
    assert warm.choices[0].message == cold.choices[0].message
    # The same prompt through /v1/messages (its template renders it alike).
    assert anthropic_usage.cache_read_input_tokens >= 0.9 * (
        anthropic_usage.input_tokens + anthropic_usage.cache_read_input_tokens
    )


@pytest.fixture(scope="module")
def two_slot_url(engine):
    """A server over the tiny model with two sessions and no prompt cache: what the slots
    alone keep."""
    model = engine.run(lambda: ds4mlx.load_model(TINY_MODEL))
    service = engine.run(lambda: ChatService(model, max_context=1024, sessions=2))
    with serve_sessions(service, engine) as url:
        yield url


def test_two_conversations_sharing_the_system_prompt_keep_their_slots(two_slot_url):
    client = openai_client(two_slot_url)
    conversations = {
        "a": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Write a Python function that adds two numbers."},
        ],
        "b": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "List three colours of the rainbow."},
        ],
    }
    prompts = {}
    for name, messages in conversations.items():
        reply = client.chat.completions.create(
            model="default", messages=messages, max_tokens=6, temperature=0
        )
        prompts[name] = reply.usage.prompt_tokens
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    for _ in range(2):  # alternating turns: each finds its own slot every time
        for name, messages in conversations.items():
            messages.append({"role": "user", "content": "Thanks, go on."})
            reply = client.chat.completions.create(
                model="default", messages=messages, max_tokens=6, temperature=0
            )
            cached = reply.usage.prompt_tokens_details.cached_tokens
            # At least the previous prompt (the answer may be re-rendered differently).
            assert cached >= prompts[name], (name, cached, prompts[name])
            prompts[name] = reply.usage.prompt_tokens
            messages.append(
                {"role": "assistant", "content": reply.choices[0].message.content or ""}
            )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--kv-disk-space", "-1"], "--kv-disk-space"),
        (["--kv-memory-space", "lots"], "--kv-memory-space"),
        (["--kv-disk-dir", "{file}"], "is not a folder"),
        (["--kv-disk-dir", "{folder}", "--kv-disk-space", "0"], "--kv-disk-space must be positive"),
    ],
)
def test_bad_cache_flags_fail_with_a_message(tmp_path, capsys, flags, message):
    (tmp_path / "file").write_text("")
    flags = [f.format(file=tmp_path / "file", folder=tmp_path / "kv") for f in flags]
    with pytest.raises(SystemExit) as exited:
        main(["-m", str(TINY_MODEL), *flags])
    assert exited.value.code == 2
    # The error line itself says it (the usage above it names every flag).
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_small_disk_budget_is_reported_as_it_is(tmp_path, caplog, engine):
    # 0.0015 GiB was reported as "budget 0.0 GiB".
    model = engine.run(lambda: ds4mlx.load_model(TINY_MODEL))
    args = build_parser().parse_args(
        ["--kv-disk-dir", str(tmp_path / "kv"), "--kv-disk-space", "0.0015"]
    )
    with caplog.at_level("INFO", logger="ds4mlx.kvcache"):
        assert engine.run(lambda: prompt_cache_for(args, model)) is not None
    assert "(budget 1.5 MiB)" in caplog.text


@pytest.mark.parametrize("size", ["nan", "inf", "-0.5"])
@pytest.mark.parametrize("flag", ["--kv-disk-space", "--kv-memory-space"])
def test_a_cache_size_is_a_finite_number_of_at_least_zero(capsys, flag, size):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([flag, size])
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]
