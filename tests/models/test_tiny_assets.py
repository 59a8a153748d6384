"""The shipped default model, ``assets/ds4-tiny.gguf`` (made by ``scripts/train_tiny.py``).

It must keep every DeepSeek-V4 feature it promises, the real checkpoints' quantization mix, a
working tokenizer, exact chunked feeding, and a language model well above chance.
"""

from __future__ import annotations

import functools
import math
import re
import sysconfig
from pathlib import Path

import ds4mlx
from ds4mlx.agent.tool_schemas import AGENT_TOOLS, SYSTEM_PROMPT
from ds4mlx.engine.chat import deepseek4
from ds4mlx.gguf import open_gguf
from ds4mlx.models.deepseek4 import CSA_RATIO, HCA_RATIO, ModelArgs

import numpy as np
import pytest
from gguf import GGMLQuantizationType

T = GGMLQuantizationType
ASSET = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
# Held-out NLL per token measured on the shipped asset (chat 3.41, code 6.24 nats; uniform
# log(6144) = 8.72), plus a margin.
CHAT_NLL_LIMIT = 3.7
CODE_NLL_LIMIT = 6.5
# Standard-library modules whose token frequencies make the unigram baseline.
UNIGRAM_SOURCES = (
    "textwrap.py",
    "shlex.py",
    "fnmatch.py",
    "heapq.py",
    "string.py",
    "queue.py",
    "calendar.py",
    "bisect.py",
    "contextlib.py",
    "functools.py",
)
UNIGRAM_MARGIN = 1.0  # nats per token: "a wide margin"

# Expected tensor types, first match wins (the real DeepSeek-V4-Flash Q2_K mix).
TENSOR_TYPES = [
    (r"blk\.\d+\.ffn_gate_tid2eid\.weight", T.I32),
    (r"blk\.\d+\.ffn_(gate|up)_exps\.weight", T.Q2_K),
    (r"blk\.\d+\.ffn_down_exps\.weight", T.Q4_K),
    (r"output\.weight", T.Q6_K),
    (r".*(_norm|_base|_scale|_sinks)\.weight|.*\.bias|blk\.\d+\.ffn_gate_inp\.weight", T.F32),
    (r".*", T.Q8_0),
]


@functools.cache
def _model():
    return ds4mlx.load_model(ASSET)


@functools.cache
def _args() -> ModelArgs:
    return _model().args


