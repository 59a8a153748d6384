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

#include <barrier>
#include <cmath>
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
