// A row's TopLogits as an engine that selects the top k itself returns them (CudaEngine::step_top),
// made on the host from the whole row: top_k_ids' order and the normalizer in double. Header-only:
// for the tests of the generation loops (qf_rt).
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

#include "qf/rt/logits.h"
#include "qf/rt/sampler.h"

namespace qf::test {

inline void top_logits_of(std::span<const float> row, int k, rt::TopLogits& out) {
  rt::top_k_ids(row, k, out.ids);
  out.logits.clear();
  for (const int32_t id : out.ids) out.logits.push_back(row[id]);
  const double m = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (const float x : row) sum += std::exp(x - m);
  out.log_z = m + std::log(sum);
}

}  // namespace qf::test
