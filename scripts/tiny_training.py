"""The training loop pieces ``train_tiny.py`` (DeepSeek-V4) and ``train_glm_tiny.py`` (GLM) share:
AdamW in two groups on a warm-up + cosine schedule, clipped steps, aux-loss-free expert
balancing, evaluation points and the progress line (loss, tokens/s, ETA)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ds4mlx.models.moe import GatingFunc

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np

Groups = dict[str, dict[str, mx.array]]


class OptimizerConfig(Protocol):
    steps: int
    warmup_steps: int
    peak_lr: float
    final_lr_fraction: float
    weight_decay: float
    grad_clip: float
    balance_rate: float
    eval_points: int


class Optimizer:
    """AdamW over two groups: matrices with weight decay; vectors (norms, sinks, biases, mHC
    base/scale) without, so that they keep their scale. (Two optimizers on flat dicts:
    MultiOptimizer would read the dots in GGUF names as nesting.)"""

    def __init__(self, cfg: OptimizerConfig, params: Mapping[str, mx.array]):
        warmup = min(cfg.warmup_steps, cfg.steps // 2)  # short (smoke-test) runs decay too
        self.schedule = optim.join_schedules(
            [
                optim.linear_schedule(0.0, cfg.peak_lr, warmup),
                optim.cosine_decay(
                    cfg.peak_lr, cfg.steps - warmup, cfg.peak_lr * cfg.final_lr_fraction
                ),
            ],
            [warmup],
        )
        betas = [0.9, 0.95]
        self.optimizers = {
            "matrices": optim.AdamW(self.schedule, betas, weight_decay=cfg.weight_decay),
            "vectors": optim.AdamW(self.schedule, betas, weight_decay=0.0),
        }
        self.groups: Groups = {
            kind: {
                name: value
                for name, value in params.items()
                if (value.ndim >= 2) == (kind == "matrices")
            }
            for kind in self.optimizers
        }
        self.grad_clip = cfg.grad_clip

    def step(self, grads: Groups) -> mx.array:
        """Applies the clipped gradients; returns the gradient norm before clipping."""
        grads, grad_norm = optim.clip_grad_norm(grads, self.grad_clip)
        self.groups = {
            kind: optimizer.apply_gradients(grads[kind], self.groups[kind])
            for kind, optimizer in self.optimizers.items()
        }
        return grad_norm

    def state(self) -> list[Any]:
        """What to evaluate after a step besides the parameters."""
        return [optimizer.state for optimizer in self.optimizers.values()]

    def params(self) -> dict[str, mx.array]:
        return self.groups["matrices"] | self.groups["vectors"]


def rebalance_experts(
    fixed: dict[str, mx.array], loads: Mapping[int, mx.array], rate: float
) -> None:
    """Aux-loss-free balancing (DeepSeek-V3): the selection bias of an expert that got fewer
    tokens than the layer's average rises by ``rate``, that of one that got more falls."""
    for layer, load in loads.items():
        name = f"blk.{layer}.exp_probs_b.bias"
        load = load.astype(mx.float32)
        fixed[name] = fixed[name] + rate * mx.sign(mx.mean(load) - load)


def evaluation_steps(steps: int, points: int) -> set[int]:
    """``points`` evenly spaced held-out evaluations, plus one at the end."""
    return {round(steps * (i + 1) / (points + 1)) for i in range(points)} | {steps}


class ProgressLog:
    """Every 10 steps (and the first): mean training losses, gradient norm, learning rate,
    tokens/s and the ETA; kept in ``history`` for the training report."""

    def __init__(self, steps: int, schedule: Callable[[int], mx.array]):
        self.steps = steps
        self.schedule = schedule
        self.started = time.monotonic()
        self.tokens = 0
        self.losses: dict[str, list[Any]] = {}
        self.history: list[dict[str, Any]] = []

    def record(
        self,
        step: int,
        kind: str,
        loss: Any,
        tokens: int,
        grad_norm: mx.array,
        show: Callable[[Any], str],
    ) -> None:
        """``loss`` of a step of ``kind`` over ``tokens`` tokens; ``show`` formats a mean."""
        self.losses.setdefault(kind, []).append(loss)
        self.tokens += tokens
        if step % 10 and step != 1:
            return
        elapsed = self.elapsed_minutes()
        means = {k: np.mean(v, axis=0).tolist() for k, v in self.losses.items() if v}
        shown = "  ".join(f"{k} {show(m)}" for k, m in means.items())
        rate = self.tokens / max(elapsed * 60, 1e-9)
        eta = (self.steps - step) * elapsed / step
        print(
            f"step {step:4d}  train loss  {shown}  grad-norm {grad_norm.item():.2f}  "
            f"lr {self.schedule(step).item():.2e}  {rate:.0f} tok/s  "
            f"{elapsed:.1f} min, ETA {eta:.1f} min",
            flush=True,
        )
        self.history.append({"step": step, "train_loss": means, "minutes": elapsed})
        self.losses = {}

    def elapsed_minutes(self) -> float:
        return (time.monotonic() - self.started) / 60


def save_checkpoint(path: Path, arrays: Mapping[str, mx.array], args: Any, report: dict) -> None:
    """The trained tensors with the model's arguments (a ModelArgs dataclass) and the training
    report as safetensors metadata."""
    metadata = {"args": json.dumps(asdict(args)), "report": json.dumps(report)}
    mx.save_safetensors(str(path), dict(arrays), metadata=metadata)


def load_checkpoint(path: Path, args_class: type) -> tuple[dict[str, mx.array], Any, dict]:
    """(tensors, ``args_class`` instance, report) of a checkpoint ``save_checkpoint`` wrote."""
    arrays, metadata = mx.load(str(path), return_metadata=True)
    fields = json.loads(metadata["args"])
    tuples = {k: tuple(v) for k, v in fields.items() if isinstance(v, list)}
    args = args_class(**(fields | tuples | {"gating_func": GatingFunc(fields["gating_func"])}))
    return arrays, args, json.loads(metadata["report"])
