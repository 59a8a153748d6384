// The MoE primitives: routed SwiGLU experts, and a decode tile's routing, experts and
// weighted sum with the shared expert, fused (MoeTile) or in two steps around streamed
// experts (MoeRoute, MoeCombine).

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {
namespace {

// The rows routed to one expert, computed together: out[r] = down_e(swiglu(gate_e x[r],
// up_e x[r])) [D] for rows x[r] [D], with the stacked weights as GGUF stores them (gate/up
// [E, F, D], down [E, D, F]). Each row's products are dot sums of that row alone
// (out_in_times_rows), so RoutedExpertsFFN's row-by-row mode and MoeTile give a row the same
// bits whichever rows share its expert, while those rows read the expert's weights once.
class ExpertRows {
 public:
  ExpertRows(const StackInput& gate_w, const StackInput& up_w, const StackInput& down_w, int ff,
             int dim, float limit)
      : gate_w_(gate_w), up_w_(up_w), down_w_(down_w), ff_(ff), dim_(dim), limit_(limit) {}

  void run(int e, const std::vector<const float*>& x, const std::vector<float*>& out) {
    const int count = static_cast<int>(x.size());
    gate_.resize(static_cast<size_t>(count) * ff_);
    up_.resize(gate_.size());
    std::vector<float*> gate(count), up(count);
    for (int r = 0; r < count; r++) {
      gate[r] = gate_.data() + static_cast<size_t>(r) * ff_;
      up[r] = up_.data() + static_cast<size_t>(r) * ff_;
    }
    gate_w_.times_rows(e, x.data(), gate.data(), count, ff_, dim_);
    up_w_.times_rows(e, x.data(), up.data(), count, ff_, dim_);
    for (size_t i = 0; i < gate_.size(); i++) gate_[i] = swiglu_clamped(gate_[i], up_[i], limit_);
    const std::vector<const float*> hidden(gate.begin(), gate.end());
    down_w_.times_rows(e, hidden.data(), out.data(), count, dim_, ff_);
  }

  // Every routed pair p of ``pairs_of`` (by expert): row p / slots of x [T, D] -> row p of out
  // [T * slots, D].
  void run_pairs(const std::vector<std::vector<int>>& pairs_of, const float* x, int slots,
                 float* out) {
    for (size_t e = 0; e < pairs_of.size(); e++) {
      if (pairs_of[e].empty()) continue;
      std::vector<const float*> rows_in;
      std::vector<float*> rows_out;
      for (const int p : pairs_of[e]) {
        rows_in.push_back(x + static_cast<size_t>(p / slots) * dim_);
        rows_out.push_back(out + static_cast<size_t>(p) * dim_);
      }
      run(static_cast<int>(e), rows_in, rows_out);
    }
  }

 private:
  const StackInput &gate_w_, &up_w_, &down_w_;
  int ff_, dim_;
  float limit_;
  std::vector<float> gate_, up_;
};

// The (token, slot) pairs p of ``expert`` [pairs] routed to each expert, in pair order (ids out
// of range route nowhere).
std::vector<std::vector<int>> pairs_by_expert(const int* expert, int pairs, int experts) {
  std::vector<std::vector<int>> pairs_of(experts);
  for (int p = 0; p < pairs; p++) {
    if (expert[p] >= 0 && expert[p] < experts) pairs_of[expert[p]].push_back(p);
  }
  return pairs_of;
}

// Routed SwiGLU experts of one layer (models.moe.RoutedExperts on float32 weights): for every
// (token t, slot s) pair, out[t, s] = down_e(swiglu(gate_e x[t], up_e x[t])) with
// e = indices[t, s], the weights stacked as GGUF has them ([E, out, in]). MLX's gather_mm runs
// one GEMV per pair; here the pairs of one expert share one GEMM (``grouped``), so a prefill
// runs at BLAS speed. Without ``grouped`` every pair is its own one-row product: a row's result
// then does not depend on which other rows share its expert (decode tiles and verify passes
// need that). Pairs of one expert keep their order, so a subset of the pairs (a streamed
// store's batch) gets the same products as the whole.
class RoutedExpertsFFN : public CpuPrimitive {
 public:
  RoutedExpertsFFN(mx::Stream stream, float limit, bool grouped)
      : CpuPrimitive(stream), limit_(limit), grouped_(grouped) {}

  Task task() const override {
    return [limit = limit_, grouped = grouped_](const std::vector<mx::array>& in,
                                                const std::vector<float*>& out) {
      run(in, out[0], limit, grouped);
    };
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
    RowMajor x(x_in);
    const std::vector<int> route_e = int_values(inputs[4]);
    // The stacked weights are contiguous as loaded (a strided one would be copied here).
    RowMajor gate_w(inputs[1]), up_w(inputs[2]), down_w(inputs[3]);
    const float* w[3] = {gate_w.data(), up_w.data(), down_w.data()};
    const auto pairs_of = pairs_by_expert(route_e.data(), tokens * slots, experts);
    float* y = out;
    std::fill(y, y + static_cast<size_t>(tokens) * slots * dim, 0.0f);
    const size_t in_size = static_cast<size_t>(ff) * dim;
    std::vector<float> rows, gate, up, down;
    // The pairs of one expert share one GEMM.
    auto grouped_block = [&](int e, const std::vector<int>& pairs) {
      const int n = static_cast<int>(pairs.size());
      rows.resize(static_cast<size_t>(n) * dim);
      gate.resize(static_cast<size_t>(n) * ff);
      up.resize(static_cast<size_t>(n) * ff);
      down.resize(static_cast<size_t>(n) * dim);
      for (int i = 0; i < n; i++) {
        const float* src = x.data() + static_cast<size_t>(pairs[i] / slots) * dim;
        std::copy(src, src + dim, rows.data() + static_cast<size_t>(i) * dim);
      }
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, ff, dim, 1.0f, rows.data(), dim,
                  w[0] + e * in_size, dim, 0.0f, gate.data(), ff);
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, ff, dim, 1.0f, rows.data(), dim,
                  w[1] + e * in_size, dim, 0.0f, up.data(), ff);
      for (size_t i = 0; i < gate.size(); i++) gate[i] = swiglu_clamped(gate[i], up[i], limit);
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, dim, ff, 1.0f, gate.data(), ff,
                  w[2] + e * in_size, ff, 0.0f, down.data(), dim);
      for (int i = 0; i < n; i++) {
        std::copy(down.data() + static_cast<size_t>(i) * dim,
                  down.data() + static_cast<size_t>(i + 1) * dim,
                  y + static_cast<size_t>(pairs[i]) * dim);
      }
    };
    if (!grouped) {
      // Row by row (decode tiles): dot products that depend on nothing but their row.
      const StackInput gate_in(inputs, 1, 1), up_in(inputs, 2, 1), down_in(inputs, 3, 1);
      ExpertRows(gate_in, up_in, down_in, ff, dim, limit).run_pairs(pairs_of, x.data(), slots, y);
      return;
    }
    for (int e = 0; e < experts; e++) {
      if (!pairs_of[e].empty()) grouped_block(e, pairs_of[e]);
    }
  }

  float limit_;
  bool grouped_;
};

