"""Tokenizer from GGUF metadata: round trip through a GGUF written like llama.cpp's converter."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.engine.detokenizer import StreamingDetokenizer
from ds4mlx.engine.tokenizer import (
    PRE_TOKENIZERS,
    NumericTokenizer,
    Tokenizer,
    TokenizerError,
    TokenType,
    UnsupportedTokenizerError,
    load_tokenizer,
    parse_token_ids,
    pre_tokenizer_for,
    write_tokenizer_metadata,
)
from ds4mlx.gguf import open_gguf

import gguf
import numpy as np
import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
CONTROL_TOKENS = [BOS, EOS, "<｜User｜>", "<｜Assistant｜>"]
USER_DEFINED_TOKENS = ["<think>", "</think>", "｜DSML｜"]

TRAINING_TEXT = (
    """\
The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces before merging.
def add(a, b):
    return a + b  # spaces  and\ttabs

for (int i = 0; i < 10; i++) { total += values[i]; }
Numbers: 1 22 333 4444 55555 3.14159 1,000,000
Ünïcödé café naïve façade — “quotes” ‘single’ … ½
日本語のテキストとカタカナ。中文文本测试。한국어 텍스트.
Emoji: 🚀 🦙 😶‍🌫️ ✅ 👍🏽
I'm sure you're right, they've said we'll go, she'd agree.
"""
    * 4
)

SAMPLE_TEXTS = [
    "Hello world",
    "   leading spaces and trailing   ",
    "tabs\tand\r\nwindows\nnewlines\n\n\n",
    "def f(x):\n    if x > 10:\n        return x ** 2\n",
    "Numbers 1234567 and 3.14, 42nd, 007",
    "Ünïcödé ñ ß Ωmega café",
    "日本語と中文 mixed with English",
    "🚀🦙😶‍🌫️👍🏽 emoji run",
    "quotes: 'single' \"double\" I'm you're",
    "<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>",
    "a<think>b</think>c｜DSML｜d",
    "",
    " ",
    "\u0000\u0001 control bytes \u007f",
]


def train_tokenizer(pre: str) -> HFTokenizer:
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizer_for(pre)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        show_progress=False,
        special_tokens=CONTROL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator([TRAINING_TEXT], trainer)
    hf.add_tokens(USER_DEFINED_TOKENS)
    # The GGUF reader applies llama.cpp's ignore_merges for this pre; compare like with like.
    hf.model.ignore_merges = PRE_TOKENIZERS[pre].ignore_merges
    return hf


def write_gguf(path: Path, hf: HFTokenizer, pre: str, **options) -> Path:
    writer = gguf.GGUFWriter(str(path), "deepseek4")
    write_tokenizer_metadata(writer, hf, pre=pre, **options)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=["deepseek-v3", "gpt-2", "glm4"])
def pair(request, tmp_path_factory) -> tuple[HFTokenizer, Tokenizer, Path]:
    """(original HF tokenizer, tokenizer rebuilt from the GGUF, GGUF path) for one pre."""
    hf = train_tokenizer(request.param)
    path = write_gguf(
        tmp_path_factory.mktemp("tok") / "tok.gguf",
        hf,
        request.param,
        bos_token=BOS,
        eos_token=EOS,
        add_bos=True,
        chat_template="{{ x }}",
    )
    return hf, Tokenizer.from_gguf(open_gguf(path)), path


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_encode_and_decode_match_the_original_tokenizer(pair, text):
    hf, tok, _ = pair
    ids = tok.encode(text)
    assert ids == hf.encode(text).ids
    assert tok.decode(ids) == text
    assert hf.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_matched_atomically(pair):
    _, tok, _ = pair
    for token in CONTROL_TOKENS + USER_DEFINED_TOKENS:
        token_id = tok.token_to_id(token)
        assert token_id is not None
        assert tok.encode(token) == [token_id]
        assert tok.encode(f"x{token}y") == [*tok.encode("x"), token_id, *tok.encode("y")]


def test_parse_special_off_encodes_control_text_as_plain_text(pair):
    _, tok, _ = pair
    plain = tok.encode(BOS, parse_special=False)
    assert plain != [tok.bos_id] and tok.bos_id not in plain
    assert tok.decode(plain) == BOS
    # User-defined tokens stay atomic either way, as in llama.cpp.
    assert tok.encode("</think>", parse_special=False) == [tok.token_to_id("</think>")]


def test_add_special_prepends_bos_when_the_file_asks(pair):
    _, tok, _ = pair
    assert tok.add_bos
    assert tok.encode("hi", add_special=True) == [tok.bos_id, *tok.encode("hi")]


def test_skip_special_hides_control_tokens_only(pair):
    _, tok, _ = pair
    ids = tok.encode("<｜User｜>hi</think>ok<｜end▁of▁sentence｜>")
    assert tok.decode(ids, skip_special=True) == "hi</think>ok"
    assert [tok.is_special(i) for i in ids[:1] + ids[-1:]] == [True, True]
    assert not tok.is_special(tok.token_to_id("</think>"))
    assert tok.id_to_token(tok.encode(" the")[0]).startswith("Ġ")  # byte-level spelling
    with pytest.raises(TokenizerError, match="outside"):
        tok.decode([tok.vocab_size])


def test_metadata_is_laid_out_like_llama_cpp(pair):
    hf, tok, path = pair
    gf = open_gguf(path)
    assert gf.get("tokenizer.ggml.model") == "gpt2"
    assert gf.get("tokenizer.ggml.pre") == tok.pre
    tokens = gf.get("tokenizer.ggml.tokens")
    types = gf.get("tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == hf.get_vocab_size() == tok.vocab_size
    assert {tokens[i] for i, t in enumerate(types) if t == TokenType.CONTROL} == set(CONTROL_TOKENS)
    assert {tokens[i] for i, t in enumerate(types) if t == TokenType.USER_DEFINED} == set(
        USER_DEFINED_TOKENS
    )
    merges = gf.get("tokenizer.ggml.merges")
    assert merges and all(len(m.split(" ")) == 2 for m in merges)
    assert gf.get("tokenizer.ggml.bos_token_id") == hf.token_to_id(BOS) == tok.bos_id
    assert gf.get("tokenizer.ggml.eos_token_id") == hf.token_to_id(EOS) == tok.eos_id
    assert gf.get("tokenizer.chat_template") == "{{ x }}"
    assert tok.stop_ids == (tok.eos_id,)


def test_vocab_is_padded_with_unused_tokens(tmp_path):
    hf = train_tokenizer("deepseek-v3")
    path = write_gguf(tmp_path / "padded.gguf", hf, "deepseek-v3", vocab_size=520)
    gf = open_gguf(path)
    assert gf.get("tokenizer.ggml.tokens")[-1] == "[PAD519]"
    assert gf.get("tokenizer.ggml.token_type")[-1] == TokenType.UNUSED
    tok = Tokenizer.from_gguf(gf)
    assert tok.vocab_size == 520
    assert tok.encode("Hello world") == hf.encode("Hello world").ids
    assert tok.decode([519]) == ""


class FakeGGUF:
    """Just enough of GGUFFile for the metadata checks."""

    path = Path("fake.gguf")

    def __init__(self, **metadata):
        self.metadata = {f"tokenizer.ggml.{key}": value for key, value in metadata.items()}

    def get(self, key, default=None):
        return self.metadata.get(key, default)


def test_end_of_turn_tokens_also_stop_generation():
    fake = FakeGGUF(
        model="gpt2",
        pre="gpt-2",
        tokens=["a", "b", "c"],
        merges=[],
        eos_token_id=0,
        eot_token_id=2,
        eom_token_id=0,
    )
    assert Tokenizer.from_gguf(fake).stop_ids == (0, 2)
    assert load_tokenizer(FakeGGUF(model="test", tokens=["t"])).stop_ids == ()


def test_unknown_pre_tokenizer_is_refused():
    fake = FakeGGUF(model="gpt2", pre="no-such-pre", tokens=["a", "b"], merges=[])
    supported = "chatglm-bpe, deepseek-v3, default, glm4, glm5, gpt-2, joyai-llm"
    with pytest.raises(UnsupportedTokenizerError) as refused:
        Tokenizer.from_gguf(fake)
    assert str(refused.value) == (
        f"unsupported tokenizer.ggml.pre 'no-such-pre' (supported: {supported})"
    )
    with pytest.raises(UnsupportedTokenizerError):
        write_tokenizer_metadata(None, train_tokenizer("gpt-2"), pre="no-such-pre")


def test_non_bpe_tokenizers_are_refused_not_faked():
    fake = FakeGGUF(model="llama", tokens=["a"], merges=[])
    with pytest.raises(UnsupportedTokenizerError, match="llama"):
        Tokenizer.from_gguf(fake)
    with pytest.raises(UnsupportedTokenizerError):
        load_tokenizer(fake)


def test_test_vocab_gets_the_numeric_fallback():
    fake = FakeGGUF(model="test", tokens=[f"tok_{i}" for i in range(128)], merges=[])
    with pytest.raises(UnsupportedTokenizerError, match="test"):
        Tokenizer.from_gguf(fake)
    tok = load_tokenizer(fake)
    assert isinstance(tok, NumericTokenizer) and tok.vocab_size == 128
    # llama.cpp's test vocabulary: each 5-byte chunk is hashed (h = h*31 + byte) mod n_vocab;
    # "hello" -> 99162322 % 128 = 82.
    assert tok.encode("hello") == [82]
    assert len(tok.encode("hello world")) == 3
    assert tok.decode([82, 7]) == "<82><7>"
    assert load_tokenizer(FakeGGUF()).vocab_size is None


def test_oracle_fixture_loads_the_numeric_fallback(ds4_fixture_path):
    tok = load_tokenizer(open_gguf(ds4_fixture_path))
    assert isinstance(tok, NumericTokenizer)
    assert all(0 <= i < tok.vocab_size for i in tok.encode("hello, oracle"))


def test_numeric_fallback_without_vocab_size_asks_for_ids():
    with pytest.raises(TokenizerError, match="token ids"):
        NumericTokenizer(None).encode("hello")


@pytest.mark.parametrize("text", ["1 2 3", "1,2,3", "[1, 2, 3]", "<1><2><3>", " 1\n2\t3 "])
def test_parse_token_ids_accepts_common_spellings(text):
    assert parse_token_ids(text) == [1, 2, 3]


@pytest.mark.parametrize("text", ["1 two 3", "<1>x", "-1"])
def test_parse_token_ids_rejects_other_text(text):
    with pytest.raises(TokenizerError):
        parse_token_ids(text)


# ----------------------------------------------------------------- streaming detokenizer


@pytest.fixture(scope="module")
def deepseek_tokenizer(tmp_path_factory) -> Tokenizer:
    hf = train_tokenizer("deepseek-v3")
    path = write_gguf(tmp_path_factory.mktemp("stream") / "tok.gguf", hf, "deepseek-v3")
    return Tokenizer.from_gguf(open_gguf(path))


def stream(tokenizer, ids, skip_special=False) -> list[str]:
    detok = tokenizer.streaming_detokenizer(skip_special=skip_special)
    return [detok.add(i) for i in ids] + [detok.finish()]


STREAM_TEXTS = ["🦙🚀👍🏽 and 😶‍🌫️", "日本語のテキスト", "ñandú ½ “q”", *SAMPLE_TEXTS]


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_streaming_never_splits_a_character(deepseek_tokenizer, text):
    ids = deepseek_tokenizer.encode(text)
    pieces = stream(deepseek_tokenizer, ids)
    assert "".join(pieces) == deepseek_tokenizer.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_multibyte_characters_spread_over_tokens_are_held_back(deepseek_tokenizer):
    # A rare emoji is not in a 500-token vocabulary: its 4 bytes come as several tokens.
    ids = deepseek_tokenizer.encode("🦒")
    assert len(ids) > 1
    pieces = stream(deepseek_tokenizer, ids)
    assert pieces[:-2] == [""] * (len(ids) - 1) and pieces[-2] == "🦒" and pieces[-1] == ""


def test_truncated_character_becomes_a_replacement_at_finish(deepseek_tokenizer):
    ids = deepseek_tokenizer.encode("🦒")[:-1]
    assert "".join(stream(deepseek_tokenizer, ids)) == "\ufffd"


def test_streaming_can_skip_control_tokens(deepseek_tokenizer):
    ids = deepseek_tokenizer.encode("<｜User｜>hi</think>")
    assert "".join(stream(deepseek_tokenizer, ids, skip_special=True)) == "hi</think>"


def test_numeric_tokens_stream_as_ids():
    assert "".join(stream(NumericTokenizer(128), [5, 99])) == "<5><99>"


def test_detokenizer_reset_starts_a_new_stream(deepseek_tokenizer):
    detok = StreamingDetokenizer(deepseek_tokenizer)
    held = deepseek_tokenizer.encode("🦒")[:-1]
    for token_id in held:
        detok.add(token_id)
    assert detok.tokens == held
    detok.reset()
    assert detok.tokens == [] and detok.add(deepseek_tokenizer.encode("a")[0]) == "a"


# ----------------------------------------------------------------- a vocabulary written by hand

# One token of each type; the single characters let plain text spell the special tokens.
HAND_TOKENS = ["a", "b", "ab", "Ġ", "<|x|>", "<unk>", "[PAD6]", "<u>", "<", "|", "x", ">"]
HAND_TYPES = [1, 1, 1, 1, 3, 2, 5, 4, 1, 1, 1, 1]


def hand_tokenizer(**options) -> Tokenizer:
    options.setdefault("token_types", HAND_TYPES)
    return Tokenizer(HAND_TOKENS, options.pop("merges", ["a b"]), "gpt-2", **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"token_types": HAND_TYPES[:-1]}, "^11 token types for 12 tokens$"),
        ({"bos_id": 12}, "^bos token id 12 is outside the vocabulary$"),
        ({"eos_id": -1}, "^eos token id -1 is outside the vocabulary$"),
        ({"pad_id": 12}, "^pad token id 12 is outside the vocabulary$"),
        ({"end_of_generation_ids": [3, 12]}, "^end-of-generation token id 12 is outside"),
        ({"merges": ["ab"]}, r"^malformed merge 'ab' \(expected 'left right'\)$"),
    ],
)
def test_a_vocabulary_that_does_not_hold_together_is_refused(options, message):
    with pytest.raises(TokenizerError, match=message):
        hand_tokenizer(**options)


def test_duplicate_tokens_are_refused():
    with pytest.raises(TokenizerError, match="duplicate tokens"):
        Tokenizer(["a", "b", "a"], [], "gpt-2")


def test_ids_at_the_vocabulary_edges_are_accepted():
    tok = hand_tokenizer(bos_id=0, eos_id=11, token_types=[*HAND_TYPES, 1, 1])
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 11, 12)
    for bad in (12, -1):
        with pytest.raises(TokenizerError, match=rf"^token id {bad} is outside the vocabulary"):
            tok.id_to_token(bad)
    assert tok.id_to_token(11) == ">"


def test_each_token_type_encodes_and_decodes_as_llama_cpp_does():
    tok = hand_tokenizer()
    # CONTROL and UNKNOWN tokens are matched only with parse_special; USER_DEFINED always.
    assert tok.encode("ab<|x|><unk><u>") == [2, 4, 5, 7]
    assert tok.encode("<|x|><u>", parse_special=False) == [8, 9, 10, 9, 11, 7]
    # skip_special hides CONTROL and UNKNOWN; UNUSED tokens stand for no bytes at all.
    assert tok.decode([6, 2, 4, 5, 7], skip_special=True) == "ab<u>"
    assert tok.decode([6, 2, 4, 5, 7]) == "ab<|x|><unk><u>"
    assert [tok.is_special(i) for i in (4, 5, 6, 7, 2)] == [True, True, False, False, False]
    # A type value llama.cpp does not define is taken as ordinary text.
    odd = hand_tokenizer(token_types=[9, *HAND_TYPES[1:]])
    assert odd.decode([0, 1]) == "ab" and not odd.is_special(0)


def test_bos_and_eos_are_added_only_where_the_file_asks():
    tok = hand_tokenizer(bos_id=4, eos_id=5, add_bos=True, add_eos=True)
    assert tok.encode("ab", add_special=True) == [4, 2, 5]
    assert tok.encode("ab") == [2]
    assert hand_tokenizer(bos_id=4, eos_id=5, add_eos=True).encode("ab", add_special=True) == [
        2,
        5,
    ]


def test_stop_ids_are_eos_then_the_end_of_generation_tokens_once_each():
    tok = hand_tokenizer(eos_id=4, end_of_generation_ids=[5, 4, 7])
    assert tok.stop_ids == (4, 5, 7)
    assert hand_tokenizer(end_of_generation_ids=[5]).stop_ids == (5,)


def test_a_file_tokenizer_takes_every_stop_token_and_flag_it_names():
    metadata = FakeGGUF(
        model="gpt2",
        tokens=HAND_TOKENS,
        merges=["a b"],
        token_type=HAND_TYPES,
        eos_token_id=4,
        eot_token_id=5,
        eom_token_id=7,
        bos_token_id=3,
        add_bos_token=True,
    )
    tok = Tokenizer.from_gguf(metadata)
    assert tok.pre == "default"  # a file without tokenizer.ggml.pre
    assert tok.stop_ids == (4, 5, 7)
    assert tok.encode("ab", add_special=True) == [3, 2]


def test_a_file_without_the_bos_and_eos_flags_adds_neither():
    # llama.cpp reads a missing add_bos_token/add_eos_token as false: a BOS id alone adds nothing.
    metadata = FakeGGUF(
        model="gpt2", tokens=HAND_TOKENS, merges=["a b"], bos_token_id=3, eos_token_id=4
    )
    tok = Tokenizer.from_gguf(metadata)
    assert (tok.add_bos, tok.add_eos) == (False, False)
    assert tok.encode("ab", add_special=True) == [2]


@pytest.mark.parametrize("missing", ["tokens", "merges"])
def test_a_file_without_tokens_or_merges_is_refused(missing):
    values = {"model": "gpt2", "tokens": HAND_TOKENS, "merges": ["a b"]}
    values[missing] = [] if missing == "tokens" else None
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens/merges missing"):
        Tokenizer.from_gguf(FakeGGUF(**values))


def test_files_without_a_tokenizer_get_ids():
    assert load_tokenizer(FakeGGUF(model="none")).vocab_size is None
    assert load_tokenizer(FakeGGUF(tokens=["a", "b"])).vocab_size == 2


def test_the_numeric_tokenizer_hashes_five_byte_chunks_and_has_no_specials():
    numeric = NumericTokenizer(1000)
    # "abcde" hashes to 9_665_256_395 and "fgh" to 98_319: modulo 1000.
    assert numeric.encode("abcdefgh") == [395, 319]
    assert numeric.encode("é") == [(195 * 31 + 169) % 1000]
    assert (numeric.bos_id, numeric.eos_id, numeric.stop_ids) == (None, None, ())
    assert [numeric.token_to_id(t) for t in ("<12>", "12", "<12>x", "<x>")] == [
        12,
        None,
        None,
        None,
    ]


def test_the_metadata_writer_refuses_what_the_reader_could_not_use(tmp_path):
    hf = train_tokenizer("gpt-2")
    with pytest.raises(TokenizerError, match=r"^vocab_size 10 is smaller than the tokenizer"):
        write_gguf(tmp_path / "a.gguf", hf, "gpt-2", vocab_size=10)
    with pytest.raises(TokenizerError, match=r"^token '<nope>' is not in the tokenizer$"):
        write_gguf(tmp_path / "b.gguf", hf, "gpt-2", bos_token="<nope>")
    words = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(TokenizerError, match="^expected a BPE tokenizer, got 'WordLevel'$"):
        write_gguf(tmp_path / "c.gguf", words, "gpt-2")
    # Exactly the tokenizer's size needs no padding; add_bos False is written, not left out.
    size = hf.get_vocab_size(with_added_tokens=True)
    path = write_gguf(tmp_path / "d.gguf", hf, "gpt-2", vocab_size=size, add_bos=False)
    written = open_gguf(path)
    assert len(written.get("tokenizer.ggml.tokens")) == size
    assert written.get("tokenizer.ggml.add_bos_token") is False


@pytest.mark.parametrize(
    ("text", "special"),
    [
        ("<pad>", True),
        ("<mask>", True),
        ("<2mass>", True),
        ("[@BOS@]", True),
        ("<|im_start|>", True),
        ("<unused12>", True),
        ("<|im_start", False),
        ("im_start|>", False),
        ("<unused12", False),
        ("<think>", False),
    ],
)
def test_added_tokens_that_look_special_are_written_as_control(tmp_path, text, special):
    hf = train_tokenizer("gpt-2")
    hf.add_tokens([text])
    written = open_gguf(write_gguf(tmp_path / "t.gguf", hf, "gpt-2"))
    token_id = written.get("tokenizer.ggml.tokens").index(text)
    expected = TokenType.CONTROL if special else TokenType.USER_DEFINED
    assert written.get("tokenizer.ggml.token_type")[token_id] == expected


def test_merges_are_written_as_spaced_strings():
    from ds4mlx.engine.tokenizer import _merges_as_strings

    assert _merges_as_strings([["a b", "c"], ["d", "e"]]) == ["a\u0120b c", "d e"]
    assert _merges_as_strings(["a b", "c d"]) == ["a b", "c d"]
    assert _merges_as_strings([]) == []


def test_deepseek_and_glm_file_names_pick_their_splits():
    assert PRE_TOKENIZERS["joyai-llm"] == PRE_TOKENIZERS["deepseek-v3"]
    assert PRE_TOKENIZERS["glm5"].ignore_merges and PRE_TOKENIZERS["glm4"].ignore_merges
    assert not PRE_TOKENIZERS["chatglm-bpe"].ignore_merges
    assert PRE_TOKENIZERS["glm5"].regexes == PRE_TOKENIZERS["chatglm-bpe"].regexes


def test_a_character_outside_the_byte_alphabet_keeps_its_utf8():
    # Only a hand-edited vocabulary holds one; its bytes are kept, not dropped.
    tok = Tokenizer(["a", "x中y", "Ġ€"], [], "gpt-2")
    assert tok.token_bytes(1) == "x中y".encode()
    assert tok.decode([2, 0]) == " €a"


def test_added_tokens_decode_as_their_own_text_not_as_byte_level():
    # "é" and "Ġ" are byte-level spellings (of 0xE9 and a space) in a NORMAL token only.
    tok = Tokenizer(["a", "Ġé", "<é>", "<|Ġ|>"], [], "gpt-2", token_types=[1, 1, 4, 3])
    assert tok.token_bytes(1) == b" \xe9"
    assert tok.decode([2, 3]) == "<é><|Ġ|>"
    assert tok.decode([2, 3], skip_special=True) == "<é>"


def test_the_metadata_writer_pads_gaps_and_spaces_user_defined_tokens(tmp_path):
    # An id the tokenizer skips becomes an UNUSED [PAD<id>]; the ids after it stay in place.
    gap = HFTokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 3}, merges=[("a", "b")]))
    written = open_gguf(write_gguf(tmp_path / "gap.gguf", gap, "gpt-2", pad_token="b"))
    assert written.get("tokenizer.ggml.tokens") == ["a", "b", "[PAD2]", "ab"]
    assert list(written.get("tokenizer.ggml.token_type")) == [1, 1, 5, 1]
    assert written.get("tokenizer.ggml.padding_token_id") == 1
    # A user-defined token's U+2581 is written as the space it stands for (llama.cpp's converter).
    words = HFTokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    words.decoder = decoders.ByteLevel()
    words.add_tokens([AddedToken("\u2581hi", special=False, normalized=False)])
    written = open_gguf(write_gguf(tmp_path / "user.gguf", words, "gpt-2"))
    assert written.get("tokenizer.ggml.tokens")[3] == " hi"
    assert list(written.get("tokenizer.ggml.token_type"))[3] == 4
