// Matmuls on GGUF-quantized weights as the file stores them (kernels.PackedWeight on the CPU):
// dense matrices, the head, the grouped output projection and the routed experts, resident or
// in a streamed store's slabs. One copy of each weight, its blocks; each weight row is decoded
// (quant_blocks.h) into a row buffer that stays in the cache while every input row takes its
// dot product with it, so no float32 matrix is ever made.
//
// Up to kTileRows input rows (decode and verify tiles) each output is one dot product of a weight
// row and an input row, the same function whatever the row count: a row's bits never depend on
// the other rows of the call (a verify row equals that token decoded alone) nor on where the
// weight's bytes live (streamed logits equal resident ones). Q8_0, Q2_K and IQ2_XXS take integer
// dot products on the blocks themselves, on the input rounded to 8 bits (per 32 values for Q8_0,
// per 256 for the others, as llama.cpp's CPU does); the other formats decode the weight row to
// float32. More rows (prefill) decode a panel of weight rows and hand it to BLAS, the input
// rounded as the integer products round it, so prefill and decode agree.

#include "common.h"
#include "ops.h"
#include "quant_blocks.h"

namespace ds4mlx_ops {
namespace {

// Weight rows decoded at a time for BLAS (prefill): 64 rows of a 4096-wide matrix are 1 MiB.
constexpr int kPanelRows = 64;
// Input rows up to which a matrix with integer dot products (Q8_0, Q2_K, IQ2_XXS) takes them
// even where it may batch: for a short prefill they beat decoding panels to float32 for BLAS
// (an expert's few pairs above all), and give the bits decode gives.
constexpr int kIntegerDotRows = 32;

// A matrix [N, K] of GGUF blocks, row j at data + j * row_bytes.
struct BlockMatrix {
  const uint8_t* data;
  RowDecoder decoder;
  int n;
  BlockType type;

  const uint8_t* row(int j) const { return data + static_cast<size_t>(j) * decoder.row_bytes(); }
};

// The per-call temporaries, kept by each thread between calls (a decode step reuses the pages of
// the last one instead of faulting in fresh ones).
struct Scratch {
  std::vector<float> weights, rows, gate, up, down;

