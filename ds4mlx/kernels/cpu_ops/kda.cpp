// A KDA (Kimi Delta Attention) decode tile as one primitive: what models/kda.py's tile computes
// after its input projections and before its output projection (twins.kda_tile is the twin).
// As MLX ops a tile is some eighty primitives, most of them views around a recurrence whose
// arithmetic is a few thousand flops a row.

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {
namespace {

// The shapes and constants of one tile.
struct KdaShape {
  int tokens, real, heads, dim, inner, kernel, cached_rows, kept_rows;
  float lower_bound, eps;
};

// twins.kda_tile's l2 norm: the native RMS norm with eps / dim, times 1 / sqrt(dim) (in place).
void l2_normalise(float* x, int dim) {
  const float eps = static_cast<float>(1e-6 / dim);
  const float inverse_root = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
  const float scale = 1.0f / std::sqrt(dot(x, x, dim) / static_cast<float>(dim) + eps);
  for (int d = 0; d < dim; d++) x[d] = x[d] * scale * inverse_root;
}

// ggml's softplus: x above 20, else log(1 + exp(x)).
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(std::min(x, 20.0f)));
}

// in: q, k, v, beta, decay, gate, dt_bias, a, conv_rows, conv_w, states [n, H, D, D] (a
// cache passes its current state alone), norm_weight, newest (int32 [1]: which state continues).
class KdaTile : public CpuPrimitive {
 public:
  KdaTile(mx::Stream stream, KdaShape shape) : CpuPrimitive(stream), s_(shape) {}

  Task task() const override {
    return [s = s_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      const RowMajor q(in[0]), k(in[1]), v(in[2]), beta(in[3]), decay(in[4]), gate(in[5]);
      const RowMajor dt_bias(in[6]), a(in[7]), rows(in[8]), conv_w(in[9]), states(in[10]);
      const RowMajor weight(in[11]);
      const int newest = in[12].data<int32_t>()[0];
      const float* proj[3] = {q.data(), k.data(), v.data()};
      const int history = s.kernel - 1, dim = s.dim, inner = s.inner;
      const size_t state_size = static_cast<size_t>(s.heads) * dim * dim;
      // The state after each real row goes straight to its output: only they are written (the
      // cache puts them in its ring).
      if (newest < 0 || newest >= in[10].shape(0)) {
        throw std::out_of_range("kda_tile: newest is not one of the states");
      }
      std::vector<float> mixed(3 * static_cast<size_t>(inner)), decays(dim), delta(dim), o(dim);
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
      std::fill(out[0], out[0] + static_cast<size_t>(s.tokens) * inner, 0.0f);
      for (int t = 0; t < s.real; t++) {
        // The causal depthwise conv over the cached rows then this tile's, and SiLU.
        for (int p = 0; p < 3; p++) {
          for (int c = 0; c < inner; c++) {
            float acc = 0.0f;
            for (int i = 0; i < s.kernel; i++) {
              const int w = t + i;
              const float value =
                  w < history ? rows[(static_cast<size_t>(p) * s.cached_rows + s.cached_rows -
                                      history + w) * inner + c]
                              : proj[p][static_cast<size_t>(w - history) * inner + c];
              const float product = value * conv_w[(static_cast<size_t>(p) * inner + c) * s.kernel + i];
              acc = i == 0 ? product : acc + product;
            }
            mixed[p * inner + c] = acc * sigmoid(acc);
          }
        }
        const float* previous =
            t == 0 ? states.data() + newest * state_size : out[2] + (t - 1) * state_size;
        float* state = out[2] + t * state_size;
        for (int h = 0; h < s.heads; h++) {
          float* qh = mixed.data() + h * dim;
          float* kh = mixed.data() + inner + h * dim;
          const float* vh = mixed.data() + 2 * inner + h * dim;
          l2_normalise(qh, dim);
          l2_normalise(kh, dim);
          const float b = sigmoid(beta[static_cast<size_t>(t) * s.heads + h]);
          for (int d = 0; d < dim; d++) {
            const float g = decay[static_cast<size_t>(t) * inner + h * dim + d] + dt_bias[h * dim + d];
            decays[d] = std::exp(s.lower_bound > -INFINITY ? s.lower_bound * sigmoid(-(g * a[h]))
                                                           : softplus(g) * a[h]);
          }
          // S = diag(exp(g)) S;  delta = beta (v - S^T k);  S += k delta^T;  o = S^T q * scale.
          // Row by row of S, so that the sums over its rows run along memory (vectorised).
          const float* from = previous + static_cast<size_t>(h) * dim * dim;
          float* to = state + static_cast<size_t>(h) * dim * dim;
          std::fill(o.begin(), o.end(), 0.0f);  // S^T k, then S^T q
          for (int r = 0; r < dim; r++) {
            for (int c = 0; c < dim; c++) {
              to[r * dim + c] = decays[r] * from[r * dim + c];
              o[c] = madd(kh[r], to[r * dim + c], o[c]);
            }
          }
          for (int c = 0; c < dim; c++) delta[c] = b * (vh[c] - o[c]);
          std::fill(o.begin(), o.end(), 0.0f);
          for (int r = 0; r < dim; r++) {
            for (int c = 0; c < dim; c++) {
              to[r * dim + c] = to[r * dim + c] + kh[r] * delta[c];
              o[c] = madd(qh[r], to[r * dim + c], o[c]);
            }
          }
          for (int c = 0; c < dim; c++) o[c] = o[c] * scale;
          // The output's RMS norm (times its weight), gated by sigmoid(gate).
          const float norm = 1.0f / std::sqrt(dot(o.data(), o.data(), dim) / dim + s.eps);
          float* row = out[0] + static_cast<size_t>(t) * inner + h * dim;
          for (int c = 0; c < dim; c++) {
            row[c] = o[c] * norm * weight[c] * sigmoid(gate[static_cast<size_t>(t) * inner + h * dim + c]);
          }
        }
      }
      // The last kept_rows of the cached conv rows followed by this tile's real rows.
      for (int p = 0; p < 3; p++) {
        for (int r = 0; r < s.kept_rows; r++) {
          const int from = s.cached_rows + s.real - s.kept_rows + r;
          const float* src = from < s.cached_rows
                                 ? rows.data() + (static_cast<size_t>(p) * s.cached_rows + from) * inner
                                 : proj[p] + static_cast<size_t>(from - s.cached_rows) * inner;
          std::copy(src, src + inner, out[1] + (static_cast<size_t>(p) * s.kept_rows + r) * inner);
        }
      }
    };
  }

