"""Where ``ds4``'s prompt and system prompt come from: an argument, a file, or standard input.

``-p TEXT`` gives the prompt, ``-p -`` reads it from standard input and ``-f FILE`` from a file;
``--system TEXT`` or ``--system-file FILE`` gives a system prompt (which only a chat template
has, so it implies ``--chat``). Text read from a file or a pipe loses its trailing newlines, as
a shell's ``$(cat FILE)`` does: ``echo "def f(" | ds4 -p -`` prompts exactly ``def f(``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

STDIN = "-"


class PromptSourceError(Exception):
    """A prompt file that cannot be read; the message says which and why."""


def add_prompt_flags(parser: argparse.ArgumentParser) -> None:
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument(
        "-p",
        "--prompt",
        help="prompt text; '-' reads it from standard input (without a prompt, on a "
        "terminal: a chat)",
    )
    prompt.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE")
    system = parser.add_mutually_exclusive_group()
    system.add_argument("--system", metavar="TEXT", help="system prompt (implies --chat)")
    system.add_argument(
        "--system-file", metavar="FILE", help="read the system prompt from FILE (implies --chat)"
    )


def _read(path: str, stdin: TextIO) -> str:
    if path == STDIN:
        text = stdin.read()
    else:
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise PromptSourceError(f"cannot read {path}: {reason}") from None
    return text.rstrip("\r\n")


def read_prompt(args: argparse.Namespace, stdin: TextIO | None = None) -> str | None:
    """The prompt the flags give; None when they give none."""
    stdin = stdin or sys.stdin
    if args.file is not None:
        return _read(args.file, stdin)
    if args.prompt == STDIN:
        return _read(STDIN, stdin)
    return args.prompt


def read_system(args: argparse.Namespace) -> str | None:
    """The system prompt the flags give; None when they give none."""
    if args.system_file is not None:
        return _read(args.system_file, sys.stdin)
    return args.system


def chat_messages(prompt: str, system: str | None) -> list[dict[str, str]]:
    """One user turn, after the system prompt when there is one."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    return [*messages, {"role": "user", "content": prompt}]
