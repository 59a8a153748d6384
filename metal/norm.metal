// Header of ds4mlx's kernels that carry an RMS norm (metal/hc_site_norm.metal,
// metal/norm_rope.metal): a sum over one threadgroup, for the mean of squares a norm divides by.

// The sum of every thread's `value` over a threadgroup of `simdgroups` simdgroups, returned to
// every thread: one simd_sum per simdgroup, then each thread adds the simdgroups' partial sums
// (in simdgroup order, so every thread gets the same bits). `partials` holds one float per
// simdgroup; every thread of the threadgroup must call this (it meets them at two barriers).
inline float ds4_threadgroup_sum(
    float value, threadgroup float* partials, uint simdgroup, uint lane, uint simdgroups) {
  value = metal::simd_sum(value);
  if (lane == 0) {
    partials[simdgroup] = value;
  }
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint i = 0; i < simdgroups; ++i) {
    total += partials[i];
  }
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);  // partials free for reuse
  return total;
}
