"""GLM's built-in MTP (``--mtp``): the glm5-next decode tile and rollback that speculation relies
on, and the NextN drafter, which reproduces plain greedy decoding exactly and drafts what the NextN
block predicts from committed rows only.

The models are variants of llama.cpp's glm5-next oracle fixture, built by the GLM model tests'
own builders: top-k 8 (real pool selection), with random NextN tensors."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import ds4mlx
from ds4mlx.generation import generate
from ds4mlx.gguf import GGUFError, TensorToWrite, open_gguf, write_gguf
from ds4mlx.loader import LoadedModel
from ds4mlx.models.base import DECODE_TILE
from ds4mlx.models.deepseek4_mtp import block_shapes
from ds4mlx.models.glm5_next import TILE_ROLLBACK
from ds4mlx.models.kda import KDACache
from ds4mlx.speculation import DrafterKind, SpeculationConfig, load_drafter
from ds4mlx.speculation.loop import SpeculativeStats
from ds4mlx.speculation.mtp import MTPDrafter
from ds4mlx.speculation.nextn import NextNDrafter, load_nextn
from ds4mlx.speculation.probe import rows_between
from ds4mlx.speculation.support_gguf import random_arrays

import mlx.core as mx
import numpy as np
import pytest
from models.test_glm5_next_oracle import VARIANTS, D, nextn_variant, oracle_dir, write_variant

from .conftest import paying_lease
from .test_loop import assert_verify_rows_equal_decode, run
from .tiny_targets import LAYERS, TINY, write_target

K = "glm5-next."
N_PROMPTS, N_TOKENS = 10, 64
# Token ids of the oracle fixture's 128-token vocabulary; lengths cross the 4-position pools.
PROMPTS = [np.random.default_rng(i).integers(0, 128, 3 + 4 * i).tolist() for i in range(N_PROMPTS)]
# Prompts whose drafts are checked against the NextN block run directly.
N_CHECKED = 3


@pytest.fixture(scope="module")
def paths(oracle, tmp_path_factory) -> dict[str, Path]:
    src = oracle_dir() / "glm5-next-a-f32.gguf"
    if not src.is_file():
        pytest.skip(f"{src} is missing")
    root = tmp_path_factory.mktemp("glm-nextn")
    out = {
        name: VARIANTS[name](src, root / f"{name}.gguf")
        for name in ("topk8", "deeper-topk8", "topk4-notail")
    }
    out["nextn"] = nextn_variant(out["topk8"], root / "nextn.gguf")
    out["copying"] = write_variant(
        out["nextn"], root / "copying.gguf", tensors=copying_block(out["nextn"])
    )
    return out


def copying_block(path: Path) -> dict[str, np.ndarray]:
    """The NextN tensors of ``path`` changed so that the block mostly repeats the target's own
    prediction (``eh_proj`` about [small | I] on [embedding; hidden], damped attention and FFN
    outputs, unit norms): its drafts of repeated tokens are accepted and others are not, so a
    run goes through both outcomes of a cycle."""
    gguf, rng, p = open_gguf(path), np.random.default_rng(5), "blk.2."
    eh_proj = np.array(gguf.dequantize(p + "nextn.eh_proj.weight"))
    eh_proj[:, :D] *= 0.1
    eh_proj[:, D:] = np.eye(D) + 0.05 * rng.standard_normal((D, D))
    out = {p + "nextn.eh_proj.weight": eh_proj.astype(np.float32)}
    for norm in ("nextn.hnorm", "nextn.shared_head_norm"):
        out[f"{p}{norm}.weight"] = np.ones(D, np.float32)
    for name in ("attn_output", "ffn_down_shexp", "ffn_down_exps"):
        out[f"{p}{name}.weight"] = 0.1 * gguf.dequantize(f"{p}{name}.weight")
    return out


@pytest.fixture(scope="module")
def models(paths) -> dict[str, LoadedModel]:
    return {name: ds4mlx.load_model(path) for name, path in paths.items()}


@pytest.fixture(scope="module")
def plain_outputs(models) -> list[list[int]]:
    """Plain greedy continuations (the NextN variants share the trunk of ``topk8``)."""
    return [run(generate(models["topk8"].new_session(), prompt, N_TOKENS))[0] for prompt in PROMPTS]


# --------------------------------------------------------------------------------------------
# The target side: decode tile and rollback
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["topk8", "deeper-topk8", "topk4-notail"])
@pytest.mark.parametrize("prompt_length", [40, 41, 42, 43])
def test_verify_logits_are_bit_identical_to_one_token_decode(models, name, prompt_length):
    """Every row of a verify chunk equals one-token decode bit for bit, with chunks that
    complete pools, over layers with their own and with a shared indexer, with and without the
    selected tail."""
    net = models[name].network
    prompt = (PROMPTS[-1] * 2)[:prompt_length]
    chunk = [61, 80, 7, 7, 3, 9, 11][: net.max_invariant_rows]
    assert_verify_rows_equal_decode(net, prompt, chunk)


def _state_after(net, chunks: list[list[int]]):
    state = net.new_state()
    for chunk in chunks:
        net.forward(mx.array(chunk), state)
    return state


@pytest.mark.parametrize("fed", [1, 3, 7])
def test_truncate_equals_feeding_only_the_accepted_rows(models, fed):
    """Feed a verify chunk, cut it back to its accepted prefix: the state continues exactly as
    if only the accepted rows had been fed (the same logits, bit for bit, and the same current
    recurrent state, latents and pooled indexer keys)."""
    net = models["deeper-topk8"].network
    prompt, chunk, after = PROMPTS[-1][:42], [61, 80, 7, 7, 3, 9, 11][:fed], [5, 9, 77]
    for accepted in range(fed + 1):
        state = _state_after(net, [prompt, chunk])
        net.truncate(state, len(prompt) + accepted)
        reference = _state_after(net, [prompt, chunk[:accepted]] if accepted else [prompt])
        assert state.pos == reference.pos == len(prompt) + accepted
        for ours, theirs in zip(state.layers, reference.layers, strict=True):
            if isinstance(ours, KDACache):
                assert np.array_equal(ours.state, theirs.state)
                assert np.array_equal(ours.conv[:, -3:], theirs.conv[:, -3:])
            else:
                assert np.array_equal(ours.latent, theirs.latent)
                if ours.index is not None:
                    assert np.array_equal(ours.index.pooled, theirs.index.pooled)
        for tokens in (after, after[:1]):
            assert np.array_equal(
                np.array(net.forward(mx.array(tokens), state)),
                np.array(net.forward(mx.array(tokens), reference)),
            )


def test_truncate_across_chunks_and_its_limits(models):
    net = models["topk8"].network
    prompt = PROMPTS[-1][:30]
    state = _state_after(net, [prompt, [1, 2, 3], [4, 5, 6, 7]])
    net.truncate(state, len(prompt) + 1)  # back over two verify chunks
    reference = _state_after(net, [prompt, [1]])
    assert np.array_equal(
        np.array(net.forward(mx.array([8]), state)), np.array(net.forward(mx.array([8]), reference))
    )
    # A chunk of DECODE_TILE tokens or more keeps no per-position recurrent states ...
    state = _state_after(net, [prompt, list(range(DECODE_TILE))])
    with pytest.raises(ValueError, match="cannot roll back"):
        net.truncate(state, state.pos - 1)
    # ... and decode tiles keep TILE_ROLLBACK of them.
    state = _state_after(net, [prompt] + [[t] for t in range(TILE_ROLLBACK + 2)])
    net.truncate(state, state.pos - TILE_ROLLBACK)
    with pytest.raises(ValueError, match="cannot roll back"):
        net.truncate(state, state.pos - 1)


# --------------------------------------------------------------------------------------------
# The NextN drafter
# --------------------------------------------------------------------------------------------


class RecordingDrafter(NextNDrafter):
    """Remembers each proposal with the position of the drafted token."""

    def __init__(self, network):
        super().__init__(network)
        self.proposals: list[tuple[int, list[int]]] = []

    def propose_on_device(self, max_tokens: int):
        # The loop's drafts stay on the device; ``propose`` comes here too.
        draft = super().propose_on_device(max_tokens)
        # The committed rows are positions 0 .. n - 1, the sampled token is at n.
        self.proposals.append((self.mtp_state.pos + 1, [] if draft is None else draft.tolist()))
        return draft


@dataclass
class SpecRun:
    prompt: list[int]
    tokens: list[int]
    stats: SpeculativeStats
    drafter: RecordingDrafter
    session_tokens: list[int]


@pytest.fixture(scope="module", params=["nextn", "copying"])
def spec_runs(request, models) -> tuple[str, list[SpecRun]]:
    model = models[request.param]
    runs = []
    for prompt in PROMPTS:
        drafter = RecordingDrafter(model.network)
        session = model.new_session()
        # The cost rule would pause a NextN that cannot pay on this machine after a few cycles,
        # before both outcomes of a cycle show: on a paying lease every cycle drafts.
        tokens, stats = run(
            generate(session, prompt, N_TOKENS, drafter=drafter, lease=paying_lease())
        )
        runs.append(SpecRun(prompt, tokens, stats, drafter, list(session.tokens)))
    return request.param, runs


def test_greedy_speculation_equals_plain_decoding(spec_runs, plain_outputs):
    name, runs = spec_runs
    for spec, plain in zip(runs, plain_outputs, strict=True):
        assert spec.tokens == plain
        assert spec.session_tokens == [*spec.prompt, *plain[:-1]]
        # The NextN cache holds exactly the committed rows, once it ran on the last observed.
        spec.drafter.catch_up()
        assert spec.drafter.mtp_state.pos == len(spec.session_tokens)
        assert all(len(tokens) == 1 for _, tokens in spec.drafter.proposals)
    drafted = sum(r.stats.drafted_tokens for r in runs)
    accepted = sum(r.stats.accepted_tokens for r in runs)
    assert drafted > 0
    if name == "copying":
        assert 0 < accepted < drafted  # both outcomes of a cycle occur


def test_drafts_are_the_nextn_argmax_over_committed_rows(spec_runs, models):
    """Each draft is the argmax of the NextN block run directly over the committed sequence
    (the target's hidden state at t, the committed token at t + 1); the drafter's cache equals
    the block's over the committed rows, so no rejected draft entered it."""
    name, runs = spec_runs
    net = models[name].network
    for spec in runs[:N_CHECKED]:
        spec.drafter.catch_up()
        sequence = [*spec.prompt, *spec.tokens]
        # One-token decode gives the verify rows' hidden states bit for bit (the decode tile).
        session = models[name].new_session()
        rows = [session.feed_hidden(spec.prompt).final_hidden]
        rows += [session.feed_hidden([t]).final_hidden for t in spec.tokens[:-1]]
        hidden = mx.concatenate(rows)
        state = net.new_mtp_state()
        logits = np.array(net.mtp_logits(hidden, mx.array(sequence[1:]), state))
        assert spec.drafter.proposals
        for position, tokens in spec.drafter.proposals:
            assert tokens == [int(np.argmax(logits[position - 2]))]
        committed = spec.drafter.mtp_state.pos
        np.testing.assert_allclose(
            np.array(spec.drafter.mtp_state.layers[0].latent),
            np.array(state.layers[0].latent[:committed]),
            atol=1e-5,
        )


def test_observe_checks_alignment(models):
    model = models["nextn"]
    drafter = load_nextn(model)
    assert isinstance(drafter, NextNDrafter) and drafter.max_draft == 1
    assert drafter.propose(1).tokens == []  # nothing observed yet
    prompt = PROMPTS[1]
    out = model.new_session().feed_hidden(prompt)
    drafter.observe(prompt, 7, rows_between(out, 0, len(prompt)))
    assert len(drafter.propose(1).tokens) == 1 and drafter.propose(0).tokens == []
    with pytest.raises(ValueError, match="rows start at position 0"):
        drafter.observe(prompt, 7, rows_between(out, 0, len(prompt)))


def test_the_draft_stays_on_the_device_until_the_verify_is_queued(models, monkeypatch):
    """The block's run over the observed rows and the draft's argmax are queued, not waited
    for: the loop queues the verify pass behind them before the host reads the token."""
    model = models["nextn"]
    prompt = PROMPTS[1]
    out = model.new_session().feed_hidden(prompt)
    drafter = load_nextn(model)
    drafter.observe(prompt, 7, rows_between(out, 0, len(prompt)))
    waits: list[str] = []
    evaluate = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *arrays: waits.append("eval") or evaluate(*arrays))
    queued = drafter.propose_on_device(1)
    assert waits == [] and queued.dtype == mx.int32 and queued.shape == (1,)
    monkeypatch.undo()
    assert queued.tolist() == drafter.propose(1).tokens
    assert drafter.propose_on_device(0) is None


