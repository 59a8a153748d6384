// Helpers shared by ds4mlx's packed-weight kernels (included before metal/<type>.metal).
//
// metal/linear.metal (the body) reads a GGML block as DS4_BLOCK_PARTS parts of DS4_PART_VALUES
// values; one lane owns a part. Each metal/<type>.metal defines, for its block format:
//   DS4_BLOCK_VALUES, DS4_BLOCK_BYTES  values and bytes per block
//   DS4_TABLE_WORDS                    uint words of lookup tables the format needs (0: none);
//                                      ds4mlx/kernels/metal.py appends them as ds4_table_words
//   ds4_codes                          one part's codes, scales and block scale, in registers
//   ds4_load_codes(block, lane, active)
//       the codes of part lane % 8 of `block`, read from device memory 2 or 4 bytes a load.
//       The 8 lanes of a block read disjoint bytes, so a block is read once: the scales every
//       part needs are read by one lane each and passed on with simd_shuffle. Every lane of
//       the simdgroup calls it (the shuffles need them all); lanes with active == false read
//       nothing.
//   ds4_part_value(part, i)            which value of the block is the part's i-th
//   ds4_codes_dot(codes, x, x_sums, tables)
//       sum_i value_i * x[i] over the part's values, where x[i] multiplies its i-th value and
//       x_sums[g] = sum of x[8g .. 8g + 8) (for formats that subtract a minimum or an offset
//       once per group instead of once per value); arithmetic of ggml's dequantize_row_<type>
//       and of the MLX twin in ds4mlx/kernels/twins.py, up to float rounding.

constant constexpr uint DS4_PART_VALUES = 32;
constant constexpr uint DS4_BLOCK_PARTS = 8;

inline float ds4_half(uint bits) {
  return float(as_type<half>(ushort(bits & 0xFFFF)));
}

// Byte `i` of 8 bytes held as two little-endian words.
inline uint ds4_byte(uint low, uint high, uint i) {
  return ((i < 4 ? low : high) >> (8 * (i % 4))) & 0xFF;
}

// The first lane of the 8 that read a block.
inline uint ds4_block_lane(uint lane) {
  return lane & ~7u;
}

// A little-endian uint32 assembled from two 2-byte loads (blocks of 66 or 210 bytes are only
// 2-byte aligned, so a 4-byte load could be misaligned).
inline uint ds4_load_u32(const device uint8_t* bytes) {
  const device ushort* halves = (const device ushort*)(bytes);
  return uint(halves[0]) | (uint(halves[1]) << 16);
}
