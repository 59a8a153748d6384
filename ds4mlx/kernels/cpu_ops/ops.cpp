// ds4mlx's native CPU operations: MLX primitives for work that is many tiny ops in MLX's own
// vocabulary. On the CPU every primitive costs microseconds of scheduling whatever its size;
// the mHC Sinkhorn alone is ~80 of them per call (a reduction and a division per half-round),
// while its arithmetic is a few hundred flops on a 4x4 matrix. Here a whole mHC site is one.
//
// The semantics are those of the pure-MLX twins in ds4mlx/kernels/twins.py, in the same order
// of operations, in float32. Each matrix (row) is computed on its own, so a row's result never
// depends on the other rows of the call (what keeps decode and verify rows bit-identical).

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

// CBLAS, resolved when the module loads: the BLAS MLX itself calls (ds4mlx preloads OpenBLAS;
// otherwise the one libmlx links). Declared here so that no BLAS headers are needed to build.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float* a, int lda, const float* b, int ldb,
                            float beta, float* c, int ldc);

namespace {

constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

// The float32 values of an evaluated array in row-major order: the array's own memory when it
// is row-contiguous (the usual case), else a copy.
class RowMajor {
 public:
  explicit RowMajor(const mx::array& a) {
    if (a.flags().row_contiguous) {
      data_ = a.data<float>();
      return;
    }
    copy_.resize(a.size());
    const float* values = a.data<float>();
    for (size_t i = 0; i < a.size(); i++) {
      copy_[i] = values[mx::elem_to_loc(static_cast<int>(i), a)];
    }
    data_ = copy_.data();
  }

  const float* data() const { return data_; }
  float operator[](size_t i) const { return data_[i]; }

 private:
  const float* data_ = nullptr;
  std::vector<float> copy_;
};

// twins._sinkhorn_rounds on one n x n matrix in place: softmax over dst plus eps, a column
// normalisation, then iters - 1 rounds of row and column normalisation, each sum padded by eps.
void sinkhorn_matrix(float* c, int n, int iters, float eps) {
  for (int i = 0; i < n; i++) {
    float* row = c + i * n;
    float top = row[0];
    for (int j = 1; j < n; j++) top = std::max(top, row[j]);
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
      row[j] = std::exp(row[j] - top);
      sum += row[j];
    }
    for (int j = 0; j < n; j++) row[j] = row[j] / sum + eps;
  }
  auto normalise_columns = [&] {
    for (int j = 0; j < n; j++) {
      float sum = 0.0f;
      for (int i = 0; i < n; i++) sum += c[i * n + j];
      sum += eps;
      for (int i = 0; i < n; i++) c[i * n + j] /= sum;
    }
  };
  auto normalise_rows = [&] {
    for (int i = 0; i < n; i++) {
      float sum = 0.0f;
      for (int j = 0; j < n; j++) sum += c[i * n + j];
      sum += eps;
      for (int j = 0; j < n; j++) c[i * n + j] /= sum;
    }
  };
  normalise_columns();
  for (int k = 0; k < iters - 1; k++) {
    normalise_rows();
    normalise_columns();
  }
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// twins.swiglu on one element: silu(gate) * up, both clamped first when limit > 0.
float swiglu_clamped(float g, float u, float limit) {
  if (limit > 1e-6f) {
    g = std::min(g, limit);
    u = std::min(std::max(u, -limit), limit);
  }
  return g * sigmoid(g) * u;
}

// a * b + c, fused where the CPU has fused multiply-add (one rounding), else two roundings;
// the build turns off the compiler's own contraction, so the choice is the same everywhere in
// this module and a value's bits do not depend on which loop computed it.
inline float madd(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// A matrix product's operands and result: x [rows, k] and y [rows, n] with row strides (a
// group's slice of wider rows), w [k, n] contiguous.
struct Product {
  const float* x;
  size_t x_stride;
  const float* w;
  float* y;
  size_t y_stride;
  int k;
  int n;
};

// Rows [r0, r0 + kGroup) x columns [j0, j0 + kColumns) of x @ w (see rows_times_in_out), the
// accumulators held in registers across the whole k loop.
template <int kGroup, int kColumns>
void rows_times_in_out_block(const Product& p, int r0, int j0) {
  float acc[kGroup][kColumns] = {};
  for (int k = 0; k < p.k; k++) {
    const float* __restrict wk = p.w + static_cast<size_t>(k) * p.n + j0;
    for (int r = 0; r < kGroup; r++) {
      const float xv = p.x[(r0 + r) * p.x_stride + k];
      for (int j = 0; j < kColumns; j++) acc[r][j] = madd(xv, wk[j], acc[r][j]);
    }
  }
  for (int r = 0; r < kGroup; r++) std::copy(acc[r], acc[r] + kColumns, p.y + (r0 + r) * p.y_stride + j0);
}

// The columns past the last whole block, one at a time, with the same chain per element.
void rows_times_in_out_tail(const Product& p, int rows, int j0) {
  for (int r = 0; r < rows; r++) {
    for (int j = j0; j < p.n; j++) {
      float acc = 0.0f;
      for (int k = 0; k < p.k; k++) {
        acc = madd(p.x[r * p.x_stride + k], p.w[static_cast<size_t>(k) * p.n + j], acc);
      }
      p.y[r * p.y_stride + j] = acc;
    }
  }
}

// Rows [r0, r0 + kGroup) of x @ w over every whole block of kColumns columns, then the columns
// left over one at a time.
template <int kGroup, int kColumns>
void rows_times_in_out_group(const Product& p, int r0) {
  const int whole = p.n - p.n % kColumns;
  for (int j0 = 0; j0 < whole; j0 += kColumns) rows_times_in_out_block<kGroup, kColumns>(p, r0, j0);
  if (whole < p.n) {
    Product rest = p;
    rest.x += r0 * p.x_stride;
    rest.y += r0 * p.y_stride;
    rows_times_in_out_tail(rest, kGroup, whole);
  }
}

// y[r, :] = x[r, :] @ w for rows r < rows of x with w [K, N] stored [in, out], and y[r, :] = 0
// for the rest of the tokens. Each output element is one chain of multiply-adds over k in
// order, whatever the row count or the block it falls in: a row's bits never depend on the
// other rows of the call. (A BLAS GEMM changes kernel and blocking with the row count, which
// is why decode tiles had a fixed number of rows; and it computed every padding row of a
// one-token tile.) Rows go four, two or one at a time through blocks of columns whose sums
// stay in registers; fewer rows take wider blocks, so that a lone row (a one-token step)
// reads each weight row in long contiguous runs.
void rows_times_in_out(const Product& p, int tokens, int rows) {
  for (int r = rows; r < tokens; r++) std::fill(p.y + r * p.y_stride, p.y + r * p.y_stride + p.n, 0.0f);
  int r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) rows_times_in_out_group<4, 32>(p, r0);
  for (; r0 + 2 <= rows; r0 += 2) rows_times_in_out_group<2, 64>(p, r0);
  for (; r0 < rows; r0++) rows_times_in_out_group<1, 128>(p, r0);
}

// a . b over n floats in sixteen interleaved partial sums added in a fixed order: vectorisable
// without reassociating anything, so the same inputs give the same bits in every call.
float dot(const float* __restrict a, const float* __restrict b, int n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; l++) lanes[l] = madd(a[i + l], b[i + l], lanes[l]);
  }
  float tail = 0.0f;
  for (; i < n; i++) tail = madd(a[i], b[i], tail);
  float sum = 0.0f;
  for (int l = 0; l < kLanes; l++) sum += lanes[l];
  return sum + tail;
}

// y = W x for one row x [K] and W [N, K] stored [out, in] (GGUF's layout).
void out_in_times_row(const float* w, const float* x, float* y, int n, int k_dim) {
  for (int j = 0; j < n; j++) y[j] = dot(w + static_cast<size_t>(j) * k_dim, x, k_dim);
}

