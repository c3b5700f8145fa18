#include "qf/rt/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "qf/error.h"
#include "qf/quant/formats.h"
#include "qf/rt/mtp_vocab.h"

namespace qf::rt {
namespace {

// Work per thread-pool task, in multiply-adds.
constexpr int64_t kGrainMacs = 131072;

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float silu(float x) {
  return x * sigmoid(x);
}
// Threshold 20, as torch. log1p in double, rounded once: glibc's log1pf rounds some inputs
// differently on aarch64 than on x86-64, its log1p agrees (every 64th float in [-104, 20]).
float softplus(float x) {
  return x > 20.0f ? x : static_cast<float>(std::log1p(static_cast<double>(std::exp(x))));
}

float sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(s);
}

// Zero-centred RMSNorm: x / rms(x) * (1 + w). `out` may be `x`.
void rms_norm_1p(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float inv = 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * (1.0f + w[i]);
}

// NeoX rotate-half RoPE on the first `rot` dims of one head: pairs (i, i + rot/2).
void rope(float* x, const float* cos, const float* sin, int64_t rot) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

}  // namespace

struct CpuEngine::Scratch {
  std::vector<float> x, u, mix;
  std::vector<float> qkv, z, b, a, core;       // GDN
  std::vector<float> q, k, v, att, cos, sin;   // attention
  std::vector<float> router, eg, eu, eo, acc;  // MoE
  std::vector<float> emb, cat, t1;             // MTP
};

CpuEngine::CpuEngine(const Model& model, int threads, KvCacheType kv)
    : model_(model), kv_(kv), pool_(threads), s_(std::make_unique<Scratch>()) {
  reset();
}

CpuEngine::~CpuEngine() = default;

void CpuEngine::reset() {
  const ckpt::Qwen35Config& c = model_.config();
  const size_t n = static_cast<size_t>(c.num_layers());
  state_ = SequenceState();
  saved_.clear();
  state_.conv.resize(n);
  state_.ssm.resize(n);
  state_.k.resize(n);
  state_.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (c.full_attention[i]) continue;
    state_.conv[i].assign(static_cast<size_t>(c.conv_dim() * (c.linear_conv_kernel_dim - 1)), 0.0f);
    state_.ssm[i].assign(static_cast<size_t>(c.linear_num_value_heads * c.linear_key_head_dim *
                                             c.linear_value_head_dim),
                         0.0f);
  }
}

void CpuEngine::save(int slot) {
  if (slot < 0 || slot >= kMaxSaves) {
    throw Error(Errc::kUsage, "CpuEngine::save: slot " + std::to_string(slot) + " of " +
                                  std::to_string(kMaxSaves));
  }
  if (saved_.size() <= static_cast<size_t>(slot)) saved_.resize(static_cast<size_t>(slot) + 1);
  Saved& s = saved_[static_cast<size_t>(slot)];
  s.conv = state_.conv;
  s.ssm = state_.ssm;
  s.position = state_.position;
}

void CpuEngine::restore(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= saved_.size() ||
      saved_[static_cast<size_t>(slot)].position < 0) {
    throw Error(Errc::kUsage, "CpuEngine::restore: nothing saved in slot " + std::to_string(slot));
  }
  const Saved& s = saved_[static_cast<size_t>(slot)];
  const ckpt::Qwen35Config& c = model_.config();
  state_.conv = s.conv;
  state_.ssm = s.ssm;
  state_.position = s.position;
  const size_t rows = static_cast<size_t>(s.position * c.num_key_value_heads * c.head_dim);
  for (size_t i = 0; i < state_.k.size(); ++i) {
    if (state_.k[i].size() > rows) state_.k[i].resize(rows);
    if (state_.v[i].size() > rows) state_.v[i].resize(rows);
  }
}

void CpuEngine::mtp_rewind(int64_t n) {
  if (n < 0 || n > state_.mtp_position) {
    throw Error(Errc::kUsage, "CpuEngine::mtp_rewind " + std::to_string(n) + " from MTP position " +
                                  std::to_string(state_.mtp_position));
  }
  const ckpt::Qwen35Config& c = model_.config();
  state_.mtp_position -= n;
  const size_t rows = static_cast<size_t>(state_.mtp_position * c.num_key_value_heads * c.head_dim);
  if (state_.mtp_k.size() > rows) state_.mtp_k.resize(rows);
  if (state_.mtp_v.size() > rows) state_.mtp_v.resize(rows);
}

void CpuEngine::matvec(const Linear& w, const float* x, float* y, int64_t rows) {
  // At least 128k multiply-adds per task: waking a worker costs more than a smaller share.
  const int64_t grain = std::max<int64_t>(1, kGrainMacs / std::max<int64_t>(1, w.k));
  pool_.run(rows < 0 ? w.n : rows, grain,
            [&](int64_t r0, int64_t r1) { w.matvec_rows(x, y + r0, r0, r1); });
}