  static Scratch& local() {
    thread_local Scratch scratch;
    return scratch;
  }
};

// block_product in integers: each input row put in the weight's integer form once (``Row``),
// then every output one ``kDot``; a weight row stays in the L1 cache while the rows take their
// products.
template <typename Row, float (*kDot)(const uint8_t*, const Row&, int)>
void integer_rows_product(const BlockMatrix& w, const float* x, size_t x_stride, float* y,
                          size_t y_stride, int count) {
  thread_local std::vector<Row> rows;
  const int k = w.decoder.k();
  if (static_cast<int>(rows.size()) < count) rows.resize(count);
  for (int r = 0; r < count; r++) rows[r].quantize(x + r * x_stride, k);
  for (int j = 0; j < w.n; j++) {
    for (int r = 0; r < count; r++) y[r * y_stride + j] = kDot(w.row(j), rows[r], k);
  }
}

// y[r, j] = W_j . x[r] for ``count`` rows x [count, K] (row stride x_stride) into y (row stride
// y_stride). ``batched``: count may share BLAS GEMMs (prefill); else each output is one dot
// product. Q8_0, Q2_K and IQ2_XXS multiply the input rounded to 8 bits (as llama.cpp does) on
// every path, so prefill and decode agree.
void block_product(const BlockMatrix& w, const float* x, size_t x_stride, float* y,
                   size_t y_stride, int count, bool batched, std::vector<float>& buffer) {
  const int k = w.decoder.k();
  if (count == 0) return;
  const int integer_block = integer_dot_block(w.type);
  const bool integer_dots = integer_block > 0 && count <= kIntegerDotRows;
  if (batched && count > kTileRows && !integer_dots) {
    if (integer_block > 0) {  // the activations the integer dot products would see
      thread_local std::vector<float> rounded;
      rounded.resize(static_cast<size_t>(count) * k);
      round_rows_to_q8(x, x_stride, count, k, integer_block, rounded.data());
      x = rounded.data();
      x_stride = k;
    }
    buffer.resize(static_cast<size_t>(kPanelRows) * k);
    for (int j0 = 0; j0 < w.n; j0 += kPanelRows) {
      const int panel = std::min(kPanelRows, w.n - j0);
      for (int j = 0; j < panel; j++) w.decoder.decode(w.row(j0 + j), buffer.data() + static_cast<size_t>(j) * k);
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, count, panel, k, 1.0f, x,
                  static_cast<int>(x_stride), buffer.data(), k, 0.0f, y + j0,
                  static_cast<int>(y_stride));
    }
    return;
  }
  switch (w.type) {  // integer dot products on the blocks themselves
    case BlockType::kQ8_0:
      integer_rows_product<Q8Row, q8_0_dot>(w, x, x_stride, y, y_stride, count);
      return;
    case BlockType::kQ2_K:
      integer_rows_product<Q8KRow, q2_k_dot>(w, x, x_stride, y, y_stride, count);
      return;
    case BlockType::kIQ2_XXS:
      integer_rows_product<Q8KRow, iq2_xxs_dot>(w, x, x_stride, y, y_stride, count);
      return;
    default: break;
  }
  // Four weight rows decoded at a time, each input row read once for the four (dot4).
  buffer.resize(static_cast<size_t>(4) * k);
  const float* rows4[4] = {buffer.data(), buffer.data() + k, buffer.data() + 2 * k,
                           buffer.data() + 3 * k};
  float sums[4];
  int j = 0;
  for (; j + 4 <= w.n; j += 4) {
    for (int b = 0; b < 4; b++) w.decoder.decode(w.row(j + b), buffer.data() + static_cast<size_t>(b) * k);
    for (int r = 0; r < count; r++) {
      dot4(rows4, x + r * x_stride, k, sums);
      std::copy(sums, sums + 4, y + r * y_stride + j);
    }
  }
  for (; j < w.n; j++) {
    w.decoder.decode(w.row(j), buffer.data());
    for (int r = 0; r < count; r++) y[r * y_stride + j] = dot(buffer.data(), x + r * x_stride, k);
  }
}

// x [T, G * K] times G matrices [N, K] of blocks (w [G, N, row_bytes]; G = 1 for a plain
// matrix): group g's channels times matrix g, for the first ``rows`` rows, the rest zeros.
class BlocksLinear : public CpuPrimitive {
 public:
  BlocksLinear(mx::Stream stream, int type, int rows)
      : CpuPrimitive(stream), type_(type), rows_(rows) {}

  Task task() const override {
    return [type = type_, rows = rows_](const std::vector<mx::array>& in,
                                        const std::vector<float*>& out) {
      RowMajor x(in[0]);
      RowMajorOf<uint8_t> w(in[1]);
      const int tokens = in[0].shape(0), groups = in[1].ndim() == 3 ? in[1].shape(0) : 1;
      const int n = in[1].shape(-2), k = in[0].shape(1) / groups, real = std::min(rows, tokens);
      const size_t width = static_cast<size_t>(groups) * n;
      std::fill(out[0] + real * width, out[0] + tokens * width, 0.0f);
      const RowDecoder decoder(type, k);
      Scratch& scratch = Scratch::local();
      for (int g = 0; g < groups; g++) {
        const BlockMatrix m{w.data() + static_cast<size_t>(g) * n * decoder.row_bytes(), decoder, n,
                            static_cast<BlockType>(type)};
        block_product(m, x.data() + static_cast<size_t>(g) * k, static_cast<size_t>(groups) * k,
                      out[0] + static_cast<size_t>(g) * n, width, real, true, scratch.weights);
      }
    };
  }

  const char* name() const override { return "DS4BlocksLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const BlocksLinear&>(other);
    return type_ == o.type_ && rows_ == o.rows_;
  }

 private:
  int type_;
  int rows_;
};

// Routed SwiGLU experts on blocks (RoutedExpertsFFN's semantics, moe.cpp): for every (token t,
// slot s) pair, out[t, s] = down_e(swiglu(gate_e x[t], up_e x[t])), e = indices[t, s], the
// stacks [E, out, row_bytes] (a resident layer or a streamed slab, E its slots). The pairs of an
// expert read its blocks once; ``grouped`` lets more than kTileRows of them share BLAS GEMMs.
// Ids out of range route nowhere (zeros).
class BlocksExperts : public CpuPrimitive {
 public:
  BlocksExperts(mx::Stream stream, std::array<int, 3> types, float limit, bool grouped)
      : CpuPrimitive(stream), types_(types), limit_(limit), grouped_(grouped) {}

