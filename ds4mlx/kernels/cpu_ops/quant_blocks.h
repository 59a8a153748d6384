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

// The little-endian float16 at p, as float32 (exact).
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
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
// dmin*(scales[s] >> 4).
inline void decode_q2_k(const uint8_t* __restrict b, float* __restrict out) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int half = 0; half < 2; half++) {
    for (int pass = 0; pass < 4; pass++) {
      for (int sub = 0; sub < 2; sub++) {
        const int s = half * 8 + pass * 2 + sub;
        const float scale = d * static_cast<float>(scales[s] & 0xF);
        const float low = dmin * static_cast<float>(scales[s] >> 4);
        const uint8_t* q = qs + half * 32 + sub * 16;
        float* o = out + half * 128 + pass * 32 + sub * 16;
        for (int l = 0; l < 16; l++) o[l] = scale * static_cast<float>((q[l] >> (2 * pass)) & 3) - low;
      }
    }
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

// d | 8 sub-blocks of 32 values in 8 bytes (twins._decode_iq2_xxs): bytes 0-3 pick four grid
// rows, bytes 4-7 a uint32 whose four 7-bit fields pick each row's signs and whose top 4 bits
// are the scale: value = d * (0.5 + scale) * 0.25 * grid * sign.
inline void decode_iq2_xxs(const uint8_t* __restrict b, float* __restrict out) {
  const float d = f16_at(b);
  for (int sub = 0; sub < 8; sub++) {
    const uint8_t* p = b + 2 + sub * 8;
    uint32_t packed;
    std::memcpy(&packed, p + 4, 4);
    const float db = d * (0.5f + static_cast<float>(packed >> 28)) * 0.25f;
    for (int row = 0; row < 4; row++) {
      const uint8_t* grid = kIq2xxsGrid[p[row]];
      const uint8_t signs = kIq2xxsSigns[(packed >> (7 * row)) & 0x7F];
      float* o = out + sub * 32 + row * 8;
      for (int j = 0; j < 8; j++) {
        o[j] = db * static_cast<float>(grid[j]) * ((signs >> j) & 1 ? -1.0f : 1.0f);
      }
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
      case BlockType::kQ8_0: blocks(row, out, 32, 34, decode_q8_0); return;
      case BlockType::kQ4_0: blocks(row, out, 32, 18, decode_q4_0); return;
      case BlockType::kMXFP4: blocks(row, out, 32, 17, decode_mxfp4); return;
      case BlockType::kQ2_K: blocks(row, out, 256, 84, decode_q2_k); return;
      case BlockType::kQ4_K: blocks(row, out, 256, 144, decode_q4_k); return;
      case BlockType::kQ6_K: blocks(row, out, 256, 210, decode_q6_k); return;
      case BlockType::kIQ2_XXS: blocks(row, out, 256, 66, decode_iq2_xxs); return;
    }
  }

 private:
  template <typename Decode>
  void blocks(const uint8_t* row, float* __restrict out, int values, int bytes,
              Decode decode_block) const {
    const int n = k_ / values;
    for (int i = 0; i < n; i++) decode_block(row + static_cast<size_t>(i) * bytes, out + i * values);
  }

  BlockType type_;
  int k_;
  size_t row_bytes_ = 0;
};

}  // namespace ds4mlx_ops