void CpuEngine::attention(const AttentionWeights& w, std::vector<float>& kc, std::vector<float>& vc,
                          int64_t pos, const float* u, float* out) {
  const ckpt::Qwen35Config& c = model_.config();
  Scratch& s = *s_;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  s.q.resize(static_cast<size_t>(2 * nq * hd));
  s.k.resize(static_cast<size_t>(nkv * hd));
  s.v.resize(static_cast<size_t>(nkv * hd));
  matvec(w.q, u, s.q.data());
  matvec(w.k, u, s.k.data());
  matvec(w.v, u, s.v.data());

  // Rotary angles for this position, computed in f32 as transformers does.
  const int64_t rot = static_cast<int64_t>(static_cast<double>(hd) * c.partial_rotary_factor);
  s.cos.resize(static_cast<size_t>(rot / 2));
  s.sin.resize(static_cast<size_t>(rot / 2));
  for (int64_t i = 0; i < rot / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rot);
    const float inv_freq = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
    const float angle = static_cast<float>(pos) * inv_freq;
    s.cos[i] = std::cos(angle);
    s.sin[i] = std::sin(angle);
  }
  // q_proj is per head [query (hd) | gate (hd)]; q/k get the zero-centred norm, then RoPE.
  for (int64_t h = 0; h < nq; ++h) {
    float* qh = s.q.data() + h * 2 * hd;
    rms_norm_1p(qh, w.q_norm.data(), hd, eps, qh);
    rope(qh, s.cos.data(), s.sin.data(), rot);
  }
  for (int64_t h = 0; h < nkv; ++h) {
    float* kh = s.k.data() + h * hd;
    rms_norm_1p(kh, w.k_norm.data(), hd, eps, kh);
    rope(kh, s.cos.data(), s.sin.data(), rot);
  }
  if (kv_ == KvCacheType::kBf16) {  // the rows as the cache holds them, used from here on
    for (float& e : s.k) e = quant::round_to_bf16(e);
    for (float& e : s.v) e = quant::round_to_bf16(e);
  } else if (kv_ == KvCacheType::kFp8) {
    for (float& e : s.k) e = quant::round_to_e4m3fn_sat(e);
    for (float& e : s.v) e = quant::round_to_e4m3fn_sat(e);
  }
  kc.insert(kc.end(), s.k.begin(), s.k.end());
  vc.insert(vc.end(), s.v.begin(), s.v.end());
  const int64_t t_len = static_cast<int64_t>(kc.size()) / (nkv * hd);

  // Causal softmax attention over the cache (GQA), then the sigmoid output gate.
  s.att.assign(static_cast<size_t>(nq * hd), 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = nq / nkv;
  pool_.run(nq, std::max<int64_t>(1, kGrainMacs / (2 * t_len * hd)), [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(static_cast<size_t>(t_len));
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = s.q.data() + h * 2 * hd;
      const int64_t g = h / group;
      float top = -INFINITY;
      for (int64_t t = 0; t < t_len; ++t) {
        const float* kt = kc.data() + (t * nkv + g) * hd;
        float d = 0;
        for (int64_t i = 0; i < hd; ++i) d += qh[i] * kt[i];
        scores[t] = d * scale;
        top = std::max(top, scores[t]);
      }
      float sum = 0;
      for (int64_t t = 0; t < t_len; ++t) sum += scores[t] = std::exp(scores[t] - top);
      float* o = s.att.data() + h * hd;
      for (int64_t t = 0; t < t_len; ++t) {
        const float p = scores[t] / sum;
        const float* vt = vc.data() + (t * nkv + g) * hd;
        for (int64_t i = 0; i < hd; ++i) o[i] += p * vt[i];
      }
      const float* gate = qh + hd;
      for (int64_t i = 0; i < hd; ++i) o[i] *= sigmoid(gate[i]);
    }
  });
  matvec(w.o, s.att.data(), out);
}

