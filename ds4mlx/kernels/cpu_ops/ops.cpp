// ds4mlx's native CPU operations: MLX primitives for work that is many tiny ops in MLX's own
// vocabulary. On the CPU every primitive costs microseconds of scheduling whatever its size;
// the mHC Sinkhorn alone is ~80 of them per call (a reduction and a division per half-round),
// while its arithmetic is a few hundred flops on a 4x4 matrix. Here it is one primitive.
//
// The semantics are those of the pure-MLX twins in ds4mlx/kernels/twins.py, in the same order
// of operations, in float32. Each matrix (row) is computed on its own, so a row's result never
// depends on the other rows of the call (what keeps decode and verify rows bit-identical).

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

// CBLAS, resolved when the module loads: the BLAS MLX itself calls (ds4mlx preloads OpenBLAS;
// otherwise the one libmlx links). Declared here so that no BLAS headers are needed to build.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float* a, int lda, const float* b, int ldb,
                            float beta, float* c, int ldc);

namespace {

constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

// The float32 values of an evaluated array in row-major order (a copy only when strided).
std::vector<float> row_major(const mx::array& a) {
  std::vector<float> out(a.size());
  const float* data = a.data<float>();
  if (a.flags().row_contiguous) {
    std::copy(data, data + a.size(), out.begin());
  } else {
    for (size_t i = 0; i < a.size(); i++) {
      out[i] = data[mx::elem_to_loc(static_cast<int>(i), a)];
    }
  }
  return out;
}

// twins._sinkhorn_rounds on one n x n matrix in place: softmax over dst plus eps, a column
// normalisation, then iters - 1 rounds of row and column normalisation, each sum padded by eps.
void sinkhorn_matrix(float* c, int n, int iters, float eps) {
  for (int i = 0; i < n; i++) {
    float* row = c + i * n;
    float top = row[0];
    for (int j = 1; j < n; j++) top = std::max(top, row[j]);
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
      row[j] = std::exp(row[j] - top);
      sum += row[j];
    }
    for (int j = 0; j < n; j++) row[j] = row[j] / sum + eps;
  }
  auto normalise_columns = [&] {
    for (int j = 0; j < n; j++) {
      float sum = 0.0f;
      for (int i = 0; i < n; i++) sum += c[i * n + j];
      sum += eps;
      for (int i = 0; i < n; i++) c[i * n + j] /= sum;
    }
  };
  auto normalise_rows = [&] {
    for (int i = 0; i < n; i++) {
      float sum = 0.0f;
      for (int j = 0; j < n; j++) sum += c[i * n + j];
      sum += eps;
      for (int j = 0; j < n; j++) c[i * n + j] /= sum;
    }
  };
  normalise_columns();
  for (int k = 0; k < iters - 1; k++) {
    normalise_rows();
    normalise_columns();
  }
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

void require_cpu(const mx::Stream& s, const char* name) {
  if (s.device != mx::Device::cpu) {
    throw std::invalid_argument(std::string(name) + " runs on the CPU stream only");
  }
}

class Sinkhorn : public mx::Primitive {
 public:
  Sinkhorn(mx::Stream stream, int iters, float eps)
      : mx::Primitive(stream), iters_(iters), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& comb = inputs[0];
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(comb);
    encoder.set_output_array(out);
    // Inputs are read inside the task: they may still be being computed when this runs.
    encoder.dispatch([comb, dst = out.data<float>(), n = comb.shape(-1), iters = iters_,
                      eps = eps_]() {
      std::vector<float> values = row_major(comb);
      size_t matrices = values.size() / (n * n);
      std::copy(values.begin(), values.end(), dst);
      for (size_t m = 0; m < matrices; m++) sinkhorn_matrix(dst + m * n * n, n, iters, eps);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("ds4mlx Sinkhorn: no GPU implementation (use the Metal kernel)");
  }

  const char* name() const override { return "DS4Sinkhorn"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Sinkhorn&>(other);
    return iters_ == o.iters_ && eps_ == o.eps_;
  }

 private:
  int iters_;
  float eps_;
};

// One mHC site's mixes (mhc.HyperConnection after its projection): from the projected mixes
// [T, (2 + hc) * hc], the per-section scale [3] and the bias [(2 + hc) * hc], the collapse
// weights pre [T, hc], the expansion weights post [T, hc] and the Sinkhorn-normalised stream
// mix comb [T, hc, hc].
class HcMixes : public mx::Primitive {
 public:
  HcMixes(mx::Stream stream, int hc, int iters, float eps)
      : mx::Primitive(stream), hc_(hc), iters_(iters), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    for (auto& out : outputs) encoder.set_output_array(out);
    encoder.dispatch([inputs, pre = outputs[0].data<float>(), post = outputs[1].data<float>(),
                      comb = outputs[2].data<float>(), hc = hc_, iters = iters_, eps = eps_]() {
      std::vector<float> mixes = row_major(inputs[0]);
      std::vector<float> scale = row_major(inputs[1]);
      std::vector<float> base = row_major(inputs[2]);
      const int tokens = inputs[0].shape(0);
      const int width = (2 + hc) * hc;
      for (int t = 0; t < tokens; t++) {
        const float* m = mixes.data() + t * width;
        for (int i = 0; i < hc; i++) {
          pre[t * hc + i] = sigmoid(m[i] * scale[0] + base[i]) + eps;
          post[t * hc + i] = 2.0f * sigmoid(m[hc + i] * scale[1] + base[hc + i]);
        }
        float* c = comb + t * hc * hc;
        for (int k = 0; k < hc * hc; k++) c[k] = m[2 * hc + k] * scale[2] + base[2 * hc + k];
        sinkhorn_matrix(c, hc, iters, eps);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("ds4mlx HcMixes: no GPU implementation");
  }

  const char* name() const override { return "DS4HcMixes"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const HcMixes&>(other);
    return hc_ == o.hc_ && iters_ == o.iters_ && eps_ == o.eps_;
  }

 private:
  int hc_;
  int iters_;
  float eps_;
};

// Routed SwiGLU experts of one layer (models.moe.RoutedExperts on float32 weights): for every
// (token t, slot s) pair, out[t, s] = down_e(swiglu(gate_e x[t], up_e x[t])) with
// e = indices[t, s], the weights stacked as GGUF has them ([E, out, in]). MLX's gather_mm runs
// one GEMV per pair; here the pairs of one expert share one GEMM (``grouped``), so a prefill
// runs at BLAS speed. Without ``grouped`` every pair is its own one-row product: a row's result
// then does not depend on which other rows share its expert (decode tiles and verify passes
// need that). Pairs of one expert keep their order, so a subset of the pairs (a streamed
// store's batch) gets the same products as the whole.
class RoutedExpertsFFN : public mx::Primitive {
 public:
  RoutedExpertsFFN(mx::Stream stream, float limit, bool grouped)
      : mx::Primitive(stream), limit_(limit), grouped_(grouped) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, dst = out.data<float>(), limit = limit_, grouped = grouped_]() {
      run(inputs, dst, limit, grouped);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("ds4mlx RoutedExpertsFFN: no GPU implementation");
  }

  const char* name() const override { return "DS4RoutedExperts"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RoutedExpertsFFN&>(other);
    return limit_ == o.limit_ && grouped_ == o.grouped_;
  }

 private:
  static void run(const std::vector<mx::array>& inputs, float* out, float limit, bool grouped) {
    const mx::array& x_in = inputs[0];
    const int tokens = x_in.shape(0), dim = x_in.shape(1);
    const int experts = inputs[1].shape(0), ff = inputs[1].shape(1);
    const int slots = inputs[4].shape(1);
    std::vector<float> x = row_major(x_in);
    std::vector<int> route_e(tokens * slots);
    const mx::array& idx = inputs[4];
    for (int p = 0; p < tokens * slots; p++) {
      route_e[p] = idx.data<int32_t>()[mx::elem_to_loc(p, idx)];
    }
    // The stacked weights are contiguous as loaded; anything else is copied once.
    std::vector<float> copies[3];
    const float* w[3];
    for (int i = 0; i < 3; i++) {
      const mx::array& a = inputs[1 + i];
      if (a.flags().row_contiguous) {
        w[i] = a.data<float>();
      } else {
        copies[i] = row_major(a);
        w[i] = copies[i].data();
      }
    }
    std::vector<std::vector<int>> pairs_of(experts);
    for (int p = 0; p < tokens * slots; p++) {
      if (route_e[p] >= 0 && route_e[p] < experts) pairs_of[route_e[p]].push_back(p);
    }
    float* y = out;
    std::fill(y, y + static_cast<size_t>(tokens) * slots * dim, 0.0f);
    std::vector<float> rows, gate, up, down;
    auto block = [&](int e, const int* pairs, int n) {
      rows.resize(static_cast<size_t>(n) * dim);
      gate.resize(static_cast<size_t>(n) * ff);
      up.resize(static_cast<size_t>(n) * ff);
      down.resize(static_cast<size_t>(n) * dim);
      for (int i = 0; i < n; i++) {
        const float* src = x.data() + static_cast<size_t>(pairs[i] / slots) * dim;
        std::copy(src, src + dim, rows.data() + static_cast<size_t>(i) * dim);
      }
      const size_t in_size = static_cast<size_t>(ff) * dim;
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, ff, dim, 1.0f, rows.data(), dim,
                  w[0] + e * in_size, dim, 0.0f, gate.data(), ff);
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, ff, dim, 1.0f, rows.data(), dim,
                  w[1] + e * in_size, dim, 0.0f, up.data(), ff);
      for (size_t i = 0; i < gate.size(); i++) {
        float g = gate[i], u = up[i];
        if (limit > 1e-6f) {
          g = std::min(g, limit);
          u = std::min(std::max(u, -limit), limit);
        }
        gate[i] = g * sigmoid(g) * u;
      }
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, dim, ff, 1.0f, gate.data(), ff,
                  w[2] + e * in_size, ff, 0.0f, down.data(), dim);
      for (int i = 0; i < n; i++) {
        std::copy(down.data() + static_cast<size_t>(i) * dim,
                  down.data() + static_cast<size_t>(i + 1) * dim,
                  y + static_cast<size_t>(pairs[i]) * dim);
      }
    };
    for (int e = 0; e < experts; e++) {
      const auto& pairs = pairs_of[e];
      if (pairs.empty()) continue;
      if (grouped) {
        block(e, pairs.data(), static_cast<int>(pairs.size()));
      } else {
        for (const int& p : pairs) block(e, &p, 1);
      }
    }
  }

