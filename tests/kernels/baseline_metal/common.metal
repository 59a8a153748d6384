// Helpers shared by ds4mlx's packed-weight kernels (included before metal/<type>.metal).
//
// Each metal/<type>.metal defines, for its GGML block format:
//   DS4_BLOCK_VALUES, DS4_BLOCK_BYTES  values and bytes per block
//   DS4_SUBBLOCK_VALUES                values decoded per ds4_decode_subblock call (one scale)
//   ds4_decode_subblock(block, sub, tables, out)
//       writes the DS4_SUBBLOCK_VALUES float values of sub-block `sub` of `block` to `out`,
//       with the arithmetic of ggml's dequantize_row_<type> (and of the MLX twin in
//       ds4mlx/kernels/twins.py). `tables` holds the lookup tables a format needs (unused by
//       most); it is a template parameter because MLX passes inputs with fewer than 8 elements
//       in the constant address space and larger ones in the device address space.
// metal/linear.metal is the kernel body that calls them.

// Blocks are not necessarily 2-byte aligned in every format: assemble the half from bytes.
inline float ds4_half_at(const device uint8_t* bytes) {
  return float(as_type<half>(ushort(ushort(bytes[0]) | (ushort(bytes[1]) << 8))));
}
