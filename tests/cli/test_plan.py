"""``ds4 plan`` and ``ds4``'s refusal of a model that cannot fit resident."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from ds4mlx.cli import main as ds4_main
from ds4mlx.cli import plan as plan_module
from ds4mlx.cli.plan import parse_memory
from ds4mlx.gguf import open_gguf
from ds4mlx.load_plan import HEADROOM, RUNTIME_BYTES, USABLE_SHARE, plan_memory
from ds4mlx.memory import wire_model

import mlx.core as mx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = REPO_ROOT / "assets" / "ds4-tiny.gguf"
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from make_flash_shaped import write_flash_shaped  # noqa: E402

GIB = 2**30


@pytest.fixture(scope="module")
def flash(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "flash3.gguf"
    write_flash_shaped(path, layers=3, experts=16, vocab=512)
    return path


def streamable_memory(path: Path) -> int:
    """Memory where the model streams with a cache of two layers' top-k but is not resident."""
    plan = plan_memory(open_gguf(path), "native")
    return int(
        ((plan.dense_bytes + 2 * plan.min_cache_bytes + plan.kv_bytes) * HEADROOM + RUNTIME_BYTES)
        / USABLE_SHARE
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("128G", 128 * GIB),
        ("96GiB", 96 * GIB),
        ("64", 64 * GIB),
        ("512M", 512 * 2**20),
        ("1.5t", int(1.5 * 2**40)),
        ("  24 gb ", 24 * GIB),
    ],
)
def test_memory_sizes(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-4G", "0", "12Q", "1e3G"])
def test_bad_memory_sizes_are_refused(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_memory(text)


def test_verdicts_follow_the_memory(flash):
    plan = plan_memory(open_gguf(flash), "native")
    resident = plan.resident_needed()
    assert resident == int(
        (plan.dense_bytes + plan.routed_bytes + plan.kv_bytes) * HEADROOM + RUNTIME_BYTES
    )
    roomy = plan.verdict(int(resident / USABLE_SHARE) + 1)
    assert roomy.kind == "resident"
    tight = plan.verdict(int(resident / USABLE_SHARE) - 1)
    assert tight.kind == "streamed"
    assert plan.min_cache_bytes <= tight.cache_bytes < plan.routed_bytes
    assert tight.needed_bytes <= tight.memory_bytes * USABLE_SHARE
    assert "--ssd-stream --expert-cache" in tight.flags()
    assert plan.verdict(plan.dense_bytes).kind == "none"


def test_kv_grows_with_the_context(flash):
    gguf = open_gguf(flash)
    short, long = plan_memory(gguf, "native", ctx=1024), plan_memory(gguf, "native", ctx=8192)
    assert long.kv_bytes - short.kv_bytes == 7 * short.kv_bytes_per_1k
    # Layers 0 and 1 keep only their windows; layer 2 (CSA, ratio 4) adds a compressed key of
    # 512 values and an indexer key of 128 every 4 tokens, in float32.
    assert short.kv_bytes_per_1k == 1024 // 4 * (512 + 128) * 4
    assert short.kv_fixed_bytes > 0


def test_f32_weights_cost_four_bytes_a_value(flash):
    gguf = open_gguf(flash)
    f32 = plan_memory(gguf, "f32")
    values = sum(
        t.nbytes // 34 * 32 for n, t in gguf.layout.tensors.items() if n.endswith("attn_q_b.weight")
    )
    assert f32.dense_bytes > plan_memory(gguf, "native").dense_bytes
    assert values * 4 <= f32.dense_bytes


def test_ds4_plan_prints_each_memory(flash, capsys):
    streamable = f"{streamable_memory(flash) / 2**20:.0f}M"
    code = ds4_main.main(
        [
            "plan",
            "-m",
            str(flash),
            "--weights-dtype",
            "native",
            "--memory",
            "64G",
            "--memory",
            streamable,
            "--memory",
            "0.1G",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "dense weights" in out and "routed experts" in out and "per 1k tokens" in out
    assert "64.00 GiB: fits resident" in out
    assert "streamed: --ssd-stream --expert-cache" in out
    assert "does not fit" in out


def test_ds4_plan_reports_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 8)
    assert ds4_main.main(["plan", "-m", str(bad)]) == 1
    assert "ds4 plan: error:" in capsys.readouterr().err


def test_ds4_refuses_a_model_larger_than_memory(flash, monkeypatch, capsys):
    available = streamable_memory(flash)
    monkeypatch.setattr(plan_module, "available_memory_bytes", lambda: available)
    code = ds4_main.main(["-m", str(flash), "-p", "hi", "-n", "1", "--weights-dtype", "native"])
    err = capsys.readouterr().err
    assert code == 1
    assert "run with --ssd-stream --expert-cache" in err and "memory plan for" in err


def test_ds4_does_not_refuse_a_model_that_fits():
    assert (
        ds4_main.refuse_oversized(
            ds4_main.model_options(ds4_main.build_parser().parse_args(["-m", str(TINY), "-p", "x"]))
        )
        is None
    )


@pytest.mark.parametrize(
    "tps, text", [(12.34, "12.3 t/s"), (0.0035, "0.0035 t/s (286 s/token)"), (0.0, "0.0 t/s")]
)
def test_slow_rates_are_shown_as_seconds_per_token(tps, text):
    assert ds4_main.rate(tps) == text


def test_expert_geometry_ignores_scale_companions(ds4_fixture_path):
    # llama.cpp's fixture stores blk.N.ffn_*_exps.scale / .input_scale next to the experts.
    gguf = open_gguf(ds4_fixture_path.parent / "deepseek4-a-kquant.gguf")
    assert gguf.has_tensor("blk.0.ffn_gate_exps.scale")
    plan = plan_memory(gguf, "f32")
    assert plan.n_experts == 2 and plan.moe_layers == 4
    assert plan.expert_bytes == 3 * 1024 * 512 * 4  # gate, up, down of one expert in float32


def test_ds4_plan_says_which_wired_limit_a_mac_needs(flash, capsys):
    plan = plan_memory(open_gguf(flash), "native")
    needed = plan.resident_needed()
    tight, roomy = needed / USABLE_SHARE / 2**10 + 1, 4 * needed / 2**10  # KiB, resident
    assert (
        ds4_main.main(
            ["plan", "-m", str(flash), "--weights-dtype", "native"]
            + ["--memory", f"{tight:.0f}K", "--memory", f"{roomy:.0f}K"]
        )
        == 0
    )
    out = capsys.readouterr().out
    # Only the tight memory is above the GPU's default share: one line, the plan's need in MiB.
    assert out.count("sudo sysctl iogpu.wired_limit_mb=") == 1
    assert f"iogpu.wired_limit_mb={-(-needed // 2**20)} keeps it resident" in out


def test_a_model_near_the_gpu_working_set_is_wired(monkeypatch):
    limits = []
    monkeypatch.setattr(mx, "set_wired_limit", limits.append)
    assert wire_model(50 * GIB, None) is None  # no Metal
    assert wire_model(50 * GIB, 96 * GIB) is None and limits == []  # far below
    note = wire_model(90 * GIB, 96 * GIB)
    assert limits == [96 * GIB] and "wired limit raised" in note and "sysctl" not in note
    note = wire_model(100 * GIB, 96 * GIB)
    assert "sudo sysctl iogpu.wired_limit_mb=112640" in note  # 110% of 100 GiB, in MiB


def test_no_reading_of_available_memory_refuses_nothing(monkeypatch):
    monkeypatch.setattr(plan_module, "available_memory_bytes", lambda: None)
    monkeypatch.setattr(plan_module, "check_resident", lambda *a: pytest.fail("planned"))
    assert plan_module.refusal(TINY, "f32", 4096) is None


@pytest.mark.parametrize(
    ("fits_native", "advice"),
    [
        (True, "it does not fit with f32 weights; try --weights-dtype native --ssd-stream"),
        (False, "it does not fit in this machine's memory in any mode"),
    ],
)
def test_a_refusal_that_cannot_stream_says_what_is_left(flash, monkeypatch, fits_native, advice):
    plan = plan_memory(open_gguf(flash), "f32")
    verdict = plan.verdict(1)
    assert verdict.kind == "none"
    oversized = SimpleNamespace(plan=plan, verdict=verdict, fits_native=fits_native)
    monkeypatch.setattr(plan_module, "available_memory_bytes", lambda: 2**20)
    monkeypatch.setattr(plan_module, "check_resident", lambda *a: oversized)
    message = plan_module.refusal(flash, "f32", 4096)
    assert message.startswith(f"{plan.path} needs ") and f"is available; {advice}\n" in message
    assert "  1.0 MiB available now: does not fit: needs at least" in message
    assert "+ one layer's experts" in message


def test_a_model_without_experts_or_a_kv_model_says_so(flash):
    plan = replace(
        plan_memory(open_gguf(flash), "f32"),
        moe_layers=0,
        routed_bytes=0,
        kv_bytes_per_1k=None,
    )
    text = plan_module.describe(plan, [(2**20, "tiny")])
    assert "in memory (none)" in text
    assert f"KV cache        not modelled for {plan.arch}" in text
    assert text.endswith(f"(dense weights {plan_module.format_size(plan.dense_bytes)})")


def test_ds4_plan_refuses_no_context(flash, capsys):
    with pytest.raises(SystemExit):
        ds4_main.main(["plan", "-m", str(flash), "--ctx", "0"])
    assert "--ctx must be positive, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ds4_main.main(["plan", "-m", str(flash), "--memory", "lots"])
    assert "memory size: expected e.g. 128G" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("total", "available", "labels"),
    [
        (64 * GIB, 32 * GIB, ["64.00 GiB (this machine)", "32.00 GiB (available now)"]),
        (None, 32 * GIB, ["32.00 GiB (available now)"]),
        (64 * GIB, None, ["64.00 GiB (this machine)"]),
    ],
)
def test_ds4_plan_without_memory_plans_for_this_machine(
    flash, monkeypatch, capsys, total, available, labels
):
    monkeypatch.setattr(plan_module, "physical_memory_bytes", lambda: total)
    monkeypatch.setattr(plan_module, "available_memory_bytes", lambda: available)
    assert ds4_main.main(["plan", "-m", str(flash), "--ctx", "1"]) == 0
    lines = [line.split(":")[0].strip() for line in capsys.readouterr().out.splitlines()[5:]]
    assert [line for line in lines if not line.startswith("on a Mac")] == labels


def test_the_kv_line_gives_its_growth_fixed_part_and_total(flash):
    plan = plan_memory(open_gguf(flash), "native", ctx=2048)
    size = plan_module.format_size
    expected = (
        f"  KV cache        {size(plan.kv_bytes_per_1k)} per 1k tokens + "
        f"{size(plan.kv_fixed_bytes)} fixed ({size(plan.kv_bytes)} at 2048 tokens)"
    )
    assert plan.kv_fixed_bytes > 0
    assert expected in plan_module.describe(plan, []).splitlines()


class ResidentNeeding:
    """A plan (delegating to ``plan``) whose verdict is resident, needing ``needed`` bytes."""

    def __init__(self, plan, needed):
        self.plan, self.needed = plan, needed

    def __getattr__(self, name):
        return getattr(self.plan, name)

    def verdict(self, memory):
        return SimpleNamespace(kind="resident", needed_bytes=self.needed)


@pytest.mark.parametrize(("needed", "noted"), [(3 * GIB, False), (3 * GIB + 1, True)])
def test_the_wired_note_starts_past_the_gpu_share(flash, needed, noted):
    assert plan_module.GPU_WIRED_SHARE * 4 * GIB == 3 * GIB
    plan = ResidentNeeding(plan_memory(open_gguf(flash), "native"), needed)
    text = plan_module.describe(plan, [(4 * GIB, "4 GiB")])
    assert ("on a Mac the GPU wires about 75% of memory by default" in text) == noted
