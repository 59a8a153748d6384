// GGML IQ2_XXS: 256 values in 66 bytes = d | 8 sub-blocks of 32 values in 8 bytes each.
// Sub-block bytes 0-3 each pick a row of the 256 x 8 grid (values 8, 25, 43); bytes 4-7 are a
// little-endian uint32 whose four low 7-bit fields pick each row's sign pattern from ksigns (bit j
// set: value j is negative) and whose top 4 bits are the scale:
// value = d * (0.5 + scale) * 0.25 * grid * sign.
// `tables` is the grid (256 * 8 bytes) followed by ksigns (128 bytes), both from gguf.quants.IQ2_XXS.

constant constexpr uint DS4_BLOCK_VALUES = 256;
constant constexpr uint DS4_BLOCK_BYTES = 66;
constant constexpr uint DS4_SUBBLOCK_VALUES = 32;
constant constexpr uint DS4_IQ2_XXS_GRID_BYTES = 256 * 8;

template <typename Tables>
inline void ds4_decode_subblock(const device uint8_t* block, uint sub, Tables tables, thread float* out) {
  const device uint8_t* sub_block = block + 2 + 8 * sub;
  const uint packed = uint(sub_block[4]) | (uint(sub_block[5]) << 8) | (uint(sub_block[6]) << 16) |
                      (uint(sub_block[7]) << 24);
  const float db = ds4_half_at(block) * (0.5f + float(packed >> 28)) * 0.25f;
  for (uint row = 0; row < 4; ++row) {
    const uint grid_offset = uint(sub_block[row]) * 8;
    const uint signs = tables[DS4_IQ2_XXS_GRID_BYTES + ((packed >> (7 * row)) & 127)];
    for (uint j = 0; j < 8; ++j) {
      const float magnitude = db * float(tables[grid_offset + j]);
      out[row * 8 + j] = ((signs >> j) & 1) ? -magnitude : magnitude;
    }
  }
}
