// GGUF blocks decoded where they lie: each format's row of blocks into float32 values, one row
// at a time, into a buffer the size of one row (in the L1/L2 cache), never the whole matrix.
// The primitives in quant_blocks.cpp take their dot products on such a row while it is hot.
//
// The arithmetic per value is the gguf package's (gguf.quants ``dequantize_blocks``) and the
// twins' (kernels/twins.py) in float32: scale products first, then the code, the same roundings,
// so a row decodes to the reference's values (tests/kernels/test_kernel_gguf_blocks.py).

#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "iq2_tables.h"

namespace ds4mlx_ops {

// GGML type ids (gguf.GGMLQuantizationType) of the formats decoded here.
enum class BlockType : int {
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ4_K = 12,
  kQ6_K = 14,
  kIQ2_XXS = 16,
  kBF16 = 30,
  kMXFP4 = 39,
};

// A format's (values a block, bytes a block).
struct BlockShape {
  int values;
  int bytes;
};

inline BlockShape block_shape(int type) {
  switch (static_cast<BlockType>(type)) {
    case BlockType::kF16: return {1, 2};
    case BlockType::kBF16: return {1, 2};
    case BlockType::kQ4_0: return {32, 18};
    case BlockType::kQ8_0: return {32, 34};
    case BlockType::kMXFP4: return {32, 17};
    case BlockType::kQ2_K: return {256, 84};
    case BlockType::kQ4_K: return {256, 144};
    case BlockType::kQ6_K: return {256, 210};
    case BlockType::kIQ2_XXS: return {256, 66};
  }
  throw std::invalid_argument("GGUF blocks: no CPU kernel for GGML type " + std::to_string(type));
}

// The little-endian float16 at p, as float32 (exact; one instruction with F16C).
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return half_to_float(h);
#endif
}

inline void decode_q8_0(const uint8_t* __restrict b, float* __restrict out) {
  const float d = f16_at(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; i++) out[i] = d * static_cast<float>(q[i]);
}

// d | 16 bytes: value i is the low nibble of byte i, value 16 + i its high nibble, minus 8.
inline void decode_q4_0(const uint8_t* __restrict b, float* __restrict out) {
  const float d = f16_at(b);
  const uint8_t* q = b + 2;
  for (int i = 0; i < 16; i++) {
    out[i] = d * static_cast<float>(static_cast<int>(q[i] & 0xF) - 8);
    out[16 + i] = d * static_cast<float>(static_cast<int>(q[i] >> 4) - 8);
  }
}

// e8m0 exponent e | 16 bytes of e2m1 nibbles (as Q4_0's), value = kvalue * 2^(e - 128)
// (the doubled e2m1 values times half the block scale).
inline void decode_mxfp4(const uint8_t* __restrict b, float* __restrict out) {
  static constexpr float kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const uint32_t e = b[0];
  const uint32_t bits = e < 2 ? (0x00200000u << e) : ((e - 1) << 23);
  float d;
  std::memcpy(&d, &bits, 4);
  const uint8_t* q = b + 1;
  for (int i = 0; i < 16; i++) {
    out[i] = d * kValues[q[i] & 0xF];
    out[16 + i] = d * kValues[q[i] >> 4];
  }
}

// scales[16] | qs[64] | d | dmin (twins._decode_q2_k): value half*128 + pass*32 + l is bits
// [2 pass, 2 pass + 2) of qs[half*32 + l]; sub-block s of 16 takes d*(scales[s] & 15) and
// dmin*(scales[s] >> 4). The codes are unpacked first (byte-wide loops the compiler
// vectorises), then scaled sixteen at a time.
inline void decode_q2_k(const uint8_t* __restrict b, float* __restrict out) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  uint8_t codes[256];
  for (int half = 0; half < 2; half++) {
    for (int pass = 0; pass < 4; pass++) {
      for (int l = 0; l < 32; l++) codes[half * 128 + pass * 32 + l] = (qs[half * 32 + l] >> (2 * pass)) & 3;
    }
  }
  for (int s = 0; s < 16; s++) {
    const float scale = d * static_cast<float>(scales[s] & 0xF);
    const float low = dmin * static_cast<float>(scales[s] >> 4);
    for (int l = 0; l < 16; l++) out[s * 16 + l] = scale * static_cast<float>(codes[s * 16 + l]) - low;
  }
}

