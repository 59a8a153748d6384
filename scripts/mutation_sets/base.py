"""What every mutation set shares: the ``Mutation`` record, the test selections each area's
mutations run against, and the paths of the files they change."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

SAMPLER = ("tests/engine/test_sampler_filters.py", "tests/engine/test_penalties.py")
PIPELINED = ("tests/engine/test_pipelined_sampling.py",)
ACCEPTANCE = ("tests/speculation/test_exact_acceptance.py", "tests/speculation/test_acceptance.py")
SCHEDULER = ("tests/speculation/test_scheduler.py",)
SESSION = ("tests/engine/test_session_rollback.py", "tests/engine/test_session.py")
ROUTING = ("tests/models/test_model_pieces.py",)
GGUF = ("tests/gguf/test_gguf_hostile.py", "tests/gguf/test_gguf_partial_overlap.py")
# The guards users trust (issue 37): each area's edge tests.
SERVER_GUARDS = ("tests/server/test_server_guards.py",)
AGENT_GUARDS = ("tests/agent/test_agent_guards.py",)
AGENT_EDGES = ("tests/agent/test_agent_tool_edges.py",)
KVCACHE_GUARDS = ("tests/engine/test_prompt_cache_order.py",)
SPECIAL_TOKENS = ("tests/engine/test_special_tokens_stay_text.py",)
STAGING = ("tests/experts/test_staging_room.py",)
GGUF_EDGES = ("tests/gguf/test_gguf_edges.py",)


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


SAMPLING_PY = "ds4mlx/engine/sampling.py"
GENERATE_PY = "ds4mlx/engine/generate.py"
ACCEPTANCE_PY = "ds4mlx/speculation/acceptance.py"
SCHEDULER_PY = "ds4mlx/speculation/scheduler.py"
SESSION_PY = "ds4mlx/engine/session.py"
DEEPSEEK4_PY = "ds4mlx/models/deepseek4.py"
GLM5_PY = "ds4mlx/models/glm5_next.py"
MOE_PY = "ds4mlx/models/moe.py"
COMPRESSED_PY = "ds4mlx/models/compressed_attention.py"
KDA_PY = "ds4mlx/models/kda.py"
POOL_INDEXER_PY = "ds4mlx/models/pool_indexer.py"
VALIDATE_PY = "ds4mlx/gguf/validate.py"
ACCESS_PY = "ds4mlx/server/access.py"
LIMITS_PY = "ds4mlx/server/limits.py"
BODY_PY = "ds4mlx/server/body.py"
UTILITY_PY = "ds4mlx/server/utility_routes.py"
WORKSPACE_PY = "ds4mlx/agent/workspace.py"
PERMISSIONS_PY = "ds4mlx/agent/permissions.py"
JOBS_PY = "ds4mlx/agent/jobs.py"
TOOLS_PY = "ds4mlx/agent/tools.py"
CHECKPOINTS_PY = "ds4mlx/agent/checkpoints.py"
PROMPT_CACHE_PY = "ds4mlx/engine/kvcache/prompt_cache.py"
STREAMED_PY = "ds4mlx/experts/streamed.py"
DEEPSEEK4_CHAT_PY = "ds4mlx/engine/chat/deepseek4.py"
GLM5_CHAT_PY = "ds4mlx/engine/chat/glm5.py"
GENERATION_PY = "ds4mlx/server/generation.py"
OPENAI_CHAT_PY = "ds4mlx/server/openai_chat.py"
CHOICES_PY = "ds4mlx/server/choices.py"
LOOKUP_PY = "ds4mlx/speculation/lookup.py"
DSPARK_LAYOUT_PY = "ds4mlx/speculation/dspark_layout.py"
SNAPSHOT_FILE_PY = "ds4mlx/engine/kvcache/snapshot_file.py"
PROMPT_INPUT_PY = "ds4mlx/agent/prompt_input.py"
CONVERSATIONS_PY = "ds4mlx/agent/conversations.py"
ANTHROPIC_PY = "ds4mlx/server/anthropic_messages.py"
FILES_PY = "ds4mlx/agent/files.py"
CONSTRAINTS_PY = "ds4mlx/engine/constraints.py"
ERRORS_PY = "ds4mlx/server/errors.py"
METRICS_PY = "ds4mlx/server/metrics.py"
QUEUE_PY = "ds4mlx/server/queue.py"
STATE_CODEC_PY = "ds4mlx/engine/kvcache/state_codec.py"
POLICY_PY = "ds4mlx/experts/policy.py"
EXPERT_READER_PY = "ds4mlx/experts/reader.py"
APP_PY = "ds4mlx/server/app.py"
CALL_GRAMMAR_PY = "ds4mlx/engine/chat/call_grammar.py"
CHAT_BASE_PY = "ds4mlx/engine/chat/base.py"
COMPLETIONS_PY = "ds4mlx/server/openai_completions.py"
EXPERT_OPTIONS_PY = "ds4mlx/experts/options.py"
KV_OPTIONS_PY = "ds4mlx/cli/kv_options.py"
KV_STATE_PY = "ds4mlx/agent/kv_state.py"
MENTIONS_PY = "ds4mlx/agent/mentions.py"
CLI_OPTIONS_PY = "ds4mlx/cli/options.py"
PROMPT_PY = "ds4mlx/engine/chat/prompt.py"
RESPONSES_PY = "ds4mlx/server/openai_responses.py"
STORE_PY = "ds4mlx/experts/store.py"
SUPPORT_GGUF_PY = "ds4mlx/speculation/support_gguf.py"
TURN_PY = "ds4mlx/server/turn.py"
WRITER_PY = "ds4mlx/gguf/writer.py"
AGENT_LOOP_PY = "ds4mlx/agent/loop.py"
CLI_SERVER_PY = "ds4mlx/cli/server.py"
COMMANDS_PY = "ds4mlx/agent/commands.py"
COMPACTION_PY = "ds4mlx/agent/compaction.py"
DETOKENIZER_PY = "ds4mlx/engine/detokenizer.py"
GGUF_READER_PY = "ds4mlx/gguf/reader.py"
MARKUP_PY = "ds4mlx/agent/markup.py"
NEXTN_PY = "ds4mlx/speculation/nextn.py"
PROMPT_SOURCE_PY = "ds4mlx/cli/prompt_source.py"
SPECULATION_CONFIG_PY = "ds4mlx/speculation/config.py"
TOKENIZER_PY = "ds4mlx/engine/tokenizer.py"


def in_area(tests: tuple[str, ...], name: str, file: str, old: str, new: str) -> Mutation:
    """A mutation, its test selection first (the sets group their mutations by area)."""
    return Mutation(name, file, old, new, tests)


# The fresh sets' test selection (from fresh5 on): the whole tests/ folder of the mutated
# code's package, run with -x.
in_agent_folder = partial(in_area, ("tests/agent",))
in_server_folder = partial(in_area, ("tests/server",))
in_engine_folder = partial(in_area, ("tests/engine",))
in_speculation_folder = partial(in_area, ("tests/speculation",))
in_experts_folder = partial(in_area, ("tests/experts",))
in_gguf_folder = partial(in_area, ("tests/gguf",))
in_cli_folder = partial(in_area, ("tests/cli",))

# Paths of hardened_agent's files (the agent modules no earlier set named here).
AGENT_DISPLAY_PY = "ds4mlx/agent/display.py"
AGENT_INSTRUCTIONS_PY = "ds4mlx/agent/instructions.py"
AGENT_EVENT_NOTES_PY = "ds4mlx/agent/event_notes.py"
AGENT_SYMBOLS_PY = "ds4mlx/agent/symbols.py"
AGENT_TOOL_SCHEMAS_PY = "ds4mlx/agent/tool_schemas.py"
AGENT_BACKEND_PY = "ds4mlx/agent/backend.py"

# Paths of the hardened sets (session 17: experts, CLI).
RESIDENT_PY = "ds4mlx/experts/resident.py"
CLI_MAIN_PY = "ds4mlx/cli/main.py"
CLI_PLAN_PY = "ds4mlx/cli/plan.py"
CLI_AGENT_PY = "ds4mlx/cli/agent.py"
CLI_REPL_PY = "ds4mlx/cli/repl.py"

# Paths first used by hardened_engine.

# Paths first used by hardened_speculation that earlier sets also name.
PROBE_PY = "ds4mlx/speculation/probe.py"
DSPARK_PY = "ds4mlx/speculation/dspark.py"

# Paths first used by hardened2_gguf_spec.
QUANTS_PY = "ds4mlx/gguf/quants.py"
MTP_PY = "ds4mlx/speculation/mtp.py"

# Paths first used by hardened2_sv_api.
SSE_PY = "ds4mlx/server/sse.py"

# Paths first used by hardened2_ag_ui.
AGENT_APP_PY = "ds4mlx/agent/app.py"
AGENT_WIDGETS_PY = "ds4mlx/agent/widgets.py"

# Paths first used by hardened2_eng (session 18: the CLI's bench and distributed front ends).
CLI_BENCH_PY = "ds4mlx/cli/bench.py"
CLI_DISTRIBUTED_PY = "ds4mlx/cli/distributed.py"
CLI_PERPLEXITY_PY = "ds4mlx/cli/perplexity.py"

# Paths first used by hardened3_h3_chat (session 19: the chat formats).
CHAT_EVENTS_PY = "ds4mlx/engine/chat/events.py"

# Paths first named in base.py by hardened3_h3_spec (earlier sets kept them to themselves).
SPECULATION_LOOP_PY = "ds4mlx/speculation/loop.py"
DRAFTER_PY = "ds4mlx/speculation/drafter.py"
SPECULATION_INIT_PY = "ds4mlx/speculation/__init__.py"

# Paths first used by hardened3_h3_expgguf.
QUANTIZE_PY = "ds4mlx/gguf/quantize.py"
