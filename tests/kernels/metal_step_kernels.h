// The GPU decode step's kernels (metal/hc_site, hc_expand, rope, moe_route, moe_combine,
// pool_blocks, indexer_scores, indexer_top_k, embed_streams, grow_rows, grow_row_pairs) and
// their runners, for tests/kernels/metal_emulation.cpp, which includes this after its own
// runners (it says how the emulation works and each mode's input).
// Each step kernel is one thread per output element (or token) and uses no threadgroup memory,
// but indexer_top_k: one threadgroup per row.

#include <algorithm>
#include <array>
#include <utility>

#ifndef DS4_E
#define DS4_E 16
#endif
#ifndef DS4_TOPK
#define DS4_TOPK 4
#endif
#ifndef DS4_ROPE_N
#define DS4_ROPE_N 16
#endif
#ifndef DS4_ROPE_OFFSET
#define DS4_ROPE_OFFSET 0
#endif
#ifndef DS4_POOL_R
#define DS4_POOL_R 4
#endif
#ifndef DS4_IDX_H
#define DS4_IDX_H 4
#endif
#ifndef DS4_IDX_D
#define DS4_IDX_D 32
#endif
#ifndef DS4_EMBED_GROUP
#define DS4_EMBED_GROUP 32
#endif
#ifndef DS4_IDX_TOPK
#define DS4_IDX_TOPK 16
#endif
#ifndef DS4_IDX_THREADS
#define DS4_IDX_THREADS 256
#endif

#define constant
#define thread

#include "moe.metal"

namespace hc_site {
template <typename T_, int HC, int D, int ITERS>
void kernel(DevicePtr<const T_> x, const int* x_shape, DevicePtr<const float> mixes,
            DevicePtr<const float> scale, DevicePtr<const float> base, DevicePtr<const float> eps,
            DevicePtr<T_> y, DevicePtr<float> post, DevicePtr<float> comb,
            uint3 thread_position_in_grid) {
#include "hc_site.metal"
}
}  // namespace hc_site

namespace hc_expand {
template <typename T_, int HC, int D>
void kernel(DevicePtr<const T_> out, const int* out_shape, DevicePtr<const T_> residual,
            DevicePtr<const float> post, DevicePtr<const float> comb, DevicePtr<T_> streams,
            uint3 thread_position_in_grid) {
#include "hc_expand.metal"
}
}  // namespace hc_expand

namespace rope {
template <typename T_, int D, int N, int OFFSET, int INTERLEAVED, int INVERSE>
void kernel(DevicePtr<const T_> x, const int* x_shape, int x_ndim, DevicePtr<const float> cosines,
            DevicePtr<const float> sines, DevicePtr<T_> out, uint3 thread_position_in_grid) {
#include "rope.metal"
}
}  // namespace rope

namespace moe_route {
template <int E, int K, int FUNC, int HAS_BIAS, int HASHED, int NORMALIZE>
void kernel(DevicePtr<const float> logits, DevicePtr<const float> bias,
            DevicePtr<const int> hashed, DevicePtr<const float> scale, DevicePtr<const int> rows,
            DevicePtr<uint> indices, DevicePtr<float> weights, uint3 thread_position_in_grid) {
#include "moe_route.metal"
}
}  // namespace moe_route

namespace moe_combine {
template <typename T_, int K, int D>
void kernel(DevicePtr<const T_> expert_out, const int* expert_out_shape,
            DevicePtr<const float> weights, DevicePtr<const T_> shared, const int* shared_shape,
            DevicePtr<T_> out, uint3 thread_position_in_grid) {
#include "moe_combine.metal"
}
}  // namespace moe_combine

namespace pool_blocks {
template <typename T_, int R, int DIM, int OVERLAP>
void kernel(DevicePtr<const T_> kv, DevicePtr<const T_> score, DevicePtr<const int> blocks,
            DevicePtr<T_> pooled, uint3 thread_position_in_grid) {
#include "pool_blocks.metal"
}
}  // namespace pool_blocks

namespace indexer_scores {
template <typename T_, int H, int D>
void kernel(DevicePtr<const T_> q, const int* q_shape, DevicePtr<const float> weights,
            DevicePtr<const T_> keys, const int* keys_shape, DevicePtr<const int> visible,
            DevicePtr<const float> weight_scale, DevicePtr<float> scores,
            uint3 thread_position_in_grid) {
#include "indexer_scores.metal"
}
}  // namespace indexer_scores