// d | dmin | scales[12] (eight 6-bit scales and mins) | qs[128]: 64 values per pair of
// sub-blocks, the low nibbles of 32 bytes then their high nibbles; value = d*sc*q - dmin*m.
inline void decode_q4_k(const uint8_t* __restrict b, float* __restrict out) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qs = b + 16;
  auto scale_min = [sc](int j, float& scale, float& low, float d_, float dmin_) {
    int s, m;
    if (j < 4) {
      s = sc[j] & 63;
      m = sc[j + 4] & 63;
    } else {
      s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
      m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
    scale = d_ * static_cast<float>(s);
    low = dmin_ * static_cast<float>(m);
  };
  for (int pair = 0; pair < 4; pair++) {
    float s0, m0, s1, m1;
    scale_min(2 * pair, s0, m0, d, dmin);
    scale_min(2 * pair + 1, s1, m1, d, dmin);
    const uint8_t* q = qs + pair * 32;
    float* o = out + pair * 64;
    for (int l = 0; l < 32; l++) {
      o[l] = s0 * static_cast<float>(q[l] & 0xF) - m0;
      o[32 + l] = s1 * static_cast<float>(q[l] >> 4) - m1;
    }
  }
}

// ql[128] | qh[64] | scales[16] (int8) | d (twins._decode_q6_k): value half*128 + quarter*32 + l
// takes nibble quarter / 2 of ql[half*64 + (quarter % 2)*32 + l] and bits [2 quarter,
// 2 quarter + 2) of qh[half*32 + l]; value = d * scales[sub-block of 16] * (q - 32).
inline void decode_q6_k(const uint8_t* __restrict b, float* __restrict out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int half = 0; half < 2; half++) {
    for (int quarter = 0; quarter < 4; quarter++) {
      for (int sub = 0; sub < 2; sub++) {
        const int first = half * 128 + quarter * 32 + sub * 16;
        const float scale = d * static_cast<float>(scales[first / 16]);
        const uint8_t* low = ql + half * 64 + (quarter % 2) * 32 + sub * 16;
        const uint8_t* high = qh + half * 32 + sub * 16;
        const int shift = 4 * (quarter / 2);
        for (int l = 0; l < 16; l++) {
          const int q = ((low[l] >> shift) & 0xF) | (((high[l] >> (2 * quarter)) & 3) << 4);
          out[first + l] = scale * static_cast<float>(q - 32);
        }
      }
    }
  }
}

// IQ2_XXS's grid rows and sign patterns as floats (the sign of value j: -1 where bit j is set),
// so that a row of eight decodes as two vectorised multiplies.
struct Iq2xxsFloatTables {
  float grid[256][8];
  float signs[128][8];

  Iq2xxsFloatTables() {
    for (int r = 0; r < 256; r++) {
      for (int j = 0; j < 8; j++) grid[r][j] = static_cast<float>(kIq2xxsGrid[r][j]);
    }
    for (int r = 0; r < 128; r++) {
      for (int j = 0; j < 8; j++) signs[r][j] = (kIq2xxsSigns[r] >> j) & 1 ? -1.0f : 1.0f;
    }
  }
};

inline const Iq2xxsFloatTables& iq2xxs_float_tables() {
  static const Iq2xxsFloatTables tables;
  return tables;
}

// d | 8 sub-blocks of 32 values in 8 bytes (twins._decode_iq2_xxs): bytes 0-3 pick four grid
// rows, bytes 4-7 a uint32 whose four 7-bit fields pick each row's signs and whose top 4 bits
// are the scale: value = d * (0.5 + scale) * 0.25 * grid * sign.
inline void decode_iq2_xxs(const uint8_t* __restrict b, float* __restrict out) {
  const Iq2xxsFloatTables& tables = iq2xxs_float_tables();
  const float d = f16_at(b);
  for (int sub = 0; sub < 8; sub++) {
    const uint8_t* p = b + 2 + sub * 8;
    uint32_t packed;
    std::memcpy(&packed, p + 4, 4);
    const float db = d * (0.5f + static_cast<float>(packed >> 28)) * 0.25f;
    for (int row = 0; row < 4; row++) {
      const float* __restrict grid = tables.grid[p[row]];
      const float* __restrict signs = tables.signs[(packed >> (7 * row)) & 0x7F];
      float* __restrict o = out + sub * 32 + row * 8;
      for (int j = 0; j < 8; j++) o[j] = db * grid[j] * signs[j];
    }
  }
}

