"""The loader: ``load_model(path)`` -> a LoadedModel (the network with ``logits`` and
``new_session``, its tokenizer and chat format), resident, SSD-streamed or distributed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ds4mlx._blas import report_blas
from ds4mlx.engine.chat import ChatFormat, chat_format_for_arch
from ds4mlx.engine.session import Session
from ds4mlx.engine.tokenizer import NumericTokenizer, Tokenizer, load_tokenizer
from ds4mlx.experts import ExpertOptions, ExpertStats, ExpertStore, open_expert_store
from ds4mlx.gguf import WEIGHT_MODES, GGUFError, GGUFFile, open_gguf
from ds4mlx.gguf.quants import default_weight_mode, float32_bytes
from ds4mlx.gguf.validate import GGUFLayout, validate_gguf
from ds4mlx.kernels.native import native_ops
from ds4mlx.memory import gpu_working_set_bytes, wire_model
from ds4mlx.models import model_class_for
from ds4mlx.models.moe import link_expert_prefetch, moe_layers

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    from ds4mlx.distributed import RankGroup


def resolve_weights_dtype(weights_dtype: str, model: str | Path | GGUFLayout | None = None) -> str:
    """``auto``: the file's blocks as stored, with Metal or the CPU's block kernels; float32
    (BLAS-backed) on a CPU without them, and for a ``model`` (its file, or the layout already
    read from it) small enough that its float copy costs little
    (``quants.CPU_FLOAT32_MODEL_BYTES``)."""
    if weights_dtype == "auto":
        size = None
        if model is not None and mx.default_device() == mx.cpu:
            layout = model if isinstance(model, GGUFLayout) else validate_gguf(Path(model))
            size = float32_bytes(info.shape for info in layout.tensors.values())
        return default_weight_mode(size)
    if weights_dtype not in WEIGHT_MODES:
        raise ValueError(
            f"weights_dtype must be auto or one of {WEIGHT_MODES}, got '{weights_dtype}'"
        )
    return weights_dtype


class LoadedModel:
    """A model loaded from a GGUF file, with its tokenizer and chat format."""

    def __init__(
        self,
        path: Path,
        gguf_file: GGUFFile,
        network,
        weights_dtype: str,
        experts: ExpertStore | None = None,
    ):
        self.path = path
        self.gguf = gguf_file
        self.network = network
        self.weights_dtype = weights_dtype
        self.experts = experts  # where the routed experts live (resident or streamed)
        # What new_session builds on the network: a distributed rank 0 swaps in sessions whose
        # operations the other ranks replay (ds4mlx.distributed.driven.lead).
        self.session_factory: Callable[[Any], Session] = Session
        self.tokenizer: Tokenizer | NumericTokenizer = load_tokenizer(gguf_file)
        # Fixtures with llama.cpp's dummy vocabulary have no chat format: prompts stay raw.
        self.chat_format: ChatFormat | None = (
            None
            if isinstance(self.tokenizer, NumericTokenizer)
            else chat_format_for_arch(gguf_file.arch)
        )

    @property
    def args(self):
        return self.network.args

    def args_summary(self) -> str:
        a = self.args
        return (
            f"{self.gguf.arch}, {a.num_layers} layers, d={a.hidden_size}, "
            f"vocab {a.vocab_size}, weights {self.weights_dtype}"
        )

    def load_summary(self) -> str:
        """How the weights were loaded: tensors mapped from the file as stored, and tensors
        converted (what the backend cannot read in place) with the seconds that took."""
        g = self.gguf
        return (
            f"{g.mapped_tensors} tensors mapped as stored, {g.converted_tensors} converted "
            f"in {g.conversion_seconds:.2f}s"
        )

    def render_user_prompt(self, text: str) -> str:
        """``text`` as one user turn followed by the assistant prompt, in the model's template."""
        if self.chat_format is None:
            raise ValueError(f"{self.path.name} has no chat template (no real tokenizer)")
        return self.chat_format.render([{"role": "user", "content": text}])

    def new_session(self) -> Session:
        return self.session_factory(self.network)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits [T, vocab] (float32) of ``tokens`` computed as one batched prefill."""
        return self.new_session().feed(tokens)

    def expert_stats(self) -> ExpertStats | None:
        """Routed-expert counters (hits, misses, bytes read, read GB/s, evictions, resident
        bytes); None for a model without routed experts."""
        return None if self.experts is None else self.experts.stats()

    def close(self) -> None:
        """Stops expert reader threads and saves the expert hot-list where asked."""
        if self.experts is not None:
            self.experts.close()


class _LoadProgress:
    """Reports the share of tensor bytes converted, at most every half second."""

    def __init__(self, total_bytes: int, report: Callable[[str], None]):
        self.total = max(total_bytes, 1)
        self.done = 0
        self.report = report
        self.last = 0.0

    def __call__(self, _name: str, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self._show(min(self.done / self.total, 0.999))

    def finish(self) -> None:
        self._show(1.0)

    def _show(self, share: float) -> None:
        bar = "#" * int(share * 30)
        self.report(f"loading [{bar:<30}] {share:6.1%} of {self.total / 2**20:.0f} MiB")


def load_model(
    path: str | Path,
    weights_dtype: str = "auto",
    progress: Callable[[str], None] | None = None,
    experts: ExpertOptions | None = None,
    ranks: RankGroup | None = None,
) -> LoadedModel:
    """Open, validate and load a GGUF model of any supported architecture.

    ``weights_dtype``: "auto", "f32" (dequantize matmul weights to float32) or "native" (keep
    the file's quantization). ``progress`` receives human-readable loading progress lines.
    ``experts``: stream routed experts from the file through a bounded cache (default:
    resident); call ``close()`` when done with a streamed model.
    ``ranks``: load this rank's shard only (``ds4mlx.distributed``; every rank of the group
    calls this with the same file).
    """
    path = Path(path)
    gguf_file = open_gguf(path)
    dtype = resolve_weights_dtype(weights_dtype, gguf_file.layout)  # the header read once
    model_class = model_class_for(gguf_file)
    report_blas()  # no optimised BLAS: said once a model is about to run, not at import
    if mx.default_device() == mx.cpu:
        # Built on first use, minutes on a first run: here, with its own progress lines, and
        # not inside the first prompt's prefill, whose speed it would seem to be.
        native_ops()
    if ranks is not None:
        model_class = _sharded_model_class(gguf_file, path, ranks, experts)
    store = open_expert_store(gguf_file, dtype, experts)
    reporter = None
    if progress is not None:
        total = sum(info.nbytes for info in gguf_file.layout.tensors.values())
        if experts is not None and experts.stream:  # routed experts are not loaded now
            total -= sum(
                info.nbytes for name, info in gguf_file.layout.tensors.items() if "_exps." in name
            )
        reporter = _LoadProgress(total, progress)

    gguf_file.on_tensor_loaded = reporter
    try:
        shard = {} if ranks is None else {"ranks": ranks}
        network = model_class.from_gguf(gguf_file, weights_dtype=dtype, expert_store=store, **shard)
        gguf_file.on_tensor_loaded = None
        if reporter is not None:
            reporter.finish()
        store.finish_loading()
        link_expert_prefetch(moe_layers(network, network.args.num_layers))
    except BaseException:
        store.close()
        raise
    # On a Mac, a model near the GPU's working set is wired (resident weights: all it holds).
    note = wire_model(mx.get_active_memory(), gpu_working_set_bytes())
    if note is not None:
        print(f"ds4mlx: {note}", file=sys.stderr, flush=True)
    return LoadedModel(path, gguf_file, network, dtype, store)


def _sharded_model_class(
    gguf_file: GGUFFile, path: Path, ranks: RankGroup, experts: ExpertOptions | None
):
    """The sharded model class for ``gguf_file``, after checking that every rank opened the
    same file (a collective: all ranks must get here)."""
    from ds4mlx.distributed import check_same_model
    from ds4mlx.distributed.model import ShardedModel

    check_same_model(ranks, path)
    if gguf_file.arch != "deepseek4":
        raise GGUFError(f"{path}: --distributed supports deepseek4 models, not '{gguf_file.arch}'")
    if experts is not None and experts.stream:
        raise ValueError(
            "--distributed keeps each rank's routed experts resident; drop --ssd-stream"
        )
    return ShardedModel
