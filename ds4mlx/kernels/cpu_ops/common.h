// ds4mlx's native CPU operations: MLX primitives for work that is many tiny ops in MLX's own
// vocabulary. On the CPU every primitive costs microseconds of scheduling whatever its size;
// the mHC Sinkhorn alone is ~80 of them per call (a reduction and a division per half-round),
// while its arithmetic is a few hundred flops on a 4x4 matrix. Here a whole mHC site is one.
//
// The semantics are those of the pure-MLX twins in ds4mlx/kernels/twins.py, in the same order
// of operations, in float32. Each matrix (row) is computed on its own, so a row's result never
// depends on the other rows of the call (what keeps decode and verify rows bit-identical).
//
// This header holds what the primitives share (ops.h declares their factories; one .cpp per
// concern defines them; module.cpp binds them). Free functions here are ``inline`` so that every
// source includes the same definitions, compiled with the same flags (CMakeLists.txt).

#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
#include <arm_neon.h>
#endif

#include "mlx/allocator.h"
#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mx = mlx::core;

// CBLAS, resolved when the module loads: the BLAS MLX itself calls (ds4mlx preloads OpenBLAS;
// otherwise the one libmlx links). Declared here so that no BLAS headers are needed to build.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float* a, int lda, const float* b, int ldb,
                            float beta, float* c, int ldc);

namespace ds4mlx_ops {

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

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// twins.swiglu on one element: silu(gate) * up, both clamped first when limit > 0.
inline float swiglu_clamped(float g, float u, float limit) {
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
inline void rows_times_in_out_tail(const Product& p, int rows, int j0) {
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

// Rows [r0, r0 + kGroup) of x @ w over columns [j_begin, n): whole blocks of kColumns, then
// what is left in blocks half as wide, down to 8, then one column at a time (narrow matrices,
// e.g. a router's eight columns, stay vectorised).
template <int kGroup, int kColumns>
void rows_times_in_out_group(const Product& p, int r0, int j_begin = 0) {
  const int whole = j_begin + (p.n - j_begin) / kColumns * kColumns;
  for (int j0 = j_begin; j0 < whole; j0 += kColumns) {
    rows_times_in_out_block<kGroup, kColumns>(p, r0, j0);
  }
  if (whole == p.n) return;
  if constexpr (kColumns > 8) {
    rows_times_in_out_group<kGroup, kColumns / 2>(p, r0, whole);
  } else {
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
// one-token tile.) Rows go up to six at a time (a verify pass's six rows read each weight
// once) through blocks of columns whose sums stay in registers: rows x columns / 16 of about
// 16-24 vector registers, the widest blocks measured fastest here (6x64 columns: 3x the
// speed of 4x32 + 2x64 for a verify pass's head).
inline void rows_times_in_out(const Product& p, int tokens, int rows) {
  for (int r = rows; r < tokens; r++) std::fill(p.y + r * p.y_stride, p.y + r * p.y_stride + p.n, 0.0f);
  int r0 = 0;
  for (; r0 + 6 <= rows; r0 += 6) rows_times_in_out_group<6, 64>(p, r0);
  switch (rows - r0) {
    case 5: rows_times_in_out_group<5, 64>(p, r0); break;
    case 4: rows_times_in_out_group<4, 64>(p, r0); break;
    case 3: rows_times_in_out_group<3, 128>(p, r0); break;
    case 2: rows_times_in_out_group<2, 128>(p, r0); break;
    case 1: rows_times_in_out_group<1, 256>(p, r0); break;
    default: break;
  }
}

// Sixteen partial sums, lane l accumulating madd(a[l], b[l], lane) for blocks of 16 floats: one
// AVX-512 register, two AVX2 or four NEON ones, else an array (the same fused multiply-adds as
// madd in every case, so the same bits). Written with intrinsics because the compiler's own
// vectorisation of such loops is not reliable: in dot4 it left one of the four sums scalar.
class Lanes16 {
 public:
  void madd_block(const float* __restrict a, const float* __restrict b) {
#if defined(__AVX512F__)
    v_ = _mm512_fmadd_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b), v_);
#elif defined(__AVX2__) && defined(__FMA__)
    lo_ = _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), lo_);
    hi_ = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), _mm256_loadu_ps(b + 8), hi_);
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
    for (int q = 0; q < 4; q++) v_[q] = vfmaq_f32(v_[q], vld1q_f32(a + 4 * q), vld1q_f32(b + 4 * q));
#else
    for (int l = 0; l < 16; l++) v_[l] = madd(a[l], b[l], v_[l]);
#endif
  }

  // The lanes added in order, from zero.
  float sum() const {
    float lanes[16];
#if defined(__AVX512F__)
    _mm512_storeu_ps(lanes, v_);
#elif defined(__AVX2__) && defined(__FMA__)
    _mm256_storeu_ps(lanes, lo_);
    _mm256_storeu_ps(lanes + 8, hi_);
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
    for (int q = 0; q < 4; q++) vst1q_f32(lanes + 4 * q, v_[q]);
#else
    std::copy(v_, v_ + 16, lanes);
#endif
    float total = 0.0f;
    for (int l = 0; l < 16; l++) total += lanes[l];
    return total;
  }

 private:
