"""``ds4-server``: serve a model over OpenAI- and Anthropic-compatible HTTP endpoints.

Takes the same model, sampling and speculation flags as ``ds4``; the sampling flags become the
defaults for requests that do not set those options.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import socket
import sys
import time
from functools import partial
from pathlib import Path

from ds4mlx.cli.distributed import follow_rank_0, join_ranks
from ds4mlx.cli.kv_options import add_kv_cache_flags, check_kv_cache_flags, prompt_cache_for
from ds4mlx.cli.main import progress_line
from ds4mlx.cli.options import (
    ModelOptions,
    add_distributed_flags,
    add_model_flags,
    add_sampling_flags,
    add_speculation_flags,
    check_drafter,
    model_options,
    sampling_options,
    speculation_config,
)
from ds4mlx.generation import (
    ChatService,
    Drafter,
    GGUFError,
    SpeculationConfig,
    TokenizerError,
    load_drafter,
)
from ds4mlx.generation.ranks import Conductor, DistributedError, RankGroup, lead
from ds4mlx.loader import LoadedModel, load_model
from ds4mlx.server import GenerationDefaults, GenerationQueue, ServerConfig, create_app

import uvicorn

log = logging.getLogger("ds4mlx.server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ds4-server",
        description="Serve a DeepSeek-V4-Flash / GLM GGUF model over OpenAI- and "
        "Anthropic-compatible HTTP endpoints.",
    )
    add_model_flags(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    group.add_argument(
        "-n",
        "--tokens",
        type=int,
        default=None,
        metavar="N",
        help="generation limit for requests that set none (default: until the context is full)",
    )
    group.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another model name requests may use (repeatable); the served "
        "name is the model file's stem",
    )
    group.add_argument(
        "--think",
        action="store_true",
        help="reason before answering unless a request says otherwise",
    )
    group.add_argument(
        "--keepalive",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="SSE keep-alive comment interval while a request waits or prefills (default 5)",
    )
    group.add_argument(
        "--cors",
        action="store_true",
        help="allow cross-origin requests from any origin (browser clients); "
        "without it a request from another web origin is refused",
    )
    group.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require this key (repeatable) as 'Authorization: Bearer KEY' or "
        "'x-api-key: KEY' on every request but /health",
    )
    group.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="require one of the keys in FILE (one a line), kept off the command line",
    )
    group.add_argument(
        "--batched-session",
        type=int,
        default=1,
        metavar="N",
        help="serve up to N requests together, decoding their next tokens in "
        "one batched pass without speculation; a request running alone "
        "still speculates (default 1: one request at a time)",
    )
    add_kv_cache_flags(parser)
    add_sampling_flags(parser)
    add_speculation_flags(parser)
    add_distributed_flags(parser, "rank 0 serves HTTP, the other ranks follow its model calls")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tokens is not None and args.tokens <= 0:
        parser.error(f"--tokens must be positive, got {args.tokens}")
    if args.keepalive <= 0:
        parser.error(f"--keepalive must be positive, got {args.keepalive}")
    if args.batched_session < 1:
        parser.error(f"--batched-session must be at least 1, got {args.batched_session}")
    check_kv_cache_flags(parser, args)
    try:
        api_keys = api_keys_from(args.api_key, args.api_key_file)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    try:
        sampling = sampling_options(args)
        speculation = speculation_config(args)
        options = model_options(args)
        check_drafter(args, speculation)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="ds4-server: %(message)s")
    try:
        # Only rank 0 samples: requests without a seed keep drawing their own.
        ranks = join_ranks(options.distributed)
    except DistributedError as exc:
        log.error("error: %s", exc)
        return 1
    if ranks is not None and ranks.rank != 0:
        return follow_rank_0("ds4-server", options, ranks)
    try:
        # Bound before the model loads (minutes for a large one): a port in use fails at once.
        # Requests that arrive meanwhile wait in the listen queue.
        listener = listen(args.host, args.port)
    except OSError as exc:
        log.error("error: cannot listen on %s port %d: %s", args.host, args.port, exc)
        return 1

    # The model is loaded on the engine thread, where every generation will run.
    engine = GenerationQueue(max_sessions=args.batched_session)
    conductor: Conductor | None = None
    try:
        try:
            model, drafter, conductor = engine.run(
                partial(load_engine, options, speculation, ranks)
            )
        except (GGUFError, TokenizerError, OSError, ValueError, DistributedError) as exc:
            log.error("error: %s", exc)
            return 1
        if model.chat_format is None:
            log.warning(
                "%s has no chat template: only /v1/completions can serve it",
                Path(options.model).name,
            )
        if ranks is not None and args.kv_disk_dir is not None:
            log.warning(
                "--kv-disk-dir is ignored with --distributed: the other ranks could "
                "not follow a restored state"
            )
        try:
            prompt_cache = (
                None if ranks is not None else engine.run(partial(prompt_cache_for, args, model))
            )
        except OSError as exc:
            log.error("error: --kv-disk-dir: %s", exc)
            return 1
        try:
            service = ChatService(
                model,
                drafter,
                speculation,
                max_context=options.ctx,
                sessions=args.batched_session,
                prompt_cache=prompt_cache,
            )
        except ValueError as exc:  # a model without batched decode (GLM)
            log.error("error: --batched-session %d: %s", args.batched_session, exc)
            return 1
        config = ServerConfig(
            model_id=Path(options.model).stem,
            aliases=tuple(args.alias),
            defaults=GenerationDefaults(
                max_tokens=args.tokens or options.ctx, sampling=sampling, thinking=args.think
            ),
            keepalive_seconds=args.keepalive,
            cors=args.cors,
            api_keys=api_keys,
            details=partial(expert_details, model) if options.verbose else None,
        )
        # An IPv6 address is bracketed in a URL (RFC 3986), or its colons read as a port's.
        url_host = f"[{args.host}]" if ":" in args.host else args.host
        log.info("serving '%s' on http://%s:%d/v1", config.model_id, url_host, args.port)
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(service, config, engine),
                log_level="info",
                timeout_graceful_shutdown=5,
            )
        )
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends serving (uvicorn.run's way)
            server.run(sockets=[listener])
    finally:
        listener.close()
        engine.close()
        if conductor is not None:
            conductor.stop()
    return 0


def expert_details(model: LoadedModel) -> str | None:
    """The routed-expert cache's counters, for ``--verbose``'s line after each request."""
    stats = model.expert_stats()
    return None if stats is None else stats.summary()


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (an IPv6 address when ``host`` has a colon, as
    uvicorn binds); OSError when the port is taken or the address is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def api_keys_from(keys: list[str], key_file: Path | None) -> tuple[str, ...]:
    """The keys of --api-key and --api-key-file; blank ones are refused."""
    found = list(keys)
    if key_file is not None:
        found += [line.strip() for line in key_file.read_text().splitlines() if line.strip()]
        if len(found) == len(keys):
            raise ValueError(f"--api-key-file {key_file} holds no key")
    if any(not key.strip() for key in found):
        raise ValueError("--api-key must not be blank")
    return tuple(key.strip() for key in found)


def load_engine(
    options: ModelOptions, speculation: SpeculationConfig, ranks: RankGroup | None = None
) -> tuple[LoadedModel, Drafter | None, Conductor | None]:
    """The model (rank 0's shard with ``ranks``, the other ranks then following its calls),
    its drafter, and the conductor that stops the followers."""
    started = time.perf_counter()
    model = load_model(
        options.model,
        weights_dtype=options.weights_dtype,
        progress=progress_line,
        experts=options.experts,
        ranks=ranks,
    )
    # Reader threads stop (and a hot-list asked for is saved) when the server exits.
    atexit.register(model.close)
    conductor = None if ranks is None else lead(model, ranks)
    try:
        drafter = load_drafter(speculation, model)
    except BaseException:
        if conductor is not None:
            conductor.stop()
        raise
    log.info(
        "loaded %s (%s) in %.2fs",
        options.model,
        model.args_summary(),
        time.perf_counter() - started,
    )
    if options.verbose:
        log.info("weights: %s", model.load_summary())
    if drafter is not None:
        log.info(
            "drafter %s%s",
            drafter.name,
            " (strict: target-only decoding)" if speculation.strict else "",
        )
    if ranks is not None:
        log.info("rank 0 of %d: the other ranks follow this one's model calls", ranks.size)
    return model, drafter, conductor


if __name__ == "__main__":
    sys.exit(main())
