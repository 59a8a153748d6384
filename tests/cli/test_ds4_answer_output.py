"""``ds4 -p``'s generation in process, on the shipped tiny model, with the token stream replaced
by a chosen one where the output must be exact: which prompt reaches the model (raw with BOS, or
in the chat template), what reaches stdout (stop tokens never; the answer ends its line once),
and the closing lines on stderr; then the paths around it: subcommands, load and drafter errors,
ranks, the chat opened on a terminal."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import SimpleNamespace

import ds4mlx
from ds4mlx.cli import main as ds4
from ds4mlx.engine.generate import GenerationStats, TokenEvent
from ds4mlx.generation import Done, GGUFError, TokenizerError
from ds4mlx.speculation.loop import SpeculativeStats

import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY = str(ASSETS / "ds4-tiny.gguf")


@cache
def tiny():
    return ds4mlx.load_model(TINY)


def tokenizer():
    return tiny().tokenizer


@pytest.fixture(autouse=True)
def loaded_once(monkeypatch):
    """Each ``ds4`` run gets the model loaded once for the file (and does not close it)."""
    model = tiny()
    monkeypatch.setattr("ds4mlx.loader.load_model", lambda *args, **kwargs: model)
    monkeypatch.setattr(model, "close", lambda: None)


class Stream:
    """Stands in for ``generate``: yields ``tokens`` then Done with ``stats``; records the
    prompt and the keywords it was called with."""

    def __init__(self, tokens: list[int], stats: GenerationStats | None = None):
        self.tokens = tokens
        self.stats = stats or GenerationStats(
            prompt_tokens=4, prefill_seconds=0.5, generated_tokens=len(tokens), stop_reason="stop"
        )
        self.calls: list[tuple[list[int], dict]] = []

    def __call__(self, session, prompt, max_tokens, *args, **kwargs):
        self.calls.append((list(prompt), kwargs))
        for token in self.tokens:
            yield TokenEvent(token)
        yield Done(self.stats)


def ds4_with(monkeypatch, stream: Stream, *flags: str) -> int:
    monkeypatch.setattr(ds4, "generate", stream)
    return ds4.main(["-m", TINY, *flags])


def text_tokens(text: str) -> list[int]:
    return tokenizer().encode(text, add_special=False)


@pytest.mark.parametrize("text", ["Hello there", "Hello there\n", "Hello there\n\n", ""])
def test_the_answer_ends_its_line_exactly_once(monkeypatch, capsys, text):
    stop = sorted(tokenizer().stop_ids)[0]
    assert ds4_with(monkeypatch, Stream([*text_tokens(text), stop]), "-p", "hi") == 0
    expected = text if text.endswith("\n") else text + "\n"
    assert capsys.readouterr().out == expected  # the stop token writes nothing


def test_a_stop_token_in_the_middle_is_not_written(monkeypatch, capsys):
    stop = sorted(tokenizer().stop_ids)[0]
    tokens = [*text_tokens("one"), stop, *text_tokens(" two")]
    assert ds4_with(monkeypatch, Stream(tokens), "-p", "hi") == 0
    assert capsys.readouterr().out == "one two\n"


def test_a_raw_prompt_gets_bos_and_no_chat_markup_ban(monkeypatch):
    stream = Stream([])
    assert ds4_with(monkeypatch, stream, "-p", "hello", "-n", "7", "-c", "512") == 0
    ((prompt, kwargs),) = stream.calls
    assert prompt == tokenizer().encode("hello", add_special=True)
    assert kwargs["constraint"] is None and kwargs["max_context"] == 512
    assert kwargs["stop_tokens"] == tokenizer().stop_ids


@pytest.mark.parametrize("flags", [["--chat"], ["--system", "Be brief."]])
def test_chat_and_a_system_prompt_render_the_template(monkeypatch, flags):
    stream = Stream([])
    assert ds4_with(monkeypatch, stream, "-p", "hello", *flags) == 0
    ((prompt, kwargs),) = stream.calls
    system = flags[1] if flags[0] == "--system" else None
    rendered = tiny().chat_format.render(ds4.chat_messages("hello", system))
    assert prompt == tokenizer().encode(rendered, add_special=False)
    assert kwargs["constraint"] is not None  # the chat's markup tokens are banned


def test_the_closing_line_counts_the_generation(monkeypatch, capsys):
    stats = GenerationStats(
        prompt_tokens=4,
        prefill_seconds=2.0,
        generated_tokens=3,
        decode_seconds=0.5,
        stop_reason="length",
    )
    assert ds4_with(monkeypatch, Stream(text_tokens("abc"), stats), "-p", "hi") == 0
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        "ds4: prompt 4 tokens, prefill 2.0 t/s | generated 3 tokens, decode 4.0 t/s (length)"
    )
    assert "speculation" not in err and "experts:" not in err


def test_a_drafted_run_says_what_its_drafts_came_to(monkeypatch, capsys):
    stats = SpeculativeStats(prompt_tokens=4, generated_tokens=2, stop_reason="stop")
    assert ds4_with(monkeypatch, Stream(text_tokens("ab"), stats), "-p", "hi") == 0
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert last == ds4.speculation_summary(stats, detailed=False)


def test_the_expert_cache_line_comes_with_verbose_only(monkeypatch, capsys):
    assert ds4_with(monkeypatch, Stream([]), "-p", "hi", "-v") == 0
    assert capsys.readouterr().err.rstrip().splitlines()[-1].startswith("ds4: experts: ")
    assert ds4_with(monkeypatch, Stream([]), "-p", "hi") == 0
    assert "experts:" not in capsys.readouterr().err


def test_a_prompt_of_no_tokens_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(tiny(), "tokenizer", Empty(tokenizer()))
    stream = Stream([])
    assert ds4_with(monkeypatch, stream, "-p", "hi") == 1
    assert capsys.readouterr().err.rstrip().endswith("ds4: error: the prompt encodes to no tokens")
    assert stream.calls == []


class Empty:
    """The tiny model's tokenizer, but every text encodes to no tokens."""

    stop_ids = frozenset()

    def __init__(self, real):
        self.real = real

    def encode(self, text: str, add_special: bool) -> list[int]:
        return []

    def streaming_detokenizer(self):
        return self.real.streaming_detokenizer()