inline void decode_bf16_values(const uint8_t* __restrict b, float* __restrict out, int n) {
  for (int i = 0; i < n; i++) {
    uint16_t h;
    std::memcpy(&h, b + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    std::memcpy(out + i, &bits, 4);
  }
}

// ``n`` values as int8 codes, llama.cpp's rounding of the input for its integer dot products:
// scale d = amax / 127, code = nearest(value / d); returns d (value ~ d * code).
inline float quantize_block(const float* v, int8_t* out, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = std::max(amax, std::fabs(v[i]));
  const float d = amax / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; i++) out[i] = static_cast<int8_t>(std::nearbyint(v[i] * inverse));
  return d;
}

// An input row in integer form for a weight format's integer dot products: int8 codes with one
// scale per ``kBlock`` values; Q8_0 weights take 32-value blocks (llama.cpp's q8_0), Q2_K and
// IQ2_XXS 256-value ones (its q8_K), which also keep each 16 codes' sum (Q2_K's minimums
// multiply those instead of every code).
template <int kBlock>
struct QuantizedRow {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> sums16;

  void quantize(const float* x, int k) {
    codes.resize(k);
    scales.resize(k / kBlock);
    for (int b = 0; b < k / kBlock; b++) {
      scales[b] = quantize_block(x + b * kBlock, codes.data() + b * kBlock, kBlock);
    }
    if constexpr (kBlock == 256) {
      sums16.assign(k / 16, 0);
      for (int i = 0; i < k; i++) sums16[i / 16] += codes[i];
    }
  }
};

using Q8Row = QuantizedRow<32>;
using Q8KRow = QuantizedRow<256>;

// The values a weight of ``type`` multiplies in its integer dot products: 32 (Q8_0) or 256
// (Q2_K, IQ2_XXS) per scale; 0 for a format that takes float32 dot products.
inline int integer_dot_block(BlockType type) {
  switch (type) {
    case BlockType::kQ8_0: return 32;
    case BlockType::kQ2_K:
    case BlockType::kIQ2_XXS: return 256;
    default: return 0;
  }
}

