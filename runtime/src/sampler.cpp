#include "qf/rt/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "qf/error.h"

namespace qf::rt {

Sampler::Sampler(const SamplingOptions& options) : o_(options), rng_(options.seed) {
  if (!(o_.temperature >= 0.0f) || !std::isfinite(o_.temperature)) {
    throw Error(Errc::kUsage,
                "temperature must be a finite number >= 0, got " + std::to_string(o_.temperature));
  }
  if (!(o_.top_p > 0.0f && o_.top_p <= 1.0f)) {
    throw Error(Errc::kUsage, "top-p must be in (0, 1], got " + std::to_string(o_.top_p));
  }
  if (o_.top_k < 0)
    throw Error(Errc::kUsage, "top-k must be >= 0, got " + std::to_string(o_.top_k));
  if (!(o_.min_p >= 0.0f && o_.min_p <= 1.0f))
    throw Error(Errc::kUsage, "min-p must be in [0, 1], got " + std::to_string(o_.min_p));
}

namespace {

// Top-k sets up to this size come from one scan of the logits rather than a partial sort of
// every id (248320 on Qwen3.5: ~600 us for k = 20 on an H100 machine's host).
constexpr int64_t kScanTopK = 256;
constexpr int64_t kBlock = 32;

// The k (>= 1) largest logits' ids, by decreasing logit and then increasing id (the partial
// sort's order), into ids[0, k). A block of logits is looked at one by one only where one of
// them beats the k-th largest so far, which after the first blocks is rare.
void top_k_by_scan(std::span<const float> l, int64_t k, std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(l.size());
  ids.resize(static_cast<size_t>(k));
  std::iota(ids.begin(), ids.end(), 0);
  const auto before = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::sort(ids.begin(), ids.end(), before);
  // Later ids rank below equal logits already held, so only a larger logit enters.
  const auto offer = [&](int32_t i) {
    if (!(l[i] > l[ids.back()])) return;
    auto at = std::upper_bound(ids.begin(), ids.end() - 1, i, before);
    std::move_backward(at, ids.end() - 1, ids.end());
    *at = i;
  };
  int64_t i = k;
  for (; i < n && i % kBlock != 0; ++i) offer(static_cast<int32_t>(i));
  for (; i + kBlock <= n; i += kBlock) {
    // A count rather than a max: no dependency chain, so the compiler vectorizes it.
    const float cut = l[ids.back()];
    int above = 0;
    for (int64_t j = 0; j < kBlock; ++j) above += l[i + j] > cut;
    if (above > 0) {
      for (int64_t j = 0; j < kBlock; ++j) offer(static_cast<int32_t>(i + j));
    }
  }
  for (; i < n; ++i) offer(static_cast<int32_t>(i));
}

}  // namespace

// By a scan for small k, else by a partial sort of every id.
void top_k_ids(std::span<const float> l, int64_t k, std::vector<int32_t>& ids) {
  if (k <= 0) return ids.clear();
  if (k <= kScanTopK) return top_k_by_scan(l, k, ids);
  ids.resize(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  ids.resize(static_cast<size_t>(k));
}

double TokenDist::prob(int32_t id) const {
  // Every id in id order (or `id` where its index would be): no search.
  if (id >= 0 && static_cast<size_t>(id) < ids.size() && ids[id] == id) return weights[id] / total;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return weights[i] / total;
  }
  return 0.0;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (o_.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  distribution(logits, dist_);
  return draw(dist_);
}

void Sampler::distribution(std::span<const float> logits, TokenDist& out) {
  if (o_.temperature == 0.0f) {
    throw Error(Errc::kUsage, "a sampling distribution needs a temperature > 0");
  }
  const int64_t n = static_cast<int64_t>(logits.size());
  int64_t k = o_.top_k > 0 ? std::min<int64_t>(o_.top_k, n) : n;
  float top = 0;  // the largest logit, once known
  // Min-p keeps the ids with exp((l - max) / T) >= min_p, i.e. l >= max + T ln(min_p): like
  // top-k, a prefix of the ids by decreasing logit, so the two make the shorter prefix.
  if (o_.min_p > 0.0f) {
    top = *std::max_element(logits.begin(), logits.end());
    const double cut = top + static_cast<double>(o_.temperature) * std::log(double{o_.min_p});
    int64_t above = 0;
    for (const float l : logits) above += static_cast<double>(l) >= cut;
    k = std::min(k, above);
  }
  std::vector<float>& w = out.weights;
  // Softmax at the temperature over the top k: weights exp((l - max) / T), summed in double.
  // When all n survive top-k, weights and sum are taken in id order, with no sort.
  int64_t sorted = 0;  // ids_[0, sorted) are the largest logits, in order
  if (k < n) {
    top_k_ids(logits, k, ids_);
    sorted = k;
    top = logits[ids_[0]];
  } else if (o_.min_p == 0.0f) {
    top = *std::max_element(logits.begin(), logits.end());
  }
  const float inv_t = 1.0f / o_.temperature;
  const auto weight = [&](int32_t id) { return std::exp((logits[id] - top) * inv_t); };
  double sum = 0;
  if (k < n) {
    for (int64_t i = 0; i < k; ++i) sum += weight(ids_[i]);
  } else {
    w.resize(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) sum += w[id] = weight(id);
  }
  // Nucleus: the smallest prefix of the top k (by probability) whose mass reaches top_p, found
  // in sorted prefixes of growing length, as it is usually much smaller than the vocabulary.
  int64_t keep = k;
  if (o_.top_p < 1.0f) {
    double mass = 0;
    int64_t i = 0;
    for (int64_t m = std::min(k, kScanTopK);; m = std::min(k, 8 * m)) {
      if (sorted < m) {
        top_k_ids(logits, m, ids_);
        sorted = m;
      }
      for (; i < m; ++i) {
        mass += weight(ids_[i]) / sum;
        if (mass >= o_.top_p) break;
      }
      if (i < m) {
        keep = i + 1;
        break;
      }
      if (m == k) break;
    }
  }
  out.total = 0;
  if (keep == n && sorted < n) {  // every id, in id order: the weights are in place
    out.ids.resize(static_cast<size_t>(n));
    std::iota(out.ids.begin(), out.ids.end(), 0);
    out.total = sum;
    return;
  }
  out.ids.assign(ids_.begin(), ids_.begin() + keep);
  w.resize(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) out.total += w[i] = weight(out.ids[i]);
}

int32_t Sampler::draw(const TokenDist& d) {
  const double u = std::uniform_real_distribution<double>(0.0, d.total)(rng_);
  double acc = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    acc += d.weights[i];
    if (u < acc) return d.ids[i];
  }
  return d.ids.back();
}

DraftChoice Sampler::resolve_draft(const TokenDist& p, const TokenDist& q, int32_t draft) {
  const double pd = p.prob(draft), qd = q.prob(draft);
  // u < p/q, written without the division; q(draft) > 0 for a draft drawn from q.
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  if (u * qd < pd) return {draft, true};
  // The residual over p's survivors (outside them p is 0, and so is the residual). q's
  // probabilities are looked up through a dense table indexed by id, cleared after use.
  int32_t hi = 0;
  for (const int32_t id : q.ids) hi = std::max(hi, id);
  if (q_dense_.size() <= static_cast<size_t>(hi)) q_dense_.resize(static_cast<size_t>(hi) + 1);
  for (size_t i = 0; i < q.ids.size(); ++i) q_dense_[q.ids[i]] = q.weights[i] / q.total;
  const auto q_of = [&](int32_t id) {
    return static_cast<size_t>(id) < q_dense_.size() ? q_dense_[id] : 0.0;
  };
  TokenDist& r = dist_;
  r.ids.clear();
  r.weights.clear();
  r.total = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double excess = p.weights[i] / p.total - q_of(p.ids[i]);
    if (excess > 0) {
      r.ids.push_back(p.ids[i]);
      r.weights.push_back(static_cast<float>(excess));
      r.total += static_cast<float>(excess);
    }
  }
  for (const int32_t id : q.ids) q_dense_[id] = 0;
  // Rounding can leave no excess where p and q agree (then a rejection had probability ~0):
  // draw from p itself.
  return {r.ids.empty() ? draw(p) : draw(r), false};
}

}  // namespace qf::rt
