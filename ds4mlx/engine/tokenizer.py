"""Tokenizers built from GGUF metadata (``tokenizer.ggml.*``), and the reverse for training scripts.

Byte-level BPE files (``tokenizer.ggml.model = "gpt2"``, as DeepSeek-V4 and GLM use) become a
Hugging Face ``tokenizers`` BPE with the pre-tokenizer split regexes llama.cpp uses for the file's
``tokenizer.ggml.pre`` (``src/llama-vocab.cpp``, ``llm_tokenizer_bpe``).  Tokens typed CONTROL,
USER_DEFINED or UNKNOWN become added tokens, so they are matched atomically before BPE runs, as in
llama.cpp's ``tokenizer_st_partition``.

llama.cpp's test vocabulary (``tokenizer.ggml.model = "test"``, used by the oracle fixtures) and
files without a tokenizer get :class:`NumericTokenizer`: text is hashed into ids exactly as
llama.cpp does for that vocabulary and tokens print as ``<id>``.  :func:`load_tokenizer` picks
between the two; :meth:`Tokenizer.from_gguf` itself raises :class:`UnsupportedTokenizerError` for
anything that is not a byte-level BPE, so a real model can never silently fall back to ids.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from ds4mlx.engine.detokenizer import StreamingDetokenizer

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    from ds4mlx.gguf import GGUFFile

    from gguf import GGUFWriter


class TokenizerError(Exception):
    """A tokenizer could not be built or could not encode its input."""


class UnsupportedTokenizerError(TokenizerError):
    """The file's tokenizer is not a byte-level BPE that ds4mlx can rebuild."""


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (llama.cpp ``llama_token_type``)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Matched atomically before BPE (llama.cpp's special-token cache holds exactly these types).
_ATOMIC_TYPES = frozenset({TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN})
# Matched only when parse_special is on, and hidden when decoding with skip_special.
_SPECIAL_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN})


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How llama.cpp splits text before BPE for one ``tokenizer.ggml.pre`` value.

    Each regex splits every piece produced by the previous one; matches and the gaps between them
    both become pieces (``tokenizers``' "isolated" split behaviour).  ``ignore_merges`` takes a
    whole piece straight from the vocabulary when it is there, before trying merges.
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False


# Regexes copied from llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe constructor, commit
# 0c1e570); the names that select them come from llama_vocab::impl::load.
_DEEPSEEK3 = PreTokenizerSpec(
    (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    )
)
_GPT2 = PreTokenizerSpec(
    (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",)
)
_DEFAULT = PreTokenizerSpec(
    (
        r"[\p{P}\$\+<=>\^~\|]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        r"\p{N}+",
        r"[0-9][0-9][0-9]",
    )
)
_CHATGLM4_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    # DeepSeek-V3/V4; real DeepSeek-V4-Flash GGUFs declare "joyai-llm" (same regexes, see ds4.c).
    "deepseek-v3": _DEEPSEEK3,
    "joyai-llm": _DEEPSEEK3,
    "gpt-2": _GPT2,
    "default": _DEFAULT,
    "chatglm-bpe": PreTokenizerSpec((_CHATGLM4_REGEX,)),
    "glm4": PreTokenizerSpec((_CHATGLM4_REGEX,), ignore_merges=True),
    "glm5": PreTokenizerSpec((_CHATGLM4_REGEX,), ignore_merges=True),
}


def pre_tokenizer_for(pre: str) -> pre_tokenizers.PreTokenizer:
    """The ``tokenizers`` pre-tokenizer (regex splits, then byte-level mapping) for ``pre``.

    Training scripts use this so that a tokenizer they train splits text exactly as the GGUF
    reader will.
    """
    spec = _pre_tokenizer_spec(pre)
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in spec.regexes]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([*splits, byte_level])


def _pre_tokenizer_spec(pre: str) -> PreTokenizerSpec:
    try:
        return PRE_TOKENIZERS[pre]
    except KeyError:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise UnsupportedTokenizerError(
            f"unsupported tokenizer.ggml.pre '{pre}' (supported: {known})"
        ) from None


@lru_cache(maxsize=1)
def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters, which byte-level BPE vocabularies
    are written in (space is 'Ġ', newline is 'Ċ', …)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


@lru_cache(maxsize=1)
def _char_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in _byte_to_char().items()}


# A dictionary, not ``TokenType(value)``: a real vocabulary looks up 129k types while loading.
_TOKEN_TYPES = {member.value: member for member in TokenType}


