"""``ds4-agent``: the interactive coding agent (Textual UI), or one scripted turn with --print.

The model runs in-process (the same model, sampling and speculation flags as ``ds4``), or on any
OpenAI-compatible server with ``--api-base``. With ``--print`` the agent answers one prompt
without a terminal UI: the final answer goes to stdout, tool activity and progress to stderr.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from ds4mlx.agent.backend import LocalBackend, ModelBackend, OpenAIBackend
from ds4mlx.agent.conversations import Conversation, ConversationError, ConversationStore
from ds4mlx.agent.display import sanitize
from ds4mlx.agent.event_notes import event_notes
from ds4mlx.agent.kv_state import ConversationStates
from ds4mlx.agent.loop import (
    Agent,
    AgentSettings,
    PermissionRequest,
    RunFinished,
    ToolFinished,
    ToolStarted,
    TurnFinished,
)
from ds4mlx.agent.permissions import Permissions
from ds4mlx.agent.tools import ToolBox, describe_call
from ds4mlx.agent.workspace import Workspace
from ds4mlx.cli.distributed import follow_rank_0, join_ranks
from ds4mlx.cli.kv_options import add_kv_cache_flags, check_kv_cache_flags, prompt_cache_for
from ds4mlx.cli.main import log, progress_line
from ds4mlx.cli.options import (
    DEFAULT_MODEL,
    add_distributed_flags,
    add_model_flags,
    add_sampling_flags,
    add_speculation_flags,
    check_drafter,
    model_options,
    sampling_options,
    speculation_config,
)
from ds4mlx.generation import GGUFError
from ds4mlx.generation.ranks import DistributedError, RankGroup

# Exit codes of --print besides 0 (answered) and 1 (error).
EXIT_STEP_LIMIT = 3
EXIT_INTERRUPTED = 130


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "ds4mlx" / "conversations"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ds4-agent",
        description="A coding agent in the terminal, on a local "
        "DeepSeek-V4-Flash / GLM GGUF model or an OpenAI-compatible server.",
        epilog="Without -c/--ctx the context is the model's own, capped by what fits in the "
        "memory available (ds4 plan shows the plan); with --api-base, the server's.",
    )
    add_model_flags(parser)
    agent = parser.add_argument_group("agent")
    agent.add_argument(
        "--print",
        metavar="PROMPT",
        dest="print_prompt",
        help="answer PROMPT without the UI: the answer to stdout, tool activity "
        "to stderr; write/edit/bash are denied unless --yolo",
    )
    sessions = agent.add_mutually_exclusive_group()
    sessions.add_argument(
        "--continue",
        dest="continue_last",
        action="store_true",
        help="continue the last conversation saved in this workspace",
    )
    sessions.add_argument(
        "--resume", metavar="NAME", help="continue the saved conversation NAME (see /list)"
    )
    agent.add_argument(
        "--workspace",
        metavar="DIR",
        default=".",
        help="the folder the tools may read and change (default: current)",
    )
    agent.add_argument(
        "--yolo", action="store_true", help="run write, edit and bash without asking"
    )
    agent.add_argument(
        "-n",
        "--n-predict",
        type=int,
        default=1024,
        help="most tokens per model turn (default 1024)",
    )
    agent.add_argument(
        "--max-steps", type=int, default=20, help="most model turns per prompt (default 20)"
    )
    agent.add_argument("--think", action="store_true", help="start with thinking on")
    agent.add_argument(
        "--bash-timeout",
        type=float,
        default=60.0,
        help="seconds before a foreground bash command is stopped (default 60)",
    )
    agent.add_argument(
        "--data-dir",
        metavar="DIR",
        default=os.environ.get("DS4MLX_DATA_DIR") or str(default_data_dir()),
        help="where conversations are saved (env DS4MLX_DATA_DIR; default "
        "$XDG_DATA_HOME/ds4mlx/conversations)",
    )
    api = parser.add_argument_group("OpenAI-compatible server (instead of the local engine)")
    api.add_argument(
        "--api-base", metavar="URL", help="server URL, e.g. http://127.0.0.1:8000/v1 (ds4-server)"
    )
    api.add_argument(
        "--api-model",
        metavar="NAME",
        default="default",
        help="model name to request (default: default)",
    )
    api.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY") or "none",
        help="API key (env OPENAI_API_KEY)",
    )
    add_kv_cache_flags(parser)
    add_sampling_flags(parser)
    add_speculation_flags(parser)
    add_distributed_flags(parser, "rank 0 runs the agent, the other ranks follow its model calls")
    return parser


def load_backend(
    args: argparse.Namespace,
    progress: Callable[[str], None] | None = None,
    ranks: RankGroup | None = None,
) -> ModelBackend:
    """The backend the flags ask for (model loading reported to ``progress``); with ``ranks``,
    rank 0's shard of the model, whose calls the other ranks follow until the process ends."""
    sampling = sampling_options(args)
    options = model_options(args)
    if args.api_base:
        backend = OpenAIBackend(
            args.api_base,
            args.api_model,
            api_key=args.api_key,
            context_size=options.ctx,
            sampling=sampling,
        )
        # The server's context size wins over the --ctx default (an explicit --ctx is kept).
        if not args.ctx_given:
            backend.context_size = backend.server_context_size() or backend.context_size
        return backend
    from ds4mlx.generation import ChatService, load_drafter
    from ds4mlx.generation.ranks import lead
    from ds4mlx.loader import load_model

    speculation = speculation_config(args)
    model = load_model(
        options.model,
        weights_dtype=options.weights_dtype,
        progress=progress,
        experts=options.experts,
        ranks=ranks,
    )
    # The backend outlives this function: reader threads stop (and a hot-list asked for is
    # saved) when the process exits, after the followers have been let go.
    atexit.register(model.close)
    if ranks is not None:
        atexit.register(lead(model, ranks).stop)
    drafter = load_drafter(speculation, model)
    # A restored state would leave the other ranks behind: no prompt cache with --distributed.
    prompt_cache = None if ranks is not None else prompt_cache_for(args, model)
    service = ChatService(
        model, drafter, speculation, max_context=options.ctx, prompt_cache=prompt_cache
    )
    return LocalBackend(service, sampling)


