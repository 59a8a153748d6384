"""The only place model code gets matmuls on stored weights from (Metal kernels or MLX twins).

A weight is one of (see ``kernels.weights``):
- ``mx.array`` [..., out, in] (float32, float16 or bfloat16): a plain matmul;
- ``QuantizedWeight``: MLX's own quantized layouts (``mx.quantized_matmul`` / ``mx.gather_qmm``);
- ``PackedWeight``: GGML blocks MLX cannot represent, computed by the Metal kernels in
  ``metal/`` or by their pure-MLX twins in ``kernels.twins``.

Results have the dtype of ``x`` whatever the weight kind; the arithmetic is at least float32
for quantized kinds.

Each fused operation has one name here and one dispatch point, its native CPU body, its Metal
body and its MLX twin side by side. By concern: ``matmul`` (products with stored weights),
``mhc_ops`` (hyper-connections), ``moe_ops`` (expert FFNs), ``sequence_ops`` (attention,
caches, rotary, norms, KDA); ``dispatch`` decides which body runs (``DS4MLX_KERNELS``).
"""

from __future__ import annotations

from ds4mlx.kernels.dispatch import KERNEL_CHOICES, PACKED_KERNELS, inference, select_kernel_backend
from ds4mlx.kernels.matmul import (
    attach_codes,
    dequantize,
    embed_streams,
    freeze,
    gather_linear,
    grouped_input_shape,
    grouped_linear,
    linear,
    linear_many,
    markov_chain,
    take_rows,
)
from ds4mlx.kernels.mhc_ops import (
    hc_expand,
    hc_head_norm,
    hc_mixes,
    hc_pre,
    hc_site,
    hc_site_norm,
    sinkhorn,
)
from ds4mlx.kernels.moe_ops import moe_combine, moe_route, moe_tile, routed_experts, routed_pairs
from ds4mlx.kernels.sequence_ops import (
    KDAWeights,
    grow_rows,
    grow_scored_rows,
    indexer_top_k,
    kda_tile,
    norm_rotary,
    pool_blocks,
    rms_norm,
    rotary,
    sparse_attention,
)
from ds4mlx.kernels.twins import swiglu
from ds4mlx.kernels.weights import PackedWeight, QuantizedWeight, RowCodes, Weight

__all__ = [
    "KDAWeights",
    "KERNEL_CHOICES",
    "PACKED_KERNELS",
    "PackedWeight",
    "QuantizedWeight",
    "RowCodes",
    "Weight",
    "attach_codes",
    "dequantize",
    "embed_streams",
    "freeze",
    "gather_linear",
    "grouped_input_shape",
    "grouped_linear",
    "grow_rows",
    "grow_scored_rows",
    "hc_expand",
    "hc_head_norm",
    "hc_mixes",
    "hc_pre",
    "hc_site",
    "hc_site_norm",
    "indexer_top_k",
    "inference",
    "kda_tile",
    "linear",
    "linear_many",
    "markov_chain",
    "moe_combine",
    "moe_route",
    "moe_tile",
    "norm_rotary",
    "pool_blocks",
    "rms_norm",
    "rotary",
    "routed_experts",
    "routed_pairs",
    "select_kernel_backend",
    "sinkhorn",
    "sparse_attention",
    "swiglu",
    "take_rows",
]
