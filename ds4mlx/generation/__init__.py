"""The generation API, the one door the faces (CLI, agent, server, benchmarks) go through to
generate text: messages or a prompt in, a stream of events out.

- ``ChatService``: chat turns and raw completions over a loaded model (``ds4mlx.loader``), its
  drafter and its sessions, with prefix reuse, a prompt cache and batched sessions. Its events:
  the chat events (``TextDelta``, ``ReasoningDelta``, the tool-call events), then ``Finished``.
- ``generate`` / ``stepped``: token-level generation, ending with ``Done``.
- ``JsonFormat``: a JSON output the chat or completion is held to (``response_format``), by
  constrained decoding; chats also hold tool calls to their template's syntax and the tools'
  schemas, and ban call markup where no call may be made (``engine.constraints``).
- ``TokenLogprobs``: each token's log-probability, when ``SamplingOptions.logprobs`` asks.
- ``Finished`` and ``Done`` carry the statistics and, when a drafter took part, its
  ``acceptance`` (``SpeculativeStats``: τ, acceptance rate, drafted and accepted counts).
- What a face configures and hands down: ``SamplingOptions``, ``SpeculationConfig`` and
  ``load_drafter`` (``check_drafter_files`` before the model loads), ``ExpertOptions`` (with
  ``parse_cache_budget`` for ``--expert-cache``),
  the prompt cache (``PromptCache``, ``DiskTier``) and the saved states of conversations
  (``read_snapshot``, ``write_snapshot``), and the errors these raise.
- What loading a model would need, from its GGUF header alone (``ds4mlx.load_plan``):
  ``plan_model`` (a ``MemoryPlan``, whose ``verdict`` for a memory size is a ``Verdict``) and
  ``check_resident`` (an ``Oversized`` when the model does not fit resident).
- ``ranks``: what a face needs for ``--distributed`` (the rank group, rank 0 leading the
  others), in a module of its own that only a distributed face imports.

The pieces live below (``engine``: sessions, sampling, tokenizer, chat formats, caches;
``speculation``: drafters, verification, scheduling); this package composes them and names
what a face may use.
"""

from ds4mlx.engine.chat import (
    ChatEvent,
    ChatFormat,
    NamedTool,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallComplete,
    ToolCallError,
    ToolCallStart,
    ToolChoice,
)
from ds4mlx.engine.chat.deepseek4 import DSML
from ds4mlx.engine.chat.prompt import max_token_bytes
from ds4mlx.engine.constraints import GrammarError, JsonFormat, check_json_format
from ds4mlx.engine.generate import DecodeStep, GenerationStats, TokenEvent
from ds4mlx.engine.kvcache import (
    MAX_CUT,
    DiskTier,
    PromptCache,
    SnapshotFileError,
    common_prefix,
    model_fingerprint,
    read_snapshot,
    write_snapshot,
)
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import feed_batch
from ds4mlx.engine.tokenizer import TextTokenizer, TokenizerError
from ds4mlx.experts.options import ExpertOptions, parse_cache_budget
from ds4mlx.generation.events import (
    Done,
    Finished,
    GenerationCancelled,
    ScheduledEvent,
    ServiceEvent,
    TokenLogprobs,
)
from ds4mlx.generation.service import PREFILL_CHUNK, ChatService, PrefillProgress
from ds4mlx.generation.tokens import chat_markup_ban, generate, stepped
from ds4mlx.gguf import GGUFError
from ds4mlx.load_plan import (
    MemoryPlan,
    Oversized,
    Verdict,
    check_resident,
    plan_model,
)
from ds4mlx.memory import format_size
from ds4mlx.speculation import (
    Drafter,
    DrafterLease,
    SpeculativeStats,
    check_drafter_files,
    load_drafter,
)
from ds4mlx.speculation.config import (
    DEFAULT_MTP_MARGIN,
    DEFAULT_NGRAM,
    DrafterKind,
    SpeculationConfig,
)

__all__ = [
    "DEFAULT_MTP_MARGIN",
    "DEFAULT_NGRAM",
    "DSML",
    "MAX_CUT",
    "PREFILL_CHUNK",
    "ChatEvent",
    "ChatFormat",
    "ChatService",
    "DecodeStep",
    "DiskTier",
    "Done",
    "Drafter",
    "DrafterKind",
    "DrafterLease",
    "ExpertOptions",
    "Finished",
    "GGUFError",
    "GenerationCancelled",
    "GenerationStats",
    "GrammarError",
    "JsonFormat",
    "MemoryPlan",
    "NamedTool",
    "Oversized",
    "PrefillProgress",
    "PromptCache",
    "ReasoningDelta",
    "SamplingOptions",
    "ScheduledEvent",
    "ServiceEvent",
    "SnapshotFileError",
    "SpeculationConfig",
    "SpeculativeStats",
    "TextDelta",
    "TextTokenizer",
    "TokenEvent",
    "TokenLogprobs",
    "TokenizerError",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallComplete",
    "ToolCallError",
    "ToolCallStart",
    "ToolChoice",
    "Verdict",
    "chat_markup_ban",
    "check_json_format",
    "check_drafter_files",
    "check_resident",
    "common_prefix",
    "feed_batch",
    "format_size",
    "generate",
    "load_drafter",
    "max_token_bytes",
    "model_fingerprint",
    "parse_cache_budget",
    "plan_model",
    "read_snapshot",
    "stepped",
    "write_snapshot",
]
