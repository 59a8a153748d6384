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
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
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
#include "ops.h"

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

// The values of an evaluated array in row-major order: the array's own memory when it is
// row-contiguous (the usual case), else a copy. ``RowMajor`` reads float32 arrays.
template <typename T>
class RowMajorOf {
 public:
  explicit RowMajorOf(const mx::array& a) {
    if (a.flags().row_contiguous) {
      data_ = a.data<T>();
      return;
    }
    copy_.resize(a.size());
    const T* values = a.data<T>();
    for (size_t i = 0; i < a.size(); i++) {
      copy_[i] = values[mx::elem_to_loc(static_cast<int>(i), a)];
    }
    data_ = copy_.data();
  }

  const T* data() const { return data_; }
  T operator[](size_t i) const { return data_[i]; }

 private:
  const T* data_ = nullptr;
  std::vector<T> copy_;
};

using RowMajor = RowMajorOf<float>;

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

// Rows of a decode or verify tile (kernels.ROWS_LINEAR_MAX): up to these, a product takes one
// chain of multiply-adds per value, so a row's bits never depend on the other rows.
constexpr int kTileRows = 8;

// The columns of a coded or float16 matrix are stored in panels this wide (``Coded``).
constexpr int kPanel = 64;

// A matrix [K, N] (stored [in, out]) whose values are scale * code + bias (a GGUF quant's
// blocks, re-laid out at load: kernels.RowCodes): codes [N / kPanel, K, kPanel] int8 and scale
// and bias [N / kPanel, K / group, kPanel], a scale and a bias per ``group`` consecutive k (the
// quant's sub-block). A quarter of float32's bytes, and each column panel is read front to back
// (a float32 [K, N] column block is read in short runs a row apart, one page each on a wide
// matrix): decode and verify tiles are bound by these reads.
struct Coded {
  const int8_t* codes;
  const float* scale;
  const float* bias;
  int group;

  // Row k (of K) of column panel ``panel``: its kPanel values into w.
  void decode(size_t panel, int k, int k_dim, float* __restrict w) const {
    const int8_t* __restrict q = codes + (panel * k_dim + k) * kPanel;
    const size_t at = (panel * (k_dim / group) + k / group) * kPanel;
    const float* __restrict s = scale + at;
    const float* __restrict o = bias + at;
    for (int j = 0; j < kPanel; j++) w[j] = s[j] * static_cast<float>(q[j]) + o[j];
  }
};

// An IEEE half's bits as float32 (exact: every half is a float).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      exponent--;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// out[i] = the float of half bits h[i], i < n.
inline void halves_to_floats(const uint16_t* __restrict h, float* __restrict out, int n) {
  int i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(h + i))));
  }
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(h + i))));
  }
#endif
  for (; i < n; i++) out[i] = half_to_float(h[i]);
}

// A matrix [K, N] (stored [in, out]) of float16 values (a GGUF F16 tensor) in panels of kPanel
// columns: [N / kPanel, K, kPanel] (the same layout as Coded's codes, at half float32's bytes),
// decoded exactly.
struct HalfPanels {
  const uint16_t* halves;

  void decode(size_t panel, int k, int k_dim, float* __restrict w) const {
    halves_to_floats(halves + (panel * k_dim + k) * kPanel, w, kPanel);
  }
};

// panels_times_in_out's rows [r0, r0 + kGroup) x columns [j0, j0 + kColumns) (whole panels):
// each k's values are decoded once for the rows, then every element takes the same multiply-add
// chain as rows_times_in_out_block's (the values are the float32 matrix's, so the same bits).
// The last panel of a matrix whose width is not a whole number of panels is stored padded: its
// columns past p.n are computed and not written.
template <int kGroup, int kColumns, typename Panels>
void panels_block(const Product& p, const Panels& m, int r0, int j0) {
  static_assert(kColumns % kPanel == 0);
  float acc[kGroup][kColumns] = {};
  float w[kColumns];
  for (int k = 0; k < p.k; k++) {
    for (int pp = 0; pp < kColumns / kPanel; pp++) m.decode(j0 / kPanel + pp, k, p.k, w + pp * kPanel);
    for (int r = 0; r < kGroup; r++) {
      const float xv = p.x[(r0 + r) * p.x_stride + k];
      for (int j = 0; j < kColumns; j++) acc[r][j] = madd(xv, w[j], acc[r][j]);
    }
  }
  const int written = std::min(kColumns, p.n - j0);
  for (int r = 0; r < kGroup; r++) std::copy(acc[r], acc[r] + written, p.y + (r0 + r) * p.y_stride + j0);
}

