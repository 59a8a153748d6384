// Runs the Metal sources in metal/ on the CPU, so their logic is tested (and measured) where
// Metal is missing.
//
// tests/kernels/emulator.py rewrites the sources before they reach this file (a device pointer
// becomes DevicePtr<T>, a threadgroup array a static array), writes them to the include
// directory as <kernel>.metal, and compiles this file against them. metal_shim.h maps the rest
// of the Metal language the kernels use onto C++20:
// - a launch runs its threadgroups one after another; the threads of a threadgroup are fibers
//   (ucontext) on one host thread, switched at every barrier, so threadgroup memory (a static
//   array) is shared by exactly the threads of the running threadgroup, and simdgroup operations
//   (simd_sum, simd_max, simd_shuffle...) and threadgroup_barrier meet like on the GPU; a barrier
//   some threads of a group never reach is reported as a deadlock;
// - every read through a device pointer is one device load instruction of sizeof(T) bytes,
//   counted per launch, checked against the bounds and the alignment of its buffer;
// - `half` decodes IEEE binary16 and `as_type` is a bit copy.
//
// Usage: metal_emulation <mode> <input> <output>; prints the launch's counters as one JSON line.
//   linear <q2_k|q6_k|iq2_xxs>, baseline_linear <format>   (-DDS4_K, -DDS4_N, -DDS4_SIMDGROUPS,
//       -DDS4_ROWS, -DDS4_XSHARE; the baseline is the kernel the packed mat-vec replaced, ROWS
//       x rows a group)
//     input: int32 P, M, E, XROWS, GROUP_STRIDE, REAL_ROWS (the x rows computed)
//            | float32 x [P / XSHARE, M, K] (M 0: a 2-D x
//            [P / XSHARE, K], one row a batch) | uint8 w [E, N, row_bytes]
//            | uint32 table_bytes | uint8 tables | uint32 expert_indices [P]
//     GROUP_STRIDE s > 1 runs only every s-th threadgroup along the output rows (the others'
//     outputs stay NaN); output: float32 y [P, M, N]
//   sinkhorn (-DDS4_HC, -DDS4_ITERS)
//     input: int32 T | float32 eps | float32 comb [T, HC, HC];  output: float32 [T, HC, HC]
//   sparse_attention (-DDS4_D, -DDS4_HEADS, -DDS4_SPLITS),
//   baseline_sparse_attention (-DDS4_D, -DDS4_SLOTS: the replaced kernel, SLOTS compiled in)
//     input: int32 T, H, W, N, SLOTS | float32 scale | float32 q [T, H, D] | float32 window [W, D]
//            | int32 window_range [T, 2] | float32 comp [N, D] | int32 comp_index [T, SLOTS]
//            | float32 sinks [H];  output: float32 [T, H, D]
//   The step kernels, one thread per output element (or token) as metal.py launches them:
//   hc_site (-DDS4_HC, -DDS4_ITERS, -DDS4_D)
//     input: int32 T | float32 eps | float32 scale [3] | float32 base [(2 + HC) * HC]
//            | float32 x [T, HC, D] | float32 mixes [T, (2 + HC) * HC]
//     output: float32 y [T, D] | float32 post [T, HC] | float32 comb [T, HC, HC]
//   hc_expand (-DDS4_HC, -DDS4_D)
//     input: int32 T | float32 out [T, D] | float32 residual [T, HC, D] | float32 post [T, HC]
//            | float32 comb [T, HC, HC];  output: float32 [T, HC, D]
//   rope (-DDS4_D, -DDS4_ROPE_N, -DDS4_ROPE_OFFSET)
//     input: int32 T, M, interleaved, inverse | float32 x [T, M, D] ([T, D] for M 0)
//            | float32 cos, sin [T, N / 2];  output: float32 [T, M, D]
//   moe_route (-DDS4_E, -DDS4_TOPK)
//     input: int32 T, R, func, has_bias, hashed, normalize | float32 scale
//            | float32 logits [T, E] | float32 bias [E] | int32 hashed [T, TOPK]
//     output: int32 indices [R, TOPK] | float32 weights [R, TOPK] (the first R rows routed)
//   moe_combine (-DDS4_TOPK, -DDS4_D)
//     input: int32 T, R | float32 expert_out [R, TOPK, D] | float32 weights [T, TOPK]
//            | float32 shared [T, D];  output: float32 [T, D]
//   pool_blocks (-DDS4_POOL_R, -DDS4_D)
//     input: int32 N, n, first, overlap | float32 kv [N, W] | float32 score [N, W]
//            (W = D, or 2 D with overlap);  output: float32 [n, D]
//   indexer_scores (-DDS4_IDX_H, -DDS4_IDX_D)
//     input: int32 T, N | float32 weight_scale | float32 q [T, H, D] | float32 weights [T, H]
//            | float32 keys [N, D] | int32 visible [T];  output: float32 [T, N]
//   indexer_top_k (-DDS4_IDX_TOPK, -DDS4_IDX_THREADS)
//     input: int32 T, N | float32 scores [T, N] | int32 visible [T]
//     output: int32 top [T, TOPK]
//   embed_streams (-DDS4_EMBED_GROUP, -DDS4_D, -DDS4_HC)
//     input: int32 T, V, bits | int32 tokens [T] | uint32 packed [V, D * bits / 32]
//            | float32 scales, biases [V, D / GROUP];  output: float32 streams [T, HC * D]
//   grow_rows (-DDS4_D)
//     input: int32 N, F, take, M | float32 cached [N, D] | float32 fresh [F, D]
//     output: float32 [M, D]
//   grow_row_pairs (-DDS4_D)
//     input: int32 N, F, take, M, added | float32 cached [N, D] | fresh [F, D] | cached2 [N, D]
//            | fresh2 [F, D] | added [F, D] (one value if not added)
//     output: float32 rows [M, D] | rows2 [M, D]
//   The kernels that carry a norm, one threadgroup per row (metal_norm_kernels.h):
//   hc_site_norm (-DDS4_HC, -DDS4_ITERS, -DDS4_D)
//     input: int32 T | float32 eps [3] | float32 scale [3] | float32 base [(2 + HC) * HC]
//            | float32 weight [D] | float32 x [T, HC, D] | float32 mixes [T, (2 + HC) * HC]
//     output: float32 y [T, D] | float32 post [T, HC] | float32 comb [T, HC, HC]
//   hc_head_norm (the same kernel, SITE 0): as hc_site_norm with scale [1], base [HC] and
//     mixes [T, HC]; post and comb come out NaN (not written)
//   norm_rope (-DDS4_D, -DDS4_ROPE_N, -DDS4_ROPE_OFFSET)
//     input: int32 T, M, interleaved, weighted | float32 eps | float32 weight [D] (1 if not
//            weighted) | float32 x [T, M, D] ([T, D] for M 0, [T, -M * D] for M < 0: a
//            product's heads as it comes) | float32 cos, sin [T, N / 2]
//     output: float32 [T, M, D]
//   kda_tile (-DDS4_KDA_D, -DDS4_KDA_H, -DDS4_KDA_KERNEL, -DDS4_KDA_KEEP_ROWS): its input and
//     output are listed at run_kda_tile