// ``count`` rows of x (row stride x_stride, k values) as a weight's integer dot products see
// them, each value d * code (``QuantizedRow``, ``block`` values a scale), into out [count, k]:
// a BLAS product (prefill) then sums the same terms as the integer dot products (decode), so
// the paths agree up to summation order.
inline void round_rows_to_q8(const float* x, size_t x_stride, int count, int k, int block,
                             float* out) {
  std::vector<int8_t> codes(block);
  for (int r = 0; r < count; r++) {
    for (int b = 0; b < k / block; b++) {
      const float d = quantize_block(x + r * x_stride + b * block, codes.data(), block);
      float* o = out + static_cast<size_t>(r) * k + b * block;
      for (int i = 0; i < block; i++) o[i] = d * static_cast<float>(codes[i]);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The sum over a 32-value block of int8 products a[i] * b[i], as eight int32 partial sums
// (AVX2: |a| times b with a's signs, pairs summed to int16 then to int32; exact).
inline __m256i q8_block_products(const int8_t* a, const int8_t* b) {
  const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(va, va), _mm256_sign_epi8(vb, va));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// The eight lanes of ``acc`` added in a fixed order.
inline float lanes_sum(__m256 acc) {
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}
#endif

// A Q8_0 weight row (k values) times an input row in Q8_0 form: per block the integer sum
// times both scales, accumulated in a fixed order (so a row's bits depend on nothing else).
inline float q8_0_dot(const uint8_t* __restrict row, const Q8Row& x, int k) {
  const int n = k / 32;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < n; b++) {
    const uint8_t* block = row + static_cast<size_t>(b) * 34;
    const __m256i sums = q8_block_products(reinterpret_cast<const int8_t*>(block + 2),
                                           x.codes.data() + b * 32);
    const __m256 scale = _mm256_set1_ps(f16_at(block) * x.scales[b]);
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc);
  }
  return lanes_sum(acc);
#else
  float total = 0.0f;
  for (int b = 0; b < n; b++) {
    const uint8_t* block = row + static_cast<size_t>(b) * 34;
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
    int32_t sum = 0;
    for (int i = 0; i < 32; i++) sum += static_cast<int32_t>(q[i]) * x.codes[b * 32 + i];
    total = madd(f16_at(block) * x.scales[b], static_cast<float>(sum), total);
  }
  return total;
#endif
}

// IQ2_XXS's sign patterns as eight int8 factors (+1, or -1 where bit j is set) packed in a
// uint64, so that one load applies a grid row's signs to the input codes.
struct Iq2xxsSignFactors {
  uint64_t factors[128];

  Iq2xxsSignFactors() {
    for (int r = 0; r < 128; r++) {
      int8_t bytes[8];
      for (int j = 0; j < 8; j++) bytes[j] = (kIq2xxsSigns[r] >> j) & 1 ? -1 : 1;
      std::memcpy(&factors[r], bytes, 8);
    }
  }
};

inline const Iq2xxsSignFactors& iq2xxs_sign_factors() {
  static const Iq2xxsSignFactors table;
  return table;
}

// An IQ2_XXS weight row (k values) times an input row in q8_K form. Value = d * (2 scale + 1)
// / 8 * grid * sign (decode_iq2_xxs's d * (0.5 + scale) * 0.25), so a super-block's sum is an
// exact integer, sum over sub-blocks of (2 scale + 1) * sum(grid * sign * code), times both
// scales and 1/8, accumulated in a fixed order.
inline float iq2_xxs_dot(const uint8_t* __restrict row, const Q8KRow& x, int k) {
  const int n = k / 256;
  const uint64_t* signs = iq2xxs_sign_factors().factors;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < n; b++) {
    const uint8_t* block = row + static_cast<size_t>(b) * 66;
    const int8_t* q = x.codes.data() + b * 256;
    __m256i sums = _mm256_setzero_si256();
    for (int sub = 0; sub < 8; sub++) {
      const uint8_t* p = block + 2 + sub * 8;
      uint32_t packed;
      std::memcpy(&packed, p + 4, 4);
      uint64_t grid[4];
      for (int i = 0; i < 4; i++) std::memcpy(&grid[i], kIq2xxsGrid[p[i]], 8);
      const __m256i magnitudes = _mm256_set_epi64x(static_cast<int64_t>(grid[3]),
                                                   static_cast<int64_t>(grid[2]),
                                                   static_cast<int64_t>(grid[1]),
                                                   static_cast<int64_t>(grid[0]));
      const __m256i sign = _mm256_set_epi64x(static_cast<int64_t>(signs[(packed >> 21) & 127]),
                                             static_cast<int64_t>(signs[(packed >> 14) & 127]),
                                             static_cast<int64_t>(signs[(packed >> 7) & 127]),
                                             static_cast<int64_t>(signs[packed & 127]));
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + sub * 32));
      // magnitudes <= 43 and |codes| <= 127: a pair's sum fits int16 without saturating
      const __m256i pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(codes, sign));
      const __m256i scale = _mm256_set1_epi16(static_cast<int16_t>(2 * (packed >> 28) + 1));
      sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, scale));
    }
    const __m256 d = _mm256_set1_ps(f16_at(block) * x.scales[b]);
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc);
  }
  return lanes_sum(acc) * 0.125f;
#else
  float total = 0.0f;
  for (int b = 0; b < n; b++) {
    const uint8_t* block = row + static_cast<size_t>(b) * 66;
    const int8_t* q = x.codes.data() + b * 256;
    int32_t sum = 0;
    for (int sub = 0; sub < 8; sub++) {
      const uint8_t* p = block + 2 + sub * 8;
      uint32_t packed;
      std::memcpy(&packed, p + 4, 4);
      int32_t sub_sum = 0;
      for (int i = 0; i < 4; i++) {
        const uint8_t sign_bits = kIq2xxsSigns[(packed >> (7 * i)) & 127];
        for (int j = 0; j < 8; j++) {
          const int32_t term = kIq2xxsGrid[p[i]][j] * q[sub * 32 + i * 8 + j];
          sub_sum += (sign_bits >> j) & 1 ? -term : term;
        }
      }
      sum += static_cast<int32_t>(2 * (packed >> 28) + 1) * sub_sum;
    }
    total = madd(f16_at(block) * x.scales[b], static_cast<float>(sum), total);
  }
  return total * 0.125f;
#endif
}

