// Runs the Metal sources in metal/ on the CPU, so their logic is tested where Metal is missing.
//
// A thin shim maps the Metal features the kernels use onto C++20: address-space qualifiers
// vanish, `half` decodes IEEE binary16, `as_type` is a bit copy, and a simdgroup is 32 host
// threads whose `simd_sum` meets at a barrier. Each format's header and the shared body are
// compiled into their own namespace, exactly as mx.fast.metal_kernel would assemble them.
//
// Built by tests/kernels/test_kernel_metal.py with -I metal -DDS4_K=... -DDS4_N=... -DDS4_ROWS=...
// Usage: metal_emulation <q2_k|q6_k|iq2_xxs> <input> <output>
//   input:  int32 P, M, E | float32 x [P, M, K] | uint8 w [E, N, row_bytes] |
//           uint32 table_bytes | uint8 tables | uint32 expert_indices [P]
//   output: float32 y [P, M, N]
//        metal_emulation sinkhorn <input> <output>      (-DDS4_HC=... -DDS4_ITERS=...)
//   input:  int32 T | float32 eps | float32 comb [T, HC, HC];  output: float32 [T, HC, HC]
//        metal_emulation sparse_attention <input> <output>  (-DDS4_D=... -DDS4_SLOTS=...)
//   input:  int32 T, H, W, N | float32 scale | float32 q [T, H, D] | float32 window [W, D] |
//           int32 window_range [T, 2] | float32 comp [N, D] | int32 comp_index [T, SLOTS] |
//           float32 sinks [H];  output: float32 [T, H, D]
//        metal_emulation hc_site <input> <output>   (-DDS4_HC=... -DDS4_ITERS=... -DDS4_D=...)
//   input:  int32 T | float32 eps | float32 scale [3] | float32 base [(2 + HC) * HC] |
//           float32 x [T, HC, D] | float32 mixes [T, (2 + HC) * HC]
//   output: float32 y [T, D] | float32 post [T, HC] | float32 comb [T, HC, HC]
//        metal_emulation hc_expand <input> <output>  (-DDS4_HC=... -DDS4_D=...)
//   input:  int32 T | float32 out [T, D] | float32 residual [T, HC, D] | float32 post [T, HC] |
//           float32 comb [T, HC, HC];  output: float32 [T, HC, D]
//        metal_emulation rope <input> <output>  (-DDS4_D=... -DDS4_ROPE_N=... -DDS4_ROPE_OFFSET=...)
//   input:  int32 T, M, interleaved, inverse | float32 x [T, M, D] ([T, D] for M 0) |
//           float32 cos, sin [T, N / 2]
//   output: float32 [T, M, D]
//        metal_emulation moe_route <input> <output>  (-DDS4_E=... -DDS4_TOPK=...)
//   input:  int32 T, func, has_bias, hashed, normalize | float32 scale | float32 logits [T, E] |
//           float32 bias [E] | int32 hashed [T, TOPK]
//   output: int32 indices [T, TOPK] | float32 weights [T, TOPK]
//        metal_emulation pool_blocks <input> <output>  (-DDS4_POOL_R=... -DDS4_D=...)
//   input:  int32 N, n, first, overlap | float32 kv [N, W] | float32 score [N, W]
//           (W = D, or 2 D with overlap);  output: float32 [n, D]
//        metal_emulation indexer_scores <input> <output>  (-DDS4_IDX_H=... -DDS4_IDX_D=...)
//   input:  int32 T, N | float32 q [T, H, D] | float32 weights [T, H] | float32 keys [N, D] |
//           int32 visible [T];  output: float32 [T, N]
//        metal_emulation moe_combine <input> <output>  (-DDS4_TOPK=... -DDS4_D=...)
//   input:  int32 T, R | float32 expert_out [R, TOPK, D] | float32 weights [T, TOPK] |
//           float32 shared [T, D];  output: float32 [T, D]