// A primitive's computation: (its evaluated inputs, its float32 outputs' memory).
using Task = std::function<void(const std::vector<mx::array>&, const std::vector<float*>&)>;

// What every primitive here does on the CPU: allocate its float32 outputs, register them and its
// inputs with the stream's encoder and queue its computation as one task. The task reads the
// inputs when it runs (they may still be in flight when eval_cpu returns) and owns copies of its
// parameters (the primitive may be gone by then).
class CpuPrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    std::vector<float*> memory;
    for (auto& out : outputs) {
      out.set_data(mx::allocator::malloc(out.nbytes()));
      encoder.set_output_array(out);
      memory.push_back(out.data<float>());
    }
    encoder.dispatch([task = task(), inputs, memory]() { task(inputs, memory); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string(name()) +
                             " runs on the CPU only (on the GPU: the Metal kernels or twins)");
  }

 protected:
  virtual Task task() const = 0;
};

// One token's mixes at an mHC site (twins.hc_mixes): from its projected mixes m [(2 + hc) * hc],
// the collapse weights pre [hc], the expansion weights post [hc] and comb [hc, hc].
void mix_row(const float* m, const float* scale, const float* base, int hc, int iters,
             float eps, float* pre, float* post, float* comb) {
  for (int i = 0; i < hc; i++) {
    pre[i] = sigmoid(m[i] * scale[0] + base[i]) + eps;
    post[i] = 2.0f * sigmoid(m[hc + i] * scale[1] + base[hc + i]);
  }
  for (int k = 0; k < hc * hc; k++) comb[k] = m[2 * hc + k] * scale[2] + base[2 * hc + k];
  sinkhorn_matrix(comb, hc, iters, eps);
}

// A whole mHC site before its block (twins.hc_pre): the streams x [T, hc, D] RMS-normed as one
// flat vector per token, projected by fn_t [hc * D, (2 + hc) * hc] (the projection stored
// [in, out], as ds4mlx keeps inference matrices; one GEMM), mixed, and
// collapsed by pre: outputs the block input [T, D], post [T, hc] and comb [T, hc, hc]. With
// every tile the same number of rows, the GEMM gives each row the same bits however the rows
// were gathered.
class HcPre : public CpuPrimitive {
 public:
  HcPre(mx::Stream stream, int hc, int iters, float eps, float norm_eps)
      : CpuPrimitive(stream), hc_(hc), iters_(iters), eps_(eps), norm_eps_(norm_eps) {}

  Task task() const override {
    return [hc = hc_, iters = iters_, eps = eps_, norm_eps = norm_eps_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]), fn_t(in[1]), scale(in[2]), base(in[3]);
      const int tokens = in[0].shape(0), dim = in[0].shape(2);
      const int flat = hc * dim, width = (2 + hc) * hc;
      std::vector<float> normed(in[0].size()), mixes(static_cast<size_t>(tokens) * width);
      for (int t = 0; t < tokens; t++) {
        const float* row = x.data() + static_cast<size_t>(t) * flat;
        float squares = 0.0f;
        for (int i = 0; i < flat; i++) squares += row[i] * row[i];
        const float inv = 1.0f / std::sqrt(squares / flat + norm_eps);
        for (int i = 0; i < flat; i++) normed[static_cast<size_t>(t) * flat + i] = row[i] * inv;
      }
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, tokens, width, flat, 1.0f, normed.data(), flat,
                  fn_t.data(), width, 0.0f, mixes.data(), width);
      std::vector<float> pre(hc);
      for (int t = 0; t < tokens; t++) {
        mix_row(mixes.data() + static_cast<size_t>(t) * width, scale.data(), base.data(), hc,
                iters, eps, pre.data(), out[1] + t * hc, out[2] + t * hc * hc);
        float* block_in = out[0] + static_cast<size_t>(t) * dim;
        const float* streams = x.data() + static_cast<size_t>(t) * flat;
        std::fill(block_in, block_in + dim, 0.0f);
        for (int s = 0; s < hc; s++) {
          for (int d = 0; d < dim; d++) block_in[d] += pre[s] * streams[s * dim + d];
        }
      }
    };
  }

  const char* name() const override { return "DS4HcPre"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const HcPre&>(other);
    return hc_ == o.hc_ && iters_ == o.iters_ && eps_ == o.eps_ && norm_eps_ == o.norm_eps_;
  }

 private:
  int hc_;
  int iters_;
  float eps_;
  float norm_eps_;
};

