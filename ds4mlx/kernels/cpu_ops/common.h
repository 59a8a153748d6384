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

// Rows of a decode or verify tile (kernels.ROWS_LINEAR_MAX): up to these, a product takes one
// chain of multiply-adds per value, so a row's bits never depend on the other rows.
constexpr int kTileRows = 8;

// The columns of a coded or float16 matrix are stored in panels this wide (``Coded``).
constexpr int kPanel = 64;

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

// One vector register of float lanes, for the products' register blocks: kLanes floats, of
// which the CPU has kVectorRegisters. A block's sums must all stay in registers across the
// k loop: blocks sized for AVX-512's 32 registers of 16 floats (6 rows x 64 columns) need 48 of
// AVX2's 16 registers of 8, and the spills made a verify pass's extra rows cost 3-4x what they
// do in registers. Every lane operation is madd's (fused where the CPU fuses), so a value's
// bits do not depend on the vector width nor on the block it falls in.
#if defined(__AVX512F__)
using FloatVec = __m512;
constexpr int kLanes = 16;
constexpr int kVectorRegisters = 32;
inline FloatVec vec_zero() { return _mm512_setzero_ps(); }
inline FloatVec vec_load(const float* a) { return _mm512_loadu_ps(a); }
inline FloatVec vec_splat(float a) { return _mm512_set1_ps(a); }
inline FloatVec vec_madd(FloatVec a, FloatVec b, FloatVec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vec_store(float* out, FloatVec v) { _mm512_storeu_ps(out, v); }
// scale * code + bias per lane, the multiply and the add rounded apart (as the load-time check
// computed the values), for kLanes codes.
inline FloatVec vec_coded(const int8_t* codes, FloatVec scale, FloatVec bias) {
  const __m512 q = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
  return _mm512_add_ps(_mm512_mul_ps(scale, q), bias);
}
#elif defined(__AVX2__) && defined(__FMA__)
using FloatVec = __m256;
constexpr int kLanes = 8;
constexpr int kVectorRegisters = 16;
inline FloatVec vec_zero() { return _mm256_setzero_ps(); }
inline FloatVec vec_load(const float* a) { return _mm256_loadu_ps(a); }
inline FloatVec vec_splat(float a) { return _mm256_set1_ps(a); }
inline FloatVec vec_madd(FloatVec a, FloatVec b, FloatVec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vec_store(float* out, FloatVec v) { _mm256_storeu_ps(out, v); }
inline FloatVec vec_coded(const int8_t* codes, FloatVec scale, FloatVec bias) {
  const __m256 q = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
  return _mm256_add_ps(_mm256_mul_ps(scale, q), bias);
}
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
using FloatVec = float32x4_t;
constexpr int kLanes = 4;
constexpr int kVectorRegisters = 32;
inline FloatVec vec_zero() { return vdupq_n_f32(0.0f); }
inline FloatVec vec_load(const float* a) { return vld1q_f32(a); }
inline FloatVec vec_splat(float a) { return vdupq_n_f32(a); }
inline FloatVec vec_madd(FloatVec a, FloatVec b, FloatVec c) { return vfmaq_f32(c, a, b); }
inline void vec_store(float* out, FloatVec v) { vst1q_f32(out, v); }
inline FloatVec vec_coded(const int8_t* codes, FloatVec scale, FloatVec bias) {
  int32_t four;  // this vector's four codes, as the low half of eight
  std::memcpy(&four, codes, sizeof four);
  const int8x8_t eight = vreinterpret_s8_s32(vdup_n_s32(four));
  const int32x4_t q = vmovl_s16(vget_low_s16(vmovl_s8(eight)));
  return vaddq_f32(vmulq_f32(scale, vcvtq_f32_s32(q)), bias);
}
#else
struct FloatVec {
  float lane[8];
};
constexpr int kLanes = 8;
constexpr int kVectorRegisters = 16;
inline FloatVec vec_zero() { return {}; }
inline FloatVec vec_load(const float* a) {
  FloatVec v;
  std::copy(a, a + kLanes, v.lane);
  return v;
}
inline FloatVec vec_splat(float a) {
  FloatVec v;
  std::fill(v.lane, v.lane + kLanes, a);
  return v;
}
inline FloatVec vec_madd(FloatVec a, FloatVec b, FloatVec c) {
  for (int l = 0; l < kLanes; l++) c.lane[l] = madd(a.lane[l], b.lane[l], c.lane[l]);
  return c;
}
inline void vec_store(float* out, FloatVec v) { std::copy(v.lane, v.lane + kLanes, out); }
inline FloatVec vec_coded(const int8_t* codes, FloatVec scale, FloatVec bias) {
  FloatVec v;
  for (int l = 0; l < kLanes; l++) {
    v.lane[l] = scale.lane[l] * static_cast<float>(codes[l]) + bias.lane[l];
  }
  return v;
}
#endif

inline FloatVec vec_halves(const uint16_t* halves) {
  float values[kLanes];
  halves_to_floats(halves, values, kLanes);
  return vec_load(values);
}

// The columns of a matrix [K, N] (stored [in, out]) as a product reads them, row k after row k:
// ``rows()`` is a cursor at row 0 whose ``load(j)`` is the vector of the row's values at columns
// [j, j + kLanes) and ``next()`` moves it to the next row (no division per row: a coded
// matrix's scale row changes every ``group`` rows). ``padded``: N is stored rounded up to whole
// panels, so a vector past the last column reads stored padding (computed, never written);
// otherwise the columns past the last whole vector take the scalar tail (``value``).

// float32 values.
struct DenseColumns {
  static constexpr bool padded = false;
  const float* w;
  int n;

  struct Rows {
    const float* row;
    size_t n;
    FloatVec load(int j) const { return vec_load(row + j); }
    void next() { row += n; }
  };
  Rows rows() const { return {w, static_cast<size_t>(n)}; }
  float value(int k, int j) const { return w[static_cast<size_t>(k) * n + j]; }
};

// Values scale * code + bias (a GGUF quant's blocks, re-laid out at load: kernels.RowCodes):
// codes [N / kPanel, K, kPanel] int8 and scale and bias [N / kPanel, K / group, kPanel], a scale
// and a bias per ``group`` consecutive k (the quant's sub-block). A quarter of float32's bytes,
// and each column panel is read front to back (a float32 [K, N] column block is read in short
// runs a row apart, one page each on a wide matrix): decode and verify tiles are bound by these
// reads.
struct Coded {
  static constexpr bool padded = true;
  const int8_t* codes;
  const float* scale;
  const float* bias;
  int group;
  int k_dim;

  struct Rows {
    const int8_t* codes;
    const float* scale;
    const float* bias;
    size_t codes_panel, scales_panel;  // the strides from one column panel to the next
    int group, in_group = 0;
    FloatVec load(int j) const {
      const size_t panel = j / kPanel, lane = j % kPanel;
      const size_t at = panel * scales_panel + lane;
      return vec_coded(codes + panel * codes_panel + lane, vec_load(scale + at),
                       vec_load(bias + at));
    }
    void next() {
      codes += kPanel;
      if (++in_group == group) {
        in_group = 0;
        scale += kPanel;
        bias += kPanel;
      }
    }
  };
  Rows rows() const {
    return {codes, scale, bias, static_cast<size_t>(k_dim) * kPanel,
            static_cast<size_t>(k_dim / group) * kPanel, group};
  }
};

// float16 values (a GGUF F16 tensor) in the panels of Coded's codes, at half float32's bytes,
// decoded exactly.
struct HalfPanels {
  static constexpr bool padded = true;
  const uint16_t* halves;
  int k_dim;

  struct Rows {
    const uint16_t* row;
    size_t panel_stride;
    FloatVec load(int j) const { return vec_halves(row + j / kPanel * panel_stride + j % kPanel); }
    void next() { row += kPanel; }
  };
  Rows rows() const { return {halves, static_cast<size_t>(k_dim) * kPanel}; }
};

// Rows [r0, r0 + kGroup) x columns [j0, j0 + kVecs * kLanes) of x @ w: each k's vectors are
// loaded (decoded) once for the rows, and the sums stay in registers across the whole k loop,
// each element one chain of madd over k in order from zero. Columns from ``written`` on are
// computed and not stored (a padded panel's).
template <int kGroup, int kVecs, typename Columns>
void product_block(const Product& p, const Columns& w, int r0, int j0, int written) {
  FloatVec acc[kGroup][kVecs];
  for (int r = 0; r < kGroup; r++) {
    for (int v = 0; v < kVecs; v++) acc[r][v] = vec_zero();
  }
  auto rows = w.rows();
  for (int k = 0; k < p.k; k++, rows.next()) {
    FloatVec wk[kVecs];
    for (int v = 0; v < kVecs; v++) wk[v] = rows.load(j0 + v * kLanes);
    for (int r = 0; r < kGroup; r++) {
      const FloatVec xv = vec_splat(p.x[(r0 + r) * p.x_stride + k]);
      for (int v = 0; v < kVecs; v++) acc[r][v] = vec_madd(xv, wk[v], acc[r][v]);
    }
  }
  for (int r = 0; r < kGroup; r++) {
    float* y = p.y + (r0 + r) * p.y_stride + j0;
    for (int v = 0; v < kVecs; v++) {
      if ((v + 1) * kLanes <= written) {
        vec_store(y + v * kLanes, acc[r][v]);
      } else if (v * kLanes < written) {
        float lanes[kLanes];
        vec_store(lanes, acc[r][v]);
        std::copy(lanes, lanes + (written - v * kLanes), y + v * kLanes);
      }
    }
  }
}

// Vectors per block for kGroup rows: as many as keep the block's sums, its loaded (decoded)
// vectors and a row's x in registers, at most 8 (AVX2: 7, 5, 3, 3, 2, 2 for 1-6 rows; AVX-512:
// 8, 8, 7, 6, 5, 4). One more spilled a sum to memory, reloaded and stored at every k.
template <int kGroup>
constexpr int kBlockVecs = std::max(1, std::min(8, (kVectorRegisters - 1) / (kGroup + 1)));

// Rows [r0, r0 + kGroup) of x @ w over all columns: whole blocks, then single vectors, then
// (unpadded columns) one column at a time with the same chain per element.
template <int kGroup, typename Columns>
void product_group(const Product& p, const Columns& w, int r0) {
  constexpr int kWidth = kBlockVecs<kGroup> * kLanes;
  int j0 = 0;
  for (; j0 + kWidth <= p.n; j0 += kWidth) product_block<kGroup, kBlockVecs<kGroup>>(p, w, r0, j0, kWidth);
  for (; j0 + kLanes <= p.n; j0 += kLanes) product_block<kGroup, 1>(p, w, r0, j0, kLanes);
  if (j0 == p.n) return;
  if constexpr (Columns::padded) {
    product_block<kGroup, 1>(p, w, r0, j0, p.n - j0);
  } else {
    for (int r = r0; r < r0 + kGroup; r++) {
      for (int j = j0; j < p.n; j++) {
        float acc = 0.0f;
        for (int k = 0; k < p.k; k++) acc = madd(p.x[r * p.x_stride + k], w.value(k, j), acc);
        p.y[r * p.y_stride + j] = acc;
      }
    }
  }
}

// y[r, :] = x[r, :] @ w for rows r < rows of x, and y[r, :] = 0 for the rest of the tokens.
// Each output element is one chain of multiply-adds over k in order, whatever the row count or
// the block it falls in: a row's bits never depend on the other rows of the call. (A BLAS GEMM
// changes kernel and blocking with the row count, which is why decode tiles had a fixed number
// of rows; and it computed every padding row of a one-token tile.) Rows go up to six at a time
// (a verify pass's six rows read each weight once).
template <typename Columns>
void product_rows(const Product& p, const Columns& w, int tokens, int rows) {
  for (int r = rows; r < tokens; r++) std::fill(p.y + r * p.y_stride, p.y + r * p.y_stride + p.n, 0.0f);
  int r0 = 0;
  for (; r0 + 6 <= rows; r0 += 6) product_group<6>(p, w, r0);
  switch (rows - r0) {
    case 5: product_group<5>(p, w, r0); break;
    case 4: product_group<4>(p, w, r0); break;
    case 3: product_group<3>(p, w, r0); break;
    case 2: product_group<2>(p, w, r0); break;
    case 1: product_group<1>(p, w, r0); break;
    default: break;
  }
}

// product_rows with w [K, N] float32 (p.w).
inline void rows_times_in_out(const Product& p, int tokens, int rows) {
  product_rows(p, DenseColumns{p.w, p.n}, tokens, rows);
}

// Sixteen partial sums, lane l accumulating madd(a[l], b[l], lane) for blocks of 16 floats:
// 16 / kLanes FloatVecs (one AVX-512 register, two AVX2 or four NEON ones, else arrays), so the
// same fused multiply-adds as madd in every case and the same bits. In vector registers
// because the compiler's own vectorisation of such loops is not reliable: in dot4 it left one
// of the four sums scalar.
class Lanes16 {
 public:
  Lanes16() {
    for (auto& v : v_) v = vec_zero();
  }

  void madd_block(const float* __restrict a, const float* __restrict b) {
    for (int v = 0; v < kVecs; v++) {
      v_[v] = vec_madd(vec_load(a + v * kLanes), vec_load(b + v * kLanes), v_[v]);
    }
  }

  // madd_block with a = scale * code + bias for 16 int8 codes (a coded row's values: the
  // multiply and the add rounded apart, as the load-time check computed them).
  void madd_coded_block(const int8_t* __restrict codes, float scale, float bias,
                        const float* __restrict b) {
    const FloatVec s = vec_splat(scale), o = vec_splat(bias);
    for (int v = 0; v < kVecs; v++) {
      v_[v] = vec_madd(vec_coded(codes + v * kLanes, s, o), vec_load(b + v * kLanes), v_[v]);
    }
  }

  // madd_block with a = the floats of 16 half values (exact).
  void madd_half_block(const uint16_t* __restrict halves, const float* __restrict b) {
    for (int v = 0; v < kVecs; v++) {
      v_[v] = vec_madd(vec_halves(halves + v * kLanes), vec_load(b + v * kLanes), v_[v]);
    }
  }

  // The lanes added in order, from zero.
  float sum() const {
    float lanes[16];
    for (int v = 0; v < kVecs; v++) vec_store(lanes + v * kLanes, v_[v]);
    float total = 0.0f;
    for (int l = 0; l < 16; l++) total += lanes[l];
    return total;
  }

 private:
  static constexpr int kVecs = 16 / kLanes;
  FloatVec v_[kVecs];
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

  // Row ``row``'s K values into out, as madd_coded_block computes them.
  void decode(size_t row, int k_dim, float* __restrict out) const {
    const int8_t* __restrict q = codes + row * k_dim;
    const float* __restrict s = scale + row * (k_dim / group);
    const float* __restrict o = bias + row * (k_dim / group);
    for (int g = 0; g < k_dim / group; g++) {
      const FloatVec group_scale = vec_splat(s[g]), group_bias = vec_splat(o[g]);
      for (int i = g * group; i < (g + 1) * group; i += kLanes) {
        vec_store(out + i, vec_coded(q + i, group_scale, group_bias));
      }
    }
  }
};

// A stack of float16 matrices [E, N, K] (GGUF F16 experts; K a multiple of 16), decoded exactly.
struct HalfRows {
  const uint16_t* halves;

  void madd(Lanes16& lanes, size_t row, int i, int k_dim, const float* __restrict x) const {
    lanes.madd_half_block(halves + row * k_dim + i, x);
  }

  void decode(size_t row, int k_dim, float* __restrict out) const {
    halves_to_floats(halves + row * k_dim, out, k_dim);
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
// values, so the same bits, reading a quarter or a half of the bytes. One input row decodes in
// its dot products; several (verify rows that chose the same expert) share each four weight
// rows decoded once into float32 (``Rows::decode``, L1-resident), as a float32 stack's rows
// are read: decoding costs more than the multiply-adds it feeds.
template <typename Rows>
void stack_times_rows(const Rows& m, size_t e, const float* const* x, float* const* y, int count,
                      int n, int k_dim) {
  const size_t first = e * n;
  int j = 0;
  if (count == 1) {
    for (; j + 4 <= n; j += 4) stack_dots<4>(m, first + j, k_dim, x[0], y[0] + j);
  } else {
    std::vector<float> decoded(static_cast<size_t>(4) * k_dim);
    const float* block[4];
    for (int b = 0; b < 4; b++) block[b] = decoded.data() + static_cast<size_t>(b) * k_dim;
    for (; j + 4 <= n; j += 4) {
      for (int b = 0; b < 4; b++) m.decode(first + j + b, k_dim, decoded.data() + static_cast<size_t>(b) * k_dim);
      for (int r = 0; r < count; r++) dot4(block, x[r], k_dim, y[r] + j);
    }
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
      product_rows(p, HalfPanels{halves_->data(), p.k}, tokens, rows);
    } else {
      product_rows(p, Coded{codes_->data(), scale_->data(), bias_->data(), group_, p.k}, tokens,
                   rows);
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
