// Error metrics between a reference and an approximation (dequantized weights, logits).
#pragma once

#include <cstdint>

namespace qf::quant {

struct ErrorStats {
  int64_t n = 0;
  int64_t n_nonfinite = 0;  // elements where either side is NaN or inf (left out of the rest)
  double max_abs = 0;       // max |got - ref|
  double mean_abs = 0;
  double rmse = 0;    // sqrt(mean((got - ref)^2))
  double nmse = 0;    // sum((got - ref)^2) / sum(ref^2)   (0 when ref is all zero and equal)
  double cosine = 1;  // <ref, got> / (|ref| |got|)  (1 when both are zero)
  double snr_db = 0;  // 10 log10(sum(ref^2) / sum((got - ref)^2)); +inf when exact
};

// Accumulates in double; deterministic.
ErrorStats error_stats(const float* ref, const float* got, int64_t n);

struct TopKAgreement {
  bool top1_equal = false;  // argmax agrees (ties: lowest index wins on both sides)
  double overlap = 0;       // |topk(ref) ∩ topk(got)| / k
};

// Agreement of the k largest logits of `got` with those of `ref` (1 <= k <= n).
TopKAgreement topk_agreement(const float* ref, const float* got, int64_t n, int k);

}  // namespace qf::quant
