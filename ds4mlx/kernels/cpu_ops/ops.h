// The native operations' factories, one per Python function of the _cpu_ops module: each checks
// its arguments' shapes (std::invalid_argument otherwise) and returns the outputs of one
// primitive on the CPU stream. Defined in mhc.cpp, moe.cpp, attention.cpp, tiles.cpp,
// drafting.cpp, quant_blocks.cpp, mapping.cpp and kda.cpp.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace ds4mlx_ops {

// A stored matrix: a float32 array, or its codes [codes (int8), scale, bias] (common.h).
using MatrixArg = std::variant<mx::array, std::vector<mx::array>>;

std::vector<mx::array> hc_mixes(const mx::array& mixes, const mx::array& scale,
                                const mx::array& base, int hc, int iters, float eps);

std::vector<mx::array> hc_pre(const mx::array& x, const mx::array& fn_t, const mx::array& scale,
                              const mx::array& base, int hc, int iters, float eps,
                              float norm_eps, int rows);

mx::array hc_expand(const mx::array& out, const mx::array& residual, const mx::array& post,
                    const mx::array& comb, int rows);

mx::array routed_experts(const mx::array& x, const mx::array& gate, const mx::array& up,
                         const mx::array& down, const mx::array& indices, float limit,
                         bool grouped);

mx::array moe_tile(const mx::array& logits, const mx::array& x, const MatrixArg& gate,
                   const MatrixArg& up, const MatrixArg& down, const mx::array& shared_gate,
                   const mx::array& shared_up, const MatrixArg& shared_down,
                   const std::optional<mx::array>& bias, const std::optional<mx::array>& hashed,
                   int rows, int n_used, int func, bool normalize, float scale, float limit,
                   float shared_limit);

std::vector<mx::array> moe_route(const mx::array& logits, const std::optional<mx::array>& bias,
                                 const std::optional<mx::array>& hashed, int rows, int n_used,
                                 int func, bool normalize, float scale);

mx::array moe_combine(const mx::array& expert_out, const mx::array& weights,
                      const mx::array& shared_gate, const mx::array& shared_up,
                      const MatrixArg& shared_down, float shared_limit);

mx::array sparse_attention(const mx::array& q, const mx::array& window,
                           const mx::array& window_range, const mx::array& comp,
                           const mx::array& comp_index, const mx::array& sinks, float scale);

mx::array indexer_top_k(const mx::array& q, const mx::array& weights, const mx::array& keys,
                        const mx::array& visible, int top_k);

mx::array pool_blocks(const mx::array& kv, const mx::array& score, int lo, int n, int ratio,
                      int dim, bool overlap);

std::vector<mx::array> markov_chain(const mx::array& logits, const mx::array& w1,
                                    const mx::array& w2, const mx::array& anchor,
                                    const std::optional<mx::array>& scale,
                                    const std::optional<mx::array>& index, int first, int n);

mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin, int offset,
               int n_dims, bool interleaved, bool inverse);

std::vector<mx::array> rows_linear(const mx::array& x, const std::vector<MatrixArg>& ws,
                                   int rows, const std::vector<int>& widths);

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps);

mx::array grouped_rows_linear(const mx::array& x, const mx::array& w, int rows);

std::vector<mx::array> append_rows(const std::vector<mx::array>& cached,
                                   const std::vector<mx::array>& fresh, int take, int keep);

// A KDA decode tile after its input projections (kda.cpp), continuing from slot ``newest`` of
// the states: (out [T, H * D], the kept conv rows [3, M, H * D], the state after each real
// row [n_real, H, D, D]).
std::vector<mx::array> kda_tile(const mx::array& q, const mx::array& k, const mx::array& v,
                                const mx::array& beta, const mx::array& decay,
                                const mx::array& gate, const mx::array& dt_bias,
                                const mx::array& a, const mx::array& conv_rows,
                                const mx::array& conv_w, const mx::array& states,
                                const mx::array& norm_weight, const mx::array& newest,
                                int n_real, float lower_bound, float eps, int keep_rows);

// Matmuls on GGUF blocks as stored (uint8 rows of one GGML ``type``; quant_blocks.cpp).
mx::array blocks_linear(const mx::array& x, const mx::array& w, int type, int rows);

mx::array blocks_experts(const mx::array& x, const mx::array& gate, const mx::array& up,
                         const mx::array& down, const std::vector<int>& types,
                         const mx::array& indices, float limit, bool grouped);

mx::array blocks_rows(const mx::array& w, int type, const mx::array& indices);

// A file's bytes [offset, offset + prod(shape)) as a uint8 array over a private mapping
// (mapping.cpp).
mx::array mapped_bytes(const std::string& path, int64_t offset, const std::vector<int>& shape);
// Whether this MLX's CPU buffers are laid out as mapped_bytes wraps a mapping (checked once).
bool mapping_supported();

}  // namespace ds4mlx_ops
