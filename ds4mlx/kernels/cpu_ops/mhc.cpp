// The mHC (manifold-constrained hyper-connection) primitives: a site's mixes with their
// Sinkhorn normalisation, the whole site before its block, and the streams after it.

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {
namespace {

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

// One token's mixes at an mHC site (twins.hc_mixes): from its projected mixes m [(2 + hc) * hc],
// the collapse weights pre [hc], the expansion weights post [hc] and comb [hc, hc].
void mix_row(const float* m, const float* scale, const float* base, int hc, int iters,
             float eps, float* pre, float* post, float* comb) {
  for (int i = 0; i < hc; i++) {
    pre[i] = sigmoid(m[i] * scale[0] + base[i]) + eps;
    post[i] = 2.0f * sigmoid(m[hc + i] * scale[1] + base[hc + i]);
  }
  for (int k = 0; k < hc * hc; k++) comb[k] = m[2 * hc + k] * scale[2] + base[2 * hc + k];
  sinkhorn_matrix(comb, hc, iters, eps);
}

// A whole mHC site before its block (twins.hc_pre): the streams x [T, hc, D] RMS-normed as one
// flat vector per token, projected by fn_t [hc * D, (2 + hc) * hc] (the projection stored
// [in, out], as ds4mlx keeps inference matrices), mixed, and collapsed by pre: outputs the
// block input [T, D], post [T, hc] and comb [T, hc, hc]. ``rows`` (-1: all): a decode tile's
// real rows, the only ones computed (the others zeros); a tile's projection takes one chain of
// multiply-adds per value (rows_times_in_out), so a row's bits never depend on the other rows,
// and a longer chunk (prefill) one GEMM.
class HcPre : public CpuPrimitive {
 public:
  HcPre(mx::Stream stream, int hc, int iters, float eps, float norm_eps, int rows)
      : CpuPrimitive(stream), hc_(hc), iters_(iters), eps_(eps), norm_eps_(norm_eps), rows_(rows) {}

  Task task() const override {
    return [hc = hc_, iters = iters_, eps = eps_, norm_eps = norm_eps_, rows = rows_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]), fn_t(in[1]), scale(in[2]), base(in[3]);
      const int tokens = in[0].shape(0), dim = in[0].shape(2);
      const int real = rows < 0 ? tokens : std::min(rows, tokens);
      const int flat = hc * dim, width = (2 + hc) * hc;
      std::vector<float> normed(in[0].size()), mixes(static_cast<size_t>(tokens) * width);
      for (int t = 0; t < real; t++) {
        const float* row = x.data() + static_cast<size_t>(t) * flat;
        float squares = 0.0f;
        for (int i = 0; i < flat; i++) squares += row[i] * row[i];
        const float inv = 1.0f / std::sqrt(squares / flat + norm_eps);
        for (int i = 0; i < flat; i++) normed[static_cast<size_t>(t) * flat + i] = row[i] * inv;
      }
      if (tokens <= kTileRows) {
        rows_times_in_out({normed.data(), static_cast<size_t>(flat), fn_t.data(), mixes.data(),
                           static_cast<size_t>(width), flat, width},
                          tokens, real);
      } else {
        cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, real, width, flat, 1.0f, normed.data(), flat,
                    fn_t.data(), width, 0.0f, mixes.data(), width);
      }
      std::fill(out[0] + static_cast<size_t>(real) * dim, out[0] + static_cast<size_t>(tokens) * dim, 0.0f);
      std::fill(out[1] + real * hc, out[1] + tokens * hc, 0.0f);
      std::fill(out[2] + real * hc * hc, out[2] + tokens * hc * hc, 0.0f);
      std::vector<float> pre(hc);
      for (int t = 0; t < real; t++) {
        mix_row(mixes.data() + static_cast<size_t>(t) * width, scale.data(), base.data(), hc,
                iters, eps, pre.data(), out[1] + t * hc, out[2] + t * hc * hc);
        float* block_in = out[0] + static_cast<size_t>(t) * dim;
        const float* streams = x.data() + static_cast<size_t>(t) * flat;
        std::fill(block_in, block_in + dim, 0.0f);
        for (int s = 0; s < hc; s++) {
          for (int d = 0; d < dim; d++) block_in[d] += pre[s] * streams[s * dim + d];
        }
      }
    };
  }

  const char* name() const override { return "DS4HcPre"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const HcPre&>(other);
    return hc_ == o.hc_ && iters_ == o.iters_ && eps_ == o.eps_ && norm_eps_ == o.norm_eps_ &&
           rows_ == o.rows_;
  }

 private:
  int hc_;
  int iters_;
  float eps_;
  float norm_eps_;
  int rows_;
};

// The streams after a block (twins.hc_expand): new[t, dst] = post[t, dst] * out[t] +
// sum over src of comb[t, src, dst] * residual[t, src], from the block output out [T, D], the
// residual streams [T, hc, D], post [T, hc] and comb [T, hc, hc]; for the first ``rows`` rows
// (-1: all), the others zeros (a decode tile's padding).
class HcExpand : public CpuPrimitive {
 public:
  HcExpand(mx::Stream stream, int rows) : CpuPrimitive(stream), rows_(rows) {}

