// Body of ds4mlx's packed-weight matmul (MLX generates the signature; see ds4mlx/kernels/metal.py):
//   y[p, m, n] = sum_k x[p, m, k] * W[expert_indices[p], n, k]
// inputs:  x [P, M, K] (T), w [E, N, K / DS4_BLOCK_VALUES * DS4_BLOCK_BYTES] (uint8 GGML blocks),
//          tables (uint8, format lookup tables), expert_indices [P] (uint32)
// output:  y [P, M, N] (T)
// template: T (x and y dtype), K (in features), N (out features), ROWS (x rows per simdgroup)
// launch:  grid (32 * N, ceil(M / ROWS), P), threadgroups of whole simdgroups along x.
// One simdgroup owns one weight row n and ROWS rows of x: each lane decodes every 32nd sub-block
// of the weight row once, multiplies it into all its x rows, and simd_sum adds the lanes up.
// Accumulation is in float, like the twin (which multiplies by the float32 decoded weight).

constexpr uint SUBBLOCKS_PER_BLOCK = DS4_BLOCK_VALUES / DS4_SUBBLOCK_VALUES;
constexpr uint SUBBLOCKS_PER_ROW = K / DS4_SUBBLOCK_VALUES;
constexpr ulong ROW_BYTES = ulong(K / DS4_BLOCK_VALUES) * DS4_BLOCK_BYTES;

const uint lane = thread_index_in_simdgroup;
const uint n = thread_position_in_grid.x / 32;
const uint first_row = thread_position_in_grid.y * ROWS;
const uint p = thread_position_in_grid.z;
const uint M = uint(x_shape[1]);
const uint rows = metal::min(uint(ROWS), M - first_row);

const device uint8_t* w_row = w + (ulong(expert_indices[p]) * N + n) * ROW_BYTES;
const device T* x_rows = x + (ulong(p) * M + first_row) * K;

float sums[ROWS];
for (uint r = 0; r < ROWS; ++r) {
  sums[r] = 0.0f;
}
float values[DS4_SUBBLOCK_VALUES];
for (uint s = lane; s < SUBBLOCKS_PER_ROW; s += 32) {
  ds4_decode_subblock(w_row + (s / SUBBLOCKS_PER_BLOCK) * DS4_BLOCK_BYTES, s % SUBBLOCKS_PER_BLOCK,
                      tables, values);
  const uint k0 = s * DS4_SUBBLOCK_VALUES;
  for (uint r = 0; r < rows; ++r) {
    const device T* xs = x_rows + r * K + k0;
    float dot = 0.0f;
    for (uint j = 0; j < DS4_SUBBLOCK_VALUES; ++j) {
      dot += values[j] * float(xs[j]);
    }
    sums[r] += dot;
  }
}
for (uint r = 0; r < ROWS; ++r) {
  const float total = metal::simd_sum(sums[r]);
  if (lane == 0 && r < rows) {
    y[(ulong(p) * M + first_row + r) * N + n] = static_cast<T>(total);
  }
}
