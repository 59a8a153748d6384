// The kernels that carry an RMS norm (metal/hc_site_norm, norm_rope) and their runners, for
// tests/kernels/metal_emulation.cpp, which includes this after metal_step_kernels.h. Unlike the
// step kernels each is one threadgroup per row, its threads meeting in a threadgroup sum.

#define constant
#define thread

#include "norm.metal"

namespace hc_site_norm {
template <typename T_, int HC, int D, int ITERS, int THREADS, int SITE>
void kernel(DevicePtr<const T_> x, DevicePtr<const float> mixes, DevicePtr<const float> scale,
            DevicePtr<const float> base, DevicePtr<const float> weight,
            DevicePtr<const float> eps, DevicePtr<T_> y, DevicePtr<float> post,
            DevicePtr<float> comb, uint3 threadgroup_position_in_grid,
            uint thread_index_in_threadgroup, uint simdgroup_index_in_threadgroup,
            uint thread_index_in_simdgroup) {
#include "hc_site_norm.metal"
}
}  // namespace hc_site_norm

namespace norm_rope {
template <typename T_, int D, int N, int OFFSET, int INTERLEAVED, int WEIGHTED, int THREADS>
void kernel(DevicePtr<const T_> x, const int* x_shape, int x_ndim, DevicePtr<const float> weight,
            DevicePtr<const float> cosines, DevicePtr<const float> sines,
            DevicePtr<const float> eps, DevicePtr<T_> out, uint3 threadgroup_position_in_grid,
            uint thread_index_in_threadgroup, uint simdgroup_index_in_threadgroup,
            uint thread_index_in_simdgroup) {
#include "norm_rope.metal"
}
}  // namespace norm_rope

#undef constant
#undef thread

// Threads of a row's threadgroup, as metal.py's _reduction_threads chooses them.
constexpr uint NORM_THREADS = std::min<uint>(256, (DS4_D + SIMD_WIDTH - 1) / SIMD_WIDTH * SIMD_WIDTH);

// SITE 0 (the head) reads mixes [T, HC] and writes y only (post and comb stay NaN).
template <int SITE>
int run_hc_site_norm(const char* in_path, const char* out_path) {
  constexpr uint MIX = SITE ? (2 + DS4_HC) * DS4_HC : DS4_HC;
  Input input(in_path);
  const int T = input.read<int32_t>(1)[0];
  const auto eps = input.read<float>(3);
  const auto scale = input.read<float>(SITE ? 3 : 1);
  const auto base = input.read<float>(MIX);
  const auto weight = input.read<float>(DS4_D);
  const auto x = input.read<float>(size_t(T) * DS4_HC * DS4_D);
  const auto mixes = input.read<float>(size_t(T) * MIX);
  for (const auto* buffer : {&eps, &scale, &base, &weight, &x, &mixes}) {
    bind_buffer(*buffer);
  }
  std::vector<float> y(size_t(T) * DS4_D, NAN), post(size_t(T) * DS4_HC, NAN),
      comb(size_t(T) * DS4_HC * DS4_HC, NAN);
  launch({1, uint(T), 1}, NORM_THREADS, [&](const ThreadIds& ids) {
    hc_site_norm::kernel<float, DS4_HC, DS4_D, DS4_ITERS, NORM_THREADS, SITE>(
        x.data(), mixes.data(), scale.data(), base.data(), weight.data(), eps.data(), y.data(),
        post.data(), comb.data(), ids.threadgroup_position_in_grid,
        ids.thread_index_in_threadgroup, ids.simdgroup_index_in_threadgroup,
        ids.thread_index_in_simdgroup);
  });
  y.insert(y.end(), post.begin(), post.end());
  y.insert(y.end(), comb.begin(), comb.end());
  write_output(out_path, y);
  return 0;
}

struct NormRopeLaunch {
  int T, M;  // M == 0: x [T, D], one row a token; M < 0: x [T, -M * D], -M rows a token
  const std::vector<float>& x;
  const std::vector<float>& weight;
  const std::vector<float>& cos;
  const std::vector<float>& sin;
  const std::vector<float>& eps;
  std::vector<float>& out;
};