// How a decode tile routes a row (llama.cpp build_moe_ffn): the router probabilities from its
// logits by gating function ``func`` (llama.cpp's numbering: 1 softmax, 2 sigmoid, 3 softmax
// over the selected logits, 4 sqrt(softplus)), the top ``n_used`` experts by probability plus
// selection bias (or the hash-routed ones given), their probabilities as weights, renormalised
// (``normalize``) and scaled. What models.moe's gate_probs and route compute (the twins).
struct Routing {
  int n_used, func;
  bool normalize;
  float scale;

  bool operator==(const Routing&) const = default;
};

class RowRouter {
 public:
  RowRouter(const Routing& r, int experts)
      : r_(r), experts_(experts), probs_(experts), score_(experts), order_(experts) {}

  // Row ``logits`` [E] -> chosen [n_used] and weights [n_used]; ``bias`` [E] or null, ``hashed``
  // [n_used] or null.
  void route(const float* logits, const float* bias, const int* hashed, int* chosen,
             float* weights) {
    probabilities(logits);
    if (hashed != nullptr) {
      std::copy(hashed, hashed + r_.n_used, chosen);
    } else {
      for (int e = 0; e < experts_; e++) {
        score_[e] = probs_[e] + (bias != nullptr ? bias[e] : 0.0f);
        order_[e] = e;
      }
      std::partial_sort(order_.begin(), order_.begin() + r_.n_used, order_.end(),
                        [&](int a, int b) {
                          return score_[a] > score_[b] || (score_[a] == score_[b] && a < b);
                        });
      std::copy(order_.begin(), order_.begin() + r_.n_used, chosen);
    }
    for (int k = 0; k < r_.n_used; k++) {
      weights[k] = chosen[k] >= 0 && chosen[k] < experts_ ? probs_[chosen[k]] : 0.0f;
    }
    if (r_.func == 3) {
      float top = weights[0];
      for (int k = 1; k < r_.n_used; k++) top = std::max(top, weights[k]);
      float sum = 0.0f;
      for (int k = 0; k < r_.n_used; k++) sum += weights[k] = std::exp(weights[k] - top);
      for (int k = 0; k < r_.n_used; k++) weights[k] /= sum;
    }
    if (r_.normalize) {
      float sum = 0.0f;
      for (int k = 0; k < r_.n_used; k++) sum += weights[k];
      sum = std::max(sum, 6.103515625e-5f);  // ggml's clamp: the smallest normal float16
      for (int k = 0; k < r_.n_used; k++) weights[k] /= sum;
    }
    if (r_.scale != 0.0f && r_.scale != 1.0f) {
      for (int k = 0; k < r_.n_used; k++) weights[k] *= r_.scale;
    }
  }