template <int kGroup, int kColumns, typename Panels>
void panels_group(const Product& p, const Panels& m, int r0) {
  const int whole = p.n / kColumns * kColumns;
  for (int j0 = 0; j0 < whole; j0 += kColumns) panels_block<kGroup, kColumns>(p, m, r0, j0);
  for (int j0 = whole; j0 < p.n; j0 += kPanel) panels_block<kGroup, kPanel>(p, m, r0, j0);
}

// rows_times_in_out on a matrix in column panels (``Coded`` or ``HalfPanels``; p.n columns of
// panels padded to a whole one): the same results, bit for bit, from a quarter or a half of
// the bytes.
template <typename Panels>
void panels_times_in_out(const Product& p, const Panels& m, int tokens, int rows) {
  for (int r = rows; r < tokens; r++) std::fill(p.y + r * p.y_stride, p.y + r * p.y_stride + p.n, 0.0f);
  int r0 = 0;
  for (; r0 + 6 <= rows; r0 += 6) panels_group<6, 64>(p, m, r0);
  switch (rows - r0) {
    case 5: panels_group<5, 64>(p, m, r0); break;
    case 4: panels_group<4, 64>(p, m, r0); break;
    case 3: panels_group<3, 128>(p, m, r0); break;
    case 2: panels_group<2, 128>(p, m, r0); break;
    case 1: panels_group<1, 128>(p, m, r0); break;
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

  // madd_block with a = scale * code + bias for 16 int8 codes (a coded row's values: the
  // multiply and the add rounded apart, as the load-time check computed them).
  void madd_coded_block(const int8_t* __restrict codes, float scale, float bias,
                        const float* __restrict b) {
#if defined(__AVX512F__)
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(codes))));
    const __m512 a = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(scale), q), _mm512_set1_ps(bias));
    v_ = _mm512_fmadd_ps(a, _mm512_loadu_ps(b), v_);
#elif defined(__AVX2__) && defined(__FMA__)
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m256 q_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    const __m256 q_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
    const __m256 s = _mm256_set1_ps(scale), o = _mm256_set1_ps(bias);
    lo_ = _mm256_fmadd_ps(_mm256_add_ps(_mm256_mul_ps(s, q_lo), o), _mm256_loadu_ps(b), lo_);
    hi_ = _mm256_fmadd_ps(_mm256_add_ps(_mm256_mul_ps(s, q_hi), o), _mm256_loadu_ps(b + 8), hi_);
#else
    float a[16];
    for (int l = 0; l < 16; l++) a[l] = scale * static_cast<float>(codes[l]) + bias;
    madd_block(a, b);
#endif
  }

  // madd_block with a = the floats of 16 half values (exact).
  void madd_half_block(const uint16_t* __restrict halves, const float* __restrict b) {
#if defined(__AVX512F__)
    const __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves)));
    v_ = _mm512_fmadd_ps(a, _mm512_loadu_ps(b), v_);
#else
    float a[16];
    halves_to_floats(halves, a, 16);
    madd_block(a, b);
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

// A stack of matrices [E, N, K] stored [out, in] (GGUF's layout: routed experts) whose values
// are scale * code + bias: codes [E, N, K] int8, scale and bias [E, N, K / group] (group a
// multiple of 16, K of the group). Decoded in the dot products (Lanes16::madd_coded_block).
struct CodedRows {
  const int8_t* codes;
  const float* scale;
  const float* bias;
  int group;

  // lanes += row ``row`` (of all E * N) at [i, i + 16) times x[i, i + 16).
  void madd(Lanes16& lanes, size_t row, int i, int k_dim, const float* __restrict x) const {
    const size_t at = row * (k_dim / group) + i / group;
    lanes.madd_coded_block(codes + row * k_dim + i, scale[at], bias[at], x);
  }
};

