"""Token ids to text while streaming, without ever splitting a UTF-8 character.

A byte-level BPE token can end in the middle of a multi-byte character (emoji and CJK are often
spread over two or three tokens), so decoding token by token would print replacement characters.
This decoder joins the tokens' bytes and holds back an incomplete trailing sequence until the
token that completes it arrives.  mlx-lm's ``BPEStreamingDetokenizer`` is not used: it drops a
leading space of the first token and expects a ``transformers`` tokenizer.
"""

from __future__ import annotations

import codecs
from typing import Protocol


class _TokenBytes(Protocol):
    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes: ...


class StreamingDetokenizer:
    """Feed ids with :meth:`add`; each call returns the text that became complete.

    The concatenation of all returned pieces plus :meth:`finish` equals
    ``tokenizer.decode(all_ids, skip_special)``; no piece contains a partial character.
    """

    def __init__(self, tokenizer: _TokenBytes, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens: list[int] = []

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly complete text (often "", never a split char)."""
        self.tokens.append(token_id)
        return self._decoder.decode(self._tokenizer.token_bytes(token_id, self._skip_special))

    def finish(self) -> str:
        """End of stream: bytes still waiting for a continuation become U+FFFD."""
        return self._decoder.decode(b"", final=True)

    def reset(self) -> None:
        self._decoder.reset()
        self.tokens.clear()