 private:
  void probabilities(const float* logits) {
    if (r_.func == 1) {
      float top = logits[0];
      for (int e = 1; e < experts_; e++) top = std::max(top, logits[e]);
      float sum = 0.0f;
      for (int e = 0; e < experts_; e++) sum += probs_[e] = std::exp(logits[e] - top);
      for (int e = 0; e < experts_; e++) probs_[e] /= sum;
      return;
    }
    for (int e = 0; e < experts_; e++) {
      const float l = logits[e];
      if (r_.func == 2) {
        probs_[e] = sigmoid(l);
      } else if (r_.func == 4) {  // softplus as ggml: x above 20, else log1p(exp(x))
        probs_[e] = std::sqrt(l > 20.0f ? l : std::log1p(std::exp(std::min(l, 20.0f))));
      } else {  // 3: the softmax is over the selected logits
        probs_[e] = l;
      }
    }
  }

  Routing r_;
  int experts_;
  std::vector<float> probs_, score_;
  std::vector<int> order_;
};

// The weighted sums of ``rows`` rows' routed expert outputs plus the shared expert: out[t] [D] =
// sum_k weights[t, k] * expert_out[t, k] (expert_out [rows, k, D], in k order) + the shared
// expert's down projection [Fs, D] (stored [in, out]) of swiglu(shared_gate[t], shared_up[t])
// [Fs], as the shared expert's own down projection computes a row (rows_linear).
void combine_rows(const float* expert_out, const float* weights, int rows, int k_used, int dim,
                  const float* shared_gate, const float* shared_up,
                  const MatrixInput& shared_down, int shared_ff, float shared_limit, float* out) {
  std::vector<float> hidden(static_cast<size_t>(rows) * shared_ff);
  for (size_t i = 0; i < hidden.size(); i++) {
    hidden[i] = swiglu_clamped(shared_gate[i], shared_up[i], shared_limit);
  }
  std::vector<float> shared(static_cast<size_t>(rows) * dim);
  shared_down.times({hidden.data(), static_cast<size_t>(shared_ff), nullptr, shared.data(),
                     static_cast<size_t>(dim), shared_ff, dim},
                    rows, rows);
  for (int t = 0; t < rows; t++) {
    float* acc = out + static_cast<size_t>(t) * dim;
    std::fill(acc, acc + dim, 0.0f);
    for (int k = 0; k < k_used; k++) {
      const float w = weights[t * k_used + k];
      const float* e = expert_out + (static_cast<size_t>(t) * k_used + k) * dim;
      for (int d = 0; d < dim; d++) acc[d] = madd(w, e[d], acc[d]);
    }
    const float* sh = shared.data() + static_cast<size_t>(t) * dim;
    for (int d = 0; d < dim; d++) acc[d] += sh[d];
  }
}