// A Q2_K weight row (k values) times an input row in q8_K form. Value = d * (scale & 15) * q -
// dmin * (scale >> 4) per sub-block of 16 (decode_q2_k), so a super-block contributes
// d * sum(scale_s * codes . q) - dmin * sum(min_s * codes' sum), both integer sums exact, each
// times the input's scale; the two parts accumulate apart, in a fixed order.
inline float q2_k_dot(const uint8_t* __restrict row, const Q8KRow& x, int k) {
  const int n = k / 256;
  float minimums = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  const __m256i two_bits = _mm256_set1_epi8(3);
  for (int b = 0; b < n; b++) {
    const uint8_t* block = row + static_cast<size_t>(b) * 84;
    const int8_t* q = x.codes.data() + b * 256;
    __m256i sums = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + half * 32));
      for (int pass = 0; pass < 4; pass++) {
        const int first = half * 128 + pass * 32;  // values first..first+31: sub-blocks s, s + 1
        const int s = first / 16;
        const __m256i codes = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * pass), two_bits);
        const __m256i input = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + first));
        const __m256i pairs = _mm256_maddubs_epi16(codes, input);
        const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(block[s + 1] & 0xF),
                                               _mm_set1_epi16(block[s] & 0xF));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, scale));
      }
    }
    int32_t low = 0;
    for (int s = 0; s < 16; s++) low += (block[s] >> 4) * x.sums16[b * 16 + s];
    const float dx = x.scales[b];
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(block + 80) * dx), _mm256_cvtepi32_ps(sums), acc);
    minimums = madd(f16_at(block + 82) * dx, static_cast<float>(low), minimums);
  }
  return lanes_sum(acc) - minimums;
#else
  float total = 0.0f;
  for (int b = 0; b < n; b++) {
    const uint8_t* block = row + static_cast<size_t>(b) * 84;
    const uint8_t* qs = block + 16;
    const int8_t* q = x.codes.data() + b * 256;
    int32_t sum = 0, low = 0;
    for (int half = 0; half < 2; half++) {
      for (int pass = 0; pass < 4; pass++) {
        for (int l = 0; l < 32; l++) {
          const int i = half * 128 + pass * 32 + l;
          sum += (block[i / 16] & 0xF) * ((qs[half * 32 + l] >> (2 * pass)) & 3) * q[i];
        }
      }
    }
    for (int s = 0; s < 16; s++) low += (block[s] >> 4) * x.sums16[b * 16 + s];
    const float dx = x.scales[b];
    total = madd(f16_at(block + 80) * dx, static_cast<float>(sum), total);
    minimums = madd(f16_at(block + 82) * dx, static_cast<float>(low), minimums);
  }
  return total - minimums;
#endif
}

// A row of ``k`` values stored as blocks of one format, decoded whole into ``out``.
class RowDecoder {
 public:
  RowDecoder(int type, int k) : type_(static_cast<BlockType>(type)), k_(k) {
    const BlockShape shape = block_shape(type);
    if (k % shape.values != 0) {
      throw std::invalid_argument("GGUF blocks: a row of " + std::to_string(k) +
                                  " values is not whole blocks of " +
                                  std::to_string(shape.values));
    }
    row_bytes_ = static_cast<size_t>(k / shape.values) * shape.bytes;
  }

  size_t row_bytes() const { return row_bytes_; }
  int k() const { return k_; }

  void decode(const uint8_t* row, float* __restrict out) const {
    switch (type_) {
      case BlockType::kF16:
        halves_to_floats(reinterpret_cast<const uint16_t*>(row), out, k_);
        return;
      case BlockType::kBF16: decode_bf16_values(row, out, k_); return;
      case BlockType::kQ8_0: blocks<32, 34, decode_q8_0>(row, out); return;
      case BlockType::kQ4_0: blocks<32, 18, decode_q4_0>(row, out); return;
      case BlockType::kMXFP4: blocks<32, 17, decode_mxfp4>(row, out); return;
      case BlockType::kQ2_K: blocks<256, 84, decode_q2_k>(row, out); return;
      case BlockType::kQ4_K: blocks<256, 144, decode_q4_k>(row, out); return;
      case BlockType::kQ6_K: blocks<256, 210, decode_q6_k>(row, out); return;
      case BlockType::kIQ2_XXS: blocks<256, 66, decode_iq2_xxs>(row, out); return;
    }
  }

 private:
  // The format's block decoder is a template argument so that it is inlined into the loop.
  template <int kValues, int kBytes, void (*kDecode)(const uint8_t*, float*)>
  void blocks(const uint8_t* row, float* __restrict out) const {
    const int n = k_ / kValues;
    for (int i = 0; i < n; i++) kDecode(row + static_cast<size_t>(i) * kBytes, out + i * kValues);
  }

  BlockType type_;
  int k_;
  size_t row_bytes_ = 0;
};

}  // namespace ds4mlx_ops