#include "metal_shim.h"

// --------------------------------------------------------------------------------------------
// The kernels, each in its own namespace, with the signature mx.fast.metal_kernel would write
// (only the attributes the body uses). Integer template arguments are `int`, as MLX declares them.
// --------------------------------------------------------------------------------------------

#define constant
#define thread

// Every size a test does not set (each build compiles every kernel).
#ifndef DS4_K
#define DS4_K 256
#endif
#ifndef DS4_N
#define DS4_N 1
#endif
#ifndef DS4_SIMDGROUPS
#define DS4_SIMDGROUPS 1
#endif
#ifndef DS4_ROWS
#define DS4_ROWS 1
#endif
#ifndef DS4_XSHARE
#define DS4_XSHARE 1
#endif
#ifndef DS4_HC
#define DS4_HC 4
#endif
#ifndef DS4_ITERS
#define DS4_ITERS 20
#endif
#ifndef DS4_D
#define DS4_D 64
#endif
#ifndef DS4_HEADS
#define DS4_HEADS 1
#endif
#ifndef DS4_SPLITS
#define DS4_SPLITS 1
#endif
#ifndef DS4_SLOTS
#define DS4_SLOTS 4
#endif

// The mHC kernels' header (metal/sinkhorn.metal's too), where MLX puts a kernel's header.
#include "hc.metal"

