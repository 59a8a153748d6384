// The Metal language on the CPU, for tests/kernels/metal_emulation.cpp (which says how it is
// used): address spaces, half, as_type, counting device pointers, threadgroups of fibers with
// threadgroup barriers, simdgroup operations and threadgroup atomics.

#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
typedef unsigned char uchar;

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

[[noreturn]] void fail(const char* message) {
  std::fprintf(stderr, "metal emulation: %s\n", message);
  std::exit(3);
}

// --------------------------------------------------------------------------------------------
// Device memory: the launch's buffers, and pointers that count and check every load
// --------------------------------------------------------------------------------------------

struct Counters {
  uint64_t device_load_instructions = 0;
  uint64_t device_bytes = 0;
  uint64_t threadgroups = 0;
  uint threads_per_threadgroup = 0;
};
Counters counters;

struct Buffer {
  const char* begin;
  size_t size;
};
std::vector<Buffer> buffers;  // every device buffer bound to the launch

template <typename T>
void bind_buffer(const std::vector<T>& values) {
  buffers.push_back({reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)});
}

void check_load(const void* address, size_t size, size_t alignment) {
  const char* at = static_cast<const char*>(address);
  if (reinterpret_cast<uintptr_t>(at) % alignment) {
    fail("misaligned device load");
  }
  for (const Buffer& buffer : buffers) {
    if (at >= buffer.begin && at + size <= buffer.begin + buffer.size) {
      return;
    }
  }
  fail("device load outside every bound buffer");
}

// `device T*` in a kernel source. Reads through a const pointer are the loads that count;
// writes (outputs) go through non-const pointers and are not counted.
template <typename T>
struct DevicePtr {
  T* address = nullptr;

  DevicePtr() = default;
  DevicePtr(T* at) : address(at) {}
  template <typename U>
    requires std::is_convertible_v<U*, T*>
  DevicePtr(DevicePtr<U> other) : address(other.address) {}
  template <typename U>  // a reinterpreting cast, `(const device uint*)(bytes)` in Metal
    requires(!std::is_convertible_v<U*, T*>)
  explicit DevicePtr(DevicePtr<U> other) : address(reinterpret_cast<T*>(other.address)) {}

  template <typename I>
  DevicePtr operator+(I offset) const {
    return DevicePtr(address + offset);
  }
  template <typename I>
  DevicePtr& operator+=(I offset) {
    address += offset;
    return *this;
  }
  template <typename I>
    requires std::is_const_v<T>
  std::remove_const_t<T> operator[](I index) const {
    check_load(address + index, sizeof(T), alignof(T));
    counters.device_load_instructions += 1;
    counters.device_bytes += sizeof(T);
    return address[index];
  }
  template <typename I>
    requires(!std::is_const_v<T>)
  T& operator[](I index) const {
    return address[index];
  }
  decltype(auto) operator*() const { return (*this)[0]; }
};

// --------------------------------------------------------------------------------------------
// Threads of a threadgroup as fibers; barriers; simdgroup operations
// --------------------------------------------------------------------------------------------

constexpr uint SIMD_WIDTH = 32;
constexpr size_t FIBER_STACK = 128 * 1024;

struct ThreadIds {
  uint3 thread_position_in_grid, threadgroup_position_in_grid, thread_position_in_threadgroup;
  uint thread_index_in_threadgroup, simdgroup_index_in_threadgroup, thread_index_in_simdgroup;
};

struct Barrier {
  uint expected, arrived = 0;
  uint64_t generation = 0;
};

struct SimdGroup {
  Barrier barrier{SIMD_WIDTH};
  alignas(16) unsigned char lanes[SIMD_WIDTH][16];  // each lane's operand of the running op
};

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;  // not zero-filled: pages are touched only as used
  ThreadIds ids;
  bool done = false;
};

struct Launch {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<SimdGroup> simdgroups;
  Barrier threadgroup_barrier{0};
  Fiber* running = nullptr;
  const std::function<void(const ThreadIds&)>* body = nullptr;
  uint64_t progress = 0;  // barrier releases and finished threads: a round without any is stuck
};
Launch launch_state;

void fiber_entry() {
  Launch& launch = launch_state;
  (*launch.body)(launch.running->ids);
  launch.running->done = true;
  ++launch.progress;
  swapcontext(&launch.running->context, &launch.scheduler);
}

void wait_at(Barrier& barrier) {
  Launch& launch = launch_state;
  const uint64_t generation = barrier.generation;
  if (++barrier.arrived == barrier.expected) {
    barrier.arrived = 0;
    ++barrier.generation;
    ++launch.progress;
    return;
  }
  while (barrier.generation == generation) {
    swapcontext(&launch.running->context, &launch.scheduler);
  }
}