#include <array>
#include <barrier>
#include <cmath>
#include <utility>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using host_thread = std::thread;

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;

struct uint3 {
  uint x, y, z;
};

struct half {
  float value;
  operator float() const { return value; }
};

template <typename To, typename From>
To as_type(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

template <>
half as_type<half, ushort>(ushort bits) {
  const int exponent = (bits >> 10) & 31;
  const int mantissa = bits & 1023;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(float(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(float(mantissa | 1024), exponent - 25);
  }
  return half{(bits >> 15) ? -magnitude : magnitude};
}

struct SimdGroup {
  std::barrier<> sync{32};
  float lanes[32];
};
thread_local SimdGroup* current_group = nullptr;
thread_local uint current_lane = 0;

namespace metal {
template <typename A>
A min(A a, A b) {
  return a < b ? a : b;
}
template <typename A>
A max(A a, A b) {
  return a > b ? a : b;
}
inline float exp(float value) { return std::exp(value); }
inline float log(float value) { return std::log(value); }
inline float sqrt(float value) { return std::sqrt(value); }
}  // namespace metal

#define device
#define constant
#define thread

// The mHC and MoE kernels' headers (metal/hc.metal, metal/moe.metal).
#include "hc.metal"
#include "moe.metal"

#undef device
#undef constant
#undef thread

namespace metal {

inline float simd_sum(float value) {
  SimdGroup& group = *current_group;
  group.lanes[current_lane] = value;
  group.sync.arrive_and_wait();
  float total = 0.0f;
  for (float lane_value : group.lanes) {
    total += lane_value;
  }
  group.sync.arrive_and_wait();  // nobody overwrites a lane before everyone has read it
  return total;
}
}  // namespace metal

#define device
#define constant
#define thread

#include "common.metal"

// Each format in its own namespace: header, then the kernel body as a function template with the
// signature MLX would generate (only the attributes and inputs the body uses).
#define DS4_KERNEL_SIGNATURE                                                                  \
  template <typename T, int K, int N, int ROWS>                                               \
  void kernel(const T* x, const int* x_shape, const uint8_t* w, const uint8_t* tables,        \
              const uint32_t* expert_indices, T* y, uint3 thread_position_in_grid,            \
              uint thread_index_in_simdgroup)

namespace q2_k {
#include "q2_k.metal"
DS4_KERNEL_SIGNATURE {
#include "linear.metal"
}
}  // namespace q2_k

namespace q6_k {
#include "q6_k.metal"
DS4_KERNEL_SIGNATURE {
#include "linear.metal"
}
}  // namespace q6_k

namespace iq2_xxs {
#include "iq2_xxs.metal"
DS4_KERNEL_SIGNATURE {
#include "linear.metal"
}
}  // namespace iq2_xxs

#ifndef DS4_HC
#define DS4_HC 4
#define DS4_ITERS 20
#endif
#ifndef DS4_D
#define DS4_D 64
#define DS4_SLOTS 4
#endif

namespace hc_site {
template <typename T_, uint HC, uint D, uint ITERS>
void kernel(const T_* x, const int* x_shape, const float* mixes, const float* scale,
            const float* base, const float* eps, T_* y, float* post, float* comb,
            uint3 thread_position_in_grid) {
#include "hc_site.metal"
}
}  // namespace hc_site

namespace hc_expand {
template <typename T_, uint HC, uint D>
void kernel(const T_* out, const int* out_shape, const T_* residual, const float* post,
            const float* comb, T_* streams, uint3 thread_position_in_grid) {
#include "hc_expand.metal"
}
}  // namespace hc_expand

#ifndef DS4_E
#define DS4_E 16
#define DS4_TOPK 4
#endif
#ifndef DS4_ROPE_N
#define DS4_ROPE_N 16
#define DS4_ROPE_OFFSET 0
#endif

namespace rope {
template <typename T_, uint D, uint N, uint OFFSET, int INTERLEAVED, int INVERSE>
void kernel(const T_* x, const int* x_shape, int x_ndim, const float* cosines, const float* sines,
            T_* out, uint3 thread_position_in_grid) {
#include "rope.metal"
}
}  // namespace rope

namespace moe_route {
template <uint E, uint K, int FUNC, int HAS_BIAS, int HASHED, int NORMALIZE>
void kernel(const float* logits, const int* logits_shape, const float* bias, const int* hashed,
            const float* scale, int* indices, float* weights, uint3 thread_position_in_grid) {
#include "moe_route.metal"
}
}  // namespace moe_route

#ifndef DS4_POOL_R
#define DS4_POOL_R 4
#endif

namespace pool_blocks {
template <typename T_, uint R, uint DIM, int OVERLAP>
void kernel(const T_* kv, const T_* score, const int* first, T_* pooled, const int* pooled_shape,
            uint3 thread_position_in_grid) {
#include "pool_blocks.metal"
}
}  // namespace pool_blocks

#ifndef DS4_IDX_H
#define DS4_IDX_H 4
#define DS4_IDX_D 32
#endif

namespace indexer_scores {
template <typename T_, uint H, uint D>
void kernel(const T_* q, const int* q_shape, const float* weights, const T_* keys,
            const int* keys_shape, const int* visible, float* scores,
            uint3 thread_position_in_grid) {
#include "indexer_scores.metal"
}
}  // namespace indexer_scores

namespace moe_combine {
template <typename T_, uint K, uint D>
void kernel(const T_* expert_out, const int* expert_out_shape, const float* weights,
            const T_* shared, const int* shared_shape, T_* out, uint3 thread_position_in_grid) {
#include "moe_combine.metal"
}
}  // namespace moe_combine

namespace sinkhorn {
template <uint HC, uint ITERS>
void kernel(const float* comb, const int* comb_shape, const float* eps, float* out,
            uint3 thread_position_in_grid) {
#include "sinkhorn.metal"
}
}  // namespace sinkhorn

namespace sparse_attention {
template <typename T_, uint D, uint K>
void kernel(const T_* q, const int* q_shape, const T_* window, const int* window_shape,
            const int* window_range, const T_* comp, const int* comp_shape, const int* comp_index,
            const float* sinks, const float* scale, T_* out, uint3 thread_position_in_grid,
            uint thread_index_in_simdgroup) {
#include "sparse_attention.metal"
}
}  // namespace sparse_attention

#undef device
#undef constant
#undef thread

using Kernel = void (*)(const float*, const int*, const uint8_t*, const uint8_t*, const uint32_t*,
                        float*, uint3, uint);

template <typename Value>
std::vector<Value> read_values(std::FILE* file, size_t count) {
  std::vector<Value> values(count);
  if (count && std::fread(values.data(), sizeof(Value), count, file) != count) {
    std::fprintf(stderr, "short input\n");
    std::exit(2);
  }
  return values;
}

void write_output(const char* path, const std::vector<float>& values) {
  std::FILE* output = std::fopen(path, "wb");
  std::fwrite(values.data(), sizeof(float), values.size(), output);
  std::fclose(output);
}

// One thread per matrix, as the grid (T, 1, 1) launches it.
int run_sinkhorn(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const int T = read_values<int32_t>(input, 1)[0];
  const auto eps = read_values<float>(input, 1);
  const auto comb = read_values<float>(input, size_t(T) * DS4_HC * DS4_HC);
  std::fclose(input);
  const int comb_shape[3] = {T, DS4_HC, DS4_HC};
  std::vector<float> out(comb.size(), NAN);
  for (uint t = 0; t < uint(T) + 3; ++t) {  // extra threads must return without writing
    sinkhorn::kernel<DS4_HC, DS4_ITERS>(comb.data(), comb_shape, eps.data(), out.data(),
                                        uint3{t, 0, 0});
  }
  write_output(out_path, out);
  return 0;
}

// One thread per (channel, token), as the grid (D, T, 1) launches it, plus threads past the ends
// that must return without writing.
int run_hc_site(const char* in_path, const char* out_path) {
  constexpr uint MIX = (2 + DS4_HC) * DS4_HC;
  std::FILE* input = std::fopen(in_path, "rb");
  const int T = read_values<int32_t>(input, 1)[0];
  const auto eps = read_values<float>(input, 1);
  const auto scale = read_values<float>(input, 3);
  const auto base = read_values<float>(input, MIX);
  const auto x = read_values<float>(input, size_t(T) * DS4_HC * DS4_D);
  const auto mixes = read_values<float>(input, size_t(T) * MIX);
  std::fclose(input);
  const int x_shape[3] = {T, DS4_HC, DS4_D};
  std::vector<float> y(size_t(T) * DS4_D, NAN), post(size_t(T) * DS4_HC, NAN),
      comb(size_t(T) * DS4_HC * DS4_HC, NAN);
  for (uint t = 0; t < uint(T) + 1; ++t) {
    for (uint d = 0; d < DS4_D + 2; ++d) {
      hc_site::kernel<float, DS4_HC, DS4_D, DS4_ITERS>(x.data(), x_shape, mixes.data(),
                                                        scale.data(), base.data(), eps.data(),
                                                        y.data(), post.data(), comb.data(),
                                                        uint3{d, t, 0});
    }
  }
  y.insert(y.end(), post.begin(), post.end());
  y.insert(y.end(), comb.begin(), comb.end());
  write_output(out_path, y);
  return 0;
}

// One thread per output element, as the grid (D, HC, T) launches it, plus threads past the ends.
int run_hc_expand(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const int T = read_values<int32_t>(input, 1)[0];
  const auto out = read_values<float>(input, size_t(T) * DS4_D);
  const auto residual = read_values<float>(input, size_t(T) * DS4_HC * DS4_D);
  const auto post = read_values<float>(input, size_t(T) * DS4_HC);
  const auto comb = read_values<float>(input, size_t(T) * DS4_HC * DS4_HC);
  std::fclose(input);
  const int out_shape[2] = {T, DS4_D};
  std::vector<float> streams(residual.size(), NAN);
  for (uint t = 0; t < uint(T) + 1; ++t) {
    for (uint dst = 0; dst < DS4_HC + 1; ++dst) {
      for (uint d = 0; d < DS4_D + 2; ++d) {
        hc_expand::kernel<float, DS4_HC, DS4_D>(out.data(), out_shape, residual.data(),
                                                 post.data(), comb.data(), streams.data(),
                                                 uint3{d, dst, t});
      }
    }
  }
  write_output(out_path, streams);
  return 0;
}

// One thread per output element, as the grid (D, M, T) launches it, plus threads past the ends.
// M == 0 runs the kernel on x [T, D] (one row a token).
template <int INTERLEAVED, int INVERSE>
void rope_all(int T, int M, const float* x, const float* cos, const float* sin, float* out) {
  const int x_shape[3] = {T, M ? M : DS4_D, DS4_D};
  const int x_ndim = M ? 3 : 2;
  for (uint t = 0; t < uint(T) + 1; ++t) {
    for (uint m = 0; m < uint(M) + 1; ++m) {
      for (uint c = 0; c < DS4_D + 2; ++c) {
        rope::kernel<float, DS4_D, DS4_ROPE_N, DS4_ROPE_OFFSET, INTERLEAVED, INVERSE>(
            x, x_shape, x_ndim, cos, sin, out, uint3{c, m, t});
      }
    }
  }
}

int run_rope(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const auto sizes = read_values<int32_t>(input, 4);
  const int T = sizes[0], M = sizes[1];
  const auto x = read_values<float>(input, size_t(T) * (M ? M : 1) * DS4_D);
  const auto cos = read_values<float>(input, size_t(T) * DS4_ROPE_N / 2);
  const auto sin = read_values<float>(input, size_t(T) * DS4_ROPE_N / 2);
  std::fclose(input);
  std::vector<float> out(x.size(), NAN);
  using Runner = void (*)(int, int, const float*, const float*, const float*, float*);
  const Runner runners[4] = {rope_all<0, 0>, rope_all<0, 1>, rope_all<1, 0>, rope_all<1, 1>};
  runners[sizes[2] * 2 + sizes[3]](T, M, x.data(), cos.data(), sin.data(), out.data());
  write_output(out_path, out);
  return 0;
}

// One thread per token, as the grid (T, 1, 1) launches it, plus one past the end; the gating
// function and flags, template arguments in Metal, are read from the input here.
using RouteRunner = void (*)(int, const float*, const float*, const int*, const float*, int*,
                             float*);

template <int FUNC, int HAS_BIAS, int HASHED, int NORMALIZE>
void route_all(int T, const float* logits, const float* bias, const int* hashed,
               const float* scale, int* indices, float* weights) {
  const int logits_shape[2] = {T, DS4_E};
  for (uint t = 0; t < uint(T) + 1; ++t) {
    moe_route::kernel<DS4_E, DS4_TOPK, FUNC, HAS_BIAS, HASHED, NORMALIZE>(
        logits, logits_shape, bias, hashed, scale, indices, weights, uint3{t, 0, 0});
  }
}

template <size_t... I>
constexpr std::array<RouteRunner, sizeof...(I)> route_runners(std::index_sequence<I...>) {
  return {route_all<int(I / 8) + 1, int(I / 4 % 2), int(I / 2 % 2), int(I % 2)>...};
}

int run_moe_route(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const auto flags = read_values<int32_t>(input, 5);
  const int T = flags[0];
  const auto scale = read_values<float>(input, 1);
  const auto logits = read_values<float>(input, size_t(T) * DS4_E);
  const auto bias = read_values<float>(input, DS4_E);
  const auto hashed = read_values<int32_t>(input, size_t(T) * DS4_TOPK);
  std::fclose(input);
  std::vector<int32_t> indices(size_t(T) * DS4_TOPK, -7);
  std::vector<float> weights(size_t(T) * DS4_TOPK, NAN);
  constexpr auto runners = route_runners(std::make_index_sequence<32>());
  runners[(flags[1] - 1) * 8 + flags[2] * 4 + flags[3] * 2 + flags[4]](
      T, logits.data(), bias.data(), hashed.data(), scale.data(), indices.data(),
      weights.data());
  std::vector<float> result(indices.size());
  std::memcpy(result.data(), indices.data(), indices.size() * sizeof(float));
  result.insert(result.end(), weights.begin(), weights.end());
  write_output(out_path, result);
  return 0;
}

// One thread per output element, as the grid (D, n, 1) launches it, plus threads past the ends.
int run_pool_blocks(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const auto sizes = read_values<int32_t>(input, 4);
  const int N = sizes[0], n = sizes[1], overlap = sizes[3];
  const size_t width = size_t(overlap ? 2 : 1) * DS4_D;
  const auto kv = read_values<float>(input, N * width);
  const auto score = read_values<float>(input, N * width);
  std::fclose(input);
  const int first[1] = {sizes[2]}, pooled_shape[2] = {n, DS4_D};
  std::vector<float> pooled(size_t(n) * DS4_D, NAN);
  for (uint block = 0; block < uint(n) + 1; ++block) {
    for (uint c = 0; c < DS4_D + 2; ++c) {
      const uint3 position{c, block, 0};
      if (overlap) {
        pool_blocks::kernel<float, DS4_POOL_R, DS4_D, 1>(kv.data(), score.data(), first,
                                                         pooled.data(), pooled_shape, position);
      } else {
        pool_blocks::kernel<float, DS4_POOL_R, DS4_D, 0>(kv.data(), score.data(), first,
                                                         pooled.data(), pooled_shape, position);
      }
    }
  }
  write_output(out_path, pooled);
  return 0;
}

// One thread per (block, row), as the grid (N, T, 1) launches it, plus threads past the ends.
int run_indexer_scores(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const auto sizes = read_values<int32_t>(input, 2);
  const int T = sizes[0], N = sizes[1];
  const auto q = read_values<float>(input, size_t(T) * DS4_IDX_H * DS4_IDX_D);
  const auto weights = read_values<float>(input, size_t(T) * DS4_IDX_H);
  const auto keys = read_values<float>(input, size_t(N) * DS4_IDX_D);
  const auto visible = read_values<int32_t>(input, T);
  std::fclose(input);
  const int q_shape[3] = {T, DS4_IDX_H, DS4_IDX_D}, keys_shape[2] = {N, DS4_IDX_D};
  std::vector<float> scores(size_t(T) * N, NAN);
  for (uint t = 0; t < uint(T) + 1; ++t) {
    for (uint j = 0; j < uint(N) + 2; ++j) {
      indexer_scores::kernel<float, DS4_IDX_H, DS4_IDX_D>(q.data(), q_shape, weights.data(),
                                                          keys.data(), keys_shape, visible.data(),
                                                          scores.data(), uint3{j, t, 0});
    }
  }
  write_output(out_path, scores);
  return 0;
}

// One thread per output element, as the grid (D, T, 1) launches it, plus threads past the ends.
int run_moe_combine(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const auto sizes = read_values<int32_t>(input, 2);
  const int T = sizes[0], R = sizes[1];
  const auto expert_out = read_values<float>(input, size_t(R) * DS4_TOPK * DS4_D);
  const auto weights = read_values<float>(input, size_t(T) * DS4_TOPK);
  const auto shared = read_values<float>(input, size_t(T) * DS4_D);
  std::fclose(input);
  const int expert_out_shape[3] = {R, DS4_TOPK, DS4_D}, shared_shape[2] = {T, DS4_D};
  std::vector<float> out(shared.size(), NAN);
  for (uint t = 0; t < uint(T) + 1; ++t) {
    for (uint d = 0; d < DS4_D + 2; ++d) {
      moe_combine::kernel<float, DS4_TOPK, DS4_D>(expert_out.data(), expert_out_shape,
                                                  weights.data(), shared.data(), shared_shape,
                                                  out.data(), uint3{d, t, 0});
    }
  }
  write_output(out_path, out);
  return 0;
}

// One simdgroup (32 host threads) per (row, head), as the grid (32, H, T) launches it.
int run_sparse_attention(const char* in_path, const char* out_path) {
  std::FILE* input = std::fopen(in_path, "rb");
  const auto sizes = read_values<int32_t>(input, 4);
  const int T = sizes[0], H = sizes[1], W = sizes[2], N = sizes[3];
  const auto scale = read_values<float>(input, 1);
  const auto q = read_values<float>(input, size_t(T) * H * DS4_D);
  const auto window = read_values<float>(input, size_t(W) * DS4_D);
  const auto window_range = read_values<int32_t>(input, size_t(T) * 2);
  const auto comp = read_values<float>(input, size_t(N) * DS4_D);
  const auto comp_index = read_values<int32_t>(input, size_t(T) * DS4_SLOTS);
  const auto sinks = read_values<float>(input, H);
  std::fclose(input);
  const int q_shape[3] = {T, H, DS4_D}, window_shape[2] = {W, DS4_D}, comp_shape[2] = {N, DS4_D};
  std::vector<float> out(q.size(), NAN);
  for (uint t = 0; t < uint(T); ++t) {
    for (uint h = 0; h < uint(H); ++h) {
      SimdGroup group;
      std::vector<host_thread> lanes;
      for (uint lane = 0; lane < 32; ++lane) {
        lanes.emplace_back([&, lane] {
          current_group = &group;
          current_lane = lane;
          sparse_attention::kernel<float, DS4_D, DS4_SLOTS>(
              q.data(), q_shape, window.data(), window_shape, window_range.data(), comp.data(),
              comp_shape, comp_index.data(), sinks.data(), scale.data(), out.data(),
              uint3{lane, h, t}, lane);
        });
      }
      for (auto& lane : lanes) {
        lane.join();
      }
    }
  }
  write_output(out_path, out);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <format> <input> <output>\n", argv[0]);
    return 2;
  }
  const std::string format = argv[1];
  if (format == "sinkhorn") {
    return run_sinkhorn(argv[2], argv[3]);
  }
  if (format == "sparse_attention") {
    return run_sparse_attention(argv[2], argv[3]);
  }
  if (format == "hc_site") {
    return run_hc_site(argv[2], argv[3]);
  }
  if (format == "hc_expand") {
    return run_hc_expand(argv[2], argv[3]);
  }
  if (format == "rope") {
    return run_rope(argv[2], argv[3]);
  }
  if (format == "moe_route") {
    return run_moe_route(argv[2], argv[3]);
  }
  if (format == "pool_blocks") {
    return run_pool_blocks(argv[2], argv[3]);
  }
  if (format == "indexer_scores") {
    return run_indexer_scores(argv[2], argv[3]);
  }
  if (format == "moe_combine") {
    return run_moe_combine(argv[2], argv[3]);
  }
  Kernel kernel;
  uint block_values, block_bytes;
  if (format == "q2_k") {
    kernel = q2_k::kernel<float, DS4_K, DS4_N, DS4_ROWS>;
    block_values = q2_k::DS4_BLOCK_VALUES;
    block_bytes = q2_k::DS4_BLOCK_BYTES;
  } else if (format == "q6_k") {
    kernel = q6_k::kernel<float, DS4_K, DS4_N, DS4_ROWS>;
    block_values = q6_k::DS4_BLOCK_VALUES;
    block_bytes = q6_k::DS4_BLOCK_BYTES;
  } else if (format == "iq2_xxs") {
    kernel = iq2_xxs::kernel<float, DS4_K, DS4_N, DS4_ROWS>;
    block_values = iq2_xxs::DS4_BLOCK_VALUES;
    block_bytes = iq2_xxs::DS4_BLOCK_BYTES;
  } else {
    std::fprintf(stderr, "unknown format %s\n", format.c_str());
    return 2;
  }

  std::FILE* input = std::fopen(argv[2], "rb");
  const auto sizes = read_values<int32_t>(input, 3);
  const uint P = sizes[0], M = sizes[1], E = sizes[2];
  const auto x = read_values<float>(input, size_t(P) * M * DS4_K);
  const auto w = read_values<uint8_t>(input, size_t(E) * DS4_N * (DS4_K / block_values) * block_bytes);
  const auto table_bytes = read_values<uint32_t>(input, 1)[0];
  const auto tables = read_values<uint8_t>(input, table_bytes);
  const auto expert_indices = read_values<uint32_t>(input, P);
  std::fclose(input);

  const int x_shape[3] = {int(P), int(M), DS4_K};
  std::vector<float> y(size_t(P) * M * DS4_N, NAN);
  const uint row_groups = (M + DS4_ROWS - 1) / DS4_ROWS;
  for (uint p = 0; p < P; ++p) {
    for (uint row_group = 0; row_group < row_groups; ++row_group) {
      for (uint n = 0; n < DS4_N; ++n) {
        SimdGroup group;
        std::vector<host_thread> lanes;
        for (uint lane = 0; lane < 32; ++lane) {
          lanes.emplace_back([&, lane] {
            current_group = &group;
            current_lane = lane;
            kernel(x.data(), x_shape, w.data(), tables.data(), expert_indices.data(), y.data(),
                   uint3{n * 32 + lane, row_group, p}, lane);
          });
        }
        for (auto& lane : lanes) {
          lane.join();
        }
      }
    }
  }

  write_output(argv[3], y);
  return 0;
}
