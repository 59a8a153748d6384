// The attention primitives: sparse sink attention over a window and selected compressed
// rows, the lightning indexer's top-k, the rotary embedding and the compressors' pooling.

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {
namespace {

// twins.sparse_attention: each query row t attends its raw window rows [lo, hi) and the
// compressed rows comp_index[t, :] (a slot outside [0, N) is unused), keys being also values
// (one KV head), with each head's sink logit in the softmax denominator only. A row reads
// exactly its own keys, in order, so its result never depends on the other rows of the call.
class SparseAttention : public CpuPrimitive {
 public:
  SparseAttention(mx::Stream stream, float scale) : CpuPrimitive(stream), scale_(scale) {}

  Task task() const override {
    return [scale = scale_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], scale);
    };
  }

  const char* name() const override { return "DS4SparseAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const SparseAttention&>(other).scale_;
  }

 private:
  static void run(const std::vector<mx::array>& inputs, float* out, float scale) {
    const int tokens = inputs[0].shape(0), heads = inputs[0].shape(1), dim = inputs[0].shape(2);
    const int window_rows = inputs[1].shape(0), comp_rows = inputs[3].shape(0);
    const int slots = inputs[4].shape(1);
    RowMajor q(inputs[0]), window(inputs[1]), comp(inputs[3]), sinks(inputs[5]);
    std::vector<int> ranges = int_values(inputs[2]), index = int_values(inputs[4]);
    std::vector<const float*> keys;
    std::vector<float> scores;
    for (int t = 0; t < tokens; t++) {
      keys.clear();
      const int lo = std::max(ranges[2 * t], 0), hi = std::min(ranges[2 * t + 1], window_rows);
      for (int r = lo; r < hi; r++) keys.push_back(window.data() + static_cast<size_t>(r) * dim);
      for (int k = 0; k < slots; k++) {
        const int row = index[t * slots + k];
        if (row >= 0 && row < comp_rows) {
          keys.push_back(comp.data() + static_cast<size_t>(row) * dim);
        }
      }
      scores.resize(keys.size());
      for (int h = 0; h < heads; h++) {
        const float* qv = q.data() + (static_cast<size_t>(t) * heads + h) * dim;
        float top = sinks[h];
        for (size_t j = 0; j < keys.size(); j++) {
          scores[j] = dot(qv, keys[j], dim) * scale;
          top = std::max(top, scores[j]);
        }
        float denominator = 0.0f;
        for (size_t j = 0; j < keys.size(); j++) {
          scores[j] = std::exp(scores[j] - top);
          denominator += scores[j];
        }
        denominator += std::exp(sinks[h] - top);
        float* o = out + (static_cast<size_t>(t) * heads + h) * dim;
        std::fill(o, o + dim, 0.0f);
        for (size_t j = 0; j < keys.size(); j++) {
          const float p = scores[j] / denominator;
          for (int d = 0; d < dim; d++) o[d] += p * keys[j][d];
        }
      }
    }
  }

  float scale_;
};

// twins.indexer_top_k: for each query row on its own, the lightning indexer's top_k blocks
// among the row's first visible[t] (scores sum_h w[t, h] * max(q[t, h] . key_j, 0); equal
// scores lower block first), in ascending order, -1 in unused slots; a row that sees at most
// top_k blocks takes them all. The output is int32, written through the float* the base
// class hands out (the memory is the array's own, sized for int32).
class IndexerTopK : public CpuPrimitive {
 public:
  IndexerTopK(mx::Stream stream, int top_k) : CpuPrimitive(stream), top_k_(top_k) {}

  Task task() const override {
    return [top_k = top_k_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, reinterpret_cast<int32_t*>(out[0]), top_k);
    };
  }

  const char* name() const override { return "DS4IndexerTopK"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return top_k_ == static_cast<const IndexerTopK&>(other).top_k_;
  }

 private:
  static void run(const std::vector<mx::array>& inputs, int32_t* out, int top_k) {
    const int tokens = inputs[0].shape(0), heads = inputs[0].shape(1), dim = inputs[0].shape(2);
    const int n_keys = inputs[2].shape(0);
    RowMajor q(inputs[0]), weights(inputs[1]), keys(inputs[2]);
    std::vector<float> scores;
    std::vector<int> order;
    for (int t = 0; t < tokens; t++) {
      const int seen = std::min(
          std::max(inputs[3].data<int32_t>()[mx::elem_to_loc(t, inputs[3])], 0), n_keys);
      int32_t* row = out + static_cast<size_t>(t) * top_k;
      if (seen <= top_k) {
        for (int k = 0; k < top_k; k++) row[k] = k < seen ? k : -1;
        continue;
      }
      scores.assign(seen, 0.0f);
      for (int h = 0; h < heads; h++) {
        const float* qv = q.data() + (static_cast<size_t>(t) * heads + h) * dim;
        const float w = weights[static_cast<size_t>(t) * heads + h];
        for (int j = 0; j < seen; j++) {
          const float* kv = keys.data() + static_cast<size_t>(j) * dim;
          float dot = 0.0f;
          for (int d = 0; d < dim; d++) dot += qv[d] * kv[d];
          scores[j] += std::max(dot, 0.0f) * w;
        }
      }
      order.resize(seen);
      for (int j = 0; j < seen; j++) order[j] = j;
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
        return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
      });
      std::sort(order.begin(), order.begin() + top_k);
      std::copy(order.begin(), order.begin() + top_k, row);
    }
  }

  int top_k_;
};