// The streams after a block (twins.hc_expand): new[t, dst] = post[t, dst] * out[t] +
// sum over src of comb[t, src, dst] * residual[t, src], from the block output out [T, D], the
// residual streams [T, hc, D], post [T, hc] and comb [T, hc, hc].
class HcExpand : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  Task task() const override {
    return [](const std::vector<mx::array>& in, const std::vector<float*>& result) {
      RowMajor out(in[0]), residual(in[1]), post(in[2]), comb(in[3]);
      const int tokens = in[1].shape(0), hc = in[1].shape(1), dim = in[1].shape(2);
      // Accumulated over src in order, each step a vector operation over the channels.
      std::vector<float> mixed(dim);
      for (int t = 0; t < tokens; t++) {
        const float* streams = residual.data() + static_cast<size_t>(t) * hc * dim;
        const float* block_out = out.data() + static_cast<size_t>(t) * dim;
        for (int j = 0; j < hc; j++) {
          std::fill(mixed.begin(), mixed.end(), 0.0f);
          for (int i = 0; i < hc; i++) {
            const float weight = comb[(t * hc + i) * hc + j];
            const float* src = streams + static_cast<size_t>(i) * dim;
            for (int d = 0; d < dim; d++) mixed[d] += weight * src[d];
          }
          float* o = result[0] + (static_cast<size_t>(t) * hc + j) * dim;
          const float scale = post[t * hc + j];
          for (int d = 0; d < dim; d++) o[d] = scale * block_out[d] + mixed[d];
        }
      }
    };
  }

  const char* name() const override { return "DS4HcExpand"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

// One mHC site's mixes (mhc.HyperConnection after its projection): from the projected mixes
// [T, (2 + hc) * hc], the per-section scale [3] and the bias [(2 + hc) * hc], the collapse
// weights pre [T, hc], the expansion weights post [T, hc] and the Sinkhorn-normalised stream
// mix comb [T, hc, hc].
class HcMixes : public CpuPrimitive {
 public:
  HcMixes(mx::Stream stream, int hc, int iters, float eps)
      : CpuPrimitive(stream), hc_(hc), iters_(iters), eps_(eps) {}

  Task task() const override {
    return [hc = hc_, iters = iters_, eps = eps_](const std::vector<mx::array>& in,
                                                  const std::vector<float*>& out) {
      RowMajor mixes(in[0]), scale(in[1]), base(in[2]);
      const int tokens = in[0].shape(0), width = (2 + hc) * hc;
      for (int t = 0; t < tokens; t++) {
        mix_row(mixes.data() + t * width, scale.data(), base.data(), hc, iters, eps,
                out[0] + t * hc, out[1] + t * hc, out[2] + t * hc * hc);
      }
    };
  }

  const char* name() const override { return "DS4HcMixes"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const HcMixes&>(other);
    return hc_ == o.hc_ && iters_ == o.iters_ && eps_ == o.eps_;
  }

 private:
  int hc_;
  int iters_;
  float eps_;
};

// Routed SwiGLU experts of one layer (models.moe.RoutedExperts on float32 weights): for every
// (token t, slot s) pair, out[t, s] = down_e(swiglu(gate_e x[t], up_e x[t])) with
// e = indices[t, s], the weights stacked as GGUF has them ([E, out, in]). MLX's gather_mm runs
// one GEMV per pair; here the pairs of one expert share one GEMM (``grouped``), so a prefill
// runs at BLAS speed. Without ``grouped`` every pair is its own one-row product: a row's result
// then does not depend on which other rows share its expert (decode tiles and verify passes
// need that). Pairs of one expert keep their order, so a subset of the pairs (a streamed
// store's batch) gets the same products as the whole.
class RoutedExpertsFFN : public CpuPrimitive {
 public:
  RoutedExpertsFFN(mx::Stream stream, float limit, bool grouped)
      : CpuPrimitive(stream), limit_(limit), grouped_(grouped) {}

  Task task() const override {
    return [limit = limit_, grouped = grouped_](const std::vector<mx::array>& in,
                                                const std::vector<float*>& out) {
      run(in, out[0], limit, grouped);
    };
  }

  const char* name() const override { return "DS4RoutedExperts"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RoutedExpertsFFN&>(other);
    return limit_ == o.limit_ && grouped_ == o.grouped_;
  }

 private:
  static void run(const std::vector<mx::array>& inputs, float* out, float limit, bool grouped) {
    const mx::array& x_in = inputs[0];
    const int tokens = x_in.shape(0), dim = x_in.shape(1);
    const int experts = inputs[1].shape(0), ff = inputs[1].shape(1);
    const int slots = inputs[4].shape(1);
    RowMajor x(x_in);
    std::vector<int> route_e(tokens * slots);
    const mx::array& idx = inputs[4];
    for (int p = 0; p < tokens * slots; p++) {
      route_e[p] = idx.data<int32_t>()[mx::elem_to_loc(p, idx)];
    }
    // The stacked weights are contiguous as loaded (a strided one would be copied here).
    RowMajor gate_w(inputs[1]), up_w(inputs[2]), down_w(inputs[3]);
    const float* w[3] = {gate_w.data(), up_w.data(), down_w.data()};
    std::vector<std::vector<int>> pairs_of(experts);
    for (int p = 0; p < tokens * slots; p++) {
      if (route_e[p] >= 0 && route_e[p] < experts) pairs_of[route_e[p]].push_back(p);
    }
    float* y = out;
    std::fill(y, y + static_cast<size_t>(tokens) * slots * dim, 0.0f);
    std::vector<float> rows, gate, up, down;
    auto block = [&](int e, const int* pairs, int n) {
      rows.resize(static_cast<size_t>(n) * dim);
      gate.resize(static_cast<size_t>(n) * ff);
      up.resize(static_cast<size_t>(n) * ff);
      down.resize(static_cast<size_t>(n) * dim);
      for (int i = 0; i < n; i++) {
        const float* src = x.data() + static_cast<size_t>(pairs[i] / slots) * dim;
        std::copy(src, src + dim, rows.data() + static_cast<size_t>(i) * dim);
      }
      const size_t in_size = static_cast<size_t>(ff) * dim;
      // Grouped rows share one GEMM; a row on its own (decode tiles) takes dot products that
      // do not depend on anything but the row.
      auto product = [&](const float* weight, const float* in, float* result, int out_dim,
                         int in_dim) {
        if (grouped) {
          cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, out_dim, in_dim, 1.0f, in, in_dim,
                      weight, in_dim, 0.0f, result, out_dim);
          return;
        }
        for (int i = 0; i < n; i++) {
          out_in_times_row(weight, in + static_cast<size_t>(i) * in_dim,
                           result + static_cast<size_t>(i) * out_dim, out_dim, in_dim);
        }
      };
      product(w[0] + e * in_size, rows.data(), gate.data(), ff, dim);
      product(w[1] + e * in_size, rows.data(), up.data(), ff, dim);
      for (size_t i = 0; i < gate.size(); i++) gate[i] = swiglu_clamped(gate[i], up[i], limit);
      product(w[2] + e * in_size, gate.data(), down.data(), dim, ff);
      for (int i = 0; i < n; i++) {
        std::copy(down.data() + static_cast<size_t>(i) * dim,
                  down.data() + static_cast<size_t>(i + 1) * dim,
                  y + static_cast<size_t>(pairs[i]) * dim);
      }
    };
    for (int e = 0; e < experts; e++) {
      const auto& pairs = pairs_of[e];
      if (pairs.empty()) continue;
      if (grouped) {
        block(e, pairs.data(), static_cast<int>(pairs.size()));
      } else {
        for (const int& p : pairs) block(e, &p, 1);
      }
    }
  }

  float limit_;
  bool grouped_;
};

// twins.sparse_attention: each query row t attends its raw window rows [lo, hi) and the
// compressed rows comp_index[t, :] (a slot outside [0, N) is unused), keys being also values
// (one KV head), with each head's sink logit in the softmax denominator only. A row reads
// exactly its own keys, in order, so its result never depends on the other rows of the call.
class SparseAttention : public CpuPrimitive {
 public:
  SparseAttention(mx::Stream stream, float scale) : CpuPrimitive(stream), scale_(scale) {}

  Task task() const override {
    return [scale = scale_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], scale);
    };
  }

  const char* name() const override { return "DS4SparseAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const SparseAttention&>(other).scale_;
  }

 private:
  static std::vector<int> int_values(const mx::array& a) {
    std::vector<int> out(a.size());
    for (size_t i = 0; i < a.size(); i++) {
      out[i] = a.data<int32_t>()[mx::elem_to_loc(static_cast<int>(i), a)];
    }
    return out;
  }

  static void run(const std::vector<mx::array>& inputs, float* out, float scale) {
    const int tokens = inputs[0].shape(0), heads = inputs[0].shape(1), dim = inputs[0].shape(2);
    const int window_rows = inputs[1].shape(0), comp_rows = inputs[3].shape(0);
    const int slots = inputs[4].shape(1);
    RowMajor q(inputs[0]), window(inputs[1]), comp(inputs[3]), sinks(inputs[5]);
    std::vector<int> ranges = int_values(inputs[2]), index = int_values(inputs[4]);
    std::vector<const float*> keys;
    std::vector<float> scores;
    for (int t = 0; t < tokens; t++) {
      keys.clear();
      const int lo = std::max(ranges[2 * t], 0), hi = std::min(ranges[2 * t + 1], window_rows);
      for (int r = lo; r < hi; r++) keys.push_back(window.data() + static_cast<size_t>(r) * dim);
      for (int k = 0; k < slots; k++) {
        const int row = index[t * slots + k];
        if (row >= 0 && row < comp_rows) {
          keys.push_back(comp.data() + static_cast<size_t>(row) * dim);
        }
      }
      scores.resize(keys.size());
      for (int h = 0; h < heads; h++) {
        const float* qv = q.data() + (static_cast<size_t>(t) * heads + h) * dim;
        float top = sinks[h];
        for (size_t j = 0; j < keys.size(); j++) {
          float dot = 0.0f;
          for (int d = 0; d < dim; d++) dot += qv[d] * keys[j][d];
          scores[j] = dot * scale;
          top = std::max(top, scores[j]);
        }
        float denominator = 0.0f;
        for (size_t j = 0; j < keys.size(); j++) {
          scores[j] = std::exp(scores[j] - top);
          denominator += scores[j];
        }
        denominator += std::exp(sinks[h] - top);
        float* o = out + (static_cast<size_t>(t) * heads + h) * dim;
        std::fill(o, o + dim, 0.0f);
        for (size_t j = 0; j < keys.size(); j++) {
          const float p = scores[j] / denominator;
          for (int d = 0; d < dim; d++) o[d] += p * keys[j][d];
        }
      }
    }
  }

  float scale_;
};

// twins.indexer_top_k: for each query row on its own, the lightning indexer's top_k blocks
// among the row's first visible[t] (scores sum_h w[t, h] * max(q[t, h] . key_j, 0); equal
// scores lower block first), in ascending order, -1 in unused slots; a row that sees at most
// top_k blocks takes them all. The output is int32, written through the float* the base
// class hands out (the memory is the array's own, sized for int32).
class IndexerTopK : public CpuPrimitive {
 public:
  IndexerTopK(mx::Stream stream, int top_k) : CpuPrimitive(stream), top_k_(top_k) {}

