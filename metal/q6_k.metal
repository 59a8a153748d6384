// GGML Q6_K: 256 values in 210 bytes = 16 sub-blocks of 16 values.
// Layout: ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] (int8) | d.
// Value e = half*128 + quarter*32 + l (half 0..1, quarter 0..3, l 0..31): low bits are nibble
// (quarter / 2) of ql[half*64 + (quarter % 2)*32 + l], high bits are bits [2*quarter, 2*quarter + 2)
// of qh[half*32 + l]; value = d * scales[e / 16] * (q - 32).
// Part p (half p / 4, l0 = 8 * (p % 4)) holds l = l0 .. l0 + 8 of every quarter: 8 bytes of ql
// for quarters 0 and 2, 8 for quarters 1 and 3, 8 of qh; its sub-blocks are
// half*8 + l0/16 + 2*quarter. Blocks are only 2-byte aligned: 2-byte loads. Lane `part` also
// reads scale pair `part` (scales[2*part], scales[2*part + 1]), lane 0 also d; the others get
// them by simd_shuffle, so every byte of a block is read once.

constant constexpr uint DS4_BLOCK_VALUES = 256;
constant constexpr uint DS4_BLOCK_BYTES = 210;
constant constexpr uint DS4_TABLE_WORDS = 0;

struct ds4_codes {
  uint low_even[2];  // ql bytes of quarters 0 and 2 (low and high nibble)
  uint low_odd[2];   // ql bytes of quarters 1 and 3
  uint high[2];      // qh bytes
  uint scales;       // byte `quarter`: the int8 scale of the quarter's sub-block
  float d;
};

inline ds4_codes ds4_load_codes(const device uint8_t* block, uint lane, bool active) {
  const uint part = lane % 8;
  const uint half_index = part / 4;
  const uint l0 = 8 * (part % 4);
  const device uint8_t* low = block + half_index * 64 + l0;
  const device uint8_t* high = block + 128 + half_index * 32 + l0;
  ds4_codes c;
  uint shared = 0;  // low half: scale pair `part`; high half (part 0): d
  for (uint w = 0; w < 2; ++w) {
    c.low_even[w] = active ? ds4_load_u32(low + 4 * w) : 0;
    c.low_odd[w] = active ? ds4_load_u32(low + 32 + 4 * w) : 0;
    c.high[w] = active ? ds4_load_u32(high + 4 * w) : 0;
  }
  if (active) {
    const device ushort* halves = (const device ushort*)(block + 192);
    shared = halves[part] | (part == 0 ? uint(halves[8]) << 16 : 0);
  }
  // The quarter's scale is byte l0/16 of pair half*4 + quarter.
  const uint first_lane = ds4_block_lane(lane);
  const uint shift = 8 * (l0 / 16);
  c.scales = 0;
  for (uint quarter = 0; quarter < 4; ++quarter) {
    const uint pair = metal::simd_shuffle(shared, first_lane + half_index * 4 + quarter);
    c.scales |= ((pair >> shift) & 0xFF) << (8 * quarter);
  }
  c.d = ds4_half(metal::simd_shuffle(shared, first_lane) >> 16);
  return c;
}

inline uint ds4_part_value(uint part, uint i) {
  return (part / 4) * 128 + (i / 8) * 32 + 8 * (part % 4) + i % 8;
}

template <typename Tables>
inline float ds4_codes_dot(ds4_codes c, thread const float* x, thread const float* x_sums, Tables) {
  float total = 0.0f;
  for (uint quarter = 0; quarter < 4; ++quarter) {
    const thread uint* low = quarter % 2 ? c.low_odd : c.low_even;
    const uint low_shift = 4 * (quarter / 2);
    float dot = 0.0f;
    for (uint i = 0; i < 8; ++i) {
      const uint q = ((ds4_byte(low[0], low[1], i) >> low_shift) & 0xF) |
                     (((ds4_byte(c.high[0], c.high[1], i) >> (2 * quarter)) & 3) << 4);
      dot += float(q) * x[quarter * 8 + i];
    }
    // (q - 32) * x summed = sum q * x - 32 * sum x: the offset once per 8 values.
    const float scale = float(as_type<int8_t>(uint8_t((c.scales >> (8 * quarter)) & 0xFF)));
    total += scale * (dot - 32.0f * x_sums[quarter]);
  }
  return c.d * total;
}