#define DS4_LINEAR_SIGNATURE                                                                    \
  template <typename T, int K, int N, int SIMDGROUPS, int ROWS, int XROWS, int XSHARE>          \
  void kernel(DevicePtr<const T> x, const int* x_shape, int x_ndim, DevicePtr<const uint8_t> w, \
              DevicePtr<const uint32_t> expert_indices, DevicePtr<const int> real_rows,         \
              DevicePtr<T> y,                                                                   \
              uint simdgroup_index_in_threadgroup, uint thread_index_in_simdgroup,              \
              uint thread_index_in_threadgroup, uint3 threadgroup_position_in_grid)
#define DS4_BASELINE_SIGNATURE                                                                  \
  template <typename T, int K, int N, int ROWS>                                                 \
  void kernel(DevicePtr<const T> x, const int* x_shape, DevicePtr<const uint8_t> w,             \
              DevicePtr<const uint8_t> tables, DevicePtr<const uint32_t> expert_indices,        \
              DevicePtr<T> y, uint3 thread_position_in_grid, uint thread_index_in_simdgroup)

namespace q2_k {
#include "q2_k.metal"
DS4_LINEAR_SIGNATURE {
#include "linear.metal"
}
}  // namespace q2_k

namespace q6_k {
#include "q6_k.metal"
DS4_LINEAR_SIGNATURE {
#include "linear.metal"
}
}  // namespace q6_k

namespace iq2_xxs {
#include "iq2_xxs.metal"
DS4_LINEAR_SIGNATURE {
#include "linear.metal"
}
}  // namespace iq2_xxs

namespace baseline_q2_k {
#include "baseline_q2_k.metal"
DS4_BASELINE_SIGNATURE {
#include "baseline_linear.metal"
}
}  // namespace baseline_q2_k

namespace baseline_q6_k {
#include "baseline_q6_k.metal"
DS4_BASELINE_SIGNATURE {
#include "baseline_linear.metal"
}
}  // namespace baseline_q6_k

namespace baseline_iq2_xxs {
#include "baseline_iq2_xxs.metal"
DS4_BASELINE_SIGNATURE {
#include "baseline_linear.metal"
}
}  // namespace baseline_iq2_xxs

namespace sinkhorn {
template <int HC, int ITERS>
void kernel(DevicePtr<const float> comb, const int* comb_shape, DevicePtr<const float> eps,
            DevicePtr<float> out, uint3 thread_position_in_grid) {
#include "sinkhorn.metal"
}
}  // namespace sinkhorn

namespace sparse_attention {
template <typename T_, int D, int HEADS, int SPLITS>
void kernel(DevicePtr<const T_> q, const int* q_shape, DevicePtr<const T_> window,
            const int* window_shape, DevicePtr<const int> window_range, DevicePtr<const T_> comp,
            const int* comp_shape, DevicePtr<const int> comp_index, const int* comp_index_shape,
            DevicePtr<const float> sinks, DevicePtr<const float> scale, DevicePtr<T_> out,
            uint simdgroup_index_in_threadgroup, uint thread_index_in_simdgroup,
            uint thread_index_in_threadgroup, uint3 threadgroup_position_in_grid) {
#include "sparse_attention.metal"
}
}  // namespace sparse_attention