def make_agent(
    args: argparse.Namespace,
    backend: ModelBackend,
    conversation: Conversation | None = None,
    store: ConversationStore | None = None,
) -> Agent:
    """The agent over ``backend``; with ``--kv-disk-dir`` and a ``store``, conversations'
    model states are kept beside them (``agent.kv_state``)."""
    toolbox = ToolBox(
        Workspace(args.workspace),
        bash_timeout=args.bash_timeout,
        max_output_chars=min(16000, args.ctx),
    )
    settings = AgentSettings(
        max_steps=args.max_steps, max_tokens=args.n_predict, thinking=args.think
    )
    agent = Agent(backend, toolbox, Permissions(yolo=args.yolo), settings, conversation)
    if store is not None and args.kv_disk_dir is not None:
        agent.states = ConversationStates(store)
    return agent


def model_context(args: argparse.Namespace, fallback: int) -> int:
    """The default context of a local model: its own (the GGUF's context_length), capped by
    what its memory plan says fits in the memory available now; ``fallback`` when the plan
    cannot say or the model does not fit at all (loading says why)."""
    from ds4mlx.load_plan import plan_model
    from ds4mlx.loader import resolve_weights_dtype
    from ds4mlx.memory import available_memory_bytes

    try:
        plan = plan_model(args.model, resolve_weights_dtype(args.weights_dtype, args.model))
    except (GGUFError, OSError, ValueError):
        return fallback
    memory = available_memory_bytes()
    fits = (
        plan.trained_ctx
        if memory is None
        else plan.context_that_fits(memory, streamed=model_options(args).experts.stream)
    )
    return fits or fallback


def resumed_conversation(args: argparse.Namespace, store: ConversationStore) -> Conversation | None:
    """The conversation --continue or --resume asks for; None for a new one."""
    if args.resume:
        return store.load(args.resume)
    if args.continue_last:
        return store.latest(str(Path(args.workspace).resolve()))
    return None


def _save(agent: Agent, store: ConversationStore, *, leaving: bool = False) -> None:
    """Save the conversation; ``leaving``: its model state too, where states are kept."""
    if not agent.conversation.is_empty:
        try:
            store.save(agent.conversation)
        except (ConversationError, OSError) as exc:
            log(f"ds4-agent: could not save the conversation: {exc}")
            return
        if leaving and agent.states is not None:
            note = agent.states.save(agent)
            if note:
                log(f"ds4-agent: {note}")


# After SIGTERM/SIGHUP, how long --print lets the run stop by itself before it is unwound.
_SIGNAL_GRACE_SECONDS = 3


def _stop_on_signals(agent: Agent) -> list[int]:
    """SIGTERM and SIGHUP stop --print's run the way Ctrl+C stops the UI's (the running command
    is stopped by the tool itself); should the run not end within the grace time (a stalled
    server), SIGALRM unwinds it through its finally blocks. Returns the signals received."""
    received: list[int] = []

    def unwind(_sig: int, _frame: object) -> None:
        raise SystemExit(128 + received[0])

    def stop(sig: int, _frame: object) -> None:
        received.append(sig)
        agent.stop()
        signal.signal(signal.SIGALRM, unwind)
        signal.alarm(_SIGNAL_GRACE_SECONDS)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    return received


