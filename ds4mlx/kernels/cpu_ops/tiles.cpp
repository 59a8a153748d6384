// The decode-tile primitives on stored weights and caches: row-by-row matmuls (plain and
// grouped), the RMS norm, and a cache growing by a chunk.

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {
namespace {

// x [T, K] @ w_i [K, N_i] for each of one or more inference matrices (stored [in, out]) that
// read the same input, for the first ``rows`` rows; the others are zeros (rows_times_in_out).
// Decode and verify tiles use it for every matmul on a stored weight: a one-token step computes
// one row, each row's bits are its own, and the projections of one input are one primitive.
class RowsLinear : public CpuPrimitive {
 public:
  // ``parts``: each matrix's input count (1: float32 [K, N], 3: coded, ``MatrixInput``);
  // ``widths``: each matrix's N (panels may pad it to a whole panel).
  RowsLinear(mx::Stream stream, int rows, std::vector<int> parts, std::vector<int> widths)
      : CpuPrimitive(stream), rows_(rows), parts_(std::move(parts)), widths_(std::move(widths)) {}

  Task task() const override {
    return [rows = rows_, parts = parts_, widths = widths_](const std::vector<mx::array>& in,
                                                            const std::vector<float*>& out) {
      RowMajor x(in[0]);
      const int tokens = in[0].shape(0), k = in[0].shape(1);
      size_t at = 1;
      for (size_t i = 0; i < parts.size(); i++) {
        const MatrixInput w(in, at, parts[i]);
        at += parts[i];
        const int n = widths[i];
        w.times({x.data(), static_cast<size_t>(k), nullptr, out[i], static_cast<size_t>(n), k, n},
                tokens, std::min(rows, tokens));
      }
    };
  }

  const char* name() const override { return "DS4RowsLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowsLinear&>(other);
    return rows_ == o.rows_ && parts_ == o.parts_ && widths_ == o.widths_;
  }

 private:
  int rows_;
  std::vector<int> parts_;
  std::vector<int> widths_;
};

// mx.fast.rms_norm over the last axis of x [..., D]: each row times 1 / sqrt(mean(x^2) + eps),
// then times weight [D] when there is one (two inputs), as one primitive; on the CPU MLX's own
// is three (a square, a sum and the rest fused) or eleven uncompiled. Each row on its own.
class RmsNorm : public CpuPrimitive {
 public:
  RmsNorm(mx::Stream stream, float eps) : CpuPrimitive(stream), eps_(eps) {}

  Task task() const override {
    return [eps = eps_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]);
      const bool weighted = in.size() > 1;
      const int dim = in[0].shape(-1);
      const size_t rows = dim ? in[0].size() / dim : 0;
      std::optional<RowMajor> weights;
      if (weighted) weights.emplace(in[1]);
      const float* weight = weighted ? weights->data() : nullptr;
      for (size_t r = 0; r < rows; r++) {
        const float* row = x.data() + r * dim;
        float* o = out[0] + r * dim;
        const float scale = 1.0f / std::sqrt(dot(row, row, dim) / static_cast<float>(dim) + eps);
        if (weighted) {
          for (int d = 0; d < dim; d++) o[d] = row[d] * scale * weight[d];
        } else {
          for (int d = 0; d < dim; d++) o[d] = row[d] * scale;
        }
      }
    };
  }

  // The derivative is mx.fast.rms_norm's (the twin's), so that training differentiates
  // through this primitive without a wrapper (one primitive more on every call).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const float eps = eps_;
    auto twin = [eps, s = stream()](const std::vector<mx::array>& in) {
      std::optional<mx::array> weight;
      if (in.size() > 1) weight = in[1];
      return std::vector<mx::array>{mx::fast::rms_norm(in[0], weight, eps, s)};
    };
    auto grads = mx::vjp(twin, primals, cotangents).second;
    std::vector<mx::array> picked;
    for (int arg : argnums) picked.push_back(grads[arg]);
    return picked;
  }

  const char* name() const override { return "DS4RmsNorm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RmsNorm&>(other).eps_;
  }

 private:
  float eps_;
};

// The grouped projection x [T, G * K] -> [T, G * N]: group g's channels times its own matrix
// w [G, K, N] (stored [in, out]), for the first ``rows`` rows (the others zeros); DeepSeek-V4's
// output projection wo_a, without reshaping and transposing around a batched matmul.
class GroupedRowsLinear : public CpuPrimitive {
 public:
  GroupedRowsLinear(mx::Stream stream, int rows) : CpuPrimitive(stream), rows_(rows) {}

  Task task() const override {
    return [rows = rows_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajor x(in[0]), w(in[1]);
      const int tokens = in[0].shape(0), groups = in[1].shape(0);
      const int k = in[1].shape(1), n = in[1].shape(2);
      for (int g = 0; g < groups; g++) {
        rows_times_in_out({x.data() + static_cast<size_t>(g) * k, static_cast<size_t>(groups) * k,
                           w.data() + static_cast<size_t>(g) * k * n, out[0] + static_cast<size_t>(g) * n,
                           static_cast<size_t>(groups) * n, k, n},
                          tokens, std::min(rows, tokens));
      }
    };
  }

  const char* name() const override { return "DS4GroupedRowsLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return rows_ == static_cast<const GroupedRowsLinear&>(other).rows_;
  }

 private:
  int rows_;
};

