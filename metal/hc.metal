// Helpers shared by ds4mlx's mHC kernels (metal/sinkhorn.metal, metal/hc_site.metal): the header
// of each. Semantics and order of operations are the twins' (ds4mlx/kernels/twins.py).

inline float ds4_sigmoid(float value) {
  return 1.0f / (1.0f + metal::exp(-value));
}

// Sinkhorn-normalises one token's mixing logits m [HC * HC] (laid out [src, dst]) in place:
// softmax over dst, + eps, one column normalisation, then ITERS - 1 rounds of row and column
// normalisation, every sum padded by eps (llama.cpp's order, and twins.sinkhorn's).
template <uint HC, uint ITERS>
inline void ds4_sinkhorn(thread float* m, float epsilon) {
  for (uint i = 0; i < HC; ++i) {
    float top = m[i * HC];
    for (uint j = 1; j < HC; ++j) {
      top = metal::max(top, m[i * HC + j]);
    }
    float total = 0.0f;
    for (uint j = 0; j < HC; ++j) {
      m[i * HC + j] = metal::exp(m[i * HC + j] - top);
      total += m[i * HC + j];
    }
    for (uint j = 0; j < HC; ++j) {
      m[i * HC + j] = m[i * HC + j] / total + epsilon;
    }
  }
  for (uint round = 0; round < ITERS; ++round) {
    if (round > 0) {
      for (uint i = 0; i < HC; ++i) {  // rows: over dst
        float total = 0.0f;
        for (uint j = 0; j < HC; ++j) {
          total += m[i * HC + j];
        }
        for (uint j = 0; j < HC; ++j) {
          m[i * HC + j] = m[i * HC + j] / (total + epsilon);
        }
      }
    }
    for (uint j = 0; j < HC; ++j) {  // columns: over src
      float total = 0.0f;
      for (uint i = 0; i < HC; ++i) {
        total += m[i * HC + j];
      }
      for (uint i = 0; i < HC; ++i) {
        m[i * HC + j] = m[i * HC + j] / (total + epsilon);
      }
    }
  }
}