namespace baseline_sparse_attention {
template <typename T_, int D, int K>
void kernel(DevicePtr<const T_> q, const int* q_shape, DevicePtr<const T_> window,
            const int* window_shape, DevicePtr<const int> window_range, DevicePtr<const T_> comp,
            const int* comp_shape, DevicePtr<const int> comp_index, DevicePtr<const float> sinks,
            DevicePtr<const float> scale, DevicePtr<T_> out, uint3 thread_position_in_grid,
            uint thread_index_in_simdgroup) {
#include "baseline_sparse_attention.metal"
}
}  // namespace baseline_sparse_attention

#undef constant
#undef thread

// --------------------------------------------------------------------------------------------
// Runners: read the inputs, launch as ds4mlx/kernels/metal{,_fused}.py do, write the outputs
// --------------------------------------------------------------------------------------------

struct Input {
  std::FILE* file;

  explicit Input(const char* path) : file(std::fopen(path, "rb")) {
    if (!file) {
      fail("cannot open the input");
    }
  }
  ~Input() { std::fclose(file); }

  template <typename Value>
  std::vector<Value> read(size_t count) {
    std::vector<Value> values(count);
    if (count && std::fread(values.data(), sizeof(Value), count, file) != count) {
      fail("short input");
    }
    return values;
  }
};

void write_output(const char* path, const std::vector<float>& values) {
  std::FILE* output = std::fopen(path, "wb");
  std::fwrite(values.data(), sizeof(float), values.size(), output);
  std::fclose(output);
}

struct LinearLaunch {
  const std::vector<float>& x;
  const int* x_shape;
  int x_ndim;
  const std::vector<uint8_t>& w;
  const std::vector<uint8_t>& tables;
  const std::vector<uint32_t>& expert_indices;
  const std::vector<int32_t>& real_rows;
  std::vector<float>& y;
  uint P, M, group_stride;
};

// The packed mat-vec: threadgroups of SIMDGROUPS x ROWS output rows by XROWS x rows.
template <int XROWS, typename Format>
void run_linear(const LinearLaunch& a) {
  constexpr uint rows_per_group = DS4_SIMDGROUPS * DS4_ROWS;
  const uint computed = std::min<uint>(a.M, a.real_rows[0]);
  const uint3 groups{(DS4_N + rows_per_group - 1) / rows_per_group,
                     (computed + XROWS - 1) / XROWS, a.P};
  launch(
      groups, SIMD_WIDTH * DS4_SIMDGROUPS,
      [&](const ThreadIds& ids) {
        Format::template kernel<float, DS4_K, DS4_N, DS4_SIMDGROUPS, DS4_ROWS, XROWS, DS4_XSHARE>(
            a.x.data(), a.x_shape, a.x_ndim, a.w.data(), a.expert_indices.data(),
            a.real_rows.data(), a.y.data(),
            ids.simdgroup_index_in_threadgroup, ids.thread_index_in_simdgroup,
            ids.thread_index_in_threadgroup, ids.threadgroup_position_in_grid);
      },
      [&](uint3 group) { return group.x % a.group_stride == 0; });
}

// Today's kernel before the packed mat-vec: one simdgroup per output row and 8 x rows.
template <typename Format>
void run_baseline_linear(const LinearLaunch& a) {
  constexpr uint rows = 8, simdgroups_per_group = DS4_N < 8 ? DS4_N : 8;
  const uint3 groups{(DS4_N + simdgroups_per_group - 1) / simdgroups_per_group,
                     (a.M + rows - 1) / rows, a.P};
  launch(
      groups, SIMD_WIDTH * simdgroups_per_group,
      [&](const ThreadIds& ids) {
        if (ids.thread_position_in_grid.x >= SIMD_WIDTH * DS4_N) {
          return;  // MLX launches exactly 32 * N threads along x
        }
        Format::template kernel<float, DS4_K, DS4_N, rows>(
            a.x.data(), a.x_shape, a.w.data(), a.tables.data(), a.expert_indices.data(),
            a.y.data(), ids.thread_position_in_grid, ids.thread_index_in_simdgroup);
      },
      [&](uint3 group) { return group.x % a.group_stride == 0; });
}