def test_observed_rows_wait_for_the_next_draft(models):
    """Rows observed in several pieces (plain advances while drafting is paused) run through
    the block in one pass when a draft is asked for, with the draft and cache of one pass over
    them all."""
    model = models["nextn"]
    prompt = PROMPTS[1]
    out = model.new_session().feed_hidden(prompt)
    whole, pieces = load_nextn(model), load_nextn(model)
    whole.observe(prompt[:-1], prompt[-1], rows_between(out, 0, len(prompt) - 1))
    for start in range(0, len(prompt) - 1, 2):
        end = min(start + 2, len(prompt) - 1)
        pieces.observe(prompt[start:end], prompt[end], rows_between(out, start, end))
    assert pieces.mtp_state.pos == 0  # nothing run yet
    assert pieces.propose(1).tokens == whole.propose(1).tokens
    assert pieces.mtp_state.pos == whole.mtp_state.pos == len(prompt) - 1
    np.testing.assert_allclose(
        np.array(pieces.mtp_state.layers[0].latent),
        np.array(whole.mtp_state.layers[0].latent),
        atol=1e-5,
    )


def test_a_model_without_nextn_block_is_refused(models, paths):
    with pytest.raises(GGUFError, match="nextn_predict_layers = 0"):
        load_drafter(SpeculationConfig(kind=DrafterKind.NEXTN), models["topk8"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds4mlx.cli.main",
            "-m",
            str(paths["topk8"]),
            "-p",
            "1 2 3",
            "--mtp",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Refused from the header, before the model loads: a usage error.
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--mtp needs the MTP draft block" in result.stderr and "loaded" not in result.stderr


def test_deepseek4_nextn_block_uses_the_legacy_mtp_drafter(tmp_path):
    """A deepseek4 file with llama.cpp's ``blk.{n}.nextn.*`` block drafts one token a cycle
    through the legacy MTP drafter, and speculation still equals plain decoding."""
    d, p = TINY.hidden_size, f"blk.{LAYERS}."
    # The block is one more sliding-window layer: layer 0's tensors, as layer LAYERS.
    shapes = {
        p + n.removeprefix("blk.0."): s
        for n, s in block_shapes(replace(TINY, num_layers=1)).items()
    }
    shapes |= {
        p + "nextn.eh_proj.weight": (d, 2 * d),
        p + "nextn.enorm.weight": (d,),
        p + "nextn.hnorm.weight": (d,),
    }
    target = write_target(
        tmp_path / "ds4-nextn.gguf",
        seed=0,
        nextn=True,
        extra=random_arrays(shapes, np.random.default_rng(2)),
    )
    drafter = load_drafter(SpeculationConfig(kind=DrafterKind.NEXTN), target)
    # One draft token every cycle, as with GLM's block: no margin cuts it.
    assert isinstance(drafter, MTPDrafter) and (drafter.max_draft, drafter.margin) == (1, 0.0)
    prompt = [t % TINY.vocab_size for t in PROMPTS[2]]  # PROMPTS are for the GLM variants
    plain, _ = run(generate(target.new_session(), prompt, 24))
    spec, stats = run(generate(target.new_session(), prompt, 24, drafter=drafter))
    assert spec == plain and stats.drafted_tokens > 0
    without = write_target(tmp_path / "ds4.gguf", seed=0)
    with pytest.raises(GGUFError, match="nextn_predict_layers"):
        load_nextn(without)


def stand_in_target(path: Path, arch: str, *, with_block: bool) -> SimpleNamespace:
    """What ``load_nextn`` reads of a loaded target (its file and layer count), for a file
    whose architecture no loader builds. It claims a NextN layer either way (a file whose block
    was stripped still says so)."""
    tensors = [TensorToWrite("token_embd.weight", np.ones((4, 32), np.float32))]
    if with_block:
        tensors.append(TensorToWrite("blk.2.nextn.eh_proj.weight", np.ones((4, 32), np.float32)))
    write_gguf(path, arch, {f"{arch}.nextn_predict_layers": 1}, tensors)
    return SimpleNamespace(gguf=open_gguf(path), args=SimpleNamespace(num_layers=2))


@pytest.mark.parametrize(
    ("with_block", "refusal"),
    [
        (
            False,
            "--mtp needs the MTP draft block inside the model, but this llama file has none "
            "(llama.nextn_predict_layers = 1, no tensor 'blk.2.nextn.eh_proj.weight')",
        ),
        (True, "--mtp does not support architecture 'llama'"),
    ],
)
def test_a_file_without_a_block_or_a_drafter_for_it_is_refused(tmp_path, with_block, refusal):
    path = tmp_path / "other.gguf"
    with pytest.raises(GGUFError) as refused:
        load_nextn(stand_in_target(path, "llama", with_block=with_block))
    assert str(refused.value) == f"{path}: {refusal}"


def test_a_network_without_a_nextn_block_is_no_drafter():
    with pytest.raises(ValueError, match=r"^the model has no NextN \(MTP\) block$"):
        NextNDrafter(SimpleNamespace(mtp=None))