// models.rope.RoPE.apply: channels [offset, offset + n_dims) of x [T, ..., D] rotated pairwise
// by token t's angles, cos/sin [T, n_dims / 2] (already scaled); ``interleaved`` pairs
// (2i, 2i + 1) (GGML_ROPE_TYPE_NORMAL), else (i, i + n_dims / 2) (NEOX). ``inverse`` rotates
// back (sin negated), which is also the vector-Jacobian product, so this primitive is
// differentiable without a twin.
class Rope : public CpuPrimitive {
 public:
  Rope(mx::Stream stream, int offset, int n_dims, bool interleaved, bool inverse)
      : CpuPrimitive(stream), offset_(offset), n_dims_(n_dims), interleaved_(interleaved),
        inverse_(inverse) {}

  Task task() const override {
    return [offset = offset_, n = n_dims_, interleaved = interleaved_, inverse = inverse_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]), cos(in[1]), sin(in[2]);
      const int tokens = in[0].shape(0), dim = in[0].shape(-1), half = n / 2;
      const size_t per_token = in[0].size() / tokens, vectors = per_token / dim;
      std::copy(x.data(), x.data() + in[0].size(), out[0]);
      for (int t = 0; t < tokens; t++) {
        for (size_t v = 0; v < vectors; v++) {
          const float* src = x.data() + t * per_token + v * dim + offset;
          float* o = out[0] + t * per_token + v * dim + offset;
          for (int i = 0; i < half; i++) {
            const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
            const float c = cos[t * half + i];
            const float s = inverse ? -sin[t * half + i] : sin[t * half + i];
            o[a] = src[a] * c - src[b] * s;
            o[b] = src[a] * s + src[b] * c;
          }
        }
      }
    };
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        grads.push_back(mx::array(
            cotangents[0].shape(), mx::float32,
            std::make_shared<Rope>(stream(), offset_, n_dims_, interleaved_, !inverse_),
            {mx::astype(cotangents[0], mx::float32, stream()), primals[1], primals[2]}));
      } else {
        grads.push_back(mx::zeros_like(primals[arg], stream()));  // the angles are constants
      }
    }
    return grads;
  }

  const char* name() const override { return "DS4Rope"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Rope&>(other);
    return offset_ == o.offset_ && n_dims_ == o.n_dims_ && interleaved_ == o.interleaved_ &&
           inverse_ == o.inverse_;
  }

 private:
  int offset_;
  int n_dims_;
  bool interleaved_;
  bool inverse_;
};

// A compressor's pooling of the blocks a chunk completes
// (models.compressed_attention.Compressor.pool): block i of ``n`` takes rows lo + i * r + j,
// j < r, of kv and score [N, C]; each channel's values are weighted by the softmax of its
// scores over the block's rows and summed. With ``overlap`` (C = 2 * dim) the softmax runs
// over the previous block's first ``dim`` channels, then the block's last ``dim`` channels (a
// row before the first is a zero value with a -inf score); else over the block's rows
// (C = dim). -> [n, dim]
class PoolBlocks : public CpuPrimitive {
 public:
  struct Config {
    int lo, n, ratio, dim;
    bool overlap;

    bool operator==(const Config&) const = default;
  };

  PoolBlocks(mx::Stream stream, Config config) : CpuPrimitive(stream), c_(config) {}