  Task task() const override {
    return [types = types_, limit = limit_, grouped = grouped_](
               const std::vector<mx::array>& in, const std::vector<float*>& out) {
      run(in, out[0], types, limit, grouped);
    };
  }

  const char* name() const override { return "DS4BlocksExperts"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const BlocksExperts&>(other);
    return types_ == o.types_ && limit_ == o.limit_ && grouped_ == o.grouped_;
  }

 private:
  static void run(const std::vector<mx::array>& in, float* out, std::array<int, 3> types,
                  float limit, bool grouped) {
    RowMajor x(in[0]);
    RowMajorOf<uint8_t> gate_w(in[1]), up_w(in[2]), down_w(in[3]);
    const int tokens = in[0].shape(0), dim = in[0].shape(1);
    const int experts = in[1].shape(0), ff = in[1].shape(1), slots = in[4].shape(1);
    const std::vector<int> route = int_values(in[4]);
    std::fill(out, out + static_cast<size_t>(tokens) * slots * dim, 0.0f);
    const RowDecoder gate_dec(types[0], dim), up_dec(types[1], dim), down_dec(types[2], ff);
    std::vector<std::vector<int>> pairs_of(experts);
    for (int p = 0; p < tokens * slots; p++) {
      if (route[p] >= 0 && route[p] < experts) pairs_of[route[p]].push_back(p);
    }
    Scratch& s = Scratch::local();
    for (int e = 0; e < experts; e++) {
      const auto& pairs = pairs_of[e];
      const int count = static_cast<int>(pairs.size());
      if (count == 0) continue;
      s.rows.resize(static_cast<size_t>(count) * dim);
      s.gate.resize(static_cast<size_t>(count) * ff);
      s.up.resize(static_cast<size_t>(count) * ff);
      s.down.resize(static_cast<size_t>(count) * dim);
      for (int i = 0; i < count; i++) {
        const float* src = x.data() + static_cast<size_t>(pairs[i] / slots) * dim;
        std::copy(src, src + dim, s.rows.data() + static_cast<size_t>(i) * dim);
      }
      const size_t e_at = static_cast<size_t>(e) * ff;
      const BlockMatrix gate{gate_w.data() + e_at * gate_dec.row_bytes(), gate_dec, ff,
                            static_cast<BlockType>(types[0])};
      const BlockMatrix up{up_w.data() + e_at * up_dec.row_bytes(), up_dec, ff,
                          static_cast<BlockType>(types[1])};
      const BlockMatrix down{down_w.data() + static_cast<size_t>(e) * dim * down_dec.row_bytes(),
                             down_dec, dim, static_cast<BlockType>(types[2])};
      block_product(gate, s.rows.data(), dim, s.gate.data(), ff, count, grouped, s.weights);
      block_product(up, s.rows.data(), dim, s.up.data(), ff, count, grouped, s.weights);
      for (size_t i = 0; i < s.gate.size(); i++) s.gate[i] = swiglu_clamped(s.gate[i], s.up[i], limit);
      block_product(down, s.gate.data(), ff, s.down.data(), dim, count, grouped, s.weights);
      for (int i = 0; i < count; i++) {
        std::copy(s.down.data() + static_cast<size_t>(i) * dim,
                  s.down.data() + static_cast<size_t>(i + 1) * dim,
                  out + static_cast<size_t>(pairs[i]) * dim);
      }
    }
  }

  std::array<int, 3> types_;
  float limit_;
  bool grouped_;
};

// Rows w[indices] of a matrix of blocks decoded to float32 [M, K] (an embedding lookup; the
// whole matrix for checks). Ids out of range give zeros.
class BlocksRows : public CpuPrimitive {
 public:
  BlocksRows(mx::Stream stream, int type) : CpuPrimitive(stream), type_(type) {}

  Task task() const override {
    return [type = type_](const std::vector<mx::array>& in, const std::vector<float*>& out) {
      RowMajorOf<uint8_t> w(in[0]);
      const std::vector<int> ids = int_values(in[1]);
      const int n = in[0].shape(0);
      const RowDecoder decoder(type, static_cast<int>(out_k(in[0], type)));
      const int k = decoder.k();
      for (size_t i = 0; i < ids.size(); i++) {
        float* o = out[0] + i * k;
        if (ids[i] < 0 || ids[i] >= n) {
          std::fill(o, o + k, 0.0f);
        } else {
          decoder.decode(w.data() + static_cast<size_t>(ids[i]) * decoder.row_bytes(), o);
        }
      }
    };
  }