  Task task() const override {
    return [rows = rows_](const std::vector<mx::array>& in, const std::vector<float*>& result) {
      RowMajor out(in[0]), residual(in[1]), post(in[2]), comb(in[3]);
      const int tokens = in[1].shape(0), hc = in[1].shape(1), dim = in[1].shape(2);
      const int real = rows < 0 ? tokens : std::min(rows, tokens);
      const size_t row_size = static_cast<size_t>(hc) * dim;
      std::fill(result[0] + real * row_size, result[0] + tokens * row_size, 0.0f);
      // Accumulated over src in order, each step a vector operation over the channels.
      std::vector<float> mixed(dim);
      for (int t = 0; t < real; t++) {
        const float* streams = residual.data() + static_cast<size_t>(t) * hc * dim;
        const float* block_out = out.data() + static_cast<size_t>(t) * dim;
        for (int j = 0; j < hc; j++) {
          std::fill(mixed.begin(), mixed.end(), 0.0f);
          for (int i = 0; i < hc; i++) {
            const float weight = comb[(t * hc + i) * hc + j];
            const float* src = streams + static_cast<size_t>(i) * dim;
            for (int d = 0; d < dim; d++) mixed[d] += weight * src[d];
          }
          float* o = result[0] + (static_cast<size_t>(t) * hc + j) * dim;
          const float scale = post[t * hc + j];
          for (int d = 0; d < dim; d++) o[d] = scale * block_out[d] + mixed[d];
        }
      }
    };
  }

  const char* name() const override { return "DS4HcExpand"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return rows_ == static_cast<const HcExpand&>(other).rows_;
  }

 private:
  int rows_;
};

// One mHC site's mixes (mhc.HyperConnection after its projection): from the projected mixes
// [T, (2 + hc) * hc], the per-section scale [3] and the bias [(2 + hc) * hc], the collapse
// weights pre [T, hc], the expansion weights post [T, hc] and the Sinkhorn-normalised stream
// mix comb [T, hc, hc].
class HcMixes : public CpuPrimitive {
 public:
  HcMixes(mx::Stream stream, int hc, int iters, float eps)
      : CpuPrimitive(stream), hc_(hc), iters_(iters), eps_(eps) {}

  Task task() const override {
    return [hc = hc_, iters = iters_, eps = eps_](const std::vector<mx::array>& in,
                                                  const std::vector<float*>& out) {
      RowMajor mixes(in[0]), scale(in[1]), base(in[2]);
      const int tokens = in[0].shape(0), width = (2 + hc) * hc;
      for (int t = 0; t < tokens; t++) {
        mix_row(mixes.data() + t * width, scale.data(), base.data(), hc, iters, eps,
                out[0] + t * hc, out[1] + t * hc, out[2] + t * hc * hc);
      }
    };
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

}  // namespace

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

std::vector<mx::array> hc_pre(const mx::array& x, const mx::array& fn_t, const mx::array& scale,
                              const mx::array& base, int hc, int iters, float eps,
                              float norm_eps, int rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  const int width = (2 + hc) * hc;
  if (x.ndim() != 3 || x.shape(1) != hc || fn_t.ndim() != 2 || fn_t.shape(1) != width ||
      fn_t.shape(0) != hc * x.shape(2) || scale.size() != 3 ||
      base.size() != static_cast<size_t>(width)) {
    throw std::invalid_argument("hc_pre: expected x [T, hc, D], fn_t [hc * D, (2 + hc) * hc], "
                                "scale [3] and base [(2 + hc) * hc]");
  }
  const int tokens = x.shape(0), dim = x.shape(2);
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s), mx::astype(fn_t, mx::float32, s),
                               mx::astype(scale, mx::float32, s),
                               mx::astype(base, mx::float32, s)};
  return mx::array::make_arrays({{tokens, dim}, {tokens, hc}, {tokens, hc, hc}},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<HcPre>(s, hc, iters, eps, norm_eps, rows), in);
}

mx::array hc_expand(const mx::array& out, const mx::array& residual, const mx::array& post,
                    const mx::array& comb, int rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (residual.ndim() != 3 || out.shape() != mx::Shape{residual.shape(0), residual.shape(2)} ||
      post.shape() != mx::Shape{residual.shape(0), residual.shape(1)} ||
      comb.shape() != mx::Shape{residual.shape(0), residual.shape(1), residual.shape(1)}) {
    throw std::invalid_argument("hc_expand: expected out [T, D], residual [T, hc, D], "
                                "post [T, hc] and comb [T, hc, hc]");
  }
  return mx::array(residual.shape(), mx::float32, std::make_shared<HcExpand>(s, rows),
                   {mx::astype(out, mx::float32, s), mx::astype(residual, mx::float32, s),
                    mx::astype(post, mx::float32, s), mx::astype(comb, mx::float32, s)});
}

}  // namespace ds4mlx_ops