template <int INTERLEAVED, int WEIGHTED>
void norm_rope_all(const NormRopeLaunch& a) {
  const int rows = a.M ? std::abs(a.M) : 1;
  const int x_shape[3] = {a.T, a.M > 0 ? a.M : rows * DS4_D, DS4_D};
  const int x_ndim = a.M > 0 ? 3 : 2;
  launch({1, uint(rows), uint(a.T)}, NORM_THREADS, [&](const ThreadIds& ids) {
    norm_rope::kernel<float, DS4_D, DS4_ROPE_N, DS4_ROPE_OFFSET, INTERLEAVED, WEIGHTED,
                      NORM_THREADS>(a.x.data(), x_shape, x_ndim, a.weight.data(), a.cos.data(),
                                    a.sin.data(), a.eps.data(), a.out.data(),
                                    ids.threadgroup_position_in_grid,
                                    ids.thread_index_in_threadgroup,
                                    ids.simdgroup_index_in_threadgroup,
                                    ids.thread_index_in_simdgroup);
  });
}

// input: int32 T, M, interleaved, weighted | float32 eps | float32 weight [D] (one value when
// not weighted) | float32 x [T, M, D] ([T, D] for M 0, [T, -M * D] for M < 0)
// | float32 cos, sin [T, N / 2]
int run_norm_rope(const char* in_path, const char* out_path) {
  Input input(in_path);
  const auto sizes = input.read<int32_t>(4);
  const int T = sizes[0], M = sizes[1];
  const auto eps = input.read<float>(1);
  const auto weight = input.read<float>(sizes[3] ? DS4_D : 1);
  const auto x = input.read<float>(size_t(T) * (M ? std::abs(M) : 1) * DS4_D);
  const auto cos = input.read<float>(size_t(T) * DS4_ROPE_N / 2);
  const auto sin = input.read<float>(size_t(T) * DS4_ROPE_N / 2);
  for (const auto* buffer : {&eps, &weight, &x, &cos, &sin}) {
    bind_buffer(*buffer);
  }
  std::vector<float> out(x.size(), NAN);
  const NormRopeLaunch launch_args{T, M, x, weight, cos, sin, eps, out};
  using Runner = void (*)(const NormRopeLaunch&);
  const Runner runners[4] = {norm_rope_all<0, 0>, norm_rope_all<0, 1>, norm_rope_all<1, 0>,
                             norm_rope_all<1, 1>};
  runners[sizes[2] * 2 + sizes[3]](launch_args);
  write_output(out_path, out);
  return 0;
}

// metal/kda_tile.metal: one threadgroup per KDA head (-DDS4_KDA_D, -DDS4_KDA_H, -DDS4_KDA_KERNEL,
// -DDS4_KDA_KEEP_ROWS; the real rows, 1 to 8, and LOWER at run time).
#ifndef DS4_KDA_D
#define DS4_KDA_D 64
#endif
#ifndef DS4_KDA_H
#define DS4_KDA_H 2
#endif
#ifndef DS4_KDA_KERNEL
#define DS4_KDA_KERNEL 4
#endif
#ifndef DS4_KDA_KEEP_ROWS
#define DS4_KDA_KEEP_ROWS 10
#endif

#define constant
#define thread

namespace kda_tile {
template <int D, int H, int KERNEL, int NREAL, int KEEP_ROWS, int LOWER>
void kernel(DevicePtr<const float> q, const int* q_shape, DevicePtr<const float> k,
            DevicePtr<const float> v, DevicePtr<const float> beta, DevicePtr<const float> decay,
            DevicePtr<const float> gate, DevicePtr<const float> dt_bias, DevicePtr<const float> a,
            DevicePtr<const float> conv_rows, const int* conv_rows_shape,
            DevicePtr<const float> conv_w, DevicePtr<const float> states,
            const int* states_shape, DevicePtr<const float> norm_weight,
            DevicePtr<const float> params, DevicePtr<const int> newest, DevicePtr<float> out,
            DevicePtr<float> rows,
            DevicePtr<float> kept, uint3 threadgroup_position_in_grid,
            uint thread_index_in_threadgroup, uint simdgroup_index_in_threadgroup,
            uint thread_index_in_simdgroup) {
#include "kda_tile.metal"
}
}  // namespace kda_tile

#undef constant
#undef thread

struct KdaLaunch {
  const int *q_shape, *rows_shape, *states_shape;
  const std::vector<float>*q, *k, *v, *beta, *decay, *gate, *dt_bias, *a, *conv_rows, *conv_w,
      *states, *norm_weight, *params;
  const std::vector<int32_t>* newest;
  std::vector<float>*out, *rows, *kept;
};