  Task task() const override {
    return [top_k = top_k_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, reinterpret_cast<int32_t*>(out[0]), top_k);
    };
  }

  const char* name() const override { return "DS4IndexerTopK"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return top_k_ == static_cast<const IndexerTopK&>(other).top_k_;
  }

 private:
  static void run(const std::vector<mx::array>& inputs, int32_t* out, int top_k) {
    const int tokens = inputs[0].shape(0), heads = inputs[0].shape(1), dim = inputs[0].shape(2);
    const int n_keys = inputs[2].shape(0);
    RowMajor q(inputs[0]), weights(inputs[1]), keys(inputs[2]);
    std::vector<float> scores;
    std::vector<int> order;
    for (int t = 0; t < tokens; t++) {
      const int seen = std::min(
          std::max(inputs[3].data<int32_t>()[mx::elem_to_loc(t, inputs[3])], 0), n_keys);
      int32_t* row = out + static_cast<size_t>(t) * top_k;
      if (seen <= top_k) {
        for (int k = 0; k < top_k; k++) row[k] = k < seen ? k : -1;
        continue;
      }
      scores.assign(seen, 0.0f);
      for (int h = 0; h < heads; h++) {
        const float* qv = q.data() + (static_cast<size_t>(t) * heads + h) * dim;
        const float w = weights[static_cast<size_t>(t) * heads + h];
        for (int j = 0; j < seen; j++) {
          const float* kv = keys.data() + static_cast<size_t>(j) * dim;
          float dot = 0.0f;
          for (int d = 0; d < dim; d++) dot += qv[d] * kv[d];
          scores[j] += std::max(dot, 0.0f) * w;
        }
      }
      order.resize(seen);
      for (int j = 0; j < seen; j++) order[j] = j;
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
        return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
      });
      std::sort(order.begin(), order.begin() + top_k);
      std::copy(order.begin(), order.begin() + top_k, row);
    }
  }

  int top_k_;
};

// models.rope.RoPE.apply: channels [offset, offset + n_dims) of x [T, ..., D] rotated pairwise
// by token t's angles, cos/sin [T, n_dims / 2] (already scaled); ``interleaved`` pairs
// (2i, 2i + 1) (GGML_ROPE_TYPE_NORMAL), else (i, i + n_dims / 2) (NEOX). ``inverse`` rotates
// back (sin negated), which is also the vector-Jacobian product, so this primitive is
// differentiable without a twin.
class Rope : public CpuPrimitive {
 public:
  Rope(mx::Stream stream, int offset, int n_dims, bool interleaved, bool inverse)
      : CpuPrimitive(stream), offset_(offset), n_dims_(n_dims), interleaved_(interleaved),
        inverse_(inverse) {}

  Task task() const override {
    return [offset = offset_, n = n_dims_, interleaved = interleaved_, inverse = inverse_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]), cos(in[1]), sin(in[2]);
      const int tokens = in[0].shape(0), dim = in[0].shape(-1), half = n / 2;
      const size_t per_token = in[0].size() / tokens, vectors = per_token / dim;
      std::copy(x.data(), x.data() + in[0].size(), out[0]);
      for (int t = 0; t < tokens; t++) {
        for (size_t v = 0; v < vectors; v++) {
          const float* src = x.data() + t * per_token + v * dim + offset;
          float* o = out[0] + t * per_token + v * dim + offset;
          for (int i = 0; i < half; i++) {
            const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
            const float c = cos[t * half + i];
            const float s = inverse ? -sin[t * half + i] : sin[t * half + i];
            o[a] = src[a] * c - src[b] * s;
            o[b] = src[a] * s + src[b] * c;
          }
        }
      }
    };
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        grads.push_back(mx::array(
            cotangents[0].shape(), mx::float32,
            std::make_shared<Rope>(stream(), offset_, n_dims_, interleaved_, !inverse_),
            {mx::astype(cotangents[0], mx::float32, stream()), primals[1], primals[2]}));
      } else {
        grads.push_back(mx::zeros_like(primals[arg], stream()));  // the angles are constants
      }
    }
    return grads;
  }

  const char* name() const override { return "DS4Rope"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Rope&>(other);
    return offset_ == o.offset_ && n_dims_ == o.n_dims_ && interleaved_ == o.interleaved_ &&
           inverse_ == o.inverse_;
  }

 private:
  int offset_;
  int n_dims_;
  bool interleaved_;
  bool inverse_;
};

// x [T, K] @ w_i [K, N_i] for each of one or more inference matrices (stored [in, out]) that
// read the same input, for the first ``rows`` rows; the others are zeros (rows_times_in_out).
// Decode and verify tiles use it for every matmul on a stored weight: a one-token step computes
// one row, each row's bits are its own, and the projections of one input are one primitive.
class RowsLinear : public CpuPrimitive {
 public:
  RowsLinear(mx::Stream stream, int rows) : CpuPrimitive(stream), rows_(rows) {}

  Task task() const override {
    return [rows = rows_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]);
      const int tokens = in[0].shape(0), k = in[0].shape(1);
      for (size_t i = 1; i < in.size(); i++) {
        RowMajor w(in[i]);
        const int n = in[i].shape(1);
        rows_times_in_out({x.data(), static_cast<size_t>(k), w.data(), out[i - 1],
                           static_cast<size_t>(n), k, n},
                          tokens, std::min(rows, tokens));
      }
    };
  }

  const char* name() const override { return "DS4RowsLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return rows_ == static_cast<const RowsLinear&>(other).rows_;
  }

 private:
  int rows_;
};

// mx.fast.rms_norm over the last axis of x [..., D]: each row times 1 / sqrt(mean(x^2) + eps),
// then times weight [D] when there is one (two inputs), as one primitive; on the CPU MLX's own
// is three (a square, a sum and the rest fused) or eleven uncompiled. Each row on its own.
class RmsNorm : public CpuPrimitive {
 public:
  RmsNorm(mx::Stream stream, float eps) : CpuPrimitive(stream), eps_(eps) {}

  Task task() const override {
    return [eps = eps_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]);
      const bool weighted = in.size() > 1;
      const int dim = in[0].shape(-1);
      const size_t rows = dim ? in[0].size() / dim : 0;
      RowMajor weights(weighted ? in[1] : in[0]);
      const float* weight = weights.data();
      for (size_t r = 0; r < rows; r++) {
        const float* row = x.data() + r * dim;
        float* o = out[0] + r * dim;
        const float scale = 1.0f / std::sqrt(dot(row, row, dim) / static_cast<float>(dim) + eps);
        if (weighted) {
          for (int d = 0; d < dim; d++) o[d] = row[d] * scale * weight[d];
        } else {
          for (int d = 0; d < dim; d++) o[d] = row[d] * scale;
        }
      }
    };
  }

  // The derivative is mx.fast.rms_norm's (the twin's), so that training differentiates
  // through this primitive without a wrapper (one primitive more on every call).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const float eps = eps_;
    auto twin = [eps, s = stream()](const std::vector<mx::array>& in) {
      std::optional<mx::array> weight;
      if (in.size() > 1) weight = in[1];
      return std::vector<mx::array>{mx::fast::rms_norm(in[0], weight, eps, s)};
    };
    auto grads = mx::vjp(twin, primals, cotangents).second;
    std::vector<mx::array> picked;
    for (int arg : argnums) picked.push_back(grads[arg]);
    return picked;
  }

  const char* name() const override { return "DS4RmsNorm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RmsNorm&>(other).eps_;
  }

 private:
  float eps_;
};

// The grouped projection x [T, G * K] -> [T, G * N]: group g's channels times its own matrix
// w [G, K, N] (stored [in, out]), for the first ``rows`` rows (the others zeros); DeepSeek-V4's
// output projection wo_a, without reshaping and transposing around a batched matmul.
class GroupedRowsLinear : public CpuPrimitive {
 public:
  GroupedRowsLinear(mx::Stream stream, int rows) : CpuPrimitive(stream), rows_(rows) {}

