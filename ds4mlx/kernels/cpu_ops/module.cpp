// The _cpu_ops extension module: ds4mlx's native CPU operations (common.h says what they are
// and how they compute; ops.h lists them) bound for Python.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "ops.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace ds4mlx_ops;

NB_MODULE(_cpu_ops, m) {
  m.doc() = "ds4mlx native CPU operations (see kernels/cpu_ops/common.h)";
  m.def("hc_mixes", &hc_mixes, "mixes"_a, "scale"_a, "base"_a, "hc"_a, "iters"_a, "eps"_a,
        "One mHC site's (pre, post, comb) from its projected mixes, as one primitive.");
  m.def("hc_pre", &hc_pre, "x"_a, "fn_t"_a, "scale"_a, "base"_a, "hc"_a, "iters"_a, "eps"_a,
        "norm_eps"_a, "rows"_a = -1,
        "A whole mHC site before its block: (block input, post, comb); rows: the real rows.");
  m.def("hc_expand", &hc_expand, "out"_a, "residual"_a, "post"_a, "comb"_a, "rows"_a = -1,
        "The mHC streams after a block, as one primitive; rows: the real rows.");
  m.def("routed_experts", &routed_experts, "x"_a, "gate"_a, "up"_a, "down"_a, "indices"_a,
        "limit"_a, "grouped"_a,
        "Every (token, slot) pair's routed SwiGLU expert output [T, k, D], as one primitive.");
  m.def("indexer_top_k", &indexer_top_k, "q"_a, "weights"_a, "keys"_a, "visible"_a, "top_k"_a,
        "Each row's lightning-indexer top-k blocks among its visible ones, as one primitive.");
  m.def("pool_blocks", &pool_blocks, "kv"_a, "score"_a, "lo"_a, "n"_a, "ratio"_a, "dim"_a,
        "overlap"_a, "A compressor's softmax pooling of the blocks a chunk completes.");
  m.def("markov_chain", &markov_chain, "logits"_a, "w1"_a, "w2"_a, "anchor"_a, "scale"_a.none(),
        "index"_a.none(), "first"_a, "n"_a,
        "DSpark's Markov head chained greedily over a block's rows: (rows, picks).");
  m.def("rope", &rope, "x"_a, "cos"_a, "sin"_a, "offset"_a, "n_dims"_a, "interleaved"_a,
        "inverse"_a, "Rotary embedding of channels [offset, offset + n_dims), one primitive.");
  m.def("rms_norm", &rms_norm, "x"_a, "weight"_a.none(), "eps"_a,
        "RMS normalisation over the last axis (times weight), as one primitive.");
  m.def("grouped_rows_linear", &grouped_rows_linear, "x"_a, "w"_a, "rows"_a,
        "Each group of channels times its own matrix, for the first rows rows.");
  m.def("grow_rows", &append_rows, "cached"_a, "new"_a, "take"_a, "keep"_a,
        "Each cached array followed by new rows, its last keep rows, as one primitive.");
  m.def("moe_tile", &moe_tile, "logits"_a, "x"_a, "gate"_a, "up"_a, "down"_a,
        "shared_gate"_a, "shared_up"_a, "shared_down"_a, "bias"_a.none(), "hashed"_a.none(),
        "rows"_a, "n_used"_a, "func"_a, "normalize"_a, "scale"_a, "limit"_a, "shared_limit"_a,
        "A decode tile's routing, routed experts and weighted sum plus the shared expert.");
  m.def("moe_route", &moe_route, "logits"_a, "bias"_a.none(), "hashed"_a.none(), "rows"_a,
        "n_used"_a, "func"_a, "normalize"_a, "scale"_a, "A decode tile's expert routing.");
  m.def("moe_combine", &moe_combine, "expert_out"_a, "weights"_a, "shared_gate"_a,
        "shared_up"_a, "shared_down"_a, "shared_limit"_a,
        "A decode tile's weighted sum of routed expert outputs plus the shared expert.");
  m.def("rows_linear", &rows_linear, "x"_a, "ws"_a, "rows"_a, "widths"_a = std::vector<int>(),
        "x @ w for each w, for the first rows rows (the rest zeros), each row on its own; "
        "widths: each w's N where its panels pad it.");
  m.def("sparse_attention", &sparse_attention, "q"_a, "window"_a, "window_range"_a, "comp"_a,
        "comp_index"_a, "sinks"_a, "scale"_a,
        "Sink attention of each row over its window range and selected compressed rows.");
  m.def("kda_tile", &kda_tile, "q"_a, "k"_a, "v"_a, "beta"_a, "decay"_a, "gate"_a, "dt_bias"_a,
        "a"_a, "conv_rows"_a, "conv_w"_a, "states"_a, "norm_weight"_a, "newest"_a,
        "n_real"_a, "lower_bound"_a, "eps"_a, "keep_rows"_a,
        "A KDA decode tile after its projections: (out, kept conv rows, new states).");
  m.def("blocks_linear", &blocks_linear, "x"_a, "w"_a, "type"_a, "rows"_a,
        "x [T, G * K] times G matrices of GGUF blocks w [G, N, bytes] (or one, [N, bytes]).");
  m.def("blocks_experts", &blocks_experts, "x"_a, "gate"_a, "up"_a, "down"_a, "types"_a,
        "indices"_a, "limit"_a, "grouped"_a,
        "Every (token, slot) pair's routed SwiGLU expert output [T, k, D] on GGUF blocks.");
  m.def("blocks_rows", &blocks_rows, "w"_a, "type"_a, "indices"_a,
        "Rows w[indices] of a matrix of GGUF blocks, decoded to float32.");
  m.def("mapped_bytes", &mapped_bytes, "path"_a, "offset"_a, "shape"_a,
        "A file's bytes as a uint8 array over a private mapping (read when first touched).");
  m.def("mapping_supported", &mapping_supported,
        "Whether this MLX lays out CPU buffers as mapped_bytes wraps a mapping.");
}