// A decode tile's whole FFN for its first ``rows`` rows (the others zeros): routing, routed
// experts, their weighted sum and the shared expert. Inputs: logits [T, E], x [T, D], the
// shared expert's gate and up products [T, Fs], then the matrices, each float32 or coded
// (``parts``): gate/up [E, F, D], down [E, D, F] and the shared expert's down matrix stored
// [in, out] [Fs, D]; then the bias [E] (``has_bias``) and the hash-routed experts [T, k] int32
// (``hashed``). One primitive where MLX needs some twenty; each row on its own. MoeRoute and
// MoeCombine compute the same in two steps, around experts that are streamed.
class MoeTile : public CpuPrimitive {
 public:
  struct Config {
    Routing routing;
    int rows;
    bool has_bias, hashed;
    float limit, shared_limit;
    std::array<int, 4> parts;  // gate, up, down, shared down: 1 (float32) or 3 (coded)

    bool operator==(const Config&) const = default;
  };

  MoeTile(mx::Stream stream, Config config) : CpuPrimitive(stream), c_(config) {}

  Task task() const override {
    return [c = c_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], c);
    };
  }

  const char* name() const override { return "DS4MoeTile"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return c_ == static_cast<const MoeTile&>(other).c_;
  }

 private:
  static void run(const std::vector<mx::array>& in, float* out, const Config& c) {
    const int tokens = in[1].shape(0), dim = in[1].shape(1);
    const int experts = in[0].shape(1), shared_ff = in[2].shape(1), k_used = c.routing.n_used;
    RowMajor logits(in[0]), x(in[1]), shared_gate(in[2]), shared_up(in[3]);
    size_t next = 4;
    const int ff = in[next].shape(1);
    const StackInput gate_w(in, next, c.parts[0]);
    const StackInput up_w(in, next += c.parts[0], c.parts[1]);
    const StackInput down_w(in, next += c.parts[1], c.parts[2]);
    const MatrixInput shared_down(in, next += c.parts[2], c.parts[3]);
    next += c.parts[3];
    std::optional<RowMajor> bias;
    if (c.has_bias) bias.emplace(in[next++]);
    const std::vector<int> hashed = c.hashed ? int_values(in[next]) : std::vector<int>();
    RowRouter router(c.routing, experts);
    const int real = std::min(c.rows, tokens);
    std::vector<int> chosen(static_cast<size_t>(real) * k_used);
    std::vector<float> weights(chosen.size());
    for (int t = 0; t < real; t++) {
      router.route(logits.data() + static_cast<size_t>(t) * experts,
                   bias ? bias->data() : nullptr, c.hashed ? &hashed[t * k_used] : nullptr,
                   &chosen[t * k_used], &weights[t * k_used]);
    }
    // The rows of one expert together (its weights read once), each row on its own bits.
    std::vector<float> expert_out(chosen.size() * dim, 0.0f);
    ExpertRows(gate_w, up_w, down_w, ff, dim, c.limit)
        .run_pairs(pairs_by_expert(chosen.data(), real * k_used, experts), x.data(), k_used,
                   expert_out.data());
    std::fill(out, out + static_cast<size_t>(tokens) * dim, 0.0f);
    combine_rows(expert_out.data(), weights.data(), real, k_used, dim, shared_gate.data(),
                 shared_up.data(), shared_down, shared_ff, c.shared_limit, out);
  }

  Config c_;
};

// MoeTile's routing alone: logits [T, E] (then bias [E], hashed [T, k] as MoeTile) -> the
// experts [T, k] int32 and their weights [T, k] for the first ``rows`` rows (zeros after).
class MoeRoute : public CpuPrimitive {
 public:
  MoeRoute(mx::Stream stream, Routing routing, int rows, bool has_bias, bool hashed)
      : CpuPrimitive(stream), r_(routing), rows_(rows), has_bias_(has_bias), hashed_(hashed) {}