struct LinearFormat {
  const char* name;
  uint block_values, block_bytes;
  void (*run[4])(const LinearLaunch&);  // XROWS 1, 2, 4, 8
  void (*baseline)(const LinearLaunch&);
};

#define DS4_FORMAT_ENTRY(NAME)                                                                 \
  struct NAME##_format {                                                                       \
    template <typename T, int K, int N, int S, int R, int X, int XS>                           \
    static void kernel(DevicePtr<const T> x, const int* shape, int ndim,                       \
                       DevicePtr<const uint8_t> w, DevicePtr<const uint32_t> e,                \
                       DevicePtr<const int> real, DevicePtr<T> y, uint sg, uint lane,          \
                       uint tid, uint3 group) {                                                \
      NAME::kernel<T, K, N, S, R, X, XS>(x, shape, ndim, w, e, real, y, sg, lane, tid, group); \
    }                                                                                          \
  };                                                                                           \
  struct baseline_##NAME##_format {                                                            \
    template <typename T, int K, int N, int R>                                                 \
    static void kernel(DevicePtr<const T> x, const int* shape, DevicePtr<const uint8_t> w,     \
                       DevicePtr<const uint8_t> tables, DevicePtr<const uint32_t> e,           \
                       DevicePtr<T> y, uint3 position, uint lane) {                            \
      baseline_##NAME::kernel<T, K, N, R>(x, shape, w, tables, e, y, position, lane);          \
    }                                                                                          \
  };
DS4_FORMAT_ENTRY(q2_k)
DS4_FORMAT_ENTRY(q6_k)
DS4_FORMAT_ENTRY(iq2_xxs)

