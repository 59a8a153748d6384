// Header of ds4mlx's metal/indexer_top_k.metal: an order-keeping key of a score, and a prefix
// sum over a threadgroup, for a selection that writes its picks in index order.

// `score` as an unsigned key that orders as the scores do (a higher score, a higher key): -0
// and +0, which compare equal, are one key, and NaN ranks below every number.
inline uint ds4_score_key(float score) {
  if (score != score) {
    return 0u;
  }
  const uint bits = as_type<uint>(score == 0.0f ? 0.0f : score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The sum of `value` over the threads before this one (in thread order), and in `total` the sum
// over the threadgroup, returned to every thread: a simdgroup prefix sum, then each simdgroup's
// total from `partials` (one uint per simdgroup). Every thread of the threadgroup must call it
// (it meets them at two barriers).
inline uint ds4_threadgroup_prefix(uint value, threadgroup uint* partials, uint simdgroup,
                                   uint lane, uint simdgroups, thread uint& total) {
  const uint before_in_simdgroup = metal::simd_prefix_exclusive_sum(value);
  if (lane == 31) {
    partials[simdgroup] = before_in_simdgroup + value;
  }
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  uint before = 0;
  total = 0;
  for (uint i = 0; i < simdgroups; ++i) {
    const uint part = partials[i];
    before += i < simdgroup ? part : 0u;
    total += part;
  }
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);  // partials free for reuse
  return before + before_in_simdgroup;
}