// A stack of float16 matrices [E, N, K] (GGUF F16 experts; K a multiple of 16), decoded exactly.
struct HalfRows {
  const uint16_t* halves;

  void madd(Lanes16& lanes, size_t row, int i, int k_dim, const float* __restrict x) const {
    lanes.madd_half_block(halves + row * k_dim + i, x);
  }
};

// kRows dot sums of rows row0.. of a stack (``CodedRows`` or ``HalfRows``) with x: Lanes16
// sums as dot's (the same bits as over the float32 values). kRows is a constant so that the
// sums stay in registers.
template <int kRows, typename Rows>
void stack_dots(const Rows& m, size_t row0, int k_dim, const float* __restrict x, float* out) {
  Lanes16 lanes[kRows];
  for (int i = 0; i < k_dim; i += 16) {
    for (int b = 0; b < kRows; b++) m.madd(lanes[b], row0 + b, i, k_dim, x + i);
  }
  for (int b = 0; b < kRows; b++) out[b] = lanes[b].sum();
}

// out_in_times_rows on matrix ``e`` of a coded or float16 stack: the same dot sums of the same
// values, so the same bits, reading a quarter or a half of the bytes.
template <typename Rows>
void stack_times_rows(const Rows& m, size_t e, const float* const* x, float* const* y, int count,
                      int n, int k_dim) {
  const size_t first = e * n;
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    for (int r = 0; r < count; r++) stack_dots<4>(m, first + j, k_dim, x[r], y[r] + j);
  }
  for (; j < n; j++) {
    for (int r = 0; r < count; r++) stack_dots<1>(m, first + j, k_dim, x[r], y[r] + j);
  }
}

inline std::vector<int> int_values(const mx::array& a) {
  std::vector<int> out(a.size());
  for (size_t i = 0; i < a.size(); i++) {
    out[i] = a.data<int32_t>()[mx::elem_to_loc(static_cast<int>(i), a)];
  }
  return out;
}

// Appends a matrix's arrays to a primitive's inputs; returns how many (1 or 3).
inline int push_matrix(std::vector<mx::array>& in, const MatrixArg& m, mx::Stream s,
                       const std::string& op) {
  if (const auto* values = std::get_if<mx::array>(&m)) {
    in.push_back(mx::astype(*values, mx::float32, s));
    return 1;
  }
  const auto& parts = std::get<std::vector<mx::array>>(m);
  if (parts.size() == 1 && parts[0].dtype() == mx::float16) {
    in.push_back(parts[0]);
    return 1;
  }
  if (parts.size() != 3 || parts[0].dtype() != mx::int8 || parts[1].shape() != parts[2].shape() ||
      parts[0].ndim() != parts[1].ndim()) {
    throw std::invalid_argument(
        op + ": a coded matrix is [codes (int8), scale, bias] or [float16 values]");
  }
  in.push_back(parts[0]);
  in.push_back(mx::astype(parts[1], mx::float32, s));
  in.push_back(mx::astype(parts[2], mx::float32, s));
  return 3;
}

// The [K, N] shape a dense matrix argument stands for (codes in kPanel-column panels), checking
// a coded one's parts against each other.
inline std::pair<int, int> matrix_shape(const MatrixArg& m, const std::string& op) {
  if (const auto* values = std::get_if<mx::array>(&m)) {
    if (values->ndim() != 2) throw std::invalid_argument(op + ": a matrix is [K, N]");
    return {values->shape(0), values->shape(1)};
  }
  const auto& parts = std::get<std::vector<mx::array>>(m);
  const mx::array& codes = parts.at(0);
  if (parts.size() == 1) {  // float16 panels
    if (codes.ndim() != 3 || codes.shape(2) != kPanel) {
      throw std::invalid_argument(op + ": float16 panels are [N / 64, K, 64]");
    }
    return {codes.shape(1), codes.shape(0) * kPanel};
  }
  const mx::array& scale = parts.at(1);
  if (codes.ndim() != 3 || codes.shape(2) != kPanel || scale.ndim() != 3 ||
      scale.shape(0) != codes.shape(0) || scale.shape(2) != kPanel || scale.shape(1) < 1 ||
      codes.shape(1) % scale.shape(1) != 0) {
    throw std::invalid_argument(op + ": coded matrix parts of mismatched shapes");
  }
  return {codes.shape(1), codes.shape(0) * kPanel};
}