void CpuEngine::gdn(const GdnWeights& w, size_t index, const float* u, float* out) {
  const ckpt::Qwen35Config& c = model_.config();
  Scratch& s = *s_;
  const int64_t conv_dim = c.conv_dim(), kc = c.linear_conv_kernel_dim, nk = c.linear_num_key_heads,
                nv = c.linear_num_value_heads, dk = c.linear_key_head_dim,
                dv = c.linear_value_head_dim, key_dim = c.key_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  s.qkv.resize(static_cast<size_t>(conv_dim));
  s.z.resize(static_cast<size_t>(c.value_dim()));
  s.b.resize(static_cast<size_t>(nv));
  s.a.resize(static_cast<size_t>(nv));
  matvec(w.in_qkv, u, s.qkv.data());
  matvec(w.in_z, u, s.z.data());
  matvec(w.in_b, u, s.b.data());
  matvec(w.in_a, u, s.a.data());

  // Causal depthwise conv over the last Kc pre-conv inputs (the state keeps Kc - 1), then SiLU.
  std::vector<float>& st = state_.conv[index];
  for (int64_t ch = 0; ch < conv_dim; ++ch) {
    float* hist = st.data() + ch * (kc - 1);
    const float* kw = w.conv.data() + ch * kc;
    float y = kw[kc - 1] * s.qkv[ch];
    for (int64_t j = 0; j < kc - 1; ++j) y += kw[j] * hist[j];
    for (int64_t j = 0; j + 1 < kc - 1; ++j) hist[j] = hist[j + 1];
    if (kc > 1) hist[kc - 2] = s.qkv[ch];
    s.qkv[ch] = silu(y);
  }
  // l2-normalized q (scaled by 1/sqrt(dk)) and k per key head.
  float* q = s.qkv.data();
  float* k = s.qkv.data() + key_dim;
  const float* v = s.qkv.data() + 2 * key_dim;
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
  s.core.resize(static_cast<size_t>(nv * dv));
  const int64_t r = nv / nk;
  std::vector<float>& ssm = state_.ssm[index];
  pool_.run(nv, std::max<int64_t>(1, kGrainMacs / (4 * dk * dv)), [&](int64_t j0, int64_t j1) {
    std::vector<float> delta(static_cast<size_t>(dv));
    for (int64_t j = j0; j < j1; ++j) {
      const float beta = sigmoid(s.b[j]);
      const float g = -std::exp(w.a_log[j]) * softplus(s.a[j] + w.dt_bias[j]);
      const float alpha = std::exp(g);
      const float* kh = k + (j / r) * dk;
      const float* qh = q + (j / r) * dk;
      const float* vh = v + j * dv;
      float* S = ssm.data() + j * dk * dv;  // [dk, dv]
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= alpha;
      std::fill(delta.begin(), delta.end(), 0.0f);
      for (int64_t d = 0; d < dk; ++d) {
        for (int64_t e = 0; e < dv; ++e) delta[e] += S[d * dv + e] * kh[d];
      }
      for (int64_t e = 0; e < dv; ++e) delta[e] = beta * (vh[e] - delta[e]);
      for (int64_t d = 0; d < dk; ++d) {
        for (int64_t e = 0; e < dv; ++e) S[d * dv + e] += kh[d] * delta[e];
      }
      float* o = s.core.data() + j * dv;
      std::fill(o, o + dv, 0.0f);
      for (int64_t d = 0; d < dk; ++d) {
        for (int64_t e = 0; e < dv; ++e) o[e] += S[d * dv + e] * qh[d];
      }
      // Gated RMSNorm: plain weight, times silu(z).
      const float inv = 1.0f / std::sqrt(sum_squares(o, dv) / static_cast<float>(dv) + eps);
      const float* zj = s.z.data() + j * dv;
      for (int64_t e = 0; e < dv; ++e) o[e] = o[e] * inv * w.norm[e] * silu(zj[e]);
    }
  });
  matvec(w.out, s.core.data(), out);
}

void CpuEngine::moe(const MoeWeights& w, const float* u, float* out) {
  const ckpt::Qwen35Config& c = model_.config();
  Scratch& s = *s_;
  const int64_t h = c.hidden_size, ne = c.num_experts, top_k = c.num_experts_per_tok;
  // Router: softmax over all experts, top-k, renormalize.
  s.router.resize(static_cast<size_t>(ne));
  matvec(w.router, u, s.router.data());
  const float top = *std::max_element(s.router.begin(), s.router.end());
  float sum = 0;
  for (float& p : s.router) sum += p = std::exp(p - top);
  for (float& p : s.router) p /= sum;
  std::vector<int64_t> order(static_cast<size_t>(ne));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t a, int64_t b) {
    return s.router[a] > s.router[b] || (s.router[a] == s.router[b] && a < b);
  });
  float picked = 0;
  for (int64_t i = 0; i < top_k; ++i) picked += s.router[order[i]];

  s.acc.assign(static_cast<size_t>(h), 0.0f);
  s.eo.resize(static_cast<size_t>(h));
  auto swiglu = [&](const Linear& gate, const Linear& up, const Linear& down) {
    s.eg.resize(static_cast<size_t>(gate.n));
    s.eu.resize(static_cast<size_t>(up.n));
    matvec(gate, u, s.eg.data());
    matvec(up, u, s.eu.data());
    for (size_t i = 0; i < s.eg.size(); ++i) s.eg[i] = silu(s.eg[i]) * s.eu[i];
    matvec(down, s.eg.data(), s.eo.data());
  };
  for (int64_t i = 0; i < top_k; ++i) {
    const int64_t e = order[i];
    const float weight = s.router[e] / picked;
    swiglu(w.gate[e], w.up[e], w.down[e]);
    for (int64_t j = 0; j < h; ++j) s.acc[j] += weight * s.eo[j];
  }
  // Shared expert, scaled by its sigmoid gate.
  swiglu(w.shared_gate, w.shared_up, w.shared_down);
  float g = 0;
  matvec(w.shared_expert_gate, u, &g);
  const float sg = sigmoid(g);
  for (int64_t j = 0; j < h; ++j) out[j] = s.acc[j] + sg * s.eo[j];
}

