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