  float limit_;
  bool grouped_;
};

mx::array sinkhorn(const mx::array& comb, int iters, float eps) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (comb.ndim() < 2 || comb.shape(-1) != comb.shape(-2)) {
    throw std::invalid_argument("sinkhorn: comb must be [..., n, n]");
  }
  auto values = mx::astype(comb, mx::float32, s);
  return mx::array(values.shape(), mx::float32, std::make_shared<Sinkhorn>(s, iters, eps),
                   {values});
}

std::vector<mx::array> hc_mixes(const mx::array& mixes, const mx::array& scale,
                                const mx::array& base, int hc, int iters, float eps) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int width = (2 + hc) * hc;
  if (mixes.ndim() != 2 || mixes.shape(1) != width || scale.size() != 3 ||
      base.size() != static_cast<size_t>(width)) {
    throw std::invalid_argument("hc_mixes: expected mixes [T, (2 + hc) * hc], scale [3] and "
                                "base [(2 + hc) * hc]");
  }
  int tokens = mixes.shape(0);
  std::vector<mx::array> in = {mx::astype(mixes, mx::float32, s),
                               mx::astype(scale, mx::float32, s),
                               mx::astype(base, mx::float32, s)};
  return mx::array::make_arrays({{tokens, hc}, {tokens, hc}, {tokens, hc, hc}},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<HcMixes>(s, hc, iters, eps), in);
}

