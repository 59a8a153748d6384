"""``ds4``'s prompt from standard input (``-p -``) or a file (``-f``), and its system prompt
(``--system``, ``--system-file``): the same output as the prompt given as an argument."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

from ds4mlx.cli.options import DEFAULT_MODEL
from ds4mlx.cli.prompt_source import PromptSourceError, chat_messages, read_prompt, read_system

import pytest

pytestmark = pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="needs assets/ds4-tiny.gguf")


def run_ds4(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ds4mlx.cli.main", *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def prompt_tokens(result: subprocess.CompletedProcess) -> int:
    return int(result.stderr.split("ds4: prompt ")[1].split()[0])


def test_stdin_and_a_file_give_the_prompt_of_p(tmp_path):
    (tmp_path / "prompt.txt").write_text("def f(\n")
    given = run_ds4("-p", "def f(", "-n", "8")
    piped = run_ds4("-p", "-", "-n", "8", stdin="def f(\n")  # as `echo "def f(" | ds4 -p -`
    from_file = run_ds4("-f", str(tmp_path / "prompt.txt"), "-n", "8")
    assert given.returncode == piped.returncode == from_file.returncode == 0, piped.stderr
    assert given.stdout.strip()
    assert piped.stdout == given.stdout == from_file.stdout
    assert prompt_tokens(piped) == prompt_tokens(given) == prompt_tokens(from_file)


def test_system_prompt_from_text_or_file_implies_chat(tmp_path):
    (tmp_path / "system.txt").write_text("You answer in Python.\n")
    flags = ["-p", "hello", "-n", "6"]
    chat = run_ds4(*flags, "--chat")
    system = run_ds4(*flags, "--system", "You answer in Python.")
    system_chat = run_ds4(*flags, "--chat", "--system", "You answer in Python.")
    system_file = run_ds4(*flags, "--system-file", str(tmp_path / "system.txt"))
    assert chat.returncode == system.returncode == system_file.returncode == 0, system.stderr
    assert system.stdout == system_chat.stdout == system_file.stdout
    assert prompt_tokens(system) > prompt_tokens(chat)  # the system turn is in the prompt


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-f", "/nonexistent/prompt.txt"], "cannot read /nonexistent/prompt.txt"),
        (["-p", "x", "--system-file", "/nonexistent/s.txt"], "cannot read /nonexistent/s.txt"),
        (["-p", "x", "-f", "y"], "not allowed with argument"),
        ([], "give a prompt: -p TEXT, -f FILE, or -p -"),
    ],
)
def test_bad_prompt_sources_fail_with_a_message(flags, message):
    result = run_ds4(*flags)
    assert result.returncode == 2 and message in result.stderr


def prompt_args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"prompt": None, "file": None, "system": None} | given)


def test_read_text_loses_its_trailing_newlines_only(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("  line one\r\nline two \n\n", newline="")
    assert read_prompt(prompt_args(file=str(path))) == "  line one\nline two "
    assert read_prompt(prompt_args(prompt="-"), io.StringIO("piped\n\r\n")) == "piped"


def test_an_argument_prompt_is_kept_as_it_is():
    assert read_prompt(prompt_args(prompt="hello\n"), io.StringIO("unused")) == "hello\n"
    assert read_prompt(prompt_args(), io.StringIO("unused")) is None


def test_a_file_wins_over_standard_input(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("from the file")
    assert read_prompt(prompt_args(file=str(path)), io.StringIO("piped")) == "from the file"
    assert read_prompt(prompt_args(file="-"), io.StringIO("piped\n")) == "piped"


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "No such file or directory"), (b"\xff\xfe bad", "can't decode byte 0xff")],
)
def test_an_unreadable_prompt_file_says_which_and_why(tmp_path, content, reason):
    path = tmp_path / "prompt.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PromptSourceError, match=f"^cannot read {path}: .*{reason}"):
        read_prompt(prompt_args(file=str(path)))


def test_the_system_prompt_from_text_or_a_file(tmp_path):
    path = tmp_path / "system.txt"
    path.write_text("be brief\n")
    assert read_system(argparse.Namespace(system="as given\n", system_file=None)) == "as given\n"
    assert read_system(argparse.Namespace(system=None, system_file=str(path))) == "be brief"
    assert read_system(argparse.Namespace(system=None, system_file=None)) is None


def test_chat_messages_put_the_system_turn_first_even_when_empty():
    assert chat_messages("hi", None) == [{"role": "user", "content": "hi"}]
    assert chat_messages("hi", "") == [
        {"role": "system", "content": ""},
        {"role": "user", "content": "hi"},
    ]
