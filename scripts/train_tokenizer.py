#!/usr/bin/env python3
"""Train the tiny model family's byte-level BPE (``tokenizers``) on the corpus.

Splitting is llama.cpp's DeepSeek-V3 pre-tokenizer (the same one the GGUF reader rebuilds), and the
DeepSeek-V4 chat template's markers are added tokens so they are matched atomically. Output is a
``tokenizer.json`` that ``scripts/train_tiny.py`` embeds in every GGUF of the family.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ds4mlx  # noqa: F401
from ds4mlx.engine.chat import deepseek4
from ds4mlx.engine.tokenizer import pre_tokenizer_for

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PRE = "deepseek-v3"
# Control tokens of the template (never produced from plain text) ...
CONTROL_TOKENS = [deepseek4.BOS, deepseek4.EOS, deepseek4.USER, deepseek4.ASSISTANT]
# ... and markup that should be one token each so that a tiny model learns it easily.
MARKUP_TOKENS = [
    deepseek4.THINK_START,
    deepseek4.THINK_END,
    deepseek4.DSML,
    "<tool_result>",
    "</tool_result>",
]


def train(corpus: Path, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer_for(PRE)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(CONTROL_TOKENS) - len(MARKUP_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts():
        with open(corpus, encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)["text"]

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    tokenizer.add_special_tokens(CONTROL_TOKENS)
    tokenizer.add_tokens(MARKUP_TOKENS)
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus/corpus.jsonl"))
    parser.add_argument("--vocab-size", type=int, default=6144)
    parser.add_argument("--out", type=Path, default=Path("build/tokenizer.json"))
    args = parser.parse_args()
    tokenizer = train(args.corpus, args.vocab_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out))
    print(f"vocab {tokenizer.get_vocab_size()} -> {args.out}")


if __name__ == "__main__":
    main()