  Task task() const override {
    return [c = c_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], c);
    };
  }

  const char* name() const override { return "DS4PoolBlocks"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return c_ == static_cast<const PoolBlocks&>(other).c_;
  }

 private:
  static void run(const std::vector<mx::array>& in, float* out, const Config& c) {
    const int width = in[0].shape(1), r = c.ratio, dim = c.dim;
    const int span = c.overlap ? 2 * r : r;
    RowMajor kv(in[0]), score(in[1]);
    std::vector<float> values(span), weights(span);
    for (int i = 0; i < c.n; i++) {
      const int base = c.lo + i * r;
      for (int ch = 0; ch < dim; ch++) {
        for (int j = 0; j < span; j++) {
          // With overlap, j < r reads the previous block's first half, j >= r this block's
          // second half; without, this block's rows.
          const int row = c.overlap ? base - r + j : base + j;
          const int col = c.overlap && j >= r ? dim + ch : ch;
          if (row < 0) {
            values[j] = 0.0f;
            weights[j] = -INFINITY;
            continue;
          }
          values[j] = kv[static_cast<size_t>(row) * width + col];
          weights[j] = score[static_cast<size_t>(row) * width + col];
        }
        float top = weights[0];
        for (int j = 1; j < span; j++) top = std::max(top, weights[j]);
        float total = 0.0f;
        for (int j = 0; j < span; j++) total += weights[j] = std::exp(weights[j] - top);
        float pooled = 0.0f;
        for (int j = 0; j < span; j++) pooled += values[j] * (weights[j] / total);
        out[static_cast<size_t>(i) * dim + ch] = pooled;
      }
    }
  }

  Config c_;
};

}  // namespace

mx::array sparse_attention(const mx::array& q, const mx::array& window,
                           const mx::array& window_range, const mx::array& comp,
                           const mx::array& comp_index, const mx::array& sinks, float scale) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int tokens = q.ndim() == 3 ? q.shape(0) : -1;
  if (q.ndim() != 3 || window.ndim() != 2 || window.shape(1) != q.shape(2) ||
      comp.ndim() != 2 || comp.shape(1) != q.shape(2) ||
      window_range.shape() != mx::Shape{tokens, 2} || comp_index.ndim() != 2 ||
      comp_index.shape(0) != tokens || sinks.ndim() != 1 || sinks.shape(0) != q.shape(1)) {
    throw std::invalid_argument(
        "sparse_attention: expected q [T, H, D], window [W, D], window_range [T, 2], "
        "comp [N, D], comp_index [T, K], sinks [H]");
  }
  std::vector<mx::array> in = {mx::astype(q, mx::float32, s), mx::astype(window, mx::float32, s),
                               mx::astype(window_range, mx::int32, s),
                               mx::astype(comp, mx::float32, s),
                               mx::astype(comp_index, mx::int32, s),
                               mx::astype(sinks, mx::float32, s)};
  return mx::array(q.shape(), mx::float32, std::make_shared<SparseAttention>(s, scale), in);
}

mx::array indexer_top_k(const mx::array& q, const mx::array& weights, const mx::array& keys,
                        const mx::array& visible, int top_k) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (q.ndim() != 3 || weights.shape() != mx::Shape{q.shape(0), q.shape(1)} ||
      keys.ndim() != 2 || keys.shape(1) != q.shape(2) ||
      visible.shape() != mx::Shape{q.shape(0)} || top_k < 1) {
    throw std::invalid_argument(
        "indexer_top_k: expected q [T, H, D], weights [T, H], keys [N, D], visible [T], "
        "top_k >= 1");
  }
  return mx::array({q.shape(0), top_k}, mx::int32, std::make_shared<IndexerTopK>(s, top_k),
                   {mx::astype(q, mx::float32, s), mx::astype(weights, mx::float32, s),
                    mx::astype(keys, mx::float32, s), mx::astype(visible, mx::int32, s)});
}

mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin, int offset,
               int n_dims, bool interleaved, bool inverse) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() < 2 || n_dims % 2 || offset < 0 || offset + n_dims > x.shape(-1) ||
      cos.shape() != mx::Shape{x.shape(0), n_dims / 2} || sin.shape() != cos.shape()) {
    throw std::invalid_argument(
        "rope: expected x [T, ..., D] with channels [offset, offset + n_dims) inside D and "
        "cos, sin [T, n_dims / 2]");
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<Rope>(s, offset, n_dims, interleaved, inverse),
                   {mx::astype(x, mx::float32, s), mx::astype(cos, mx::float32, s),
                    mx::astype(sin, mx::float32, s)});
}

mx::array pool_blocks(const mx::array& kv, const mx::array& score, int lo, int n, int ratio,
                      int dim, bool overlap) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int width = overlap ? 2 * dim : dim;
  if (kv.ndim() != 2 || kv.shape(1) != width || score.shape() != kv.shape() || ratio < 1 ||
      n < 0 || lo < 0 || lo + n * ratio > kv.shape(0)) {
    throw std::invalid_argument(
        "pool_blocks: expected kv and score [N, C] (C = 2 * dim with overlap, else dim) "
        "holding rows [lo, lo + n * ratio)");
  }
  return mx::array({n, dim}, mx::float32,
                   std::make_shared<PoolBlocks>(s, PoolBlocks::Config{lo, n, ratio, dim, overlap}),
                   {mx::astype(kv, mx::float32, s), mx::astype(score, mx::float32, s)});
}

}  // namespace ds4mlx_ops
