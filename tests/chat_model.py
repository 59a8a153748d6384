"""A small DeepSeek-V4 model with a real BPE tokenizer and chat template, for tests of the faces.

Built from llama.cpp's oracle fixture ``deepseek4-b-f16`` (random weights): every tensor and key
is kept, except that the vocabulary becomes a byte-level BPE trained here on rendered agent chats,
with new random embedding and output rows for it. Generation is gibberish, but every path a chat
request takes (template, special tokens, streaming detokenization, tool-call parsing, stop tokens)
runs for real. Tests that need a trained model use ``assets/ds4-tiny.gguf``.
"""

from __future__ import annotations

from pathlib import Path

from ds4mlx.agent.tool_schemas import AGENT_TOOLS
from ds4mlx.engine.chat import deepseek4
from ds4mlx.engine.tokenizer import pre_tokenizer_for, write_tokenizer_metadata

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, quants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 640
_VOCAB_TENSORS = ("token_embd.weight", "output.weight")

_SAMPLES = [
    [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "list", "arguments": {"path": "."}}],
        },
        {"role": "tool", "content": "a.py 10\nb.py 20"},
        {"role": "assistant", "content": "There are two files: a.py and b.py."},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that adds two numbers."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b\n"},
    ],
]


def _train_tokenizer() -> Tokenizer:
    texts = [
        deepseek4.render_chat(m, tools=AGENT_TOOLS, add_generation_prompt=False) for m in _SAMPLES
    ] * 4
    texts.append("The quick brown fox jumps over the lazy dog. 0123456789 éàü 😀 {}[]()")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer_for("deepseek-v3")
    tokenizer.decoder = decoders.ByteLevel()
    specials = [deepseek4.BOS, deepseek4.EOS, deepseek4.USER, deepseek4.ASSISTANT]
    markup = [
        deepseek4.THINK_START,
        deepseek4.THINK_END,
        deepseek4.DSML,
        "<tool_result>",
        "</tool_result>",
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(specials) - len(markup),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens(specials)
    tokenizer.add_tokens(markup)
    return tokenizer


def build_chat_model(source: Path, path: Path, seed: int = 0) -> Path:
    """Write the chat model derived from the oracle GGUF ``source`` to ``path``."""
    reader = GGUFReader(source)
    hf_tokenizer = _train_tokenizer()
    vocab = hf_tokenizer.get_vocab_size()
    writer = GGUFWriter(path, "deepseek4")
    for key, field in reader.fields.items():
        is_array = field.types[0] == GGUFValueType.ARRAY
        if key.startswith(("GGUF.", "general.architecture", "tokenizer.")) or (
            is_array and len(field.types) < 2
        ):  # empty arrays cannot be written
            continue
        value = vocab if key == "deepseek4.vocab_size" else field.contents()
        sub_type = field.types[1] if is_array else None
        writer.add_key_value(key, value, field.types[0], sub_type)
    write_tokenizer_metadata(
        writer,
        hf_tokenizer,
        pre="deepseek-v3",
        bos_token=deepseek4.BOS,
        eos_token=deepseek4.EOS,
        add_bos=True,
    )
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        data = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        data = data.reshape(tuple(reversed(tensor.shape.tolist())))
        if tensor.name in _VOCAB_TENSORS:
            data = rng.normal(0.0, float(data.std()), (vocab, data.shape[1])).astype(np.float32)
        writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