#define DS4_FORMAT_TABLE_ROW(NAME)                                                               \
  LinearFormat {                                                                                 \
    #NAME, NAME::DS4_BLOCK_VALUES, NAME::DS4_BLOCK_BYTES,                                        \
        {run_linear<1, NAME##_format>, run_linear<2, NAME##_format>,                             \
         run_linear<4, NAME##_format>, run_linear<8, NAME##_format>},                            \
        run_baseline_linear<baseline_##NAME##_format>                                            \
  }
const LinearFormat LINEAR_FORMATS[] = {DS4_FORMAT_TABLE_ROW(q2_k), DS4_FORMAT_TABLE_ROW(q6_k),
                                       DS4_FORMAT_TABLE_ROW(iq2_xxs)};

int run_linear_mode(bool baseline, const std::string& format, const char* in_path,
                    const char* out_path) {
  const LinearFormat* chosen = nullptr;
  for (const LinearFormat& candidate : LINEAR_FORMATS) {
    if (format == candidate.name) {
      chosen = &candidate;
    }
  }
  if (!chosen) {
    fail("unknown packed format");
  }
  Input input(in_path);
  const auto sizes = input.read<int32_t>(6);
  // M 0: x [P / XSHARE, K], one row a batch (2-D); else x [P / XSHARE, M, K].
  const uint P = sizes[0], M = std::max(sizes[1], 1), E = sizes[2], XROWS = sizes[3],
             stride = sizes[4];
  const std::vector<int32_t> real_rows{sizes[5]};
  if (P % DS4_XSHARE) {
    fail("P must be a multiple of XSHARE");
  }
  const auto x = input.read<float>(size_t(P / DS4_XSHARE) * M * DS4_K);
  const auto w = input.read<uint8_t>(size_t(E) * DS4_N * (DS4_K / chosen->block_values) *
                                     chosen->block_bytes);
  const auto table_bytes = input.read<uint32_t>(1)[0];
  const auto tables = input.read<uint8_t>(table_bytes);
  const auto expert_indices = input.read<uint32_t>(P);
  for (uint32_t expert : expert_indices) {
    if (expert >= E) {
      fail("expert index out of range");
    }
  }
  bind_buffer(x);
  bind_buffer(w);
  bind_buffer(tables);
  bind_buffer(expert_indices);
  bind_buffer(real_rows);
  const int x_ndim = sizes[1] ? 3 : 2;
  const int x_shape[3] = {int(P / DS4_XSHARE), x_ndim == 3 ? int(M) : DS4_K, DS4_K};
  std::vector<float> y(size_t(P) * M * DS4_N, NAN);
  const LinearLaunch arguments{x, x_shape,       x_ndim,    w, tables, expert_indices,
                               real_rows, y, P, M, stride ? stride : 1};
  if (baseline) {
    chosen->baseline(arguments);
  } else {
    const int slot = XROWS == 1 ? 0 : XROWS == 2 ? 1 : XROWS == 4 ? 2 : XROWS == 8 ? 3 : -1;
    if (slot < 0) {
      fail("XROWS must be 1, 2, 4 or 8");
    }
    chosen->run[slot](arguments);
  }
  write_output(out_path, y);
  return 0;
}

// One thread per matrix, as the grid (T, 1, 1) launches it; the threads past T must return
// without writing.
int run_sinkhorn(const char* in_path, const char* out_path) {
  Input input(in_path);
  const int T = input.read<int32_t>(1)[0];
  const auto eps = input.read<float>(1);
  const auto comb = input.read<float>(size_t(T) * DS4_HC * DS4_HC);
  bind_buffer(eps);
  bind_buffer(comb);
  const int comb_shape[3] = {T, DS4_HC, DS4_HC};
  std::vector<float> out(comb.size(), NAN);
  launch({(uint(T) + SIMD_WIDTH - 1) / SIMD_WIDTH, 1, 1}, SIMD_WIDTH, [&](const ThreadIds& ids) {
    sinkhorn::kernel<DS4_HC, DS4_ITERS>(comb.data(), comb_shape, eps.data(), out.data(),
                                        ids.thread_position_in_grid);
  });
  write_output(out_path, out);
  return 0;
}

// Threadgroups of HEADS heads x SPLITS simdgroups per (row, head group), as metal.py launches.
int run_sparse_attention(bool baseline, const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(5);
  const int T = sizes[0], H = sizes[1], W = sizes[2], N = sizes[3], SLOTS = sizes[4];
  const auto scale = input.read<float>(1);
  const auto q = input.read<float>(size_t(T) * H * DS4_D);
  const auto window = input.read<float>(size_t(W) * DS4_D);
  const auto window_range = input.read<int32_t>(size_t(T) * 2);
  const auto comp = input.read<float>(size_t(N) * DS4_D);
  const auto comp_index = input.read<int32_t>(size_t(T) * SLOTS);
  const auto sinks = input.read<float>(H);
  for (const auto* buffer : {&q, &window, &comp, &sinks, &scale}) {
    bind_buffer(*buffer);
  }
  bind_buffer(window_range);
  bind_buffer(comp_index);
  const int q_shape[3] = {T, H, DS4_D}, window_shape[2] = {W, DS4_D}, comp_shape[2] = {N, DS4_D};
  const int comp_index_shape[2] = {T, SLOTS};
  std::vector<float> out(q.size(), NAN);
  if (baseline) {  // the kernel it replaced: one simdgroup per (row, head), SLOTS compiled in
    if (SLOTS != DS4_SLOTS) {
      fail("the baseline attention was compiled for another slot count");
    }
    launch({1, uint(H), uint(T)}, SIMD_WIDTH, [&](const ThreadIds& ids) {
      baseline_sparse_attention::kernel<float, DS4_D, DS4_SLOTS>(
          q.data(), q_shape, window.data(), window_shape, window_range.data(), comp.data(),
          comp_shape, comp_index.data(), sinks.data(), scale.data(), out.data(),
          {ids.thread_index_in_simdgroup, ids.threadgroup_position_in_grid.y,
           ids.threadgroup_position_in_grid.z},
          ids.thread_index_in_simdgroup);
    });
  } else if (H % DS4_HEADS) {
    fail("the heads per threadgroup must divide H");
  } else {
    launch({1, uint(H) / DS4_HEADS, uint(T)}, SIMD_WIDTH * DS4_HEADS * DS4_SPLITS,
         [&](const ThreadIds& ids) {
           sparse_attention::kernel<float, DS4_D, DS4_HEADS, DS4_SPLITS>(
               q.data(), q_shape, window.data(), window_shape, window_range.data(), comp.data(),
               comp_shape, comp_index.data(), comp_index_shape, sinks.data(), scale.data(),
               out.data(), ids.simdgroup_index_in_threadgroup, ids.thread_index_in_simdgroup,
               ids.thread_index_in_threadgroup, ids.threadgroup_position_in_grid);
         });
  }
  write_output(out_path, out);
  return 0;
}

#include "metal_step_kernels.h"
#include "metal_norm_kernels.h"

// The modes that take `<input> <output>`: the attention, the mHC and MoE step kernels.
struct Mode {
  const char* name;
  int (*run)(const char*, const char*);
};
const Mode MODES[] = {
    {"sparse_attention", [](const char* in, const char* out) {
       return run_sparse_attention(false, in, out);
     }},
    {"baseline_sparse_attention", [](const char* in, const char* out) {
       return run_sparse_attention(true, in, out);
     }},
    {"sinkhorn", run_sinkhorn},
    {"hc_site", run_hc_site},
    {"hc_expand", run_hc_expand},
    {"rope", run_rope},
    {"moe_route", run_moe_route},
    {"moe_combine", run_moe_combine},
    {"pool_blocks", run_pool_blocks},
    {"indexer_scores", run_indexer_scores},
    {"indexer_top_k", run_indexer_top_k},
    {"embed_streams", run_embed_streams},
    {"grow_rows", run_grow_rows},
    {"grow_row_pairs", run_grow_row_pairs},
    {"hc_site_norm", run_hc_site_norm<1>},
    {"hc_head_norm", run_hc_site_norm<0>},
    {"norm_rope", run_norm_rope},
    {"kda_tile", run_kda_tile},
};

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const Mode* chosen = nullptr;
  for (const Mode& candidate : MODES) {
    if (mode == candidate.name && argc == 4) {
      chosen = &candidate;
    }
  }
  int status;
  if (chosen) {
    status = chosen->run(argv[2], argv[3]);
  } else if ((mode == "linear" || mode == "baseline_linear") && argc == 5) {
    status = run_linear_mode(mode == "baseline_linear", argv[2], argv[3], argv[4]);
  } else {
    std::fprintf(stderr, "usage: %s <linear|baseline_linear> <format> <input> <output>\n", argv[0]);
    for (const Mode& candidate : MODES) {
      std::fprintf(stderr, "       %s %s <input> <output>\n", argv[0], candidate.name);
    }
    return 2;
  }
  std::printf(
      "{\"device_load_instructions\": %llu, \"device_bytes\": %llu, \"threadgroups\": %llu, "
      "\"threads_per_threadgroup\": %u}\n",
      (unsigned long long)counters.device_load_instructions,
      (unsigned long long)counters.device_bytes, (unsigned long long)counters.threadgroups,
      counters.threads_per_threadgroup);
  return status;
}
