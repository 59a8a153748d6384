// DSpark's Markov head chained over a drafted block (speculation.dspark.DSparkNet.block_rows
// without confidences) as one primitive: in MLX each row is a gather, a matmul, a scale, a
// scatter through d2t, an add and an argmax, one row after the other since a row's bias
// depends on the previous row's pick.

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {
namespace {

// The index of a row's largest value, the first one on ties (as mx.argmax).
int first_argmax(const float* row, int n) {
  int best = 0;
  for (int v = 1; v < n; v++) {
    if (row[v] > row[best]) best = v;
  }
  return best;
}

// Inputs: logits [B, V], markov_w1 stored [in, out] [R, V], markov_w2 stored [in, out]
// [R, Vd], the anchor [1] int32, then the scale [1] (``has_scale``) and the d2t index [V]
// int32 (``has_index``; Vd marks a target token without a draft row). Outputs: rows [n, V]
// (the biased logits) and picks [n] int32. Rows before ``first`` (the bonus slot) pass
// through unbiased.
class MarkovChain : public CpuPrimitive {
 public:
  struct Config {
    int first, n;
    bool has_scale, has_index;

    bool operator==(const Config&) const = default;
  };

  MarkovChain(mx::Stream stream, Config config) : CpuPrimitive(stream), c_(config) {}

  Task task() const override {
    return [c = c_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], reinterpret_cast<int32_t*>(out[1]), c);
    };
  }

  const char* name() const override { return "DS4MarkovChain"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return c_ == static_cast<const MarkovChain&>(other).c_;
  }

 private:
  static void run(const std::vector<mx::array>& in, float* rows, int32_t* picks,
                  const Config& c) {
    const int vocab = in[0].shape(1), rank = in[1].shape(0), draft_vocab = in[2].shape(1);
    RowMajor logits(in[0]), w1(in[1]), w2(in[2]);
    size_t next = 4;
    const float scale = c.has_scale ? in[next++].data<float>()[0] : 1.0f;
    const std::vector<int> index = c.has_index ? int_values(in[next]) : std::vector<int>();
    int prev = int_values(in[3])[0];
    std::vector<float> features(rank), bias(draft_vocab);
    for (int i = 0; i < c.n; i++) {
      const float* logit_row = logits.data() + static_cast<size_t>(i) * vocab;
      float* row = rows + static_cast<size_t>(i) * vocab;
      if (i < c.first) {
        std::copy(logit_row, logit_row + vocab, row);
        picks[i] = first_argmax(row, vocab);
        continue;
      }
      // markov_w1[prev] . markov_w2 as linear computes a one-row product (rows_linear).
      for (int r = 0; r < rank; r++) features[r] = w1[static_cast<size_t>(r) * vocab + prev];
      rows_times_in_out({features.data(), static_cast<size_t>(rank), w2.data(), bias.data(),
                         static_cast<size_t>(draft_vocab), rank, draft_vocab},
                        1, 1);
      if (c.has_scale) {
        for (float& b : bias) b *= scale;
      }
      for (int v = 0; v < vocab; v++) {
        const int at = c.has_index ? index[v] : v;
        row[v] = logit_row[v] + (at < draft_vocab ? bias[at] : 0.0f);
      }
      prev = picks[i] = first_argmax(row, vocab);
    }
  }

  Config c_;
};

}  // namespace

std::vector<mx::array> markov_chain(const mx::array& logits, const mx::array& w1,
                                    const mx::array& w2, const mx::array& anchor,
                                    const std::optional<mx::array>& scale,
                                    const std::optional<mx::array>& index, int first, int n) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (logits.ndim() != 2 || w1.ndim() != 2 || w1.shape(1) != logits.shape(1) ||
      w2.ndim() != 2 || w2.shape(0) != w1.shape(0) || anchor.size() != 1 || n < 0 ||
      n > logits.shape(0) || first < 0 || (scale && scale->size() != 1) ||
      (index && index->shape() != mx::Shape{logits.shape(1)}) ||
      (!index && w2.shape(1) != logits.shape(1))) {
    throw std::invalid_argument(
        "markov_chain: expected logits [B, V], w1 [R, V], w2 [R, Vd], anchor [1], scale [1] "
        "or None, index [V] or None (Vd == V without one), 0 <= n <= B");
  }
  std::vector<mx::array> in = {mx::astype(logits, mx::float32, s), mx::astype(w1, mx::float32, s),
                               mx::astype(w2, mx::float32, s),
                               mx::astype(mx::reshape(anchor, {1}, s), mx::int32, s)};
  if (scale) in.push_back(mx::astype(mx::reshape(*scale, {1}, s), mx::float32, s));
  if (index) in.push_back(mx::astype(*index, mx::int32, s));
  MarkovChain::Config config{first, n, scale.has_value(), index.has_value()};
  return mx::array::make_arrays({{n, logits.shape(1)}, {n}}, {mx::float32, mx::int32},
                                std::make_shared<MarkovChain>(s, config), in);
}

}  // namespace ds4mlx_ops
