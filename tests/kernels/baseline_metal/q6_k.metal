// GGML Q6_K: 256 values in 210 bytes = 16 sub-blocks of 16 values.
// Layout: ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] (int8) | d.
// Value e = half*128 + quarter*32 + l (half 0..1, quarter 0..3, l 0..31): low bits are nibble
// (quarter / 2) of ql[half*64 + (quarter % 2)*32 + l], high bits are bits [2*quarter, 2*quarter + 2)
// of qh[half*32 + l]; value = d * scales[e / 16] * (q - 32).

constant constexpr uint DS4_BLOCK_VALUES = 256;
constant constexpr uint DS4_BLOCK_BYTES = 210;
constant constexpr uint DS4_SUBBLOCK_VALUES = 16;

template <typename Tables>
inline void ds4_decode_subblock(const device uint8_t* block, uint sub, Tables, thread float* out) {
  const float scale = ds4_half_at(block + 208) * float(as_type<int8_t>(block[192 + sub]));
  const uint half_index = sub / 8;
  const uint quarter = (sub % 8) / 2;
  const uint first = (sub % 2) * 16;
  const device uint8_t* low = block + half_index * 64 + (quarter % 2) * 32 + first;
  const device uint8_t* high = block + 128 + half_index * 32 + first;
  const uint low_shift = (quarter / 2) * 4;
  const uint high_shift = quarter * 2;
  for (uint j = 0; j < 16; ++j) {
    const int q = int(((low[j] >> low_shift) & 0xF) | (((high[j] >> high_shift) & 3) << 4)) - 32;
    out[j] = scale * float(q);
  }
}