template <int NREAL, int LOWER>
void kda_tile_all(const KdaLaunch& l) {
  launch({1, DS4_KDA_H, 1}, DS4_KDA_D, [&](const ThreadIds& ids) {
    kda_tile::kernel<DS4_KDA_D, DS4_KDA_H, DS4_KDA_KERNEL, NREAL, DS4_KDA_KEEP_ROWS, LOWER>(
        l.q->data(), l.q_shape, l.k->data(), l.v->data(), l.beta->data(), l.decay->data(),
        l.gate->data(), l.dt_bias->data(), l.a->data(), l.conv_rows->data(), l.rows_shape,
        l.conv_w->data(), l.states->data(), l.states_shape, l.norm_weight->data(),
        l.params->data(), l.newest->data(), l.out->data(), l.rows->data(), l.kept->data(),
        ids.threadgroup_position_in_grid, ids.thread_index_in_threadgroup,
        ids.simdgroup_index_in_threadgroup, ids.thread_index_in_simdgroup);
  });
}

template <int LOWER, int... N>
constexpr std::array<void (*)(const KdaLaunch&), sizeof...(N)> kda_runners(
    std::integer_sequence<int, N...>) {
  return {kda_tile_all<N + 1, LOWER>...};
}

// input: int32 T, R, n, n_real (1 to 8), lower, newest (a slot of the ring states) | float32
//        params [4] | q, k, v [T, H * D] | beta [T, H] | decay, gate [T, H * D] | dt_bias [H * D]
//        | a [H] | conv_rows [3, R, H * D] | conv_w [3, H * D, KERNEL] | states [n, H, D, D]
//        | norm_weight [D]
// output: out [T, H * D] | rows [3, M, H * D] | kept [n_real, H, D, D]
int run_kda_tile(const char* in_path, const char* out_path) {
  constexpr size_t inner = size_t(DS4_KDA_H) * DS4_KDA_D;
  Input input(in_path);
  const auto sizes = input.read<int32_t>(6);
  const int T = sizes[0], R = sizes[1], n = sizes[2], n_real = sizes[3];
  if (n_real < 1 || n_real > 8) {
    fail("n_real must be 1 to 8");
  }
  if (sizes[5] < 0 || sizes[5] >= n) {
    fail("newest must be a slot of the states");
  }
  const std::vector<int32_t> newest(1, sizes[5]);
  const auto params = input.read<float>(4);
  const auto q = input.read<float>(T * inner), k = input.read<float>(T * inner),
             v = input.read<float>(T * inner);
  const auto beta = input.read<float>(size_t(T) * DS4_KDA_H);
  const auto decay = input.read<float>(T * inner), gate = input.read<float>(T * inner);
  const auto dt_bias = input.read<float>(inner);
  const auto a = input.read<float>(DS4_KDA_H);
  const auto conv_rows = input.read<float>(3 * R * inner);
  const auto conv_w = input.read<float>(3 * inner * DS4_KDA_KERNEL);
  const auto states = input.read<float>(n * inner * DS4_KDA_D);
  const auto norm_weight = input.read<float>(DS4_KDA_D);
  for (const auto* buffer : {&params, &q, &k, &v, &beta, &decay, &gate, &dt_bias, &a, &conv_rows,
                             &conv_w, &states, &norm_weight}) {
    bind_buffer(*buffer);
  }
  bind_buffer(newest);
  const int M = std::min(R + n_real, DS4_KDA_KEEP_ROWS);
  const int q_shape[2] = {T, int(inner)}, rows_shape[3] = {3, R, int(inner)},
            states_shape[4] = {n, DS4_KDA_H, DS4_KDA_D, DS4_KDA_D};
  std::vector<float> out(T * inner, NAN), rows(3 * M * inner, NAN), kept(n_real * inner * DS4_KDA_D, NAN);
  const KdaLaunch launch_args{q_shape, rows_shape, states_shape, &q,      &k,       &v,
                              &beta,   &decay,     &gate,        &dt_bias, &a,       &conv_rows,
                              &conv_w, &states,    &norm_weight, &params,  &newest,  &out,
                              &rows,   &kept};
  const auto seq = std::make_integer_sequence<int, 8>();
  (sizes[4] ? kda_runners<1>(seq) : kda_runners<0>(seq))[n_real - 1](launch_args);
  out.insert(out.end(), rows.begin(), rows.end());
  out.insert(out.end(), kept.begin(), kept.end());
  write_output(out_path, out);
  return 0;
}
