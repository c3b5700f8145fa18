// CPU twin of gdn.cu: the arithmetic of CpuEngine::gdn (runtime/src/cpu_engine.cpp) after the
// projections, statement for statement (float math, sums of squares in double, sequential
// column sums), so the GPU kernel is held to the engine that was proven equal to transformers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "qf/kern/gdn.h"

namespace qf::kern {
namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float silu(float x) {
  return x * sigmoid(x);
}
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}
float sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(s);
}

}  // namespace

void gdn_decode_ref(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                    const float* b, const float* a, GdnState state, float* out) {
  const int64_t conv_dim = shape.conv_dim(), kc = shape.kc, nk = shape.n_k_heads,
                nv = shape.n_v_heads, dk = shape.dk, dv = shape.dv, key_dim = nk * dk;
  std::vector<float> x(qkv, qkv + conv_dim);

  // Causal depthwise conv over the last kc pre-conv inputs (the state keeps kc - 1), then SiLU.
  for (int64_t ch = 0; ch < conv_dim; ++ch) {
    float* hist = state.conv + ch * (kc - 1);
    const float* kw = p.conv_w + ch * kc;
    float y = kw[kc - 1] * x[ch];
    for (int64_t j = 0; j < kc - 1; ++j) y += kw[j] * hist[j];
    for (int64_t j = 0; j + 1 < kc - 1; ++j) hist[j] = hist[j + 1];
    if (kc > 1) hist[kc - 2] = x[ch];
    x[ch] = silu(y);
  }
  // l2-normalized q (scaled by 1/sqrt(dk)) and k per key head.
  float* q = x.data();
  float* k = x.data() + key_dim;
  const float* v = x.data() + 2 * key_dim;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t h = 0; h < nk; ++h) {
    const float qi = 1.0f / std::sqrt(sum_squares(q + h * dk, dk) + 1e-6f);
    const float ki = 1.0f / std::sqrt(sum_squares(k + h * dk, dk) + 1e-6f);
    for (int64_t i = 0; i < dk; ++i) {
      q[h * dk + i] = q[h * dk + i] * qi * q_scale;
      k[h * dk + i] *= ki;
    }
  }
  // Gated delta rule per value head j (key head j / r): decay, predict, write, read.
  const int64_t r = nv / nk;
  std::vector<float> delta(static_cast<size_t>(dv));
  for (int64_t j = 0; j < nv; ++j) {
    const float beta = sigmoid(b[j]);
    const float g = -std::exp(p.a_log[j]) * softplus(a[j] + p.dt_bias[j]);
    const float alpha = std::exp(g);
    const float* kh = k + (j / r) * dk;
    const float* qh = q + (j / r) * dk;
    const float* vh = v + j * dv;
    float* S = state.ssm + j * dk * dv;  // [dk, dv]
    for (int64_t i = 0; i < dk * dv; ++i) S[i] *= alpha;
    std::fill(delta.begin(), delta.end(), 0.0f);
    for (int64_t d = 0; d < dk; ++d) {
      for (int64_t e = 0; e < dv; ++e) delta[e] += S[d * dv + e] * kh[d];
    }
    for (int64_t e = 0; e < dv; ++e) delta[e] = beta * (vh[e] - delta[e]);
    for (int64_t d = 0; d < dk; ++d) {
      for (int64_t e = 0; e < dv; ++e) S[d * dv + e] += kh[d] * delta[e];
    }
    float* o = out + j * dv;
    std::fill(o, o + dv, 0.0f);
    for (int64_t d = 0; d < dk; ++d) {
      for (int64_t e = 0; e < dv; ++e) o[e] += S[d * dv + e] * qh[d];
    }
    // Gated RMSNorm: plain weight, times silu(z).
    const float inv = 1.0f / std::sqrt(sum_squares(o, dv) / static_cast<float>(dv) + shape.eps);
    const float* zj = z + j * dv;
    for (int64_t e = 0; e < dv; ++e) o[e] = o[e] * inv * p.norm_w[e] * silu(zj[e]);
  }
}

}  // namespace qf::kern