  Task task() const override {
    return [rows = rows_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]), w(in[1]);
      const int tokens = in[0].shape(0), groups = in[1].shape(0);
      const int k = in[1].shape(1), n = in[1].shape(2);
      for (int g = 0; g < groups; g++) {
        rows_times_in_out({x.data() + static_cast<size_t>(g) * k, static_cast<size_t>(groups) * k,
                           w.data() + static_cast<size_t>(g) * k * n, out[0] + static_cast<size_t>(g) * n,
                           static_cast<size_t>(groups) * n, k, n},
                          tokens, std::min(rows, tokens));
      }
    };
  }

  const char* name() const override { return "DS4GroupedRowsLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return rows_ == static_cast<const GroupedRowsLinear&>(other).rows_;
  }

 private:
  int rows_;
};

// For each pair i: the rows of cached_i followed by the first ``take`` rows of new_i, of which
// the last ``keep`` (or all, if fewer): how a cache grows by a chunk and drops what no later
// chunk needs, in one primitive instead of a slice, a concatenation and a slice per array.
class AppendRows : public CpuPrimitive {
 public:
  AppendRows(mx::Stream stream, int take, int keep) : CpuPrimitive(stream), take_(take), keep_(keep) {}

  Task task() const override {
    return [take = take_, keep = keep_](const std::vector<mx::array>& in,
                                        const std::vector<float*>& out) {
      const size_t pairs = in.size() / 2;
      for (size_t i = 0; i < pairs; i++) {
        RowMajor cached(in[i]), fresh(in[pairs + i]);
        const int width = in[pairs + i].shape(1), old_rows = in[i].shape(0);
        const int total = old_rows + take, kept = std::min(total, keep), skip = total - kept;
        float* o = out[i];
        for (int r = skip; r < total; r++, o += width) {
          const float* src = r < old_rows ? cached.data() + static_cast<size_t>(r) * width
                                          : fresh.data() + static_cast<size_t>(r - old_rows) * width;
          std::copy(src, src + width, o);
        }
      }
    };
  }

  const char* name() const override { return "DS4AppendRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const AppendRows&>(other);
    return take_ == o.take_ && keep_ == o.keep_;
  }

 private:
  int take_;
  int keep_;
};

// How a decode tile routes a row (llama.cpp build_moe_ffn): the router probabilities from its
// logits by gating function ``func`` (llama.cpp's numbering: 1 softmax, 2 sigmoid, 3 softmax
// over the selected logits, 4 sqrt(softplus)), the top ``n_used`` experts by probability plus
// selection bias (or the hash-routed ones given), their probabilities as weights, renormalised
// (``normalize``) and scaled. What models.moe's gate_probs and route compute (the twins).
struct Routing {
  int n_used, func;
  bool normalize;
  float scale;

  bool operator==(const Routing&) const = default;
};

class RowRouter {
 public:
  RowRouter(const Routing& r, int experts)
      : r_(r), experts_(experts), probs_(experts), score_(experts), order_(experts) {}

  // Row ``logits`` [E] -> chosen [n_used] and weights [n_used]; ``bias`` [E] or null, ``hashed``
  // [n_used] or null.
  void route(const float* logits, const float* bias, const int* hashed, int* chosen,
             float* weights) {
    probabilities(logits);
    if (hashed != nullptr) {
      std::copy(hashed, hashed + r_.n_used, chosen);
    } else {
      for (int e = 0; e < experts_; e++) {
        score_[e] = probs_[e] + (bias != nullptr ? bias[e] : 0.0f);
        order_[e] = e;
      }
      std::partial_sort(order_.begin(), order_.begin() + r_.n_used, order_.end(),
                        [&](int a, int b) {
                          return score_[a] > score_[b] || (score_[a] == score_[b] && a < b);
                        });
      std::copy(order_.begin(), order_.begin() + r_.n_used, chosen);
    }
    for (int k = 0; k < r_.n_used; k++) {
      weights[k] = chosen[k] >= 0 && chosen[k] < experts_ ? probs_[chosen[k]] : 0.0f;
    }
    if (r_.func == 3) {
      float top = weights[0];
      for (int k = 1; k < r_.n_used; k++) top = std::max(top, weights[k]);
      float sum = 0.0f;
      for (int k = 0; k < r_.n_used; k++) sum += weights[k] = std::exp(weights[k] - top);
      for (int k = 0; k < r_.n_used; k++) weights[k] /= sum;
    }
    if (r_.normalize) {
      float sum = 0.0f;
      for (int k = 0; k < r_.n_used; k++) sum += weights[k];
      sum = std::max(sum, 6.103515625e-5f);  // ggml's clamp: the smallest normal float16
      for (int k = 0; k < r_.n_used; k++) weights[k] /= sum;
    }
    if (r_.scale != 0.0f && r_.scale != 1.0f) {
      for (int k = 0; k < r_.n_used; k++) weights[k] *= r_.scale;
    }
  }

 private:
  void probabilities(const float* logits) {
    if (r_.func == 1) {
      float top = logits[0];
      for (int e = 1; e < experts_; e++) top = std::max(top, logits[e]);
      float sum = 0.0f;
      for (int e = 0; e < experts_; e++) sum += probs_[e] = std::exp(logits[e] - top);
      for (int e = 0; e < experts_; e++) probs_[e] /= sum;
      return;
    }
    for (int e = 0; e < experts_; e++) {
      const float l = logits[e];
      if (r_.func == 2) {
        probs_[e] = sigmoid(l);
      } else if (r_.func == 4) {  // softplus as ggml: x above 20, else log1p(exp(x))
        probs_[e] = std::sqrt(l > 20.0f ? l : std::log1p(std::exp(std::min(l, 20.0f))));
      } else {  // 3: the softmax is over the selected logits
        probs_[e] = l;
      }
    }
  }

  Routing r_;
  int experts_;
  std::vector<float> probs_, score_;
  std::vector<int> order_;
};

// One routed expert e on one row x [D]: down_e(swiglu(gate_e x, up_e x)) -> out [D], with the
// stacked weights as GGUF stores them (gate/up [E, F, D], down [E, D, F]); the same products as
// RoutedExpertsFFN's row-by-row mode, so the same bits.
void expert_row(const float* gate_w, const float* up_w, const float* down_w, int e, int ff,
                int dim, float limit, const float* x, float* gate, float* up, float* out) {
  const size_t in_size = static_cast<size_t>(ff) * dim;
  out_in_times_row(gate_w + e * in_size, x, gate, ff, dim);
  out_in_times_row(up_w + e * in_size, x, up, ff, dim);
  for (int j = 0; j < ff; j++) gate[j] = swiglu_clamped(gate[j], up[j], limit);
  out_in_times_row(down_w + e * in_size, gate, out, dim, ff);
}

// The weighted sum of one row's routed expert outputs plus the shared expert.
class RowCombiner {
 public:
  RowCombiner(int dim, int shared_ff, const float* shared_down, float shared_limit)
      : dim_(dim), shared_ff_(shared_ff), shared_down_(shared_down), shared_limit_(shared_limit),
        hidden_(shared_ff), shared_(dim), acc_(dim) {}

  // out [D] = sum_k weights[k] * expert_out[k] (expert_out [k, D], in k order) + the shared
  // expert's down projection of swiglu(shared_gate, shared_up) [Fs].
  void combine(const float* expert_out, const float* weights, int k_used,
               const float* shared_gate, const float* shared_up, float* out) {
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    for (int k = 0; k < k_used; k++) {
      const float* e = expert_out + static_cast<size_t>(k) * dim_;
      for (int d = 0; d < dim_; d++) acc_[d] = madd(weights[k], e[d], acc_[d]);
    }
    for (int j = 0; j < shared_ff_; j++) {
      hidden_[j] = swiglu_clamped(shared_gate[j], shared_up[j], shared_limit_);
    }
    // As the shared expert's own down projection computes this row (rows_linear).
    rows_times_in_out({hidden_.data(), static_cast<size_t>(shared_ff_), shared_down_,
                       shared_.data(), static_cast<size_t>(dim_), shared_ff_, dim_},
                      1, 1);
    for (int d = 0; d < dim_; d++) out[d] = acc_[d] + shared_[d];
  }