#if defined(__AVX512F__)
  __m512 v_ = _mm512_setzero_ps();
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 lo_ = _mm256_setzero_ps(), hi_ = _mm256_setzero_ps();
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
  float32x4_t v_[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                       vdupq_n_f32(0.0f)};
#else
  float v_[16] = {};
#endif
};

// a . b over n floats: sixteen interleaved partial sums (Lanes16) added in a fixed order, then the
// tail, so the same inputs give the same bits in every call.
inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  Lanes16 lanes;
  const int whole = n / 16 * 16;
  for (int i = 0; i < whole; i += 16) lanes.madd_block(a + i, b + i);
  float tail = 0.0f;
  for (int i = whole; i < n; i++) tail = madd(a[i], b[i], tail);
  return lanes.sum() + tail;
}

// dot(w[r], x) for four rows w[0..3] against the same x (the same bits as dot), x read once.
inline void dot4(const float* const* w, const float* __restrict x, int n, float* out) {
  Lanes16 lanes[4];
  const int whole = n / 16 * 16;
  for (int i = 0; i < whole; i += 16) {
    for (int r = 0; r < 4; r++) lanes[r].madd_block(w[r] + i, x + i);
  }
  for (int r = 0; r < 4; r++) {
    float tail = 0.0f;
    for (int i = whole; i < n; i++) tail = madd(w[r][i], x[i], tail);
    out[r] = lanes[r].sum() + tail;
  }
}

// y[r] = W x[r] for ``count`` rows x[r] [K] and W [N, K] stored [out, in] (GGUF's layout): each
// output is dot's sum (dot4 four at a time), so a row's bits do not depend on the other rows.
// The rows go through W together, four of its rows at a time, so that the 4 x K floats of W stay
// in the L1 cache for all of them: rows that share an expert read its weights once.
inline void out_in_times_rows(const float* w, const float* const* x, float* const* y, int count,
                              int n, int k_dim) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* block[4];
    for (int r = 0; r < 4; r++) block[r] = w + static_cast<size_t>(j + r) * k_dim;
    for (int r = 0; r < count; r++) dot4(block, x[r], k_dim, y[r] + j);
  }
  for (; j < n; j++) {
    for (int r = 0; r < count; r++) y[r][j] = dot(w + static_cast<size_t>(j) * k_dim, x[r], k_dim);
  }
}

inline std::vector<int> int_values(const mx::array& a) {
  std::vector<int> out(a.size());
  for (size_t i = 0; i < a.size(); i++) {
    out[i] = a.data<int32_t>()[mx::elem_to_loc(static_cast<int>(i), a)];
  }
  return out;
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

}  // namespace ds4mlx_ops
