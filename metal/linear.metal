// Body of ds4mlx's packed-weight mat-vec (MLX generates the signature; see ds4mlx/kernels/metal.py):
//   y[p, m, n] = sum_k x[p / XSHARE, m, k] * W[expert_indices[p], n, k]
// inputs:  x [P / XSHARE, M, K] (T; any leading dims, or [P / XSHARE, K] for M = 1),
//          w [E, N, K / DS4_BLOCK_VALUES * DS4_BLOCK_BYTES] (uint8 GGML blocks),
//          expert_indices [P] (uint32; read as P flat values, so [R, k] of a routed tile),
//          real_rows [1] int32: the x rows computed, each batch's first (a decode tile's real
//          rows; M for all): a row's result does not depend on how many are computed
// output:  y [P, M, N] (T): the rows past real_rows are not written
// template: T (x and y dtype), K (in features), N (out features), SIMDGROUPS (per threadgroup),
//          ROWS (weight rows per simdgroup), XROWS (x rows per threadgroup: 1, 2, 4 or 8),
//          XSHARE (consecutive batches that read one x batch: a routed row's k experts read
//          the row where it lies, with no copy of it per expert; 1 else)
// launch:  grid (32 * SIMDGROUPS * ceil(N / (SIMDGROUPS * ROWS)), ceil(real_rows / XROWS), P),
//          threadgroup (32 * SIMDGROUPS, 1, 1). P > 1 is the MoE gather: every selected expert
//          of a tile in one launch.
//
// Memory traffic is the design: the weights are read once, x once per threadgroup.
// - The threadgroup stages a slice of its XROWS x rows in threadgroup memory (16 KiB), so the
//   SIMDGROUPS * ROWS weight rows it computes share one device read of x.
// - A lane owns one part (32 values) of a block, 8 lanes a block: it loads the part's codes of
//   ROWS weight rows into registers, 2-4 bytes a load, the 8 lanes' loads disjoint so every
//   weight byte is read once (ds4_load_codes), then for each x row loads the part's
//   x values once from threadgroup memory and applies them to all ROWS rows (ds4_codes_dot,
//   with the block's scales and minimums outside the per-value loop).
// - The lanes' partial sums meet in one simd_sum per (weight row, x row): at M = 1, ROWS sums.
// Lookup tables (IQ2_XXS) are copied from constant to threadgroup memory once per threadgroup.

constexpr uint BLOCKS = K / DS4_BLOCK_VALUES;
constexpr ulong ROW_BYTES = ulong(BLOCKS) * DS4_BLOCK_BYTES;
constexpr uint THREADS = 32 * SIMDGROUPS;
constexpr uint STAGE_BUDGET_BLOCKS = 16384 / (XROWS * sizeof(T) * DS4_BLOCK_VALUES);
// Blocks of x staged at a time: the budget, at least one block, at most the row.
constexpr uint STAGE_BLOCKS = STAGE_BUDGET_BLOCKS == 0 ? 1
                              : STAGE_BUDGET_BLOCKS < BLOCKS ? STAGE_BUDGET_BLOCKS : BLOCKS;
constexpr uint STAGE_VALUES = STAGE_BLOCKS * DS4_BLOCK_VALUES;

const uint lane = thread_index_in_simdgroup;
const uint thread_index = thread_index_in_threadgroup;
const uint3 group = threadgroup_position_in_grid;
const uint M = x_ndim >= 3 ? uint(x_shape[x_ndim - 2]) : 1u;
// One lane reads the real row count and passes it on (as the expert index below).
const uint computed_rows =
    metal::min(M, metal::simd_broadcast(lane == 0 ? uint(real_rows[0]) : 0u, 0));
const uint p = group.z;
const uint first_x_row = group.y * XROWS;
// The staging layout and each row's sums follow XROWS, not how many rows are computed.
const uint x_rows =
    first_x_row < computed_rows ? metal::min(uint(XROWS), computed_rows - first_x_row) : 0u;
const uint first_row = (group.x * SIMDGROUPS + simdgroup_index_in_threadgroup) * ROWS;

threadgroup uint tables[DS4_TABLE_WORDS > 0 ? DS4_TABLE_WORDS : 1];
for (uint i = thread_index; i < DS4_TABLE_WORDS; i += THREADS) {
  tables[i] = ds4_table_words[i];
}
threadgroup T x_stage[XROWS * STAGE_VALUES];

// One lane reads the expert index and passes it on: every thread of the launch needs it.
const uint expert = metal::simd_broadcast(lane == 0 ? expert_indices[p] : 0u, 0);
const device uint8_t* w_expert = w + ulong(expert) * N * ROW_BYTES;
const device T* x_first = x + (ulong(p / XSHARE) * M + first_x_row) * K;

float sums[ROWS][XROWS];
for (uint r = 0; r < ROWS; ++r) {
  for (uint m = 0; m < XROWS; ++m) {
    sums[r][m] = 0.0f;
  }
}
for (uint stage = 0; stage < BLOCKS; stage += STAGE_BLOCKS) {
  const uint stage_blocks = metal::min(STAGE_BLOCKS, BLOCKS - stage);
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);  // last stage fully read
  for (uint i = thread_index; i < x_rows * STAGE_VALUES; i += THREADS) {
    const uint k = i % STAGE_VALUES;
    if (k < stage_blocks * DS4_BLOCK_VALUES) {
      x_stage[i] = x_first[ulong(i / STAGE_VALUES) * K + stage * DS4_BLOCK_VALUES + k];
    }
  }
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);

  // The loop is uniform across the simdgroup (ds4_load_codes shuffles): lanes past the stage's
  // last part run along inactive.
  const uint units = stage_blocks * DS4_BLOCK_PARTS;
  for (uint first_unit = 0; first_unit < units; first_unit += 32) {
    const uint unit = first_unit + lane;
    const bool active = unit < units;
    const uint block = active ? unit / DS4_BLOCK_PARTS : 0;
    const uint part = lane % DS4_BLOCK_PARTS;
    ds4_codes codes[ROWS];
    for (uint r = 0; r < ROWS; ++r) {
      // Rows past N (the last threadgroup of a ragged N) read row N - 1 and are never written.
      const uint row = metal::min(first_row + r, uint(N) - 1);
      codes[r] = ds4_load_codes(w_expert + row * ROW_BYTES + (stage + block) * DS4_BLOCK_BYTES,
                                lane, active);
    }
    for (uint m = 0; active && m < x_rows; ++m) {
      float xs[DS4_PART_VALUES];
      float x_sums[DS4_PART_VALUES / 8];
      const threadgroup T* x_block = x_stage + m * STAGE_VALUES + block * DS4_BLOCK_VALUES;
      for (uint g = 0; g < DS4_PART_VALUES / 8; ++g) {
        x_sums[g] = 0.0f;
        for (uint i = 8 * g; i < 8 * g + 8; ++i) {
          xs[i] = float(x_block[ds4_part_value(part, i)]);
          x_sums[g] += xs[i];
        }
      }
      for (uint r = 0; r < ROWS; ++r) {
        sums[r][m] += ds4_codes_dot(codes[r], xs, x_sums, tables);
      }
    }
  }
}
for (uint r = 0; r < ROWS; ++r) {
  for (uint m = 0; m < XROWS; ++m) {
    const float total = metal::simd_sum(sums[r][m]);
    if (lane == 0 && m < x_rows && first_row + r < N) {
      y[(ulong(p) * M + first_x_row + m) * N + first_row + r] = static_cast<T>(total);
    }
  }
}
