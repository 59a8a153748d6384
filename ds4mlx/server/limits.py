"""What a generation request is checked against before it is queued: the context (by the
prompt's length first, then by its tokens, counted on a worker thread) and the vocabulary."""

from __future__ import annotations

import asyncio
import dataclasses

from ds4mlx.generation import SamplingOptions, TokenizerError, max_token_bytes
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationCall, GenerationService


class RequestLimits:
    """The model's limits a request must keep. Text surely longer than the context is refused
    before it is tokenized: no token covers more than ``max_token_bytes`` bytes, so C characters
    are at least C / that many tokens."""

    def __init__(self, service: GenerationService):
        self.max_context = service.max_context
        self.bytes_per_token = max_token_bytes(service.model.tokenizer)
        self.vocab_size = service.model.tokenizer.vocab_size

    def check_text(self, characters: int, param: str) -> None:
        if self.bytes_per_token is None:
            return
        at_least = -(-characters // self.bytes_per_token)
        if at_least >= self.max_context:
            raise APIError(
                400,
                f"the text of '{param}' is at least {at_least} tokens long ({characters} "
                f"characters, at most {self.bytes_per_token} per token); the context "
                f"is {self.max_context} tokens",
                param=param,
                code="context_length_exceeded",
            )

    def check_tokens(self, count: int, param: str) -> None:
        if count >= self.max_context:
            raise APIError(
                400,
                f"the prompt has {count} tokens; the context is {self.max_context} tokens",
                param=param,
                code="context_length_exceeded",
            )

    async def tokenized(self, call: GenerationCall, service: GenerationService) -> GenerationCall:
        """``call`` checked against the model (its prompt's length, the token ids it names)
        and, for a chat, with its prompt tokenized on a worker thread and checked against the
        context; a raw completion is only checked by its length (the engine counts its
        tokens)."""
        param = "messages" if call.messages is not None else "prompt"
        self.check_text(call.text_characters, param)
        call = dataclasses.replace(call, sampling=self._sampling(call.sampling))
        if call.messages is None:
            return call
        try:
            tokens = await asyncio.to_thread(call.chat_prompt, service)
        except (ValueError, TypeError, TokenizerError) as exc:
            raise APIError(
                400, f"the conversation cannot be rendered: {exc}", param=param
            ) from None
        self.check_tokens(len(tokens), param)
        return dataclasses.replace(call, prompt_tokens=tokens)

    def _sampling(self, sampling: SamplingOptions) -> SamplingOptions:
        """``sampling`` within what the model has: logit biases name tokens of its vocabulary,
        and the penalty window is at most the context (llama.cpp's -1 means all of it)."""
        for token_id, _ in sampling.logit_bias:
            if self.vocab_size is not None and token_id >= self.vocab_size:
                raise APIError(
                    400,
                    f"invalid 'logit_bias': token id {token_id} is outside the "
                    f"vocabulary (0..{self.vocab_size - 1})",
                    param="logit_bias",
                )
        if sampling.repeat_last_n > self.max_context:
            return dataclasses.replace(sampling, repeat_last_n=self.max_context)
        return sampling
