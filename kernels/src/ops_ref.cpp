#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "qf/kern/ops.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
}  // namespace

void embed_ref(FloatKind kind, const void* table, int h, int token, float* out) {
  const size_t row = static_cast<size_t>(token) * h;
  for (int i = 0; i < h; ++i) {
    out[i] = kind == FloatKind::kF32
                 ? static_cast<const float*>(table)[row + i]
                 : quant::bf16_to_f32(static_cast<const uint16_t*>(table)[row + i]);
  }
}

void rms_norm_1p_ref(const float* x, const float* w, int n, int rows, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * n;
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss) / static_cast<float>(n) + eps);
    for (int i = 0; i < n; ++i) out[static_cast<size_t>(r) * n + i] = xr[i] * inv * (1.0f + w[i]);
  }
}

void swiglu_ref(const float* gate, const float* up, int n, int rows, size_t stride, float* out) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < n; ++c) {
      const float g = gate[r * stride + c];
      out[static_cast<size_t>(r) * n + c] = g * sigmoid(g) * up[r * stride + c];
    }
  }
}

void router_topk_ref(const float* logits, int e, int k, int* ids, float* weights) {
  const float top = *std::max_element(logits, logits + e);
  std::vector<float> p(static_cast<size_t>(e));
  double sum = 0;
  for (int i = 0; i < e; ++i) sum += p[i] = std::exp(logits[i] - top);
  for (float& v : p) v = static_cast<float>(v / sum);
  std::vector<int> order(static_cast<size_t>(e));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  float picked = 0;
  for (int j = 0; j < k; ++j) picked += p[order[j]];
  for (int j = 0; j < k; ++j) {
    ids[j] = order[j];
    weights[j] = p[order[j]] / picked;
  }
}

void moe_combine_ref(const float* y, const float* weights, int k, const float* shared,
                     float shared_gate, int h, float* x) {
  const float sg = sigmoid(shared_gate);
  for (int i = 0; i < h; ++i) {
    float acc = 0;
    for (int j = 0; j < k; ++j) acc += weights[j] * y[static_cast<size_t>(j) * h + i];
    x[i] += acc + sg * shared[i];
  }
}

int argmax_ref(const float* logits, int n) {
  return static_cast<int>(std::max_element(logits, logits + n) - logits);
}

}  // namespace qf::kern