 private:
  int dim_, shared_ff_;
  const float* shared_down_;
  float shared_limit_;
  std::vector<float> hidden_, shared_, acc_;
};

std::vector<int> int_values_of(const mx::array& a) {
  std::vector<int> out(a.size());
  for (size_t i = 0; i < a.size(); i++) {
    out[i] = a.data<int32_t>()[mx::elem_to_loc(static_cast<int>(i), a)];
  }
  return out;
}

// A decode tile's whole FFN for its first ``rows`` rows (the others zeros): routing, routed
// experts, their weighted sum and the shared expert. Inputs: logits [T, E], x [T, D],
// gate/up [E, F, D], down [E, D, F], the shared expert's gate and up products [T, Fs] and its
// down matrix stored [in, out] [Fs, D], then the bias [E] (``has_bias``) and the hash-routed
// experts [T, k] int32 (``hashed``). One primitive where MLX needs some twenty; each row on its
// own. MoeRoute and MoeCombine compute the same in two steps, around experts that are streamed.
class MoeTile : public CpuPrimitive {
 public:
  struct Config {
    Routing routing;
    int rows;
    bool has_bias, hashed;
    float limit, shared_limit;

    bool operator==(const Config&) const = default;
  };

  MoeTile(mx::Stream stream, Config config) : CpuPrimitive(stream), c_(config) {}

  Task task() const override {
    return [c = c_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], c);
    };
  }

  const char* name() const override { return "DS4MoeTile"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return c_ == static_cast<const MoeTile&>(other).c_;
  }

 private:
  static void run(const std::vector<mx::array>& in, float* out, const Config& c) {
    const int tokens = in[1].shape(0), dim = in[1].shape(1);
    const int experts = in[2].shape(0), ff = in[2].shape(1), k_used = c.routing.n_used;
    RowMajor logits(in[0]), x(in[1]), gate_w(in[2]), up_w(in[3]), down_w(in[4]);
    RowMajor shared_gate(in[5]), shared_up(in[6]), shared_down(in[7]);
    const int shared_ff = in[5].shape(1);
    size_t next = 8;
    std::optional<RowMajor> bias;
    if (c.has_bias) bias.emplace(in[next++]);
    const std::vector<int> hashed = c.hashed ? int_values_of(in[next]) : std::vector<int>();
    RowRouter router(c.routing, experts);
    RowCombiner combiner(dim, shared_ff, shared_down.data(), c.shared_limit);
    std::vector<int> chosen(k_used);
    std::vector<float> weights(k_used), gate(ff), up(ff),
        expert_out(static_cast<size_t>(k_used) * dim);
    std::fill(out, out + static_cast<size_t>(tokens) * dim, 0.0f);
    for (int t = 0; t < std::min(c.rows, tokens); t++) {
      router.route(logits.data() + static_cast<size_t>(t) * experts,
                   bias ? bias->data() : nullptr, c.hashed ? &hashed[t * k_used] : nullptr,
                   chosen.data(), weights.data());
      const float* row = x.data() + static_cast<size_t>(t) * dim;
      for (int k = 0; k < k_used; k++) {
        float* e_out = expert_out.data() + static_cast<size_t>(k) * dim;
        if (chosen[k] < 0 || chosen[k] >= experts) {
          std::fill(e_out, e_out + dim, 0.0f);
          continue;
        }
        expert_row(gate_w.data(), up_w.data(), down_w.data(), chosen[k], ff, dim, c.limit, row,
                   gate.data(), up.data(), e_out);
      }
      combiner.combine(expert_out.data(), weights.data(), k_used,
                       shared_gate.data() + static_cast<size_t>(t) * shared_ff,
                       shared_up.data() + static_cast<size_t>(t) * shared_ff,
                       out + static_cast<size_t>(t) * dim);
    }
  }

  Config c_;
};

// MoeTile's routing alone: logits [T, E] (then bias [E], hashed [T, k] as MoeTile) -> the
// experts [T, k] int32 and their weights [T, k] for the first ``rows`` rows (zeros after).
class MoeRoute : public CpuPrimitive {
 public:
  MoeRoute(mx::Stream stream, Routing routing, int rows, bool has_bias, bool hashed)
      : CpuPrimitive(stream), r_(routing), rows_(rows), has_bias_(has_bias), hashed_(hashed) {}

  Task task() const override {
    return [r = r_, rows = rows_, has_bias = has_bias_, hashed = hashed_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      const int tokens = in[0].shape(0), experts = in[0].shape(1);
      RowMajor logits(in[0]);
      std::optional<RowMajor> bias;
      if (has_bias) bias.emplace(in[1]);
      const std::vector<int> ids =
          hashed ? int_values_of(in[has_bias ? 2 : 1]) : std::vector<int>();
      auto* chosen = reinterpret_cast<int32_t*>(out[0]);
      std::fill(chosen, chosen + static_cast<size_t>(tokens) * r.n_used, 0);
      std::fill(out[1], out[1] + static_cast<size_t>(tokens) * r.n_used, 0.0f);
      RowRouter router(r, experts);
      std::vector<int> picked(r.n_used);
      for (int t = 0; t < std::min(rows, tokens); t++) {
        router.route(logits.data() + static_cast<size_t>(t) * experts,
                     bias ? bias->data() : nullptr, hashed ? &ids[t * r.n_used] : nullptr,
                     picked.data(), out[1] + static_cast<size_t>(t) * r.n_used);
        std::copy(picked.begin(), picked.end(), chosen + static_cast<size_t>(t) * r.n_used);
      }
    };
  }

  const char* name() const override { return "DS4MoeRoute"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const MoeRoute&>(other);
    return r_ == o.r_ && rows_ == o.rows_ && has_bias_ == o.has_bias_ && hashed_ == o.hashed_;
  }

 private:
  Routing r_;
  int rows_;
  bool has_bias_, hashed_;
};

// MoeTile's sum: the routed experts' outputs [R, k, D] (R real rows) and their weights [T, k],
// the shared expert's gate and up products [T, Fs] and down matrix [Fs, D] -> [T, D], zeros
// past the R rows.
class MoeCombine : public CpuPrimitive {
 public:
  MoeCombine(mx::Stream stream, float shared_limit)
      : CpuPrimitive(stream), shared_limit_(shared_limit) {}

  Task task() const override {
    return [limit = shared_limit_](const std::vector<mx::array>& in,
                                   const std::vector<float*>& out) {
      RowMajor expert_out(in[0]), weights(in[1]), shared_gate(in[2]), shared_up(in[3]),
          shared_down(in[4]);
      const int real = in[0].shape(0), k_used = in[0].shape(1), dim = in[0].shape(2);
      const int tokens = in[1].shape(0), shared_ff = in[2].shape(1);
      RowCombiner combiner(dim, shared_ff, shared_down.data(), limit);
      std::fill(out[0], out[0] + static_cast<size_t>(tokens) * dim, 0.0f);
      for (int t = 0; t < real; t++) {
        combiner.combine(expert_out.data() + static_cast<size_t>(t) * k_used * dim,
                         weights.data() + static_cast<size_t>(t) * k_used, k_used,
                         shared_gate.data() + static_cast<size_t>(t) * shared_ff,
                         shared_up.data() + static_cast<size_t>(t) * shared_ff,
                         out[0] + static_cast<size_t>(t) * dim);
      }
    };
  }

  const char* name() const override { return "DS4MoeCombine"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return shared_limit_ == static_cast<const MoeCombine&>(other).shared_limit_;
  }

 private:
  float shared_limit_;
};

std::vector<mx::array> hc_mixes(const mx::array& mixes, const mx::array& scale,
                                const mx::array& base, int hc, int iters, float eps) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int width = (2 + hc) * hc;
  if (mixes.ndim() != 2 || mixes.shape(1) != width || scale.size() != 3 ||
      base.size() != static_cast<size_t>(width)) {
    throw std::invalid_argument("hc_mixes: expected mixes [T, (2 + hc) * hc], scale [3] and "
                                "base [(2 + hc) * hc]");
  }
  int tokens = mixes.shape(0);
  std::vector<mx::array> in = {mx::astype(mixes, mx::float32, s),
                               mx::astype(scale, mx::float32, s),
                               mx::astype(base, mx::float32, s)};
  return mx::array::make_arrays({{tokens, hc}, {tokens, hc}, {tokens, hc, hc}},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<HcMixes>(s, hc, iters, eps), in);
}

