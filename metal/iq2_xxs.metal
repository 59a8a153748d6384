// GGML IQ2_XXS: 256 values in 66 bytes = d | 8 sub-blocks of 32 values in 8 bytes each.
// Sub-block bytes 0-3 each pick a row of the 256 x 8 grid (values 8, 25, 43); bytes 4-7 are a
// little-endian uint32 whose four low 7-bit fields pick each row's sign pattern from ksigns (bit j
// set: value j is negative) and whose top 4 bits are the scale:
// value = d * (0.5 + scale) * 0.25 * grid * sign.
// A part is a sub-block. Blocks are only 2-byte aligned: a lane reads its 8 bytes in four 2-byte
// loads; lane 0 of the block also reads d and passes it on by simd_shuffle.
// ds4_table_words (appended by ds4mlx/kernels/metal.py from gguf.quants.IQ2_XXS) is the grid,
// one row in two little-endian words, then ksigns, four bytes a word; the kernel copies it to
// threadgroup memory, so a lookup is no device load.

constant constexpr uint DS4_BLOCK_VALUES = 256;
constant constexpr uint DS4_BLOCK_BYTES = 66;
constant constexpr uint DS4_IQ2_XXS_GRID_WORDS = 256 * 2;
constant constexpr uint DS4_TABLE_WORDS = DS4_IQ2_XXS_GRID_WORDS + 128 / 4;

struct ds4_codes {
  uint grid_rows;  // byte r: grid row of values 8r .. 8r + 8
  uint packed;     // sign fields and scale
  float d;
};

inline ds4_codes ds4_load_codes(const device uint8_t* block, uint lane, bool active) {
  const uint part = lane % 8;
  ds4_codes c;
  c.grid_rows = active ? ds4_load_u32(block + 2 + 8 * part) : 0;
  c.packed = active ? ds4_load_u32(block + 6 + 8 * part) : 0;
  const uint d_bits = active && part == 0 ? uint(((const device ushort*)(block))[0]) : 0;
  c.d = ds4_half(metal::simd_shuffle(d_bits, ds4_block_lane(lane)));
  return c;
}

inline uint ds4_part_value(uint part, uint i) {
  return part * 32 + i;
}

template <typename Tables>
inline float ds4_codes_dot(ds4_codes c, thread const float* x, thread const float*, Tables tables) {
  float total = 0.0f;
  for (uint row = 0; row < 4; ++row) {
    const uint grid_row = (c.grid_rows >> (8 * row)) & 0xFF;
    const uint low = tables[2 * grid_row];
    const uint high = tables[2 * grid_row + 1];
    const uint sign_index = (c.packed >> (7 * row)) & 127;
    const uint signs = (tables[DS4_IQ2_XXS_GRID_WORDS + sign_index / 4] >> (8 * (sign_index % 4))) & 0xFF;
    for (uint j = 0; j < 8; ++j) {
      const float term = float(ds4_byte(low, high, j)) * x[row * 8 + j];
      total += ((signs >> j) & 1) ? -term : term;
    }
  }
  return c.d * (0.5f + float(c.packed >> 28)) * 0.25f * total;
}