// Runs `body` once per thread of `groups` threadgroups of `threads` threads (a multiple of the
// SIMD width), as dispatchThreadgroups would; `run_group` may skip threadgroups.
void launch(uint3 groups, uint threads, const std::function<void(const ThreadIds&)>& body,
            const std::function<bool(uint3)>& run_group = [](uint3) { return true; }) {
  if (threads == 0 || threads % SIMD_WIDTH) {
    fail("threadgroup size must be a positive multiple of 32");
  }
  Launch& launch = launch_state;
  launch.body = &body;
  launch.fibers.resize(threads);
  launch.simdgroups = std::vector<SimdGroup>(threads / SIMD_WIDTH);
  counters.threads_per_threadgroup = threads;
  for (Fiber& fiber : launch.fibers) {
    if (!fiber.stack) {
      fiber.stack.reset(new char[FIBER_STACK]);
    }
  }
  for (uint gz = 0; gz < groups.z; ++gz) {
    for (uint gy = 0; gy < groups.y; ++gy) {
      for (uint gx = 0; gx < groups.x; ++gx) {
        const uint3 group{gx, gy, gz};
        if (!run_group(group)) {
          continue;
        }
        ++counters.threadgroups;
        launch.threadgroup_barrier = Barrier{threads};
        for (SimdGroup& simdgroup : launch.simdgroups) {
          simdgroup.barrier = Barrier{SIMD_WIDTH};
        }
        for (uint t = 0; t < threads; ++t) {
          Fiber& fiber = launch.fibers[t];
          fiber.done = false;
          fiber.ids = {{gx * threads + t, gy, gz}, group, {t, 0, 0}, t, t / SIMD_WIDTH,
                       t % SIMD_WIDTH};
          getcontext(&fiber.context);
          fiber.context.uc_stack.ss_sp = fiber.stack.get();
          fiber.context.uc_stack.ss_size = FIBER_STACK;
          fiber.context.uc_link = nullptr;
          makecontext(&fiber.context, fiber_entry, 0);
        }
        for (uint live = threads; live > 0;) {
          const uint64_t progress = launch.progress;
          live = 0;
          for (Fiber& fiber : launch.fibers) {
            if (!fiber.done) {
              launch.running = &fiber;
              swapcontext(&launch.scheduler, &fiber.context);
              live += !fiber.done;
            }
          }
          if (live && launch.progress == progress) {
            fail("deadlock: some threads wait at a barrier the others never reach");
          }
        }
      }
    }
  }
}

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

enum class mem_flags { mem_none, mem_device, mem_threadgroup };

inline void threadgroup_barrier(mem_flags) { wait_at(launch_state.threadgroup_barrier); }

// Every lane publishes its operand, all meet, each reads what it needs, all meet again (so no
// lane overwrites its operand before everyone has read it).
template <typename V, typename Read>
V simd_exchange(V value, Read read) {
  static_assert(sizeof(V) <= 16, "simdgroup operands are at most 16 bytes");
  const ThreadIds& ids = launch_state.running->ids;
  SimdGroup& group = launch_state.simdgroups[ids.simdgroup_index_in_threadgroup];
  std::memcpy(group.lanes[ids.thread_index_in_simdgroup], &value, sizeof(V));
  wait_at(group.barrier);
  auto lane_value = [&](uint lane) {
    V other;
    std::memcpy(&other, group.lanes[lane % SIMD_WIDTH], sizeof(V));
    return other;
  };
  const V result = read(lane_value, ids.thread_index_in_simdgroup);
  wait_at(group.barrier);
  return result;
}

template <typename V>
V simd_sum(V value) {
  return simd_exchange(value, [](auto lane_value, uint) {
    V total = 0;
    for (uint lane = 0; lane < SIMD_WIDTH; ++lane) {
      total += lane_value(lane);
    }
    return total;
  });
}
template <typename V>
V simd_max(V value) {
  return simd_exchange(value, [](auto lane_value, uint) {
    V top = lane_value(0);
    for (uint lane = 1; lane < SIMD_WIDTH; ++lane) {
      top = max(top, lane_value(lane));
    }
    return top;
  });
}
template <typename V>
V simd_shuffle(V value, uint source) {
  return simd_exchange(value, [source](auto lane_value, uint) { return lane_value(source); });
}
template <typename V>
V simd_broadcast(V value, uint source) {
  return simd_shuffle(value, source);
}
template <typename V>
V simd_shuffle_xor(V value, uint mask) {
  return simd_exchange(value, [mask](auto lane_value, uint lane) { return lane_value(lane ^ mask); });
}
template <typename V>
V simd_shuffle_down(V value, uint delta) {  // lanes past the end keep their own value
  return simd_exchange(value, [delta](auto lane_value, uint lane) {
    return lane_value(lane + delta < SIMD_WIDTH ? lane + delta : lane);
  });
}
template <typename V>
V simd_prefix_exclusive_sum(V value) {  // the sum over the lanes before this one
  return simd_exchange(value, [](auto lane_value, uint lane) {
    V total = 0;
    for (uint before = 0; before < lane; ++before) {
      total += lane_value(before);
    }
    return total;
  });
}

// Threadgroup atomics: the fibers of a threadgroup run one at a time, so a plain access is
// atomic.
struct atomic_uint {
  uint value;
};
enum memory_order { memory_order_relaxed };
inline void atomic_store_explicit(atomic_uint* object, uint value, memory_order) {
  object->value = value;
}
inline uint atomic_load_explicit(atomic_uint* object, memory_order) { return object->value; }
inline uint atomic_fetch_add_explicit(atomic_uint* object, uint value, memory_order) {
  const uint old = object->value;
  object->value += value;
  return old;
}
}  // namespace metal