void CpuEngine::layer(const LayerWeights& w, size_t index, float* x) {
  const ckpt::Qwen35Config& c = model_.config();
  Scratch& s = *s_;
  const int64_t h = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  s.u.resize(static_cast<size_t>(h));
  s.mix.resize(static_cast<size_t>(h));
  rms_norm_1p(x, w.input_norm.data(), h, eps, s.u.data());
  if (index == SIZE_MAX) {  // the MTP layer
    attention(w.attn, state_.mtp_k, state_.mtp_v, state_.mtp_position, s.u.data(), s.mix.data());
  } else if (w.full_attention) {
    attention(w.attn, state_.k[index], state_.v[index], state_.position, s.u.data(), s.mix.data());
  } else {
    gdn(w.gdn, index, s.u.data(), s.mix.data());
  }
  for (int64_t i = 0; i < h; ++i) x[i] += s.mix[i];
  rms_norm_1p(x, w.post_norm.data(), h, eps, s.u.data());
  moe(w.moe, s.u.data(), s.mix.data());
  for (int64_t i = 0; i < h; ++i) x[i] += s.mix[i];
}

void CpuEngine::step(int32_t token, float* logits) {
  const ckpt::Qwen35Config& c = model_.config();
  if (token < 0 || token >= c.vocab_size) {
    throw Error(Errc::kUsage, "token id " + std::to_string(token) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                  ")");
  }
  Scratch& s = *s_;
  const int64_t h = c.hidden_size;
  s.x.resize(static_cast<size_t>(h));
  model_.embed(token, s.x.data());
  const std::vector<LayerWeights>& layers = model_.layers();
  for (size_t i = 0; i < layers.size(); ++i) layer(layers[i], i, s.x.data());
  hidden_.resize(static_cast<size_t>(h));
  rms_norm_1p(s.x.data(), model_.final_norm().data(), h, static_cast<float>(c.rms_norm_eps),
              hidden_.data());
  ++state_.position;
  if (logits) matvec(model_.lm_head(), hidden_.data(), logits);
}

void CpuEngine::mtp_step(int32_t next_token, const float* hidden, float* logits) {
  const ckpt::Qwen35Config& c = model_.config();
  if (!model_.mtp()) {
    throw Error(Errc::kUnsupported, model_.dir().string() + " has no MTP head (mtp.* tensors)");
  }
  if (next_token < 0 || next_token >= c.vocab_size) {
    throw Error(Errc::kUsage, "token id " + std::to_string(next_token) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                  ")");
  }
  const MtpWeights& m = *model_.mtp();
  Scratch& s = *s_;
  const int64_t h = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // [norm(embedding of the next token) | norm(hidden)] -> fc -> one attention + MoE layer.
  s.emb.resize(static_cast<size_t>(h));
  s.cat.resize(static_cast<size_t>(2 * h));
  model_.embed(next_token, s.emb.data());
  rms_norm_1p(s.emb.data(), m.pre_fc_norm_embedding.data(), h, eps, s.cat.data());
  rms_norm_1p(hidden, m.pre_fc_norm_hidden.data(), h, eps, s.cat.data() + h);
  s.t1.resize(static_cast<size_t>(h));
  matvec(m.fc, s.cat.data(), s.t1.data());
  layer(m.layer, SIZE_MAX, s.t1.data());
  mtp_hidden_.resize(static_cast<size_t>(h));
  rms_norm_1p(s.t1.data(), m.norm.data(), h, eps, mtp_hidden_.data());
  ++state_.mtp_position;
  if (!logits) return;
  const int64_t rows = mtp_vocab_ > 0 ? mtp_vocab_ : c.vocab_size;
  matvec(model_.lm_head(), mtp_hidden_.data(), logits, rows);
  std::fill(logits + rows, logits + c.vocab_size, -std::numeric_limits<float>::infinity());
}

void CpuEngine::set_mtp_vocab(int64_t n) {
  const int64_t vocab = model_.config().vocab_size;
  check_mtp_vocab(n, vocab);
  mtp_vocab_ = n == vocab ? 0 : n;
}

}  // namespace qf::rt
