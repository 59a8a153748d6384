// GGML Q2_K: 256 values in 84 bytes = 16 sub-blocks of 16 values.
// Layout: scales[16] (low nibble: scale, high nibble: min) | qs[64] (2-bit codes) | d | dmin.
// Value e = half*128 + pass*32 + l (half 0..1, pass 0..3, l 0..31) is bits [2*pass, 2*pass + 2)
// of qs[half*32 + l]; its sub-block s = e / 16 gives value = d*(scales[s] & 15)*q - dmin*(scales[s] >> 4).
// Part p (half p / 4, l0 = 8 * (p % 4)) holds the 8 code bytes qs[half*32 + l0 ..] = 32 values
// (4 passes x 8), whose sub-blocks are half*8 + l0/16 + 2*pass. 84 is a multiple of 4, so a
// lane reads 4-byte words: its 2 words of codes, and one shared word (parts 0-3: scale word
// `part`, part 4: d | dmin) that the others get by simd_shuffle.

constant constexpr uint DS4_BLOCK_VALUES = 256;
constant constexpr uint DS4_BLOCK_BYTES = 84;
constant constexpr uint DS4_TABLE_WORDS = 0;

struct ds4_codes {
  uint codes[2];
  uint scales;  // byte `pass`: the packed scale | min of the pass's sub-block
  uint d_dmin;
};

inline ds4_codes ds4_load_codes(const device uint8_t* block, uint lane, bool active) {
  const device uint* words = (const device uint*)(block);
  const uint part = lane % 8;
  const uint half_index = part / 4;
  const uint l0 = 8 * (part % 4);
  ds4_codes c;
  c.codes[0] = 0;
  c.codes[1] = 0;
  uint shared = 0;
  if (active) {
    c.codes[0] = words[4 + (half_index * 32 + l0) / 4];
    c.codes[1] = words[4 + (half_index * 32 + l0) / 4 + 1];
    if (part < 4) {
      shared = words[part];
    } else if (part == 4) {
      shared = words[20];
    }
  }
  const uint first_lane = ds4_block_lane(lane);
  const uint low = metal::simd_shuffle(shared, first_lane + half_index * 2);
  const uint high = metal::simd_shuffle(shared, first_lane + half_index * 2 + 1);
  c.d_dmin = metal::simd_shuffle(shared, first_lane + 4);
  const uint first = l0 / 16;  // sub-block scales first, first + 2, first + 4, first + 6
  c.scales = ds4_byte(low, high, first) | (ds4_byte(low, high, first + 2) << 8) |
             (ds4_byte(low, high, first + 4) << 16) | (ds4_byte(low, high, first + 6) << 24);
  return c;
}

inline uint ds4_part_value(uint part, uint i) {
  return (part / 4) * 128 + (i / 8) * 32 + 8 * (part % 4) + i % 8;
}

template <typename Tables>
inline float ds4_codes_dot(ds4_codes c, thread const float* x, thread const float* x_sums, Tables) {
  float scaled = 0.0f;
  float minimums = 0.0f;
  for (uint pass = 0; pass < 4; ++pass) {
    float dot = 0.0f;
    for (uint i = 0; i < 8; ++i) {
      dot += float((ds4_byte(c.codes[0], c.codes[1], i) >> (2 * pass)) & 3) * x[pass * 8 + i];
    }
    const uint packed = (c.scales >> (8 * pass)) & 0xFF;
    scaled += float(packed & 0xF) * dot;
    minimums += float(packed >> 4) * x_sums[pass];
  }
  return ds4_half(c.d_dmin) * scaled - ds4_half(c.d_dmin >> 16) * minimums;
}