mx::array routed_experts(const mx::array& x, const mx::array& gate, const mx::array& up,
                         const mx::array& down, const mx::array& indices, float limit,
                         bool grouped) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() != 2 || gate.ndim() != 3 || up.shape() != gate.shape() || down.ndim() != 3 ||
      down.shape(0) != gate.shape(0) || down.shape(1) != x.shape(1) ||
      down.shape(2) != gate.shape(1) || gate.shape(2) != x.shape(1) || indices.ndim() != 2 ||
      indices.shape(0) != x.shape(0)) {
    throw std::invalid_argument(
        "routed_experts: expected x [T, D], gate/up [E, F, D], down [E, D, F], indices [T, k]");
  }
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s), mx::astype(gate, mx::float32, s),
                               mx::astype(up, mx::float32, s), mx::astype(down, mx::float32, s),
                               mx::astype(indices, mx::int32, s)};
  return mx::array({x.shape(0), indices.shape(1), x.shape(1)}, mx::float32,
                   std::make_shared<RoutedExpertsFFN>(s, limit, grouped), in);
}

}  // namespace

NB_MODULE(_cpu_ops, m) {
  m.doc() = "ds4mlx native CPU operations (see ops.cpp)";
  m.def("sinkhorn", &sinkhorn, "comb"_a, "iters"_a, "eps"_a,
        "Sinkhorn-normalised [..., n, n] matrices (twins.sinkhorn) as one primitive.");
  m.def("hc_mixes", &hc_mixes, "mixes"_a, "scale"_a, "base"_a, "hc"_a, "iters"_a, "eps"_a,
        "One mHC site's (pre, post, comb) from its projected mixes, as one primitive.");
  m.def("routed_experts", &routed_experts, "x"_a, "gate"_a, "up"_a, "down"_a, "indices"_a,
        "limit"_a, "grouped"_a,
        "Every (token, slot) pair's routed SwiGLU expert output [T, k, D], as one primitive.");
}
