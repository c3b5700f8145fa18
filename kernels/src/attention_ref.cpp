// CPU twin of attention.cu: the arithmetic of CpuEngine::attention (runtime/src/cpu_engine.cpp)
// after the projections, statement for statement (f32 rotary table from powf/cosf/sinf, sums of
// squares in double, two-pass softmax with the global max, sequential sums over the context).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "qf/kern/attention.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

float sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(s);
}

// Zero-centred RMSNorm x / rms(x) * (1 + w), then NeoX rotate-half on the first `rot` dims.
void norm_rope(const float* x, const float* w, int64_t hd, float eps, const float* cos,
               const float* sin, int64_t rot, float* out) {
  const float inv = 1.0f / std::sqrt(sum_squares(x, hd) / static_cast<float>(hd) + eps);
  for (int64_t i = 0; i < hd; ++i) out[i] = x[i] * inv * (1.0f + w[i]);
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = out[i], b = out[i + half];
    out[i] = a * cos[i] - b * sin[i];
    out[i + half] = b * cos[i] + a * sin[i];
  }
}

}  // namespace

void attn_prepare_ref(const AttnShape& shape, const float* q_proj, const float* k_proj,
                      const float* v_proj, const float* q_norm_w, const float* k_norm_w, int pos,
                      float* q, float* k_cache, float* v_cache) {
  const int64_t nq = shape.n_q_heads, nkv = shape.n_kv_heads, hd = shape.head_dim,
                rot = shape.rot_dim;
  std::vector<float> cos(static_cast<size_t>(rot / 2)), sin(static_cast<size_t>(rot / 2));
  for (int64_t i = 0; i < rot / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rot);
    const float inv_freq = 1.0f / std::pow(shape.theta, exponent);
    const float angle = static_cast<float>(pos) * inv_freq;
    cos[static_cast<size_t>(i)] = std::cos(angle);
    sin[static_cast<size_t>(i)] = std::sin(angle);
  }
  for (int64_t h = 0; h < nq; ++h) {
    norm_rope(q_proj + h * 2 * hd, q_norm_w, hd, shape.eps, cos.data(), sin.data(), rot,
              q + h * hd);
  }
  const int64_t row = static_cast<int64_t>(pos) * nkv * hd;
  for (int64_t h = 0; h < nkv; ++h) {
    norm_rope(k_proj + h * hd, k_norm_w, hd, shape.eps, cos.data(), sin.data(), rot,
              k_cache + row + h * hd);
  }
  std::copy(v_proj, v_proj + nkv * hd, v_cache + row);
  if (shape.kv == KvType::kBf16) {
    for (int64_t i = row; i < row + nkv * hd; ++i) {
      k_cache[i] = quant::round_to_bf16(k_cache[i]);
      v_cache[i] = quant::round_to_bf16(v_cache[i]);
    }
  } else if (shape.kv == KvType::kFp8) {
    for (int64_t i = row; i < row + nkv * hd; ++i) {
      k_cache[i] = quant::round_to_e4m3fn_sat(k_cache[i]);
      v_cache[i] = quant::round_to_e4m3fn_sat(v_cache[i]);
    }
  }
}

void attn_decode_ref(const AttnShape& shape, const float* q, const float* q_proj,
                     const float* k_cache, const float* v_cache, int pos, float* out) {
  const int64_t nq = shape.n_q_heads, nkv = shape.n_kv_heads, hd = shape.head_dim;
  const int64_t t_len = static_cast<int64_t>(pos) + 1, group = nq / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> scores(static_cast<size_t>(t_len));
  for (int64_t h = 0; h < nq; ++h) {
    const float* qh = q + h * hd;
    const int64_t g = h / group;
    float top = -INFINITY;
    for (int64_t t = 0; t < t_len; ++t) {
      const float* kt = k_cache + (t * nkv + g) * hd;
      float d = 0;
      for (int64_t i = 0; i < hd; ++i) d += qh[i] * kt[i];
      scores[static_cast<size_t>(t)] = d * scale;
      top = std::max(top, scores[static_cast<size_t>(t)]);
    }
    float sum = 0;
    for (float& s : scores) sum += s = std::exp(s - top);
    float* o = out + h * hd;
    std::fill(o, o + hd, 0.0f);
    for (int64_t t = 0; t < t_len; ++t) {
      const float p = scores[static_cast<size_t>(t)] / sum;
      const float* vt = v_cache + (t * nkv + g) * hd;
      for (int64_t i = 0; i < hd; ++i) o[i] += p * vt[i];
    }
    const float* gate = q_proj + h * 2 * hd + hd;
    for (int64_t i = 0; i < hd; ++i) o[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  }
}

}  // namespace qf::kern