// A stored weight read from a primitive's inputs: float32 values (one input), float16 values
// (one float16 input) or codes (three: codes, scale and bias, whose sizes along
// ``group_axis`` give the group).
class WeightInput {
 protected:
  WeightInput(const std::vector<mx::array>& in, size_t at, int parts, int group_axis) {
    if (parts == 1 && in[at].dtype() == mx::float16) {
      halves_.emplace(in[at]);
      return;
    }
    if (parts == 1) {
      values_.emplace(in[at]);
      return;
    }
    codes_.emplace(in[at]);
    scale_.emplace(in[at + 1]);
    bias_.emplace(in[at + 2]);
    group_ = in[at].shape(group_axis) / in[at + 1].shape(group_axis);
  }

  std::optional<RowMajor> values_, scale_, bias_;
  std::optional<RowMajorOf<int8_t>> codes_;
  std::optional<RowMajorOf<uint16_t>> halves_;
  int group_ = 0;
};

// A stored matrix [K, N] ([in, out]): float32, or float16 or codes in column panels (``Coded``).
class MatrixInput : WeightInput {
 public:
  MatrixInput(const std::vector<mx::array>& in, size_t at, int parts)
      : WeightInput(in, at, parts, 1) {}

  // y = x @ this for the first ``rows`` of ``tokens`` rows (the others zeros); p.w unused.
  void times(Product p, int tokens, int rows) const {
    if (values_) {
      p.w = values_->data();
      rows_times_in_out(p, tokens, rows);
    } else if (halves_) {
      panels_times_in_out(p, HalfPanels{halves_->data()}, tokens, rows);
    } else {
      panels_times_in_out(p, Coded{codes_->data(), scale_->data(), bias_->data(), group_},
                          tokens, rows);
    }
  }
};

// The [E, N, K] shape a stacked matrix argument stands for (stored [out, in]: routed experts),
// checking a coded one's parts (codes [E, N, K], scale and bias [E, N, K / group], the group a
// multiple of 16).
inline mx::Shape stack_shape(const MatrixArg& m, const std::string& op) {
  if (const auto* values = std::get_if<mx::array>(&m)) return values->shape();
  const auto& parts = std::get<std::vector<mx::array>>(m);
  const mx::array& codes = parts.at(0);
  if (parts.size() == 1) {  // float16 values [E, N, K]
    if (codes.ndim() != 3 || codes.shape(2) % 16 != 0) {
      throw std::invalid_argument(op + ": float16 experts are [E, N, K], K a multiple of 16");
    }
    return codes.shape();
  }
  const mx::array& scale = parts.at(1);
  if (codes.ndim() != 3 || scale.ndim() != 3 || scale.shape(0) != codes.shape(0) ||
      scale.shape(1) != codes.shape(1) || scale.shape(2) < 1 ||
      codes.shape(2) % scale.shape(2) != 0 || (codes.shape(2) / scale.shape(2)) % 16 != 0) {
    throw std::invalid_argument(op + ": coded expert parts of mismatched shapes");
  }
  return codes.shape();
}

// A stack of matrices [E, N, K] stored [out, in] (routed experts): float32, float16 or codes
// (``CodedRows``).
class StackInput : WeightInput {
 public:
  StackInput(const std::vector<mx::array>& in, size_t at, int parts)
      : WeightInput(in, at, parts, 2) {}

  // y[r] = W_e x[r] for ``count`` rows, W_e [n, k] (out_in_times_rows).
  void times_rows(size_t e, const float* const* x, float* const* y, int count, int n,
                  int k) const {
    if (values_) {
      out_in_times_rows(values_->data() + e * n * static_cast<size_t>(k), x, y, count, n, k);
    } else if (halves_) {
      stack_times_rows(HalfRows{halves_->data()}, e, x, y, count, n, k);
    } else {
      stack_times_rows(CodedRows{codes_->data(), scale_->data(), bias_->data(), group_}, e, x,
                       y, count, n, k);
    }
  }
};

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
