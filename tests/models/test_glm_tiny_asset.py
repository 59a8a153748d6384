"""The shipped GLM-style model ``assets/glm-tiny.gguf`` (``scripts/train_glm_tiny.py``): it loads as
glm5-next with its NextN block, speaks GLM's chat format with the tiny family's BPE, and drafting
with its built-in MTP (``--mtp``) reproduces plain greedy decoding. (llama.cpp's own logits for it
are checked in test_llamacpp_crosscheck.py.)"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import ds4mlx
from ds4mlx.engine.chat import glm5
from ds4mlx.engine.generate import DoneEvent, TokenEvent
from ds4mlx.generation import generate
from ds4mlx.gguf import open_gguf
from ds4mlx.loader import LoadedModel
from ds4mlx.models.base import DECODE_TILE
from ds4mlx.models.sparse_mla import MLACache
from ds4mlx.speculation.nextn import NextNDrafter, load_nextn

import mlx.core as mx
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
ASSET = ASSETS / "glm-tiny.gguf"
CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n"

pytestmark = pytest.mark.skipif(
    not ASSET.is_file(), reason=f"{ASSET} is not built (python scripts/train_glm_tiny.py)"
)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return ds4mlx.load_model(ASSET)


def tokens_of(events) -> tuple[list[int], object]:
    tokens, stats = [], None
    for event in events:
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        elif isinstance(event, DoneEvent):
            stats = event.stats
    return tokens, stats


def test_a_small_glm5_next_model_with_its_nextn_block(model):
    args = model.args
    assert model.gguf.arch == "glm5-next" and ASSET.stat().st_size <= 10_000_000
    assert args.nextn_layers == 1 and isinstance(load_nextn(model), NextNDrafter)
    main = range(args.num_layers)
    assert {args.recurrent[i] for i in main} == {True, False}  # KDA and MLA layers
    mla = [i for i in main if not args.recurrent[i]]
    assert {args.index_full[i] for i in mla} == {True, False}  # own and shared indexers
    assert 0 < args.n_dense_layers < args.num_layers and args.n_experts > args.n_experts_used
    # The keys are exactly what ModelArgs writes for what it reads.
    for key, value in args.to_gguf_metadata(model.gguf.get("glm5-next.context_length")).items():
        stored = model.gguf.get(key)
        if isinstance(value.value, float):
            assert math.isclose(stored, value.value, rel_tol=1e-6), key
        else:
            assert stored == value.value, key


def test_chat_format_is_glms(model):
    tokenizer = model.tokenizer
    assert model.chat_format is glm5.GLM5
    prompt = model.render_user_prompt("Run the tests.")
    assert prompt.startswith(glm5.PREFIX)
    assert prompt.endswith(glm5.ASSISTANT + glm5.THINK_START + glm5.THINK_END)
    ids = tokenizer.encode(prompt, add_special=False)
    assert tokenizer.decode(ids) == prompt
    markers = [
        "[gMASK]",
        "<sop>",
        glm5.SYSTEM,
        glm5.USER,
        glm5.ASSISTANT,
        glm5.THINK_START,
        glm5.THINK_END,
    ]
    assert all(tokenizer.token_to_id(m) in ids for m in markers)
    call = (
        f"{glm5.CALL_START}read{glm5.KEY_START}path{glm5.KEY_END}"
        f"{glm5.VALUE_START}a.py{glm5.VALUE_END}{glm5.CALL_END}"
    )
    call_ids = tokenizer.encode(call, add_special=False)
    assert all(
        tokenizer.token_to_id(m) in call_ids
        for m in (glm5.CALL_START, glm5.KEY_END, glm5.VALUE_START, glm5.CALL_END)
    )
    assert model.chat_format.parse(call).tool_calls[0].arguments == {"path": "a.py"}
    # No BOS (the template opens the prompt); a turn ends at the next role or end of text.
    assert not tokenizer.add_bos
    assert set(tokenizer.stop_ids) == {
        tokenizer.token_to_id(t) for t in (glm5.END_OF_TEXT, glm5.USER, glm5.OBSERVATION)
    }


def test_shares_the_tiny_familys_bpe():
    ds4 = ASSETS / "ds4-tiny.gguf"
    if not ds4.is_file():
        pytest.skip(f"{ds4} is not built")
    glm, ds4 = open_gguf(ASSET), open_gguf(ds4)
    base = ds4.get("tokenizer.ggml.tokens")
    assert glm.get("tokenizer.ggml.tokens")[: len(base)] == base
    assert glm.get("tokenizer.ggml.merges") == ds4.get("tokenizer.ggml.merges")


@pytest.mark.parametrize("kind", ["code", "chat"])
def test_nextn_speculation_reproduces_plain_greedy_decoding(model, kind):
    if kind == "code":
        prompt = model.tokenizer.encode(CODE, add_special=False)
    else:
        prompt = model.tokenizer.encode(
            model.render_user_prompt("What does `dedent` do?"), add_special=False
        )
    plain, _ = tokens_of(generate(model.new_session(), prompt, 64))
    spec, stats = tokens_of(generate(model.new_session(), prompt, 64, drafter=load_nextn(model)))
    assert spec == plain
    assert stats.accepted_tokens > 0  # the trained NextN layer drafts some of them right


def run_ds4(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ds4mlx.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_mtp_prints_counters_and_keeps_the_output():
    flags = ["-m", str(ASSET), "--chat", "-p", "Show me the start of dedent.", "-n", "40"]
    plain, timed = run_ds4(*flags), run_ds4(*flags, "--mtp-timing")
    assert plain.returncode == 0 and timed.returncode == 0, timed.stderr
    assert timed.stdout == plain.stdout
    assert "drafter nextn" in timed.stderr
    assert "speculation:" in timed.stderr and "timing:" in timed.stderr


@pytest.mark.parametrize("entry", ["chunk", "tile"])
def test_an_mla_layer_without_an_indexer_refuses_to_run_without_a_selection(model, entry):
    # Layer 2 of the asset is MLA without an indexer of its own: it attends the selection of
    # the full indexer layer before it, and says so when it is called without one.
    mla = model.network.blocks[2].mixer
    assert mla.indexer is None
    x = mx.zeros((DECODE_TILE, model.args.hidden_size))
    with pytest.raises(ValueError, match="needs a full indexer layer before it"):
        if entry == "tile":
            mla.attend_tile(mla.project_tile(x, 1), 0, MLACache(), None, 1)
        else:
            mla(x, 0, MLACache(), None)