namespace indexer_top_k {
#include "select.metal"
template <int TOPK, int THREADS>
void kernel(DevicePtr<const float> scores, const int* scores_shape, DevicePtr<const int> visible,
            DevicePtr<int> top, uint3 threadgroup_position_in_grid,
            uint thread_index_in_threadgroup, uint simdgroup_index_in_threadgroup,
            uint thread_index_in_simdgroup) {
#include "indexer_top_k.metal"
}
}  // namespace indexer_top_k

namespace embed_streams {
template <typename S_, int BITS, int GROUP, int D, int HC>
void kernel(DevicePtr<const int> tokens, const int* tokens_shape, DevicePtr<const uint> packed,
            DevicePtr<const S_> scales, DevicePtr<const S_> biases, DevicePtr<float> streams,
            uint3 thread_position_in_grid) {
#include "embed_streams.metal"
}
}  // namespace embed_streams

namespace grow_rows {
template <typename T_, int W>
void kernel(DevicePtr<const T_> cached, const int* cached_shape, DevicePtr<const T_> fresh,
            DevicePtr<const int> counts, DevicePtr<T_> rows, uint3 thread_position_in_grid) {
#include "grow_rows.metal"
}
}  // namespace grow_rows

namespace grow_row_pairs {
template <typename T_, int W, int ADDED>
void kernel(DevicePtr<const T_> cached, const int* cached_shape, DevicePtr<const T_> fresh,
            DevicePtr<const T_> cached2, DevicePtr<const T_> fresh2, DevicePtr<const float> added,
            DevicePtr<const int> counts, DevicePtr<T_> rows, DevicePtr<T_> rows2,
            uint3 thread_position_in_grid) {
#include "grow_row_pairs.metal"
}
}  // namespace grow_row_pairs

#undef constant
#undef thread

// The step kernels run one thread per element of a grid (X, Y, Z) in threadgroups of
// min(X, 256) threads along x, as metal.py launches them (rounded up here to whole
// simdgroups). Each runner passes a grid past the ends of its data: those threads must return
// without writing (outputs start as NaN, and a load outside every buffer fails the run).
void launch_grid(uint3 grid, const std::function<void(uint3)>& thread) {
  const uint width = std::min<uint>(grid.x, 256);
  const uint threads = (width + SIMD_WIDTH - 1) / SIMD_WIDTH * SIMD_WIDTH;
  launch({(grid.x + threads - 1) / threads, grid.y, grid.z}, threads,
         [&](const ThreadIds& ids) { thread(ids.thread_position_in_grid); });
}

