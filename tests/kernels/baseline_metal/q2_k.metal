// GGML Q2_K: 256 values in 84 bytes = 16 sub-blocks of 16 values.
// Layout: scales[16] (low nibble: scale, high nibble: min) | qs[64] (2-bit codes) | d | dmin.
// Value e = half*128 + pass*32 + l (half 0..1, pass 0..3, l 0..31) is bits [2*pass, 2*pass + 2)
// of qs[half*32 + l]; its sub-block s = e / 16 gives value = d*(scales[s] & 15)*q - dmin*(scales[s] >> 4).

constant constexpr uint DS4_BLOCK_VALUES = 256;
constant constexpr uint DS4_BLOCK_BYTES = 84;
constant constexpr uint DS4_SUBBLOCK_VALUES = 16;

template <typename Tables>
inline void ds4_decode_subblock(const device uint8_t* block, uint sub, Tables, thread float* out) {
  const uint8_t packed_scale = block[sub];
  const float scale = ds4_half_at(block + 80) * float(packed_scale & 0xF);
  const float minimum = ds4_half_at(block + 82) * float(packed_scale >> 4);
  const uint half_index = sub / 8;
  const uint pass = (sub % 8) / 2;
  const device uint8_t* codes = block + 16 + half_index * 32 + (sub % 2) * 16;
  for (uint j = 0; j < 16; ++j) {
    out[j] = scale * float((codes[j] >> (2 * pass)) & 3) - minimum;
  }
}
