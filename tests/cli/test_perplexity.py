"""``ds4 perplexity`` and ``ds4 logprobs`` against llama.cpp's logits (the oracle fixtures) and
against the definition of llama-perplexity's measure on the shipped tiny model."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import ds4mlx
from ds4mlx.cli import perplexity as scoring_module
from ds4mlx.cli.main import main
from ds4mlx.cli.perplexity import FEED_BATCH, Perplexity, bos_for_chunks, perplexity
from ds4mlx.generation import TokenizerError

import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def oracle_dir() -> Path:
    # As tests/conftest.py finds it; imported by name, "conftest" may be another folder's.
    default = Path(__file__).resolve().parents[3] / "shared" / "oracle"
    return Path(os.environ.get("DS4MLX_ORACLE_DIR", default))


#: llama.cpp's own batch and step paths differ by this much; the issue asks for 1e-3 relative.
RELATIVE = 1e-3


def reference_perplexity(logits: np.ndarray, tokens: list[int], ctx: int) -> float:
    """llama-perplexity's value for one chunk of ``ctx`` tokens from llama.cpp's logits of that
    chunk: the rows ctx/2 .. ctx-2 score the token after each (a fixture's batch logits are the
    first chunk's, computed from an empty context, and its vocabulary adds no BOS)."""
    first = ctx // 2
    rows = logits[first : ctx - 1].astype(np.float64)
    rows = rows - rows.max(axis=1, keepdims=True)
    logprobs = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    following = np.asarray(tokens[first + 1 : ctx])
    return math.exp(-logprobs[np.arange(len(following)), following].mean())


def oracle_fixtures(oracle: dict, names: tuple[str, ...]) -> list[dict]:
    return [f for f in oracle["fixtures"] if f["name"] in names]


@pytest.mark.parametrize("ctx", [100, 64])
def test_perplexity_equals_llamacpp_on_the_oracle_fixtures(oracle, ctx):
    fixtures = oracle_fixtures(oracle, ("deepseek4-a-f16", "deepseek4-b-f16", "glm5-next-a-f32"))
    assert fixtures
    for fixture in fixtures:
        model = ds4mlx.load_model(oracle_dir() / fixture["gguf"])
        assert bos_for_chunks(model) is None  # llama.cpp's test vocabulary adds no BOS
        tokens = fixture["tokens"]
        expected = reference_perplexity(
            np.load(oracle_dir() / fixture["batch_logits"]), tokens, ctx
        )
        ours = list(perplexity(model, tokens, ctx, chunks=1))
        assert len(ours) == 1 and ours[0].count == ctx - 1 - ctx // 2
        assert ours[0].value == pytest.approx(expected, rel=RELATIVE), fixture["name"]


def test_logprobs_jsonl_equals_llamacpp_logits(oracle, tmp_path):
    fixture = oracle_fixtures(oracle, ("deepseek4-a-f16",))[0]
    tokens = fixture["tokens"]
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, tokens)))
    out = tmp_path / "logprobs.jsonl"
    model = str(oracle_dir() / fixture["gguf"])
    status = main(["logprobs", "-m", model, "-f", str(ids), "--ids", "--top", "3", "-o", str(out)])
    assert status == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["position"] for r in records] == list(range(1, len(tokens)))
    assert [r["token"] for r in records] == tokens[1:]
    logits = np.load(oracle_dir() / fixture["batch_logits"]).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    reference = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    ours = np.array([r["logprob"] for r in records])
    expected = reference[np.arange(len(records)), tokens[1:]]
    np.testing.assert_allclose(ours, expected, atol=2e-3)
    for record, row in zip(records, reference, strict=False):
        # The three best, best first; near-ties may come in either engine's order.
        top = record["top_logprobs"]
        listed = [t["logprob"] for t in top]
        assert listed == sorted(listed, reverse=True)
        np.testing.assert_allclose(listed, np.sort(row)[::-1][:3], atol=2e-3)
        np.testing.assert_allclose(listed, row[[t["token"] for t in top]], atol=2e-3)