  Task task() const override {
    return [r = r_, rows = rows_, has_bias = has_bias_, hashed = hashed_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      const int tokens = in[0].shape(0), experts = in[0].shape(1);
      RowMajor logits(in[0]);
      std::optional<RowMajor> bias;
      if (has_bias) bias.emplace(in[1]);
      const std::vector<int> ids =
          hashed ? int_values(in[has_bias ? 2 : 1]) : std::vector<int>();
      auto* chosen = reinterpret_cast<int32_t*>(out[0]);
      std::fill(chosen, chosen + static_cast<size_t>(tokens) * r.n_used, 0);
      std::fill(out[1], out[1] + static_cast<size_t>(tokens) * r.n_used, 0.0f);
      RowRouter router(r, experts);
      std::vector<int> picked(r.n_used);
      for (int t = 0; t < std::min(rows, tokens); t++) {
        router.route(logits.data() + static_cast<size_t>(t) * experts,
                     bias ? bias->data() : nullptr, hashed ? &ids[t * r.n_used] : nullptr,
                     picked.data(), out[1] + static_cast<size_t>(t) * r.n_used);
        std::copy(picked.begin(), picked.end(), chosen + static_cast<size_t>(t) * r.n_used);
      }
    };
  }

  const char* name() const override { return "DS4MoeRoute"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const MoeRoute&>(other);
    return r_ == o.r_ && rows_ == o.rows_ && has_bias_ == o.has_bias_ && hashed_ == o.hashed_;
  }

 private:
  Routing r_;
  int rows_;
  bool has_bias_, hashed_;
};

// MoeTile's sum: the routed experts' outputs [R, k, D] (R real rows) and their weights [T, k],
// the shared expert's gate and up products [T, Fs] and down matrix [Fs, D] (float32 or coded,
// ``parts``) -> [T, D], zeros past the R rows.
class MoeCombine : public CpuPrimitive {
 public:
  MoeCombine(mx::Stream stream, float shared_limit, int parts)
      : CpuPrimitive(stream), shared_limit_(shared_limit), parts_(parts) {}

  Task task() const override {
    return [limit = shared_limit_, parts = parts_](const std::vector<mx::array>& in,
                                                   const std::vector<float*>& out) {
      RowMajor expert_out(in[0]), weights(in[1]), shared_gate(in[2]), shared_up(in[3]);
      const MatrixInput shared_down(in, 4, parts);
      const int real = in[0].shape(0), k_used = in[0].shape(1), dim = in[0].shape(2);
      const int tokens = in[1].shape(0), shared_ff = in[2].shape(1);
      std::fill(out[0], out[0] + static_cast<size_t>(tokens) * dim, 0.0f);
      combine_rows(expert_out.data(), weights.data(), real, k_used, dim, shared_gate.data(),
                   shared_up.data(), shared_down, shared_ff, limit, out[0]);
    };
  }

  const char* name() const override { return "DS4MoeCombine"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const MoeCombine&>(other);
    return shared_limit_ == o.shared_limit_ && parts_ == o.parts_;
  }

 private:
  float shared_limit_;
  int parts_;
};

}  // namespace

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

mx::array moe_tile(const mx::array& logits, const mx::array& x, const MatrixArg& gate,
                   const MatrixArg& up, const MatrixArg& down, const mx::array& shared_gate,
                   const mx::array& shared_up, const MatrixArg& shared_down,
                   const std::optional<mx::array>& bias, const std::optional<mx::array>& hashed,
                   int rows, int n_used, int func, bool normalize, float scale, float limit,
                   float shared_limit) {
  auto s = mx::default_stream(mx::Device::cpu);
  const std::string op = "moe_tile";
  const mx::Shape gate_shape = stack_shape(gate, op);
  const int tokens = x.ndim() == 2 ? x.shape(0) : -1;
  const int experts = gate_shape.size() == 3 ? gate_shape[0] : -1;
  const int ff = gate_shape.size() == 3 ? gate_shape[1] : -1;
  const auto [shared_ff, shared_dim] = matrix_shape(shared_down, op);
  if (x.ndim() != 2 || gate_shape.size() != 3 || logits.shape() != mx::Shape{tokens, experts} ||
      stack_shape(up, op) != gate_shape || gate_shape[2] != x.shape(1) ||
      stack_shape(down, op) != mx::Shape{experts, x.shape(1), ff} || shared_gate.ndim() != 2 ||
      shared_gate.shape(0) != tokens || shared_up.shape() != shared_gate.shape() ||
      shared_ff != shared_gate.shape(1) || shared_dim != x.shape(1) || n_used < 1 ||
      n_used > experts || func < 1 || func > 4 ||
      (bias && bias->size() != static_cast<size_t>(experts)) ||
      (hashed && hashed->shape() != mx::Shape{tokens, n_used})) {
    throw std::invalid_argument(
        "moe_tile: expected logits [T, E], x [T, D], gate/up [E, F, D], down [E, D, F], "
        "shared gate/up [T, Fs], shared down [Fs, D], bias [E] or None, hashed [T, k] or "
        "None, 1 <= k <= E, func 1-4");
  }
  std::vector<mx::array> in = {mx::astype(logits, mx::float32, s), mx::astype(x, mx::float32, s),
                               mx::astype(shared_gate, mx::float32, s),
                               mx::astype(shared_up, mx::float32, s)};
  std::array<int, 4> parts = {push_matrix(in, gate, s, op), push_matrix(in, up, s, op),
                              push_matrix(in, down, s, op), push_matrix(in, shared_down, s, op)};
  if (bias) in.push_back(mx::astype(*bias, mx::float32, s));
  if (hashed) in.push_back(mx::astype(*hashed, mx::int32, s));
  MoeTile::Config config{{n_used, func, normalize, scale}, rows, bias.has_value(),
                         hashed.has_value(), limit, shared_limit, parts};
  return mx::array(x.shape(), mx::float32, std::make_shared<MoeTile>(s, config), in);
}