def _byte_level_bytes(token_text: str) -> bytes:
    char_to_byte = _char_to_byte()
    out = bytearray()
    for char in token_text:
        byte = char_to_byte.get(char)
        # A character outside the byte alphabet can only come from a hand-edited vocabulary; keep
        # its UTF-8 rather than dropping it (as Hugging Face's ByteLevel decoder does).
        out.extend(char.encode("utf-8") if byte is None else (byte,))
    return bytes(out)


class TextTokenizer(Protocol):
    """What the engine and the faces need from a tokenizer."""

    @property
    def vocab_size(self) -> int | None: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def stop_ids(self) -> tuple[int, ...]: ...

    def encode(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str: ...
    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes: ...
    def token_to_id(self, text: str) -> int | None: ...
    def streaming_detokenizer(self, skip_special: bool = False) -> StreamingDetokenizer: ...


class Tokenizer:
    """A byte-level BPE tokenizer rebuilt from a GGUF file's metadata."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        pre: str,
        *,
        token_types: Sequence[int] | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        end_of_generation_ids: Sequence[int] = (),
        add_bos: bool = False,
        add_eos: bool = False,
    ):
        if token_types is not None and len(token_types) < len(tokens):
            raise TokenizerError(f"{len(token_types)} token types for {len(tokens)} tokens")
        self._tokens = list(tokens)
        self._types = (
            [_TOKEN_TYPES.get(t, TokenType.UNDEFINED) for t in token_types[: len(tokens)]]
            if token_types is not None
            else [TokenType.NORMAL] * len(tokens)
        )
        self._token_to_id = {text: token_id for token_id, text in enumerate(self._tokens)}
        if len(self._token_to_id) != len(self._tokens):
            raise TokenizerError("tokenizer.ggml.tokens holds duplicate tokens")
        for name, token_id in (
            ("bos", bos_id),
            ("eos", eos_id),
            ("pad", pad_id),
            *(("end-of-generation", i) for i in end_of_generation_ids),
        ):
            if token_id is not None and not 0 <= token_id < len(self._tokens):
                raise TokenizerError(f"{name} token id {token_id} is outside the vocabulary")
        self.pre = pre
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        # Tokens that end generation: EOS plus the file's end-of-turn/end-of-message ids.
        self.stop_ids = tuple(
            dict.fromkeys(i for i in (eos_id, *end_of_generation_ids) if i is not None)
        )
        self.add_bos = add_bos
        self.add_eos = add_eos
        self._hf = self._build_hf_tokenizer(merges)
        # ``encode_special_tokens`` is tokenizer-wide state, so encodes that flip it take a lock.
        self._encode_lock = threading.Lock()
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile) -> Tokenizer:
        """Build the tokenizer described by ``gguf_file``'s ``tokenizer.ggml.*`` metadata.

        Raises :class:`UnsupportedTokenizerError` unless the file holds a byte-level BPE
        (``tokenizer.ggml.model = "gpt2"``) with a supported ``tokenizer.ggml.pre``.
        """
        model = gguf_file.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise UnsupportedTokenizerError(
                f"{gguf_file.path}: tokenizer.ggml.model is {model!r}; only byte-level BPE "
                "('gpt2') can be rebuilt (use load_tokenizer for llama.cpp's 'test' vocabulary)"
            )
        tokens = gguf_file.get("tokenizer.ggml.tokens")
        merges = gguf_file.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise TokenizerError(f"{gguf_file.path}: tokenizer.ggml.tokens/merges missing")
        return cls(
            tokens,
            merges,
            gguf_file.get("tokenizer.ggml.pre") or "default",
            token_types=gguf_file.get("tokenizer.ggml.token_type"),
            bos_id=gguf_file.get("tokenizer.ggml.bos_token_id"),
            eos_id=gguf_file.get("tokenizer.ggml.eos_token_id"),
            pad_id=gguf_file.get("tokenizer.ggml.padding_token_id"),
            end_of_generation_ids=[
                token_id
                for key in ("eot_token_id", "eom_token_id")
                if (token_id := gguf_file.get(f"tokenizer.ggml.{key}")) is not None
            ],
            add_bos=bool(gguf_file.get("tokenizer.ggml.add_bos_token", False)),
            add_eos=bool(gguf_file.get("tokenizer.ggml.add_eos_token", False)),
        )

    def _build_hf_tokenizer(self, merges: Sequence[str]) -> HFTokenizer:
        spec = _pre_tokenizer_spec(self.pre)
        merge_pairs = []
        for merge in merges:
            left, space, right = merge.partition(" ")
            if not space:
                raise TokenizerError(f"malformed merge {merge!r} (expected 'left right')")
            merge_pairs.append((left, right))
        hf = HFTokenizer(
            models.BPE(
                vocab=dict(self._token_to_id), merges=merge_pairs, ignore_merges=spec.ignore_merges
            )
        )
        hf.pre_tokenizer = pre_tokenizer_for(self.pre)
        hf.decoder = decoders.ByteLevel()
        atomic = [
            AddedToken(text, special=self._types[token_id] in _SPECIAL_TYPES, normalized=False)
            for token_id, text in enumerate(self._tokens)
            if self._types[token_id] in _ATOMIC_TYPES
        ]
        hf.add_tokens(atomic)
        return hf

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for ``text``.

        ``add_special`` adds BOS/EOS where the file asks for them (``add_bos_token``), as
        llama.cpp's ``add_special``; rendered chat prompts already contain BOS and want False.
        ``parse_special`` turns the text of CONTROL tokens into those tokens; switch it off for
        untrusted text that must stay plain (USER_DEFINED tokens are matched either way).
        """
        with self._encode_lock:
            self._hf.encode_special_tokens = not parse_special
            # encode_batch releases the GIL while it works (encode holds it): a long prompt
            # tokenized on one thread must not stall the others, a server's event loop above all.
            ids = self._hf.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """The bytes token ``token_id`` stands for (llama.cpp ``token_to_piece`` semantics)."""
        token_type = self._type_of(token_id)
        if token_type in _SPECIAL_TYPES and skip_special:
            return b""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            text = self._tokens[token_id]
            if token_type in _ATOMIC_TYPES:
                cached = text.encode("utf-8")
            elif token_type == TokenType.UNUSED:
                cached = b""
            else:
                cached = _byte_level_bytes(text)
            self._bytes_cache[token_id] = cached
        return cached

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text for ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return b"".join(self.token_bytes(i, skip_special) for i in ids).decode("utf-8", "replace")

    def streaming_detokenizer(self, skip_special: bool = False) -> StreamingDetokenizer:
        return StreamingDetokenizer(self, skip_special)

    def token_to_id(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled ``text`` (as stored in the file), or None."""
        return self._token_to_id.get(text)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry for ``token_id`` as stored in the file (byte-level spelling)."""
        self._type_of(token_id)
        return self._tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a CONTROL/UNKNOWN token (hidden by ``skip_special``)."""
        return self._type_of(token_id) in _SPECIAL_TYPES

    def _type_of(self, token_id: int) -> TokenType:
        if not 0 <= token_id < len(self._tokens):
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary (size {len(self._tokens)})"
            )
        return self._types[token_id]


class NumericTokenizer:
    """Stand-in for files without a real tokenizer: ids in, ``<id>`` out.

    For llama.cpp's test vocabulary (``tokenizer.ggml.model = "test"``) text is hashed into ids
    exactly as llama.cpp does (``llama_vocab::impl::tokenize``, LLAMA_VOCAB_TYPE_TEST: each 5-byte
    chunk becomes ``(hash * 31 + byte ...) % n_vocab``), so a text prompt gives the same ids as
    llama.cpp on the oracle fixtures.  Decoding prints ``<id>`` per token rather than llama.cpp's
    bare hex, so output stays readable.  Use :func:`parse_token_ids` to give ids directly.
    """

    _CHUNK_BYTES = 5

    def __init__(self, vocab_size: int | None):
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def bos_id(self) -> None:
        return None

    @property
    def eos_id(self) -> None:
        return None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return ()

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        if self._vocab_size is None:
            raise TokenizerError(
                "this model file has no tokenizer and no vocabulary size; "
                "give the prompt as token ids"
            )
        data = text.encode("utf-8")
        ids = []
        for start in range(0, len(data), self._CHUNK_BYTES):
            chunk_hash = 0
            for byte in data[start : start + self._CHUNK_BYTES]:
                chunk_hash = chunk_hash * 31 + byte
            ids.append(chunk_hash % self._vocab_size)
        return ids

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        return f"<{token_id}>".encode()

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return "".join(f"<{token_id}>" for token_id in ids)

    def streaming_detokenizer(self, skip_special: bool = False) -> StreamingDetokenizer:
        return StreamingDetokenizer(self, skip_special)

    def token_to_id(self, text: str) -> int | None:
        match = re.fullmatch(r"<(\d+)>", text)
        return int(match.group(1)) if match else None


_ID_LIST_PIECE = re.compile(r"<(\d+)>|(\d+)|[\s,\[\]]+")


def parse_token_ids(text: str) -> list[int]:
    """Ids written as ``1 2 3``, ``1,2,3``, ``[1, 2, 3]`` or ``<1><2><3>`` (what NumericTokenizer
    prints); raises TokenizerError on anything else."""
    ids: list[int] = []
    position = 0
    for piece in _ID_LIST_PIECE.finditer(text):
        if piece.start() != position:
            break
        number = piece.group(1) or piece.group(2)
        if number is not None:
            ids.append(int(number))
        position = piece.end()
    if position != len(text):
        raise TokenizerError(f"not a list of token ids at {text[position : position + 20]!r}")
    return ids


def load_tokenizer(gguf_file: GGUFFile) -> Tokenizer | NumericTokenizer:
    """The tokenizer for ``gguf_file``: a real BPE when it has one, ids otherwise.

    Only llama.cpp's test vocabulary and files with no tokenizer at all get the numeric
    fallback; any other tokenizer ds4mlx cannot rebuild raises UnsupportedTokenizerError.
    """
    model = gguf_file.get("tokenizer.ggml.model")
    if model in (None, "none", "test"):
        tokens = gguf_file.get("tokenizer.ggml.tokens")
        return NumericTokenizer(len(tokens) if tokens else None)
    return Tokenizer.from_gguf(gguf_file)


# llama.cpp's converter also marks these added tokens CONTROL even when the Hugging Face tokenizer
# does not call them special (conversion/base.py, does_token_look_special).
_LOOKS_SPECIAL = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")


def _looks_special(text: str) -> bool:
    return (
        text in _LOOKS_SPECIAL
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def write_tokenizer_metadata(
    writer: GGUFWriter,
    hf_tokenizer: HFTokenizer,
    *,
    pre: str = "deepseek-v3",
    chat_template: str | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    pad_token: str | None = None,
    add_bos: bool | None = None,
    vocab_size: int | None = None,
) -> None:
    """Write a ``tokenizers`` byte-level BPE into ``writer`` the way llama.cpp's converter does
    (``conversion/base.py``: get_vocab_base, _set_vocab_gpt2, gguf.SpecialVocab).

    ``vocab_size`` pads the token list to the model's embedding rows with ``[PAD{i}]`` UNUSED
    entries, as the converter does when config.json's vocab_size exceeds the tokenizer's.
    ``bos_token``/``eos_token``/``pad_token`` name tokens of ``hf_tokenizer``.
    """
    _pre_tokenizer_spec(pre)  # refuse a name the reader could not rebuild
    model_json: dict[str, Any] = json.loads(hf_tokenizer.to_str())["model"]
    if model_json.get("type") != "BPE":
        raise TokenizerError(f"expected a BPE tokenizer, got {model_json.get('type')!r}")

    vocab = hf_tokenizer.get_vocab(with_added_tokens=True)
    id_to_text = {token_id: text for text, token_id in vocab.items()}
    added = hf_tokenizer.get_added_tokens_decoder()
    n_tokens = max(id_to_text) + 1
    if vocab_size is not None:
        if vocab_size < n_tokens:
            raise TokenizerError(
                f"vocab_size {vocab_size} is smaller than the tokenizer ({n_tokens} tokens)"
            )
        n_tokens = vocab_size

    tokens: list[str] = []
    token_types: list[TokenType] = []
    for token_id in range(n_tokens):
        if token_id not in id_to_text:
            tokens.append(f"[PAD{token_id}]")
            token_types.append(TokenType.UNUSED)
        elif token_id in added:
            added_token = added[token_id]
            text = added_token.content
            if not added_token.normalized:
                # llama.cpp matches added tokens on pre-normalized text, so store what the
                # tokenizer's own round trip turns them into.
                text = hf_tokenizer.decode(
                    hf_tokenizer.encode(text, add_special_tokens=False).ids,
                    skip_special_tokens=False,
                )
            if added_token.special or _looks_special(text):
                token_types.append(TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")  # converter: pre-normalize user-defined spaces
                token_types.append(TokenType.USER_DEFINED)
            tokens.append(text)
        else:
            tokens.append(id_to_text[token_id])
            token_types.append(TokenType.NORMAL)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(_merges_as_strings(model_json.get("merges") or []))
    for token_text, add_id in (
        (bos_token, writer.add_bos_token_id),
        (eos_token, writer.add_eos_token_id),
        (pad_token, writer.add_pad_token_id),
    ):
        if token_text is not None:
            token_id = hf_tokenizer.token_to_id(token_text)
            if token_id is None:
                raise TokenizerError(f"token {token_text!r} is not in the tokenizer")
            add_id(token_id)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def _merges_as_strings(merges: list[Any]) -> list[str]:
    """``tokenizers`` saves merges as pairs; GGUF wants "left right" strings, with any space
    inside a part written as U+0120 (gguf-py SpecialVocab does the same)."""
    if merges and isinstance(merges[0], str):
        return list(merges)
    return [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merges]