def run_print(agent: Agent, prompt: str, store: ConversationStore | None = None) -> int:
    """One prompt, no UI: returns the exit code. The conversation is saved to ``store``
    after every turn."""
    for event in agent.run(prompt):
        if store is not None and isinstance(event, (TurnFinished, RunFinished)):
            _save(agent, store)
        for text, _ in event_notes(event):
            log(f"ds4-agent: {sanitize(text)}")
        if isinstance(event, ToolStarted):
            log(f"ds4-agent: > {sanitize(describe_call(event.call))}")
        elif isinstance(event, PermissionRequest):
            log(
                f"ds4-agent: denied {event.call.name} (--print asks nobody; pass --yolo to "
                "allow write, edit and bash)"
            )
        elif isinstance(event, ToolFinished):
            lines = event.result.output.splitlines() or [""]
            more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
            log(f"ds4-agent:   {sanitize(lines[0][:120])}{more}")
        elif isinstance(event, RunFinished):
            if event.answer:
                # A terminal must not obey the model's escape sequences; a pipe gets the text.
                print(sanitize(event.answer) if sys.stdout.isatty() else event.answer, flush=True)
            if event.reason == "error":
                log(f"ds4-agent: error: {event.error}")
                return 1
            if event.reason == "context_full":
                # /compact is the UI's; here a larger context (or a new conversation) helps.
                log(
                    f"ds4-agent: {event.error}; give a larger -c/--ctx, or leave out "
                    "--continue/--resume to start a new conversation"
                )
                return 1
            if event.reason == "step_limit":
                log(f"ds4-agent: {event.error}")
                return EXIT_STEP_LIMIT
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked (a bad one exits with the parser's message)."""
    parser = build_parser()
    default_ctx = parser.get_default("ctx")
    parser.set_defaults(ctx=None)  # to tell an explicit --ctx from the default
    args = parser.parse_args(argv)
    args.ctx_given = args.ctx is not None
    args.ctx = args.ctx if args.ctx_given else default_ctx
    for flag, value in (
        ("--n-predict", args.n_predict),
        ("--max-steps", args.max_steps),
        ("--bash-timeout", args.bash_timeout),
    ):
        if value <= 0:
            parser.error(f"{flag} must be positive, got {value}")
    try:
        speculation = speculation_config(args)
        model_options(args)
        Workspace(args.workspace)
    except ValueError as exc:
        parser.error(str(exc))
    check_kv_cache_flags(parser, args)
    if not args.api_base and not Path(args.model).is_file():
        parser.error(
            f"model file {args.model} not found"
            + (
                " (the tiny model is built by scripts/train_tiny.py)"
                if Path(args.model) == DEFAULT_MODEL
                else ""
            )
        )
    if not args.api_base:  # a drafter that cannot serve is found before the model loads
        try:
            check_drafter(args, speculation)
        except ValueError as exc:
            parser.error(str(exc))
    if not args.ctx_given and not args.api_base:
        args.ctx = model_context(args, default_ctx)
    if args.distributed and args.api_base:
        parser.error(
            "--distributed runs the model in this group of processes; it cannot be "
            "combined with --api-base"
        )
    return args


def _print_mode(
    args: argparse.Namespace,
    conversation: Conversation | None,
    store: ConversationStore,
    ranks: RankGroup | None,
) -> int:
    """``--print``: one prompt answered without the interface."""
    try:
        agent = make_agent(args, load_backend(args, progress_line, ranks), conversation, store)
    except Exception as exc:  # GGUF, tokenizer, drafter and server errors alike
        log(f"ds4-agent: error: {exc}")
        return 1
    if agent.instructions is not None and conversation is None:
        log(f"ds4-agent: {agent.instructions.describe()}")
    if conversation is not None and agent.states is not None:
        note = agent.states.restore(agent)
        if note:
            log(f"ds4-agent: {note}")
    received = _stop_on_signals(agent)
    # Saved like the UI's conversations, so that --continue picks it up (as claude -p, -c).
    try:
        code = run_print(agent, args.print_prompt, store)
        return 128 + received[0] if received else code
    except KeyboardInterrupt:
        log("ds4-agent: interrupted")
        return EXIT_INTERRUPTED
    finally:
        signal.alarm(0)
        agent.toolbox.close()
        _save(agent, store, leaving=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        ranks = join_ranks(args.distributed)
    except DistributedError as exc:
        log(f"ds4-agent: error: {exc}")
        return 1
    if ranks is not None and ranks.rank != 0:
        return follow_rank_0("ds4-agent", model_options(args), ranks)
    store = ConversationStore(args.data_dir)
    store.remove_stale_temporaries()
    try:
        conversation = resumed_conversation(args, store)
    except ConversationError as exc:
        log(f"ds4-agent: error: {exc}")
        return 1
    if args.print_prompt is not None:
        return _print_mode(args, conversation, store, ranks)

    from ds4mlx.agent.app import AgentApp

    agents: list[Agent] = []

    def load_agent() -> Agent:
        agents.append(make_agent(args, load_backend(args, ranks=ranks), conversation, store))
        return agents[0]

    name = args.api_model if args.api_base else Path(args.model).stem
    app = AgentApp(load_agent, store, model_name=name)
    try:
        app.run()
    finally:
        for agent in agents:
            agent.toolbox.close()
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