  const char* name() const override { return "DS4KdaTile"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const KdaTile&>(other).s_;
    return std::memcmp(&o, &s_, sizeof s_) == 0;
  }

 private:
  KdaShape s_;
};

}  // namespace

std::vector<mx::array> kda_tile(const mx::array& q, const mx::array& k, const mx::array& v,
                                const mx::array& beta, const mx::array& decay,
                                const mx::array& gate, const mx::array& dt_bias,
                                const mx::array& a, const mx::array& conv_rows,
                                const mx::array& conv_w, const mx::array& states,
                                const mx::array& norm_weight, const mx::array& newest,
                                int n_real, float lower_bound, float eps, int keep_rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int tokens = q.ndim() == 2 ? q.shape(0) : 0, inner = q.ndim() == 2 ? q.shape(1) : 0;
  const int heads = a.ndim() == 1 ? a.shape(0) : 0;
  const int dim = heads ? inner / heads : 0;
  const bool shapes_fit =
      tokens && heads && dim * heads == inner && k.shape() == q.shape() && v.shape() == q.shape() &&
      decay.shape() == q.shape() && gate.shape() == q.shape() && beta.ndim() == 2 &&
      beta.shape(0) == tokens && beta.shape(1) == heads && dt_bias.size() == size_t(inner) &&
      conv_w.ndim() == 3 && conv_w.shape(0) == 3 && conv_w.shape(1) == inner &&
      conv_rows.ndim() == 3 && conv_rows.shape(0) == 3 && conv_rows.shape(2) == inner &&
      conv_rows.shape(1) >= conv_w.shape(2) - 1 && states.ndim() == 4 && states.shape(0) >= 1 &&
      states.shape(1) == heads && states.shape(2) == dim && states.shape(3) == dim &&
      norm_weight.size() == size_t(dim) && newest.size() == 1;
  if (!shapes_fit || n_real < 1 || n_real > tokens || keep_rows < 0) {
    throw std::invalid_argument(
        "kda_tile: expected q, k, v, decay, gate [T, H * D], beta [T, H], dt_bias [H * D], "
        "a [H], conv_rows [3, R, H * D] (R >= kernel - 1), conv_w [3, H * D, kernel], states "
        "[n, H, D, D], norm_weight [D], newest [1], 1 <= n_real <= T, keep_rows >= 0");
  }
  const KdaShape shape{tokens,
                       n_real,
                       heads,
                       dim,
                       inner,
                       conv_w.shape(2),
                       conv_rows.shape(1),
                       std::min(conv_rows.shape(1) + n_real, keep_rows),
                       lower_bound,
                       eps};
  std::vector<mx::array> in;
  for (const auto* x : {&q, &k, &v, &beta, &decay, &gate, &dt_bias, &a, &conv_rows, &conv_w,
                        &states, &norm_weight}) {
    in.push_back(mx::astype(*x, mx::float32, s));
  }
  in.push_back(mx::reshape(mx::astype(newest, mx::int32, s), {1}, s));
  return mx::array::make_arrays(
      {{tokens, inner}, {3, shape.kept_rows, inner}, {n_real, heads, dim, dim}},
      {mx::float32, mx::float32, mx::float32}, std::make_shared<KdaTile>(s, shape), in);
}

}  // namespace ds4mlx_ops