@pytest.fixture(scope="module")
def tiny():
    path = ASSETS / "ds4-tiny.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return ds4mlx.load_model(path)


def test_chunks_start_from_an_empty_context_with_bos(tiny):
    """The second chunk is scored from an empty context with its first token replaced by BOS
    (ds4-tiny's vocabulary adds BOS), the second half of each chunk scored."""
    bos = bos_for_chunks(tiny)
    assert bos is not None
    text = "The harbour was quiet in the early morning, and the boats rocked on the tide. " * 12
    tokens = tiny.tokenizer.encode(text, add_special=True)
    ctx = 48
    result = list(perplexity(tiny, tokens, ctx, chunks=2, bos=bos))[-1]
    scored = ctx - 1 - ctx // 2
    assert result.count == 2 * scored
    nll = 0.0
    for chunk in range(2):
        ids = [bos, *tokens[chunk * ctx + 1 : (chunk + 1) * ctx]]
        nll += math.log(reference_perplexity(tiny.logits(ids), ids, ctx)) * scored
        running = math.exp(nll / ((chunk + 1) * scored))
        assert result.after_chunk[chunk] == pytest.approx(running, rel=1e-6)


def test_a_chunk_longer_than_a_feed_is_fed_in_pieces(monkeypatch):
    # float32: pieces and the whole agree to summation order; native Q8_0 products round their
    # inputs to 8 bits, where that order can step a rounding (test_bench_quality bounds it).
    tiny = ds4mlx.load_model(ASSETS / "ds4-tiny.gguf", weights_dtype="f32")
    tokens = tiny.tokenizer.encode("one two three four five six seven eight nine " * 20)
    whole = list(perplexity(tiny, tokens, 64, chunks=2))[-1].value
    monkeypatch.setattr("ds4mlx.cli.perplexity.FEED_BATCH", 24)
    assert FEED_BATCH != 24
    pieces = list(perplexity(tiny, tokens, 64, chunks=2))[-1].value
    assert pieces == pytest.approx(whole, rel=1e-5)