  const char* name() const override { return "DS4BlocksRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return type_ == static_cast<const BlocksRows&>(other).type_;
  }

  static size_t out_k(const mx::array& w, int type) {
    const BlockShape shape = block_shape(type);
    return static_cast<size_t>(w.shape(-1)) / shape.bytes * shape.values;
  }

 private:
  int type_;
};

// The values a row of ``row_bytes`` holds in ``type`` (checking it is whole blocks).
int row_values(int row_bytes, int type, const std::string& op) {
  const BlockShape shape = block_shape(type);
  if (row_bytes % shape.bytes != 0) {
    throw std::invalid_argument(op + ": rows of " + std::to_string(row_bytes) +
                                " bytes are not whole blocks of GGML type " +
                                std::to_string(type));
  }
  return row_bytes / shape.bytes * shape.values;
}

mx::array as_bytes(const mx::array& w, const std::string& op) {
  if (w.dtype() != mx::uint8) throw std::invalid_argument(op + ": blocks must be uint8");
  return w;
}

}  // namespace

mx::array blocks_linear(const mx::array& x, const mx::array& w, int type, int rows) {
  auto s = mx::default_stream(mx::Device::cpu);
  const std::string op = "blocks_linear";
  if (x.ndim() != 2 || (w.ndim() != 2 && w.ndim() != 3) || rows < 0) {
    throw std::invalid_argument(op + ": expected x [T, G * K], w [N, bytes] or [G, N, bytes]");
  }
  const int groups = w.ndim() == 3 ? w.shape(0) : 1;
  const int k = row_values(w.shape(-1), type, op);
  if (x.shape(1) != groups * k) {
    throw std::invalid_argument(op + ": x has " + std::to_string(x.shape(1)) +
                                " columns, the weight takes " + std::to_string(groups * k));
  }
  return mx::array({x.shape(0), groups * w.shape(-2)}, mx::float32,
                   std::make_shared<BlocksLinear>(s, type, rows),
                   {mx::astype(x, mx::float32, s), as_bytes(w, op)});
}

mx::array blocks_experts(const mx::array& x, const mx::array& gate, const mx::array& up,
                         const mx::array& down, const std::vector<int>& types,
                         const mx::array& indices, float limit, bool grouped) {
  auto s = mx::default_stream(mx::Device::cpu);
  const std::string op = "blocks_experts";
  if (types.size() != 3 || x.ndim() != 2 || gate.ndim() != 3 || up.ndim() != 3 ||
      down.ndim() != 3 || indices.ndim() != 2 || indices.shape(0) != x.shape(0)) {
    throw std::invalid_argument(op + ": expected x [T, D], gate/up/down [E, out, bytes], three "
                                     "types and indices [T, k]");
  }
  const int dim = x.shape(1), ff = gate.shape(1);
  if (row_values(gate.shape(2), types[0], op) != dim || row_values(up.shape(2), types[1], op) != dim ||
      row_values(down.shape(2), types[2], op) != ff || up.shape(1) != ff ||
      down.shape(1) != dim || up.shape(0) != gate.shape(0) || down.shape(0) != gate.shape(0)) {
    throw std::invalid_argument(op + ": gate/up must be [E, F, D] and down [E, D, F] in values");
  }
  return mx::array({x.shape(0), indices.shape(1), dim}, mx::float32,
                   std::make_shared<BlocksExperts>(s, std::array<int, 3>{types[0], types[1], types[2]},
                                                   limit, grouped),
                   {mx::astype(x, mx::float32, s), as_bytes(gate, op), as_bytes(up, op),
                    as_bytes(down, op), mx::astype(indices, mx::int32, s)});
}

mx::array blocks_rows(const mx::array& w, int type, const mx::array& indices) {
  auto s = mx::default_stream(mx::Device::cpu);
  const std::string op = "blocks_rows";
  if (w.ndim() != 2) throw std::invalid_argument(op + ": expected w [N, bytes]");
  const int k = row_values(w.shape(1), type, op);
  mx::Shape shape = indices.shape();
  shape.push_back(k);
  return mx::array(shape, mx::float32, std::make_shared<BlocksRows>(s, type),
                   {as_bytes(w, op), mx::astype(indices, mx::int32, s)});
}

}  // namespace ds4mlx_ops