def test_an_interrupted_generation_exits_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        yield TokenEvent(text_tokens("a")[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(ds4, "generate", interrupted)
    assert ds4.main(["-m", TINY, "-p", "hi"]) == 130
    assert capsys.readouterr().err.rstrip().endswith("ds4: interrupted")


def test_a_generation_error_is_one_line_and_exit_1(monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise ValueError("prompt of 9 tokens does not fit the context of 8")
        yield

    monkeypatch.setattr(ds4, "generate", refused)
    assert ds4.main(["-m", TINY, "-p", "hi"]) == 1
    err = capsys.readouterr().err.rstrip()
    assert err.endswith("ds4: error: prompt of 9 tokens does not fit the context of 8")


@pytest.mark.parametrize(
    ("module", "words", "given"),
    [
        ("bench", ["bench", "--ctx", "64"], (["--ctx", "64"],)),
        ("plan", ["plan", "-m", "x"], (["-m", "x"],)),
        ("perplexity", ["perplexity", "-f", "t"], ("perplexity", ["-f", "t"])),
        ("perplexity", ["logprobs", "-f", "t"], ("logprobs", ["-f", "t"])),
    ],
)
def test_subcommands_get_the_words_after_their_name(monkeypatch, module, words, given):
    calls = []
    monkeypatch.setattr(f"ds4mlx.cli.{module}.main", lambda *args: calls.append(args) or 4)
    assert ds4.main(words) == 4
    assert calls == [given]


def test_the_load_and_weights_lines(monkeypatch, capsys):
    assert ds4_with(monkeypatch, Stream([]), "-p", "hi", "-v") == 0
    err = capsys.readouterr().err
    assert f"ds4: loaded {TINY} ({tiny().args_summary()}) in " in err
    assert f"ds4: weights: {tiny().load_summary()}\n" in err
    assert ds4_with(monkeypatch, Stream([]), "-p", "hi") == 0
    assert "ds4: weights:" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "error",
    [GGUFError("bad tensor"), TokenizerError("no vocab"), OSError("gone"), ValueError("odd")],
)
def test_a_model_that_cannot_load_is_one_line_and_exit_1(monkeypatch, capsys, error):
    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr("ds4mlx.loader.load_model", failing)
    assert ds4.main(["-m", TINY, "-p", "hi"]) == 1
    assert capsys.readouterr().err == f"ds4: error: {error}\n"


@pytest.fixture
def closes(monkeypatch):
    """How many times the model was closed."""
    closed = []
    monkeypatch.setattr(tiny(), "close", lambda: closed.append(True))
    return closed


@pytest.fixture
def rank(monkeypatch):
    """``ds4 --distributed`` as rank ``rank.number`` (set it before running)."""
    state = SimpleNamespace(number=0)

    def start_ranks(distributed, sampling):
        assert distributed
        return SimpleNamespace(rank=state.number), sampling

    monkeypatch.setattr("ds4mlx.cli.distributed.start_ranks", start_ranks)
    return state


def test_other_ranks_say_only_their_errors(monkeypatch, capsys, rank, closes):
    rank.number = 1
    assert ds4_with(monkeypatch, Stream(text_tokens("ab")), "-p", "hi", "--distributed") == 0
    captured = capsys.readouterr()
    assert captured.err == "" and closes == [True]
    assert captured.out == "ab\n"  # (join_ranks sends a follower's stdout to /dev/null)


@pytest.mark.parametrize("number", [0, 2])
def test_a_dropped_peer_stops_a_distributed_run(monkeypatch, capsys, rank, closes, number):
    rank.number = number

    def dropped(*args, **kwargs):
        raise RuntimeError("peer closed the connection")
        yield

    monkeypatch.setattr(ds4, "generate", dropped)
    assert ds4.main(["-m", TINY, "-p", "hi", "--distributed"]) == 1
    assert capsys.readouterr().err.endswith(
        f"ds4: error: distributed run stopped on rank {number}: peer closed the connection\n"
    )
    assert closes == [True]


def test_a_runtime_error_of_one_process_is_not_hidden(monkeypatch, closes):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
        yield

    monkeypatch.setattr(ds4, "generate", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        ds4.main(["-m", TINY, "-p", "hi"])
    assert closes == [True]


@pytest.mark.parametrize("error", [GGUFError("no block"), OSError("gone"), ValueError("odd")])
def test_a_drafter_that_cannot_load_is_one_line_and_exit_1(monkeypatch, capsys, error):
    def failing(speculation, model):
        raise error

    monkeypatch.setattr(ds4, "load_drafter", failing)
    stream = Stream([])
    assert ds4_with(monkeypatch, stream, "-p", "hi") == 1
    assert capsys.readouterr().err.endswith(f"ds4: error: {error}\n")
    assert stream.calls == []


@pytest.mark.parametrize(
    ("max_draft", "flags", "line"),
    [
        (1, [], "ds4: drafter mtp (up to 1 token a draft)"),
        (3, [], "ds4: drafter mtp (up to 3 tokens a draft)"),
        (3, ["--quality"], "ds4: drafter mtp (strict: target-only decoding)"),
    ],
)
def test_the_drafter_line(monkeypatch, capsys, max_draft, flags, line):
    drafter = SimpleNamespace(name="mtp", max_draft=max_draft)
    monkeypatch.setattr(ds4, "load_drafter", lambda speculation, model: drafter)
    stream = Stream([])
    assert ds4_with(monkeypatch, stream, "-p", "hi", *flags) == 0
    assert f"\n{line}\n" in capsys.readouterr().err
    assert stream.calls[0][0] and len(stream.calls) == 1


def test_a_terminal_without_a_prompt_opens_the_chat(monkeypatch, closes):
    calls = []

    def run_repl(model, **kwargs):
        calls.append((model, kwargs))
        return 6

    monkeypatch.setattr("ds4mlx.cli.repl.run_repl", run_repl)
    monkeypatch.setattr(ds4.sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(ds4.sys.stdout, "isatty", lambda: True)
    argv = ["-m", TINY, "--system", "Be brief.", "-n", "9", "-c", "300", "--temp", "0.5", "-v"]
    assert ds4.main(argv) == 6
    ((model, kwargs),) = calls
    assert model is tiny() and closes == [True]
    assert (kwargs["system"], kwargs["max_tokens"], kwargs["max_context"]) == ("Be brief.", 9, 300)
    assert kwargs["sampling"].temperature == 0.5 and kwargs["verbose"]
    assert (kwargs["drafter"], kwargs["speculation"].kind.name) == (None, "NONE")
    assert kwargs["info"].__self__.rank == 0  # rank 0's messages


def test_a_model_without_a_chat_template_cannot_chat(monkeypatch, capsys):
    monkeypatch.setattr(tiny(), "chat_format", None)
    stream = Stream([])
    assert ds4_with(monkeypatch, stream, "-p", "hi", "--chat") == 1
    err = capsys.readouterr().err
    assert err.endswith("ds4: error: ds4-tiny.gguf has no chat template (no real tokenizer)\n")
    assert stream.calls == []
    assert ds4_with(monkeypatch, stream, "-p", "hi") == 0  # a raw prompt needs none