template <typename Value>
std::vector<float> as_floats(const std::vector<Value>& values) {  // int32 outputs as raw bits
  std::vector<float> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

int run_hc_site(const char* in_path, const char* out_path) {
  constexpr uint MIX = (2 + DS4_HC) * DS4_HC;
  Input input(in_path);
  const int T = input.read<int32_t>(1)[0];
  const auto eps = input.read<float>(1);
  const auto scale = input.read<float>(3);
  const auto base = input.read<float>(MIX);
  const auto x = input.read<float>(size_t(T) * DS4_HC * DS4_D);
  const auto mixes = input.read<float>(size_t(T) * MIX);
  for (const auto* buffer : {&eps, &scale, &base, &x, &mixes}) {
    bind_buffer(*buffer);
  }
  const int x_shape[3] = {T, DS4_HC, DS4_D};
  std::vector<float> y(size_t(T) * DS4_D, NAN), post(size_t(T) * DS4_HC, NAN),
      comb(size_t(T) * DS4_HC * DS4_HC, NAN);
  launch_grid({DS4_D + 2, uint(T) + 1, 1}, [&](uint3 position) {
    hc_site::kernel<float, DS4_HC, DS4_D, DS4_ITERS>(x.data(), x_shape, mixes.data(),
                                                      scale.data(), base.data(), eps.data(),
                                                      y.data(), post.data(), comb.data(), position);
  });
  y.insert(y.end(), post.begin(), post.end());
  y.insert(y.end(), comb.begin(), comb.end());
  write_output(out_path, y);
  return 0;
}

int run_hc_expand(const char* in_path, const char* out_path) {
  Input input(in_path);
  const int T = input.read<int32_t>(1)[0];
  const auto out = input.read<float>(size_t(T) * DS4_D);
  const auto residual = input.read<float>(size_t(T) * DS4_HC * DS4_D);
  const auto post = input.read<float>(size_t(T) * DS4_HC);
  const auto comb = input.read<float>(size_t(T) * DS4_HC * DS4_HC);
  for (const auto* buffer : {&out, &residual, &post, &comb}) {
    bind_buffer(*buffer);
  }
  const int out_shape[2] = {T, DS4_D};
  std::vector<float> streams(residual.size(), NAN);
  launch_grid({DS4_D + 2, DS4_HC + 1, uint(T) + 1}, [&](uint3 position) {
    hc_expand::kernel<float, DS4_HC, DS4_D>(out.data(), out_shape, residual.data(), post.data(),
                                            comb.data(), streams.data(), position);
  });
  write_output(out_path, streams);
  return 0;
}

// M == 0 runs the kernel on x [T, D] (one row a token).
template <int INTERLEAVED, int INVERSE>
void rope_all(int T, int M, const std::vector<float>& x, const std::vector<float>& cos,
              const std::vector<float>& sin, std::vector<float>& out) {
  const int x_shape[3] = {T, M ? M : DS4_D, DS4_D};
  const int x_ndim = M ? 3 : 2;
  launch_grid({DS4_D + 2, uint(M) + 1, uint(T) + 1}, [&](uint3 position) {
    rope::kernel<float, DS4_D, DS4_ROPE_N, DS4_ROPE_OFFSET, INTERLEAVED, INVERSE>(
        x.data(), x_shape, x_ndim, cos.data(), sin.data(), out.data(), position);
  });
}

int run_rope(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(4);
  const int T = sizes[0], M = sizes[1];
  const auto x = input.read<float>(size_t(T) * (M ? M : 1) * DS4_D);
  const auto cos = input.read<float>(size_t(T) * DS4_ROPE_N / 2);
  const auto sin = input.read<float>(size_t(T) * DS4_ROPE_N / 2);
  for (const auto* buffer : {&x, &cos, &sin}) {
    bind_buffer(*buffer);
  }
  std::vector<float> out(x.size(), NAN);
  using Runner = void (*)(int, int, const std::vector<float>&, const std::vector<float>&,
                          const std::vector<float>&, std::vector<float>&);
  const Runner runners[4] = {rope_all<0, 0>, rope_all<0, 1>, rope_all<1, 0>, rope_all<1, 1>};
  runners[sizes[2] * 2 + sizes[3]](T, M, x, cos, sin, out);
  write_output(out_path, out);
  return 0;
}

// The routing's inputs; the gating function and flags, template arguments in Metal, are read
// from the input here and pick one of the 32 compiled runners.
struct RouteLaunch {
  int T, R;
  const std::vector<float>& logits;
  const std::vector<float>& bias;
  const std::vector<int32_t>& hashed;
  const std::vector<float>& scale;
  std::vector<uint32_t>& indices;
  std::vector<float>& weights;
};

template <int FUNC, int HAS_BIAS, int HASHED, int NORMALIZE>
void route_all(const RouteLaunch& a) {
  const std::vector<int32_t> rows{a.R};
  bind_buffer(rows);
  launch_grid({uint(a.T) + 1, 1, 1}, [&](uint3 position) {
    moe_route::kernel<DS4_E, DS4_TOPK, FUNC, HAS_BIAS, HASHED, NORMALIZE>(
        a.logits.data(), a.bias.data(), a.hashed.data(), a.scale.data(), rows.data(),
        a.indices.data(), a.weights.data(), position);
  });
}

template <size_t... I>
constexpr std::array<void (*)(const RouteLaunch&), sizeof...(I)> route_runners(
    std::index_sequence<I...>) {
  return {route_all<int(I / 8) + 1, int(I / 4 % 2), int(I / 2 % 2), int(I % 2)>...};
}

int run_moe_route(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(2);  // T logits rows, the first R routed
  const int T = sizes[0], R = sizes[1];
  const auto flags = input.read<int32_t>(4);
  const auto scale = input.read<float>(1);
  const auto logits = input.read<float>(size_t(T) * DS4_E);
  const auto bias = input.read<float>(DS4_E);
  const auto hashed = input.read<int32_t>(size_t(T) * DS4_TOPK);
  for (const auto* buffer : {&scale, &logits, &bias}) {
    bind_buffer(*buffer);
  }
  bind_buffer(hashed);
  std::vector<uint32_t> indices(size_t(R) * DS4_TOPK, uint32_t(-7));
  std::vector<float> weights(size_t(R) * DS4_TOPK, NAN);
  if (flags[0] < 1 || flags[0] > 4) {
    fail("the gating function must be 1 to 4");
  }
  constexpr auto runners = route_runners(std::make_index_sequence<32>());
  runners[(flags[0] - 1) * 8 + flags[1] * 4 + flags[2] * 2 + flags[3]](
      {T, R, logits, bias, hashed, scale, indices, weights});
  std::vector<float> result = as_floats(indices);
  result.insert(result.end(), weights.begin(), weights.end());
  write_output(out_path, result);
  return 0;
}

int run_pool_blocks(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(4);
  const int N = sizes[0], n = sizes[1], overlap = sizes[3];
  const size_t width = size_t(overlap ? 2 : 1) * DS4_D;
  const auto kv = input.read<float>(N * width);
  const auto score = input.read<float>(N * width);
  const std::vector<int32_t> blocks{sizes[2], n};
  bind_buffer(kv);
  bind_buffer(score);
  bind_buffer(blocks);
  std::vector<float> pooled(size_t(n) * DS4_D, NAN);
  launch_grid({DS4_D + 2, uint(n) + 1, 1}, [&](uint3 position) {
    if (overlap) {
      pool_blocks::kernel<float, DS4_POOL_R, DS4_D, 1>(kv.data(), score.data(), blocks.data(),
                                                       pooled.data(), position);
    } else {
      pool_blocks::kernel<float, DS4_POOL_R, DS4_D, 0>(kv.data(), score.data(), blocks.data(),
                                                       pooled.data(), position);
    }
  });
  write_output(out_path, pooled);
  return 0;
}

int run_indexer_scores(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(2);
  const int T = sizes[0], N = sizes[1];
  const auto weight_scale = input.read<float>(1);
  const auto q = input.read<float>(size_t(T) * DS4_IDX_H * DS4_IDX_D);
  const auto weights = input.read<float>(size_t(T) * DS4_IDX_H);
  const auto keys = input.read<float>(size_t(N) * DS4_IDX_D);
  const auto visible = input.read<int32_t>(T);
  for (const auto* buffer : {&weight_scale, &q, &weights, &keys}) {
    bind_buffer(*buffer);
  }
  bind_buffer(visible);
  const int q_shape[3] = {T, DS4_IDX_H, DS4_IDX_D}, keys_shape[2] = {N, DS4_IDX_D};
  std::vector<float> scores(size_t(T) * N, NAN);
  launch_grid({uint(N) + 2, uint(T) + 1, 1}, [&](uint3 position) {
    indexer_scores::kernel<float, DS4_IDX_H, DS4_IDX_D>(
        q.data(), q_shape, weights.data(), keys.data(), keys_shape, visible.data(),
        weight_scale.data(), scores.data(), position);
  });
  write_output(out_path, scores);
  return 0;
}

// One threadgroup of DS4_IDX_THREADS threads per row, as metal.py launches it.
int run_indexer_top_k(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(2);
  const int T = sizes[0], N = sizes[1];
  const auto scores = input.read<float>(size_t(T) * N);
  const auto visible = input.read<int32_t>(T);
  bind_buffer(scores);
  bind_buffer(visible);
  const int scores_shape[2] = {T, N};
  std::vector<int32_t> top(size_t(T) * DS4_IDX_TOPK, -7);
  launch({1, uint(T), 1}, DS4_IDX_THREADS, [&](const ThreadIds& ids) {
    indexer_top_k::kernel<DS4_IDX_TOPK, DS4_IDX_THREADS>(
        scores.data(), scores_shape, visible.data(), top.data(), ids.threadgroup_position_in_grid,
        ids.thread_index_in_threadgroup, ids.simdgroup_index_in_threadgroup,
        ids.thread_index_in_simdgroup);
  });
  write_output(out_path, as_floats(top));
  return 0;
}

// input: int32 T, V, bits | int32 tokens [T] | uint32 packed [V, D * bits / 32]
// | float32 scales, biases [V, D / GROUP];  output: float32 streams [T, HC * D]
int run_embed_streams(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(3);
  const int T = sizes[0], V = sizes[1], bits = sizes[2];
  const auto tokens = input.read<int32_t>(T);
  const auto packed = input.read<uint32_t>(size_t(V) * DS4_D * bits / 32);
  const auto scales = input.read<float>(size_t(V) * DS4_D / DS4_EMBED_GROUP);
  const auto biases = input.read<float>(size_t(V) * DS4_D / DS4_EMBED_GROUP);
  for (const int32_t token : tokens) {
    if (token < 0 || token >= V) {
      fail("token out of range");
    }
  }
  bind_buffer(tokens);
  bind_buffer(packed);
  bind_buffer(scales);
  bind_buffer(biases);
  const int tokens_shape[1] = {T};
  std::vector<float> streams(size_t(T) * DS4_HC * DS4_D, NAN);
  const auto kernel = bits == 2   ? embed_streams::kernel<float, 2, DS4_EMBED_GROUP, DS4_D, DS4_HC>
                      : bits == 4 ? embed_streams::kernel<float, 4, DS4_EMBED_GROUP, DS4_D, DS4_HC>
                                  : embed_streams::kernel<float, 8, DS4_EMBED_GROUP, DS4_D, DS4_HC>;
  if (bits != 2 && bits != 4 && bits != 8) {
    fail("bits must be 2, 4 or 8");
  }
  launch_grid({DS4_D + 2, uint(T) + 1, 1}, [&](uint3 position) {
    kernel(tokens.data(), tokens_shape, packed.data(), scales.data(), biases.data(),
           streams.data(), position);
  });
  write_output(out_path, streams);
  return 0;
}

int run_moe_combine(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(2);
  const int T = sizes[0], R = sizes[1];
  const auto expert_out = input.read<float>(size_t(R) * DS4_TOPK * DS4_D);
  const auto weights = input.read<float>(size_t(T) * DS4_TOPK);
  const auto shared = input.read<float>(size_t(T) * DS4_D);
  for (const auto* buffer : {&expert_out, &weights, &shared}) {
    bind_buffer(*buffer);
  }
  const int expert_out_shape[3] = {R, DS4_TOPK, DS4_D}, shared_shape[2] = {T, DS4_D};
  std::vector<float> out(shared.size(), NAN);
  launch_grid({DS4_D + 2, uint(T) + 1, 1}, [&](uint3 position) {
    moe_combine::kernel<float, DS4_TOPK, DS4_D>(expert_out.data(), expert_out_shape,
                                                weights.data(), shared.data(), shared_shape,
                                                out.data(), position);
  });
  write_output(out_path, out);
  return 0;
}

int run_grow_rows(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(4);
  const int N = sizes[0], F = sizes[1], M = sizes[3];
  const auto cached = input.read<float>(size_t(N) * DS4_D);
  const auto fresh = input.read<float>(size_t(F) * DS4_D);
  const std::vector<int32_t> counts{sizes[2], M};
  bind_buffer(cached);
  bind_buffer(fresh);
  bind_buffer(counts);
  const int cached_shape[2] = {N, DS4_D};
  std::vector<float> rows(size_t(M) * DS4_D, NAN);
  launch_grid({DS4_D + 2, uint(M) + 1, 1}, [&](uint3 position) {
    grow_rows::kernel<float, DS4_D>(cached.data(), cached_shape, fresh.data(), counts.data(),
                                    rows.data(), position);
  });
  write_output(out_path, rows);
  return 0;
}

// input: int32 N, F, take, M, added | float32 cached [N, D] | fresh [F, D] | cached2 [N, D]
// | fresh2 [F, D] | added [F, D] (one value without added);  output: float32 rows [M, D]
// | rows2 [M, D]
int run_grow_row_pairs(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(5);
  const int N = sizes[0], F = sizes[1], M = sizes[3], with_added = sizes[4];
  const auto cached = input.read<float>(size_t(N) * DS4_D);
  const auto fresh = input.read<float>(size_t(F) * DS4_D);
  const auto cached2 = input.read<float>(size_t(N) * DS4_D);
  const auto fresh2 = input.read<float>(size_t(F) * DS4_D);
  const auto added = input.read<float>(with_added ? size_t(F) * DS4_D : 1);
  const std::vector<int32_t> counts{sizes[2], M};
  for (const auto* buffer : {&cached, &fresh, &cached2, &fresh2, &added}) {
    bind_buffer(*buffer);
  }
  bind_buffer(counts);
  const int cached_shape[2] = {N, DS4_D};
  std::vector<float> rows(size_t(M) * DS4_D, NAN), rows2(size_t(M) * DS4_D, NAN);
  const auto kernel = with_added ? grow_row_pairs::kernel<float, DS4_D, 1>
                                 : grow_row_pairs::kernel<float, DS4_D, 0>;
  launch_grid({DS4_D + 2, uint(M) + 1, 2}, [&](uint3 position) {
    kernel(cached.data(), cached_shape, fresh.data(), cached2.data(), fresh2.data(), added.data(),
           counts.data(), rows.data(), rows2.data(), position);
  });
  rows.insert(rows.end(), rows2.begin(), rows2.end());
  write_output(out_path, rows);
  return 0;
}
