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

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <format> <input> <output>\n", argv[0]);
    return 2;
  }
  const std::string format = argv[1];
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

  std::FILE* output = std::fopen(argv[3], "wb");
  std::fwrite(y.data(), sizeof(float), y.size(), output);
  std::fclose(output);
  return 0;
}