def _nll(logits: np.ndarray, targets: list[int]) -> float:
    """Mean NLL of ``targets`` under ``logits`` (one row per target)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return float(-np.mean(log_probs[np.arange(len(targets)), targets]))


def test_file_is_small():
    assert ASSET.stat().st_size < 15 * 2**20


def test_promised_architecture():
    args, gguf = _args(), open_gguf(ASSET)
    context = gguf.get("deepseek4.context_length")
    assert args.num_layers >= 6
    assert args.hc_mult == 4
    assert {0, CSA_RATIO, HCA_RATIO} <= set(args.compress_ratios)
    assert args.index_topk < 1024 // CSA_RATIO  # the indexer selects at a 1k context
    assert args.sliding_window < context
    assert args.n_experts >= 8 and 2 <= args.n_experts_used <= 4
    assert args.n_hash_layers == 1
    assert gguf.has_tensor("blk.0.ffn_gate_tid2eid.weight")
    assert not gguf.has_tensor("blk.1.ffn_gate_tid2eid.weight")
    assert args.n_shared_experts >= 1
    assert min(args.swiglu_limits) > 0 and min(args.swiglu_limits_shared) > 0
    assert args.q_lora_rank > 0 and args.o_groups > 1 and args.o_lora_rank > 0
    assert all(gguf.has_tensor(f"blk.{i}.attn_sinks.weight") for i in range(args.num_layers))
    assert args.rope_scaling_type == "yarn" and args.rope_freq_scale < 1.0
    assert args.rope_orig_ctx * round(1 / args.rope_freq_scale) == context


def test_quantization_mix():
    gguf = open_gguf(ASSET)
    seen = set()
    for name in gguf.tensor_names():
        expected = next(t for pattern, t in TENSOR_TYPES if re.fullmatch(pattern, name))
        assert gguf.tensor_type(name) == expected, name
        seen.add(expected)
    assert seen == {t for _, t in TENSOR_TYPES}


def test_tokenizer_round_trips_text_and_chat_markup():
    tokenizer = _model().tokenizer
    code = "def add(a, b):\n    return a + b  # ünïcode ✓\n"
    assert tokenizer.decode(tokenizer.encode(code)) == code
    prompt = deepseek4.render_chat(
        [
            {"role": "user", "content": "Run the tests."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "bash", "arguments": {"command": "pytest -q"}}],
            },
        ],
        tools=AGENT_TOOLS[:1],
    )
    ids = tokenizer.encode(prompt)
    assert tokenizer.decode(ids) == prompt
    for marker in (
        deepseek4.BOS,
        deepseek4.EOS,
        deepseek4.USER,
        deepseek4.ASSISTANT,
        deepseek4.DSML,
        deepseek4.THINK_END,
    ):
        assert len(tokenizer.encode(marker)) == 1, marker
    assert tokenizer.encode(deepseek4.EOS)[0] in tokenizer.stop_ids


def test_chunked_feeding_equals_batch():
    # Past the window (64), several CSA blocks (4) and one HCA block (128). In float32: the
    # chunkings of one float computation agree to the last bits, which native Q8_0 products
    # (inputs rounded to 8 bits) can turn into a rounding step (test_bench_quality checks them).
    model = ds4mlx.load_model(ASSET, weights_dtype="f32")
    tokens = model.tokenizer.encode(Path(deepseek4.__file__).read_text()[:4000])[:200]
    batch = model.logits(tokens)
    session = model.new_session()
    fed = np.concatenate([session.feed(tokens[i : i + 9]) for i in range(0, len(tokens), 9)])
    assert np.max(np.abs(fed - batch)) <= 1e-4 * np.max(np.abs(batch))


def test_heldout_chat_nll():
    """An agent conversation in the training chats' style (new names), scored after the shared
    system prompt."""
    model = _model()
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What does `quote_header` do?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "search", "arguments": {"pattern": "def quote_header\\("}}],
        },
        {"role": "tool", "content": "src/quo_41.py:88: def quote_header(value):"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"name": "read", "arguments": {"path": "src/quo_41.py", "start": 88, "end": 93}}
            ],
        },
        {
            "role": "tool",
            "content": "   88  def quote_header(value):\n"
            '   89      """Quote a header value if needed."""\n'
            "   90      if not value:\n   91          return '\"\"'\n"
            "   92      return value",
        },
        {
            "role": "assistant",
            "content": "`quote_header` is defined in `src/quo_41.py` at line "
            "88. Quote a header value if needed.",
        },
    ]
    text = deepseek4.render_chat(messages, tools=AGENT_TOOLS, add_generation_prompt=False)
    ids = model.tokenizer.encode(text)
    start = ids.index(model.tokenizer.encode(deepseek4.USER)[0])
    logits = model.logits(ids[:-1])
    nll = _nll(logits[start:], ids[start + 1 :])
    assert nll < CHAT_NLL_LIMIT < math.log(model.args.vocab_size) / 2


def test_heldout_code_nll():
    """The start of a standard-library module that training held out."""
    model = _model()
    source = (Path(sysconfig.get_paths()["stdlib"]) / "getpass.py").read_text()
    ids = model.tokenizer.encode(source)[:512]
    nll = _nll(model.logits(ids[:-1]), ids[1:])
    assert nll < CODE_NLL_LIMIT < math.log(model.args.vocab_size)


@pytest.mark.parametrize("request_text", ["Run the tests.", "List the workspace."])
def test_agent_request_starts_a_tool_call(request_text):
    """Greedy decoding of an agent request opens a DSML tool-call block."""
    model = _model()
    prompt = deepseek4.render_chat(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": request_text}],
        tools=AGENT_TOOLS,
    )
    session = model.new_session()
    logits = session.feed(model.tokenizer.encode(prompt))
    out = []
    for _ in range(6):
        out.append(int(np.argmax(logits[-1])))
        logits = session.feed(out[-1:])
    assert f"<{deepseek4.DSML}tool_calls>" in model.tokenizer.decode(out)


def _stdlib_ids(name: str) -> list[int]:
    return _model().tokenizer.encode((Path(sysconfig.get_paths()["stdlib"]) / name).read_text())


def test_code_beats_a_unigram_baseline():
    """Held-out code NLL under the model vs under add-one unigram frequencies of other stdlib
    modules."""
    model = _model()
    counts = (
        np.bincount(
            np.concatenate([_stdlib_ids(n) for n in UNIGRAM_SOURCES]),
            minlength=model.args.vocab_size,
        )
        + 1.0
    )
    ids = _stdlib_ids("getpass.py")[:512]
    unigram = float(-np.mean(np.log(counts / counts.sum())[ids[1:]]))
    nll = _nll(model.logits(ids[:-1]), ids[1:])
    assert nll < unigram - UNIGRAM_MARGIN, f"model {nll:.3f} vs unigram {unigram:.3f} nats/token"


def test_greedy_code_continuation_round_trips_through_the_tokenizer():
    model = _model()
    session = model.new_session()
    logits = session.feed(_stdlib_ids("getpass.py")[:64])
    generated = []
    for _ in range(48):
        generated.append(int(np.argmax(logits[-1])))
        logits = session.feed(generated[-1:])
    text = model.tokenizer.decode(generated)
    assert text.strip()
    assert model.tokenizer.decode(model.tokenizer.encode(text)) == text