std::vector<mx::array> hc_pre(const mx::array& x, const mx::array& fn_t, const mx::array& scale,
                              const mx::array& base, int hc, int iters, float eps,
                              float norm_eps) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int width = (2 + hc) * hc;
  if (x.ndim() != 3 || x.shape(1) != hc || fn_t.ndim() != 2 || fn_t.shape(1) != width ||
      fn_t.shape(0) != hc * x.shape(2) || scale.size() != 3 ||
      base.size() != static_cast<size_t>(width)) {
    throw std::invalid_argument("hc_pre: expected x [T, hc, D], fn_t [hc * D, (2 + hc) * hc], "
                                "scale [3] and base [(2 + hc) * hc]");
  }
  const int tokens = x.shape(0), dim = x.shape(2);
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s), mx::astype(fn_t, mx::float32, s),
                               mx::astype(scale, mx::float32, s),
                               mx::astype(base, mx::float32, s)};
  return mx::array::make_arrays({{tokens, dim}, {tokens, hc}, {tokens, hc, hc}},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<HcPre>(s, hc, iters, eps, norm_eps), in);
}

mx::array hc_expand(const mx::array& out, const mx::array& residual, const mx::array& post,
                    const mx::array& comb) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (residual.ndim() != 3 || out.shape() != mx::Shape{residual.shape(0), residual.shape(2)} ||
      post.shape() != mx::Shape{residual.shape(0), residual.shape(1)} ||
      comb.shape() != mx::Shape{residual.shape(0), residual.shape(1), residual.shape(1)}) {
    throw std::invalid_argument("hc_expand: expected out [T, D], residual [T, hc, D], "
                                "post [T, hc] and comb [T, hc, hc]");
  }
  return mx::array(residual.shape(), mx::float32, std::make_shared<HcExpand>(s),
                   {mx::astype(out, mx::float32, s), mx::astype(residual, mx::float32, s),
                    mx::astype(post, mx::float32, s), mx::astype(comb, mx::float32, s)});
}

mx::array routed_experts(const mx::array& x, const mx::array& gate, const mx::array& up,
                         const mx::array& down, const mx::array& indices, float limit,
                         bool grouped) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() != 2 || gate.ndim() != 3 || up.shape() != gate.shape() || down.ndim() != 3 ||
      down.shape(0) != gate.shape(0) || down.shape(1) != x.shape(1) ||
      down.shape(2) != gate.shape(1) || gate.shape(2) != x.shape(1) || indices.ndim() != 2 ||
      indices.shape(0) != x.shape(0)) {
    throw std::invalid_argument(
        "routed_experts: expected x [T, D], gate/up [E, F, D], down [E, D, F], indices [T, k]");
  }
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s), mx::astype(gate, mx::float32, s),
                               mx::astype(up, mx::float32, s), mx::astype(down, mx::float32, s),
                               mx::astype(indices, mx::int32, s)};
  return mx::array({x.shape(0), indices.shape(1), x.shape(1)}, mx::float32,
                   std::make_shared<RoutedExpertsFFN>(s, limit, grouped), in);
}

mx::array sparse_attention(const mx::array& q, const mx::array& window,
                           const mx::array& window_range, const mx::array& comp,
                           const mx::array& comp_index, const mx::array& sinks, float scale) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int tokens = q.ndim() == 3 ? q.shape(0) : -1;
  if (q.ndim() != 3 || window.ndim() != 2 || window.shape(1) != q.shape(2) ||
      comp.ndim() != 2 || comp.shape(1) != q.shape(2) ||
      window_range.shape() != mx::Shape{tokens, 2} || comp_index.ndim() != 2 ||
      comp_index.shape(0) != tokens || sinks.ndim() != 1 || sinks.shape(0) != q.shape(1)) {
    throw std::invalid_argument(
        "sparse_attention: expected q [T, H, D], window [W, D], window_range [T, 2], "
        "comp [N, D], comp_index [T, K], sinks [H]");
  }
  std::vector<mx::array> in = {mx::astype(q, mx::float32, s), mx::astype(window, mx::float32, s),
                               mx::astype(window_range, mx::int32, s),
                               mx::astype(comp, mx::float32, s),
                               mx::astype(comp_index, mx::int32, s),
                               mx::astype(sinks, mx::float32, s)};
  return mx::array(q.shape(), mx::float32, std::make_shared<SparseAttention>(s, scale), in);
}

mx::array indexer_top_k(const mx::array& q, const mx::array& weights, const mx::array& keys,
                        const mx::array& visible, int top_k) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (q.ndim() != 3 || weights.shape() != mx::Shape{q.shape(0), q.shape(1)} ||
      keys.ndim() != 2 || keys.shape(1) != q.shape(2) ||
      visible.shape() != mx::Shape{q.shape(0)} || top_k < 1) {
    throw std::invalid_argument(
        "indexer_top_k: expected q [T, H, D], weights [T, H], keys [N, D], visible [T], "
        "top_k >= 1");
  }
  return mx::array({q.shape(0), top_k}, mx::int32, std::make_shared<IndexerTopK>(s, top_k),
                   {mx::astype(q, mx::float32, s), mx::astype(weights, mx::float32, s),
                    mx::astype(keys, mx::float32, s), mx::astype(visible, mx::int32, s)});
}

mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin, int offset,
               int n_dims, bool interleaved, bool inverse) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() < 2 || n_dims % 2 || offset < 0 || offset + n_dims > x.shape(-1) ||
      cos.shape() != mx::Shape{x.shape(0), n_dims / 2} || sin.shape() != cos.shape()) {
    throw std::invalid_argument(
        "rope: expected x [T, ..., D] with channels [offset, offset + n_dims) inside D and "
        "cos, sin [T, n_dims / 2]");
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<Rope>(s, offset, n_dims, interleaved, inverse),
                   {mx::astype(x, mx::float32, s), mx::astype(cos, mx::float32, s),
                    mx::astype(sin, mx::float32, s)});
}

std::vector<mx::array> rows_linear(const mx::array& x, const std::vector<mx::array>& ws,
                                   int rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() != 2 || ws.empty() || rows < 0) {
    throw std::invalid_argument("rows_linear: expected x [T, K], one or more w [K, N], rows >= 0");
  }
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s)};
  std::vector<mx::Shape> shapes;
  for (const auto& w : ws) {
    if (w.ndim() != 2 || w.shape(0) != x.shape(1)) {
      throw std::invalid_argument("rows_linear: every w must be [K, N] with x [T, K]");
    }
    in.push_back(mx::astype(w, mx::float32, s));
    shapes.push_back({x.shape(0), w.shape(1)});
  }
  return mx::array::make_arrays(shapes, std::vector<mx::Dtype>(ws.size(), mx::float32),
                                std::make_shared<RowsLinear>(s, rows), in);
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() < 1 || (weight && (weight->ndim() != 1 || weight->shape(0) != x.shape(-1)))) {
    throw std::invalid_argument("rms_norm: expected x [..., D] and weight [D] or None");
  }
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s)};
  if (weight) in.push_back(mx::astype(*weight, mx::float32, s));
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, eps), in);
}

mx::array grouped_rows_linear(const mx::array& x, const mx::array& w, int rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() != 2 || w.ndim() != 3 || x.shape(1) != w.shape(0) * w.shape(1) || rows < 0) {
    throw std::invalid_argument(
        "grouped_rows_linear: expected x [T, G * K], w [G, K, N] and rows >= 0");
  }
  return mx::array({x.shape(0), w.shape(0) * w.shape(2)}, mx::float32,
                   std::make_shared<GroupedRowsLinear>(s, rows),
                   {mx::astype(x, mx::float32, s), mx::astype(w, mx::float32, s)});
}

