// Header of ds4mlx's MoE routing kernel (metal/moe_route.metal): an expert's router
// probability from its logit, as models.moe.gate_probs computes it for gating function FUNC.
// FUNC and E come from the kernel's template; `top` and `denominator` are the row's maximum
// logit and softmax sum (used by FUNC 1 only).

// log(1 + y) accurate for small y (Metal has no log1p): the rounding error of 1 + y cancels.
inline float ds4_log1p(float y) {
  const float u = 1.0f + y;
  return u == 1.0f ? y : metal::log(u) * y / (u - 1.0f);
}

template <int FUNC>
inline float ds4_gate_prob(float logit, float top, float denominator) {
  if (FUNC == 1) {
    return metal::exp(logit - top) / denominator;
  }
  if (FUNC == 2) {
    return 1.0f / (1.0f + metal::exp(-logit));
  }
  if (FUNC == 4) {  // sqrt(softplus), ggml's softplus: x above 20, else log(1 + exp(x))
    return metal::sqrt(logit > 20.0f ? logit : ds4_log1p(metal::exp(logit)));
  }
  return logit;  // FUNC 3: the logits themselves (softmax over the chosen ones later)
}