std::vector<mx::array> moe_route(const mx::array& logits, const std::optional<mx::array>& bias,
                                 const std::optional<mx::array>& hashed, int rows, int n_used,
                                 int func, bool normalize, float scale) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int tokens = logits.ndim() == 2 ? logits.shape(0) : -1;
  if (logits.ndim() != 2 || n_used < 1 || n_used > logits.shape(1) || func < 1 || func > 4 ||
      (bias && bias->size() != static_cast<size_t>(logits.shape(1))) ||
      (hashed && hashed->shape() != mx::Shape{tokens, n_used})) {
    throw std::invalid_argument("moe_route: expected logits [T, E], bias [E] or None, hashed "
                                "[T, k] or None, 1 <= k <= E, func 1-4");
  }
  std::vector<mx::array> in = {mx::astype(logits, mx::float32, s)};
  if (bias) in.push_back(mx::astype(*bias, mx::float32, s));
  if (hashed) in.push_back(mx::astype(*hashed, mx::int32, s));
  return mx::array::make_arrays(
      {{tokens, n_used}, {tokens, n_used}}, {mx::int32, mx::float32},
      std::make_shared<MoeRoute>(s, Routing{n_used, func, normalize, scale}, rows,
                                 bias.has_value(), hashed.has_value()),
      in);
}

mx::array moe_combine(const mx::array& expert_out, const mx::array& weights,
                      const mx::array& shared_gate, const mx::array& shared_up,
                      const MatrixArg& shared_down, float shared_limit) {
  auto s = mx::default_stream(mx::Device::cpu);
  const auto [shared_ff, shared_dim] = matrix_shape(shared_down, "moe_combine");
  if (expert_out.ndim() != 3 || weights.ndim() != 2 || weights.shape(1) != expert_out.shape(1) ||
      weights.shape(0) < expert_out.shape(0) || shared_gate.ndim() != 2 ||
      shared_gate.shape(0) != weights.shape(0) || shared_up.shape() != shared_gate.shape() ||
      shared_ff != shared_gate.shape(1) || shared_dim != expert_out.shape(2)) {
    throw std::invalid_argument(
        "moe_combine: expected expert outputs [R, k, D], weights [T, k] (T >= R), shared "
        "gate/up [T, Fs] and shared down [Fs, D]");
  }
  std::vector<mx::array> in = {
      mx::astype(expert_out, mx::float32, s), mx::astype(weights, mx::float32, s),
      mx::astype(shared_gate, mx::float32, s), mx::astype(shared_up, mx::float32, s)};
  const int parts = push_matrix(in, shared_down, s, "moe_combine");
  return mx::array({weights.shape(0), expert_out.shape(2)}, mx::float32,
                   std::make_shared<MoeCombine>(s, shared_limit, parts), in);
}

}  // namespace ds4mlx_ops