def test_the_command_prints_llamacpp_lines(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("Fishing boats rocked against the pier. " * 40)
    status = main(["perplexity", "-m", str(ASSETS / "ds4-tiny.gguf"), "-f", str(text), "-c", "64"])
    out = capsys.readouterr().out
    assert status == 0
    progress, final = out.strip().splitlines()
    assert progress.startswith("[1]") and progress.endswith(",")
    assert final.startswith("Final estimate: PPL = ") and " +/- " in final
    last = float(progress.rstrip(",").split(",")[-1].split("]")[1])
    assert float(final.split()[4]) == pytest.approx(last, abs=1e-4)


def test_too_short_a_text_is_refused_before_scoring(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("too short")
    status = main(["perplexity", "-m", str(ASSETS / "ds4-tiny.gguf"), "-f", str(text)])
    assert status == 1
    assert "needs at least 8192" in capsys.readouterr().err


def test_bad_ids_are_refused(tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 three")
    status = main(["logprobs", "-m", str(ASSETS / "ds4-tiny.gguf"), "-f", str(ids), "--ids"])
    assert status == 1
    assert "whitespace-separated token ids" in capsys.readouterr().err
    ids.write_text("1 2 99999999")
    assert main(["logprobs", "-m", str(ASSETS / "ds4-tiny.gguf"), "-f", str(ids), "--ids"]) == 1
    assert "outside the vocabulary" in capsys.readouterr().err


def scoring(command: str, *flags: str) -> list[str]:
    return [command, "-m", str(ASSETS / "ds4-tiny.gguf"), *flags]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            scoring("perplexity", "-f", "t.txt", "--chunks", "0"),
            "--chunks must be at least 1, got 0",
        ),
        (scoring("logprobs", "-f", "t.txt", "--top", "-1"), "--top must be >= 0, got -1"),
        # The bounds themselves pass: the next check (the file) is the one that refuses.
        (scoring("perplexity", "-f", "no-such.txt", "--chunks", "1"), "-f no-such.txt: no such"),
        (scoring("logprobs", "-f", "no-such.txt", "--top", "0"), "-f no-such.txt: no such file"),
    ],
)
def test_scoring_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_model_that_cannot_load_is_one_error_line(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("hello")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)
    assert main(["logprobs", "-m", str(broken), "-f", str(text)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ds4 logprobs: error: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("ids", "ctx", "message"),
    [("5", "8", "fewer than two tokens"), ("1 2 3", "2", "3 tokens, more than the context of 2")],
)
def test_logprobs_wants_two_tokens_within_the_context(tmp_path, capsys, ids, ctx, message):
    path = tmp_path / "ids.txt"
    path.write_text(ids)
    assert main(scoring("logprobs", "-f", str(path), "--ids", "-c", ctx)) == 1
    assert capsys.readouterr().err == f"ds4 logprobs: error: {path}: {message}" + (
        " (raise --ctx or cut the text)\n" if "context" in message else ", nothing to score\n"
    )


def test_logprobs_of_a_text_filling_the_context_go_to_stdout(tmp_path, capsys):
    path = tmp_path / "ids.txt"
    path.write_text("7 8")
    assert main(scoring("logprobs", "-f", str(path), "--ids", "-c", "2")) == 0
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert (record["position"], record["token"]) == (1, 8) and "top_logprobs" not in record


def test_the_error_is_the_sample_standard_error_of_the_perplexity():
    scored = Perplexity()
    scored.add(np.array([-1.0, -2.0]))
    # Mean NLL 1.5, variance 0.25 over the two tokens: llama.cpp divides by count - 1 = 1.
    assert scored.value == math.exp(1.5)
    assert scored.error == 0.5 * math.exp(1.5)


class StandInTokenizer:
    """Token ``t`` is the byte ``t`` (ids 0xe2 and 0x82 are halves of a UTF-8 character)."""

    def __init__(self, add_bos=True, bos_id=1):
        self.add_bos, self.bos_id = add_bos, bos_id

    def token_bytes(self, token: int) -> bytes:
        return bytes([token])

    def encode(self, text: str, add_special: bool) -> list[int]:
        bos = [self.bos_id] if add_special and self.add_bos else []
        return [*bos, *text.encode()]


class StandInModel:
    """A model whose logits favour, at each position, the token ``(id + 1) % VOCAB``; counts
    what it was fed and whether it was closed."""

    VOCAB = 256

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer or StandInTokenizer()
        self.args = SimpleNamespace(vocab_size=self.VOCAB)
        self.closed = 0

    def new_session(self):
        def feed(piece):
            logits = np.zeros((len(piece), self.VOCAB), dtype=np.float32)
            logits[np.arange(len(piece)), (np.array(piece) + 1) % self.VOCAB] = 3.0
            return logits

        return SimpleNamespace(feed=feed)

    def close(self):
        self.closed += 1


def test_one_token_or_equal_ones_have_no_error():
    one = Perplexity()
    one.add(np.array([-0.5]))
    assert (one.value, one.error) == (math.exp(0.5), 0.0)
    equal = Perplexity()
    equal.add(np.array([-0.5, -0.5, -0.5]))
    assert equal.error == 0.0


@pytest.mark.parametrize(
    ("first", "starts", "rows"), [(0, [0, 4], [4, 4]), (4, [4], [4]), (5, [5], [3])]
)
def test_pieces_start_at_the_first_position_asked(monkeypatch, first, starts, rows):
    monkeypatch.setattr(scoring_module, "FEED_BATCH", 4)
    pieces = list(scoring_module.logit_pieces(StandInModel(), list(range(8)), first))
    assert [start for start, _, _ in pieces] == starts
    assert [len(logits) for _, logits, _ in pieces] == rows
    assert all(len(norms) == len(logits) for _, logits, norms in pieces)


@pytest.mark.parametrize(
    ("add_bos", "bos_id", "bos"), [(True, 5, 5), (False, 5, None), (True, None, None)]
)
def test_chunks_start_with_bos_only_where_the_file_asks(add_bos, bos_id, bos):
    model = StandInModel(StandInTokenizer(add_bos, bos_id))
    assert bos_for_chunks(model) == bos


@pytest.mark.parametrize(("chunks", "count"), [(None, 3), (2, 2), (3, 3), (5, 3)])
def test_chunks_asked_for_are_at_most_those_the_text_holds(chunks, count):
    assert scoring_module.chunk_count(399, 100, chunks) == count


def test_a_broken_character_is_shown_replaced():
    model = StandInModel()
    records = list(scoring_module.token_logprobs(model, [0x41, 0xE2, 0x82], top=1))
    assert [record["text"] for record in records] == ["\ufffd", "\ufffd"]
    assert records[0]["top_logprobs"][0]["text"] == "B"  # 0x41 + 1


@pytest.mark.parametrize("ids", ["-1", "256", "3 -7"])
def test_ids_outside_the_vocabulary_are_refused(tmp_path, ids):
    path = tmp_path / "ids.txt"
    path.write_text(ids)
    outside = next(word for word in ids.split() if not 0 <= int(word) < 256)
    with pytest.raises(ValueError) as refused:
        scoring_module.read_tokens(StandInModel(), path, ids=True)
    assert str(refused.value) == f"{path}: token id {outside} is outside the vocabulary (0..255)"
    path.write_text("0 255")
    assert scoring_module.read_tokens(StandInModel(), path, ids=True) == [0, 255]


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """``ds4 perplexity``/``logprobs`` over a StandInModel, on a text file of 16 letters."""
    model = StandInModel()
    monkeypatch.setattr("ds4mlx.loader.load_model", lambda *args, **kwargs: model)
    text = tmp_path / "text.txt"
    text.write_text("abcdefghijklmnop")
    model.argv = ["-m", "stand-in.gguf", "-f", str(text)]
    return model


@pytest.mark.parametrize(("add_bos", "told"), [(True, ", BOS 1 first"), (False, "")])
def test_the_perplexity_header_tells_what_is_scored(stand_in, capsys, add_bos, told):
    stand_in.tokenizer.add_bos = add_bos
    assert scoring_module.main("perplexity", [*stand_in.argv, "-c", "8"]) == 0
    tokens = 17 if add_bos else 16
    assert capsys.readouterr().err == (
        f"ds4 perplexity: {tokens} tokens, 2 chunks of 8, scoring the last 3 of each{told}\n"
    )
    assert stand_in.closed == 1


def test_a_flag_contradiction_is_a_usage_error(stand_in, capsys):
    with pytest.raises(SystemExit) as refused:
        scoring_module.main("perplexity", [*stand_in.argv, "--expert-cache", "4"])
    assert refused.value.code == 2
    assert "--expert-cache and --expert-hotlist apply to --ssd-stream only" in (
        capsys.readouterr().err
    )


def test_a_closed_pipe_is_left_to_ds4_to_end_quietly(stand_in, monkeypatch):
    def closed(*args):
        raise BrokenPipeError

    monkeypatch.setattr(scoring_module, "_print_perplexity", closed)
    with pytest.raises(BrokenPipeError):
        scoring_module.main("perplexity", [*stand_in.argv])
    assert stand_in.closed == 1


def test_a_text_the_tokenizer_refuses_is_one_error_line(stand_in, monkeypatch, capsys):
    def refuse(text, add_special):
        raise TokenizerError("no merges for this text")

    monkeypatch.setattr(stand_in.tokenizer, "encode", refuse)
    assert scoring_module.main("logprobs", [*stand_in.argv]) == 1
    assert capsys.readouterr().err == "ds4 logprobs: error: no merges for this text\n"
    assert stand_in.closed == 1


def test_logprobs_written_to_a_file_are_complete(stand_in, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert scoring_module.main("logprobs", [*stand_in.argv, "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    lines = out.read_text().splitlines()
    assert len(lines) == 16 and json.loads(lines[-1])["text"] == "p"