// For each pair i: the rows of cached_i followed by the first ``take`` rows of new_i, of which
// the last ``keep`` (or all, if fewer): how a cache grows by a chunk and drops what no later
// chunk needs, in one primitive instead of a slice, a concatenation and a slice per array.
class AppendRows : public CpuPrimitive {
 public:
  AppendRows(mx::Stream stream, int take, int keep) : CpuPrimitive(stream), take_(take), keep_(keep) {}

  Task task() const override {
    return [take = take_, keep = keep_](const std::vector<mx::array>& in,
                                        const std::vector<float*>& out) {
      const size_t pairs = in.size() / 2;
      for (size_t i = 0; i < pairs; i++) {
        RowMajor cached(in[i]), fresh(in[pairs + i]);
        const int width = in[pairs + i].shape(1), old_rows = in[i].shape(0);
        const int total = old_rows + take, kept = std::min(total, keep), skip = total - kept;
        float* o = out[i];
        for (int r = skip; r < total; r++, o += width) {
          const float* src = r < old_rows ? cached.data() + static_cast<size_t>(r) * width
                                          : fresh.data() + static_cast<size_t>(r - old_rows) * width;
          std::copy(src, src + width, o);
        }
      }
    };
  }

  const char* name() const override { return "DS4AppendRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const AppendRows&>(other);
    return take_ == o.take_ && keep_ == o.keep_;
  }

 private:
  int take_;
  int keep_;
};

}  // namespace

std::vector<mx::array> rows_linear(const mx::array& x, const std::vector<MatrixArg>& ws,
                                   int rows, const std::vector<int>& widths) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() != 2 || ws.empty() || rows < 0) {
    throw std::invalid_argument("rows_linear: expected x [T, K], one or more w [K, N], rows >= 0");
  }
  if (!widths.empty() && widths.size() != ws.size()) {
    throw std::invalid_argument("rows_linear: one width per matrix, or none");
  }
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s)};
  std::vector<mx::Shape> shapes;
  std::vector<int> parts, ns;
  for (size_t i = 0; i < ws.size(); i++) {
    const auto [k, stored_n] = matrix_shape(ws[i], "rows_linear");
    if (k != x.shape(1)) {
      throw std::invalid_argument("rows_linear: every w must be [K, N] with x [T, K]");
    }
    // Panels hold a width short of a whole panel padded; float32 values hold it exactly.
    const int n = widths.empty() ? stored_n : widths[i];
    const int padding = std::holds_alternative<mx::array>(ws[i]) ? 0 : kPanel - 1;
    if (n > stored_n || n < stored_n - padding || n < 0) {
      throw std::invalid_argument("rows_linear: a width does not fit its matrix's columns");
    }
    parts.push_back(push_matrix(in, ws[i], s, "rows_linear"));
    shapes.push_back({x.shape(0), n});
    ns.push_back(n);
  }
  return mx::array::make_arrays(
      shapes, std::vector<mx::Dtype>(ws.size(), mx::float32),
      std::make_shared<RowsLinear>(s, rows, std::move(parts), std::move(ns)), in);
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() < 1 || (weight && (weight->ndim() != 1 || weight->shape(0) != x.shape(-1)))) {
    throw std::invalid_argument("rms_norm: expected x [..., D] and weight [D] or None");
  }
  std::vector<mx::array> in = {mx::astype(x, mx::float32, s)};
  if (weight) in.push_back(mx::astype(*weight, mx::float32, s));
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, eps), in);
}

mx::array grouped_rows_linear(const mx::array& x, const mx::array& w, int rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (x.ndim() != 2 || w.ndim() != 3 || x.shape(1) != w.shape(0) * w.shape(1) || rows < 0) {
    throw std::invalid_argument(
        "grouped_rows_linear: expected x [T, G * K], w [G, K, N] and rows >= 0");
  }
  return mx::array({x.shape(0), w.shape(0) * w.shape(2)}, mx::float32,
                   std::make_shared<GroupedRowsLinear>(s, rows),
                   {mx::astype(x, mx::float32, s), mx::astype(w, mx::float32, s)});
}

std::vector<mx::array> append_rows(const std::vector<mx::array>& cached,
                                   const std::vector<mx::array>& fresh, int take, int keep) {
  auto s = mx::default_stream(mx::Device::cpu);
  if (cached.size() != fresh.size() || cached.empty() || keep < 0) {
    throw std::invalid_argument("append_rows: expected as many cached as new arrays, keep >= 0");
  }
  std::vector<mx::array> in;
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < cached.size(); i++) {
    const auto& a = cached[i];
    const auto& b = fresh[i];
    if (a.ndim() != 2 || b.ndim() != 2 || a.shape(1) != b.shape(1) || take < 0 ||
        take > b.shape(0)) {
      throw std::invalid_argument("append_rows: expected [N, W] and [T, W] with take <= T");
    }
    shapes.push_back({std::min(a.shape(0) + take, keep), a.shape(1)});
  }
  for (const auto& a : cached) in.push_back(mx::astype(a, mx::float32, s));
  for (const auto& b : fresh) in.push_back(mx::astype(b, mx::float32, s));
  return mx::array::make_arrays(shapes, std::vector<mx::Dtype>(cached.size(), mx::float32),
                                std::make_shared<AppendRows>(s, take, keep), in);
}

}  // namespace ds4mlx_ops