std::vector<mx::array> append_rows(const std::vector<mx::array>& cached,
                                   const std::vector<mx::array>& fresh, int take, int keep) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (cached.size() != fresh.size() || cached.empty() || keep < 0) {
    throw std::invalid_argument("append_rows: expected as many cached as new arrays, keep >= 0");
  }
  std::vector<mx::array> in;
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < cached.size(); i++) {
    const auto& a = cached[i];
    const auto& b = fresh[i];
    if (a.ndim() != 2 || b.ndim() != 2 || a.shape(1) != b.shape(1) || take < 0 ||
        take > b.shape(0)) {
      throw std::invalid_argument("append_rows: expected [N, W] and [T, W] with take <= T");
    }
    shapes.push_back({std::min(a.shape(0) + take, keep), a.shape(1)});
  }
  for (const auto& a : cached) in.push_back(mx::astype(a, mx::float32, s));
  for (const auto& b : fresh) in.push_back(mx::astype(b, mx::float32, s));
  return mx::array::make_arrays(shapes, std::vector<mx::Dtype>(cached.size(), mx::float32),
                                std::make_shared<AppendRows>(s, take, keep), in);
}

mx::array moe_tile(const mx::array& logits, const mx::array& x, const mx::array& gate,
                   const mx::array& up, const mx::array& down, const mx::array& shared_gate,
                   const mx::array& shared_up, const mx::array& shared_down,
                   const std::optional<mx::array>& bias, const std::optional<mx::array>& hashed,
                   int rows, int n_used, int func, bool normalize, float scale, float limit,
                   float shared_limit) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int tokens = x.ndim() == 2 ? x.shape(0) : -1;
  if (x.ndim() != 2 || gate.ndim() != 3 || logits.shape() != mx::Shape{tokens, gate.shape(0)} ||
      up.shape() != gate.shape() || gate.shape(2) != x.shape(1) ||
      down.shape() != mx::Shape{gate.shape(0), x.shape(1), gate.shape(1)} ||
      shared_gate.ndim() != 2 || shared_gate.shape(0) != tokens ||
      shared_up.shape() != shared_gate.shape() ||
      shared_down.shape() != mx::Shape{shared_gate.shape(1), x.shape(1)} || n_used < 1 ||
      n_used > gate.shape(0) || func < 1 || func > 4 ||
      (bias && bias->size() != static_cast<size_t>(gate.shape(0))) ||
      (hashed && hashed->shape() != mx::Shape{tokens, n_used})) {
    throw std::invalid_argument(
        "moe_tile: expected logits [T, E], x [T, D], gate/up [E, F, D], down [E, D, F], "
        "shared gate/up [T, Fs], shared down [Fs, D], bias [E] or None, hashed [T, k] or "
        "None, 1 <= k <= E, func 1-4");
  }
  std::vector<mx::array> in = {
      mx::astype(logits, mx::float32, s),    mx::astype(x, mx::float32, s),
      mx::astype(gate, mx::float32, s),      mx::astype(up, mx::float32, s),
      mx::astype(down, mx::float32, s),      mx::astype(shared_gate, mx::float32, s),
      mx::astype(shared_up, mx::float32, s), mx::astype(shared_down, mx::float32, s)};
  if (bias) in.push_back(mx::astype(*bias, mx::float32, s));
  if (hashed) in.push_back(mx::astype(*hashed, mx::int32, s));
  MoeTile::Config config{{n_used, func, normalize, scale}, rows, bias.has_value(),
                         hashed.has_value(), limit, shared_limit};
  return mx::array(x.shape(), mx::float32, std::make_shared<MoeTile>(s, config), in);
}

std::vector<mx::array> moe_route(const mx::array& logits, const std::optional<mx::array>& bias,
                                 const std::optional<mx::array>& hashed, int rows, int n_used,
                                 int func, bool normalize, float scale) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int tokens = logits.ndim() == 2 ? logits.shape(0) : -1;
  if (logits.ndim() != 2 || n_used < 1 || n_used > logits.shape(1) || func < 1 || func > 4 ||
      (bias && bias->size() != static_cast<size_t>(logits.shape(1))) ||
      (hashed && hashed->shape() != mx::Shape{tokens, n_used})) {
    throw std::invalid_argument("moe_route: expected logits [T, E], bias [E] or None, hashed "
                                "[T, k] or None, 1 <= k <= E, func 1-4");
  }
  std::vector<mx::array> in = {mx::astype(logits, mx::float32, s)};
  if (bias) in.push_back(mx::astype(*bias, mx::float32, s));
  if (hashed) in.push_back(mx::astype(*hashed, mx::int32, s));
  return mx::array::make_arrays(
      {{tokens, n_used}, {tokens, n_used}}, {mx::int32, mx::float32},
      std::make_shared<MoeRoute>(s, Routing{n_used, func, normalize, scale}, rows,
                                 bias.has_value(), hashed.has_value()),
      in);
}

mx::array moe_combine(const mx::array& expert_out, const mx::array& weights,
                      const mx::array& shared_gate, const mx::array& shared_up,
                      const mx::array& shared_down, float shared_limit) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (expert_out.ndim() != 3 || weights.ndim() != 2 || weights.shape(1) != expert_out.shape(1) ||
      weights.shape(0) < expert_out.shape(0) || shared_gate.ndim() != 2 ||
      shared_gate.shape(0) != weights.shape(0) || shared_up.shape() != shared_gate.shape() ||
      shared_down.shape() != mx::Shape{shared_gate.shape(1), expert_out.shape(2)}) {
    throw std::invalid_argument(
        "moe_combine: expected expert outputs [R, k, D], weights [T, k] (T >= R), shared "
        "gate/up [T, Fs] and shared down [Fs, D]");
  }
  return mx::array({weights.shape(0), expert_out.shape(2)}, mx::float32,
                   std::make_shared<MoeCombine>(s, shared_limit),
                   {mx::astype(expert_out, mx::float32, s), mx::astype(weights, mx::float32, s),
                    mx::astype(shared_gate, mx::float32, s),
                    mx::astype(shared_up, mx::float32, s),
                    mx::astype(shared_down, mx::float32, s)});
}

}  // namespace

NB_MODULE(_cpu_ops, m) {
  m.doc() = "ds4mlx native CPU operations (see ops.cpp)";
  m.def("hc_mixes", &hc_mixes, "mixes"_a, "scale"_a, "base"_a, "hc"_a, "iters"_a, "eps"_a,
        "One mHC site's (pre, post, comb) from its projected mixes, as one primitive.");
  m.def("hc_pre", &hc_pre, "x"_a, "fn_t"_a, "scale"_a, "base"_a, "hc"_a, "iters"_a, "eps"_a,
        "norm_eps"_a, "A whole mHC site before its block: (block input, post, comb).");
  m.def("hc_expand", &hc_expand, "out"_a, "residual"_a, "post"_a, "comb"_a,
        "The mHC streams after a block, as one primitive.");
  m.def("routed_experts", &routed_experts, "x"_a, "gate"_a, "up"_a, "down"_a, "indices"_a,
        "limit"_a, "grouped"_a,
        "Every (token, slot) pair's routed SwiGLU expert output [T, k, D], as one primitive.");
  m.def("indexer_top_k", &indexer_top_k, "q"_a, "weights"_a, "keys"_a, "visible"_a, "top_k"_a,
        "Each row's lightning-indexer top-k blocks among its visible ones, as one primitive.");
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
  m.def("rows_linear", &rows_linear, "x"_a, "ws"_a, "rows"_a,
        "x @ w for each w, for the first rows rows (the rest zeros), each row on its own.");
  m.def("sparse_attention", &sparse_attention, "q"_a, "window"_a, "window_range"_a, "comp"_a,
        "comp_index"_a, "sinks"_a, "scale"_a,
        "Sink attention of each row over its window range and selected compressed rows.");
}
