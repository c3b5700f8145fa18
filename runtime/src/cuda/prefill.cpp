// Batched prefill (CudaEngine::prefill): a pass of up to CudaOptions::prefill_chunk tokens runs
// every layer over all of them. Each projection reads its weights once per pass: kern::gemm for
// INT4, FP8, INT8 and BF16 matrices (dense), the routed experts grouped by expert
// (kern::gemm_route sorts the router's choices; the gate | up product reads each choice's token
// row, the down product writes each result back to its token's slot, so the combine sees the
// step's layout; BF16 experts, the MTP head's, alike); products gemm does not take (F32, odd
// shapes) run as gemv with one slot per token, side by side on the one matrix. The DeltaNet
// layers run kern::gdn_prefill (all tokens of a pass in four launches, the state kept on chip
// through them), attention kern::attn_prefill (every token's k and v rows appended, then each
// token's attention in one launch); where they do not take the model's shapes the engine has no
// prefill buffers and prompts go in pairs. Everything runs on the main stream (the GEMM's limbs
// are one scratch). A full pass is captured once and replayed (tokens and positions are read on
// the device); a shorter last pass runs launch by launch.
#include <algorithm>

#include "engine_impl.h"
#include "qf/kern/gemm.h"

namespace qf::rt {

void CudaEngine::Impl::alloc_prefill() {
  const ckpt::Qwen35Config& c = m->config;
  int64_t n = o.prefill_chunk;
  const int64_t h = c.hidden_size, k = c.num_experts_per_tok, im = c.moe_intermediate_size,
                is = c.shared_expert_intermediate_size, e = c.num_experts;
  if (n < 0 || n > 4096) {
    throw Error(Errc::kUsage, "prefill_chunk must be 0 to 4096, not " + std::to_string(n));
  }
  n = std::min(n, o.max_context);  // no prompt is longer
  // Without kernels for the mixers' shapes (none of Qwen3.5's), prompts go in pairs instead.
  const bool has_attn =
      std::find(c.full_attention.begin(), c.full_attention.end(), true) != c.full_attention.end();
  const bool has_gdn =
      std::find(c.full_attention.begin(), c.full_attention.end(), false) != c.full_attention.end();
  if ((has_attn && !kern::attn_prefill_ok(attn, static_cast<int>(n))) ||
      (has_gdn && !kern::gdn_prefill_ok(gdn))) {
    n = 0;
  }
  pf.cap = static_cast<int>(n);
  if (n == 0) return;
  const auto f = [&](int64_t count) {
    return static_cast<float*>(m->alloc(static_cast<size_t>(count) * 4));
  };
  const auto i = [&](int64_t count) {
    return static_cast<int*>(m->alloc(static_cast<size_t>(count) * 4));
  };
  pf.x = f(n * h), pf.u = f(n * h), pf.mix = f(n * h), pf.gin = f(n * gin_row());
  pf.core = f(n * c.value_dim()), pf.qkvp = f(n * qkvp_row());
  pf.att = f(n * c.num_attention_heads * c.head_dim), pf.rl = f(n * (e + 1)), pf.rw = f(n * k);
  // egu: the gate | up rows before SwiGLU, where a layer's experts are not paired (the MTP
  // layer's too: prompt scoring runs its MoE; 64 MB at 122B-A10B, whose MTP experts are BF16).
  const bool unpaired =
      std::any_of(m->layers.begin(), m->layers.end(),
                  [](const cuda::DeviceLayer& l) { return !l.moe.gate_up.swiglu_pairs; }) ||
      (m->mtp && !m->mtp->layer.moe.gate_up.swiglu_pairs);
  pf.egu = unpaired ? f(n * k * 2 * im) : nullptr, pf.eh = f(n * k * im), pf.ey = f(n * k * h);
  pf.sgu = f(n * 2 * is), pf.sh = f(n * is), pf.sy = f(n * h), pf.hidden = f(n * h);
  pf.tokens = i(n), pf.pos = i(n), pf.ids = i(n * k), pf.offsets = i(e + 1);
  pf.x_rows = i(n * k), pf.y_rows = i(n * k);
  if (has_attn)
    pf.attn_scratch = f(static_cast<int64_t>(kern::attn_prefill_scratch_floats(attn, pf.cap)));
  if (has_gdn)
    pf.gdn_scratch = f(static_cast<int64_t>(kern::gdn_prefill_scratch_floats(gdn, pf.cap)));
  if (m->mtp) pf.cat = f(n * 2 * h), pf.mtp_tokens = i(n);
  cuda::check(cudaMallocHost(&pf.pinned, static_cast<size_t>(3 * n) * sizeof(int)),
              "cudaMallocHost");
  // The GEMM's limbs: the largest x any product of a pass stages.
  size_t scratch = 0;
  const auto need = [&](const kern::DeviceLinear& w, int64_t rows) {
    kern::GemmRows r;
    r.x_count = static_cast<int>(rows);
    if (w.n > 0 && kern::gemm_ok(w, false)) {
      scratch = std::max(scratch, kern::gemm_scratch_bytes(w, r));
    }
  };
  const auto need_group = [&](const cuda::RowGroup& g, int64_t rows) {
    if (g.fused.n > 0) need(g.fused, rows);
    for (const kern::DeviceLinear& p : g.parts) need(p, rows);
  };
  if (m->mtp) {  // the layer's o projection and MoE: prompt scoring's MTP rows (score.cpp)
    const cuda::DeviceLayer& t = m->mtp->layer;
    need(m->mtp->fc, n), need_group(t.qkv, n), need(t.o, n), need_group(t.moe.router, n);
    need_group(t.moe.shared_gate_up, n), need(t.moe.shared_down, n);
    need_group(t.moe.gate_up, n), need(t.moe.down, n * k);
  }
  need(m->lm_head, std::min<int64_t>(n, kScoreRows));  // prompt scoring (score.cpp)
  for (const cuda::DeviceLayer& l : m->layers) {
    need_group(l.gdn_in, n), need(l.out, n), need_group(l.qkv, n), need(l.o, n);
    need_group(l.moe.router, n), need_group(l.moe.shared_gate_up, n), need(l.moe.shared_down, n);
    need_group(l.moe.gate_up, n), need(l.moe.down, n * k);
  }
  pf.scratch = m->alloc(std::max<size_t>(scratch, 16));
}

void CudaEngine::Impl::gemm_rows(const kern::DeviceLinear& w, const float* in, size_t ldx,
                                 float* out, size_t ldy, int n) {
  if (kern::gemm_ok(w, false)) {
    kern::GemmRows r;
    r.entries = r.x_count = n;
    r.ldx = ldx, r.ldy = ldy;
    cuda::check(kern::gemm(w, in, out, r, false, pf.scratch, stream), "gemm");
    return;
  }
  cuda::check(kern::gemv(one_matrix(w), in, out, kern::GemvBatch{n, nullptr, ldx, ldy}, stream),
              "gemv");
}

void CudaEngine::Impl::gemm_rows(const cuda::RowGroup& g, const float* in, size_t ldx, float* out,
                                 size_t ldy, int n) {
  each_part(g, out,
            [&](const kern::DeviceLinear& w, float* dst) { gemm_rows(w, in, ldx, dst, ldy, n); });
}

void CudaEngine::Impl::moe_rows(const cuda::DeviceMoe& w, int n, const float* next_norm,
                                float* next_out) {
  const ckpt::Qwen35Config& c = m->config;
  const int h = static_cast<int>(c.hidden_size), k = static_cast<int>(c.num_experts_per_tok),
            im = static_cast<int>(c.moe_intermediate_size),
            is = static_cast<int>(c.shared_expert_intermediate_size),
            e = static_cast<int>(c.num_experts), entries = n * k;
  const size_t h_ = static_cast<size_t>(h), im_ = static_cast<size_t>(im);
  gemm_rows(w.shared_gate_up, pf.u, h_, pf.sgu, 2 * static_cast<size_t>(is), n);
  cuda::check(kern::swiglu(pf.sgu, pf.sgu + is, is, n, 2 * static_cast<size_t>(is), pf.sh, stream),
              "swiglu");
  gemm_rows(w.shared_down, pf.sh, static_cast<size_t>(is), pf.sy, h_, n);
  mark("shared expert", bytes(w.shared_gate_up) + kern::weight_bytes(w.shared_down));
  gemm_rows(w.router, pf.u, h_, pf.rl, static_cast<size_t>(e) + 1, n);  // and the shared gate
  cuda::check(kern::router_topk(pf.rl, e, k, pf.ids, pf.rw, stream, n, static_cast<size_t>(e) + 1),
              "router_topk");
  mark("router", bytes(w.router));
  const bool pairs = w.gate_up.swiglu_pairs;
  const bool grouped = w.gate_up.fused.n > 0 && kern::gemm_ok(w.gate_up.fused, pairs) &&
                       kern::gemm_ok(w.down, false) && e <= kern::kRouteMaxMats;
  if (grouped) {
    cuda::check(kern::gemm_route(pf.ids, entries, k, e, pf.offsets, pf.x_rows, pf.y_rows, stream),
                "gemm_route");
    kern::GemmRows gu;
    gu.entries = entries, gu.x_count = n, gu.ldx = h_, gu.ldy = pairs ? im_ : 2 * im_;
    gu.x_rows = pf.x_rows, gu.n_mats = e, gu.offsets = pf.offsets;
    cuda::check(
        kern::gemm(w.gate_up.fused, pf.u, pairs ? pf.eh : pf.egu, gu, pairs, pf.scratch, stream),
        "gemm experts gate | up");
    if (!pairs) {
      cuda::check(kern::swiglu(pf.egu, pf.egu + im, im, entries, 2 * im_, pf.eh, stream), "swiglu");
    }
    kern::GemmRows dn;
    dn.entries = dn.x_count = entries, dn.ldx = im_, dn.ldy = h_;
    dn.y_rows = pf.y_rows, dn.n_mats = e, dn.offsets = pf.offsets;
    cuda::check(kern::gemm(w.down, pf.eh, pf.ey, dn, false, pf.scratch, stream),
                "gemm experts down");
    mark("experts (INT4 MoE)", 0);
  } else {
    experts_by_slot(w, pf.u, n, pf.ids, pf.egu, pf.eh, pf.ey, false);
  }
  cuda::check(kern::moe_combine_norm(pf.ey, pf.rw, k, pf.sy, pf.rl + e, h, pf.x, next_norm,
                                     static_cast<float>(c.rms_norm_eps), next_out, stream, n,
                                     static_cast<size_t>(e) + 1),
              "moe_combine_norm");
  mark("norms and elementwise", 0);
}

void CudaEngine::Impl::launch_prefill(int n) {
  const ckpt::Qwen35Config& c = m->config;
  const int h = static_cast<int>(c.hidden_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const size_t h_ = static_cast<size_t>(h);
  mark("start", 0);  // profile_prefill: where its first interval begins
  for (int r = 0; r < n; ++r) {
    cuda::check(kern::embed(m->embed_kind, m->embed, h, pf.tokens + r, pf.x + r * h_, stream),
                "embed");
  }
  cuda::check(kern::rms_norm_1p(pf.x, m->layers[0].input_norm, h, n, eps, pf.u, stream),
              "rms_norm");
  mark("norms and elementwise", 0);
  const size_t qr = static_cast<size_t>(qkvp_row()), gr = static_cast<size_t>(gin_row());
  const size_t att_row = static_cast<size_t>(c.num_attention_heads * c.head_dim),
               vd = static_cast<size_t>(c.value_dim());
  const int64_t q_rows = c.q_proj_rows(), kv_rows = c.kv_rows(), nv = c.linear_num_value_heads;
  for (size_t l = 0; l < m->layers.size(); ++l) {
    const cuda::DeviceLayer& w = m->layers[l];
    if (w.full_attention) {
      gemm_rows(w.qkv, pf.u, h_, pf.qkvp, qr, n);
      mark("attention projections", bytes(w.qkv));
      const float* q = pf.qkvp;  // every token's k, v rows appended, then their attention
      cuda::check(kern::attn_prefill(attn, q, q + q_rows, q + q_rows + kv_rows, qr, n, w.q_norm,
                                     w.k_norm, rope, pf.pos, k_cache[l], v_cache[l], pf.att,
                                     att_row, pf.attn_scratch, stream, attn_path()),
                  "attn_prefill");
      mark("attention", 0);
      gemm_rows(w.o, pf.att, att_row, pf.mix, h_, n);
      mark("attention projections", kern::weight_bytes(w.o));
    } else {
      gemm_rows(w.gdn_in, pf.u, h_, pf.gin, gr, n);
      mark("DeltaNet projections", bytes(w.gdn_in));
      const float* zr = pf.gin + c.conv_dim();  // qkv | z | b | a; the state kept on chip
      cuda::check(kern::gdn_prefill(gdn, {w.conv, w.dt_bias, w.a_log, w.gdn_norm}, pf.gin, zr,
                                    zr + vd, zr + vd + nv, gr, n, pf.pos, {conv[l], ssm[l]},
                                    pf.core, vd, pf.gdn_scratch, stream),
                  "gdn_prefill");
      mark("DeltaNet recurrence", 0);
      gemm_rows(w.out, pf.core, vd, pf.mix, h_, n);
      mark("DeltaNet projections", kern::weight_bytes(w.out));
    }
    cuda::check(
        kern::add_parts_rms_norm_1p(pf.x, pf.mix, 1, h_, w.post_norm, h, eps, pf.u, stream, n, h_),
        "add_rms_norm");
    mark("norms and elementwise", 0);
    const bool last = l + 1 == m->layers.size();
    moe_rows(w.moe, n, last ? m->final_norm : m->layers[l + 1].input_norm, last ? pf.hidden : pf.u);
  }
}

void CudaEngine::Impl::launch_mtp_prefill(int n, bool full) {
  const ckpt::Qwen35Config& c = m->config;
  const cuda::DeviceMtp& t = *m->mtp;
  const int h = static_cast<int>(c.hidden_size);
  const size_t h_ = static_cast<size_t>(h), row = h_ * 4;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // [rms_norm(embedding of the next token) | rms_norm(hidden)] per row, as launch_mtp's cat.
  for (int r = 0; r < n; ++r) {
    cuda::check(kern::embed(m->embed_kind, m->embed, h, pf.mtp_tokens + r, pf.x + r * h_, stream),
                "embed");
  }
  cuda::check(kern::rms_norm_1p(pf.x, t.pre_fc_norm_embedding, h, n, eps, pf.mix, stream),
              "rms_norm");
  cuda::check(kern::rms_norm_1p(pf.hidden, t.pre_fc_norm_hidden, h, n, eps, pf.u, stream),
              "rms_norm");
  cuda::check(cudaMemcpy2DAsync(pf.cat, 2 * row, pf.mix, row, row, static_cast<size_t>(n),
                                cudaMemcpyDeviceToDevice, stream),
              "copy");
  cuda::check(cudaMemcpy2DAsync(pf.cat + h, 2 * row, pf.u, row, row, static_cast<size_t>(n),
                                cudaMemcpyDeviceToDevice, stream),
              "copy");
  gemm_rows(t.fc, pf.cat, 2 * h_, pf.x, h_, n);
  cuda::check(kern::rms_norm_1p(pf.x, t.layer.input_norm, h, n, eps, pf.u, stream), "rms_norm");
  mark("MTP head", kern::weight_bytes(t.fc));
  const size_t qr = static_cast<size_t>(qkvp_row());
  const size_t att_row = static_cast<size_t>(c.num_attention_heads * c.head_dim);
  const int64_t q_rows = c.q_proj_rows(), kv_rows = c.kv_rows();
  gemm_rows(t.layer.qkv, pf.u, h_, pf.qkvp, qr, n);
  const float* q = pf.qkvp;
  cuda::check(kern::attn_prefill(attn, q, q + q_rows, q + q_rows + kv_rows, qr, n, t.layer.q_norm,
                                 t.layer.k_norm, rope, pf.pos, mtp_k, mtp_v, pf.att, att_row,
                                 pf.attn_scratch, stream, attn_path()),
              "attn_prefill");
  mark("MTP head", bytes(t.layer.qkv));
  if (!full) return;
  gemm_rows(t.layer.o, pf.att, att_row, pf.mix, h_, n);
  cuda::check(kern::add_parts_rms_norm_1p(pf.x, pf.mix, 1, h_, t.layer.post_norm, h, eps, pf.u,
                                          stream, n, h_),
              "add_rms_norm");
  moe_rows(t.layer.moe, n, t.norm, pf.u);
  mark("MTP head", kern::weight_bytes(t.layer.o));
}

void CudaEngine::Impl::head_row(int r) {
  const int64_t h = m->config.hidden_size;
  gemv(m->lm_head, pf.hidden + r * h, logits, {}, "LM head");
  cuda::check(
      kern::argmax(logits, static_cast<int>(m->config.vocab_size), next, argmax_scratch, stream),
      "argmax");
  mark("argmax", 0);
}

void CudaEngine::Impl::pass_layers(const int32_t* tokens, int n, const int32_t* mtp_after,
                                   int mtp_rows, bool mtp_full) {
  settle();  // the last verify's kept tokens into the states the pass reads
  const int64_t vocab = m->config.vocab_size;
  for (int r = 0; r < n; ++r) {
    if (tokens[r] < 0 || tokens[r] >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(tokens[r]) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
  }
  before_step(position + n - 1);
  verified = 0;
  // The pinned copies are read by the stream: the previous pass must be done with them.
  cuda::check(cudaStreamSynchronize(stream), "prefill");
  std::copy(tokens, tokens + n, pf.pinned);
  for (int r = 0; r < n; ++r) pf.pinned[pf.cap + r] = static_cast<int>(position + r);
  cuda::check(cudaMemcpyAsync(pf.tokens, pf.pinned, static_cast<size_t>(n) * sizeof(int),
                              cudaMemcpyHostToDevice, stream),
              "copy");
  cuda::check(cudaMemcpyAsync(pf.pos, pf.pinned + pf.cap, static_cast<size_t>(n) * sizeof(int),
                              cudaMemcpyHostToDevice, stream),
              "copy");
  if (n == pf.cap && !marks) {
    run(prefill_graph, [&] { launch_prefill(n); });
  } else {
    launch_prefill(n);
  }
  if (mtp_rows > 0) {
    std::copy(mtp_after, mtp_after + mtp_rows, pf.pinned + 2 * pf.cap);
    cuda::check(cudaMemcpyAsync(pf.mtp_tokens, pf.pinned + 2 * pf.cap,
                                static_cast<size_t>(mtp_rows) * sizeof(int), cudaMemcpyHostToDevice,
                                stream),
                "copy");
    launch_mtp_prefill(mtp_rows, mtp_full);
  }
}

void CudaEngine::Impl::prefill_pass(const int32_t* tokens, int n, int32_t* top, float* out,
                                    const int32_t* mtp_after, int mtp_rows) {
  const int64_t vocab = m->config.vocab_size;
  pass_layers(tokens, n, mtp_after, mtp_rows);
  for (int r = top ? 0 : n - 1; r < n; ++r) {  // the last row's results stay in logits / next
    head_row(r);
    if (!top) break;
    cuda::check(cudaMemcpyAsync(pinned + 1, next, sizeof(int), cudaMemcpyDeviceToHost, stream),
                "copy");
    if (out) queue_logits(logits, 1);
    cuda::check(cudaStreamSynchronize(stream), "prefill");
    top[r] = pinned[1];
    if (out) take_logits(out + r * vocab, 1);
  }
  pass_end(n);
}

void CudaEngine::Impl::pass_end(int n) {
  const int64_t h = m->config.hidden_size;
  cuda::check(cudaMemcpyAsync(hidden, pf.hidden + (n - 1) * h, static_cast<size_t>(h) * 4,
                              cudaMemcpyDeviceToDevice, stream),
              "copy");
  // The step's token and position: step_greedy goes on from here.
  pinned[9] = static_cast<int>(position + n);
  cuda::check(cudaMemcpyAsync(pos, pinned + 9, sizeof(int), cudaMemcpyHostToDevice, stream),
              "copy");
  cuda::check(cudaMemcpyAsync(token, next, sizeof(int), cudaMemcpyDeviceToDevice, stream), "copy");
  position += n;
}

int32_t CudaEngine::prefill(std::span<const int32_t> tokens, float* logits) {
  if (tokens.empty()) throw Error(Errc::kUsage, "prefill: no tokens");
  return prefill_tokens(tokens, logits, nullptr, 0);
}

void CudaEngine::Impl::check_mtp_prefill(const char* what, size_t n_tokens) const {
  if (!m->mtp) {
    throw Error(Errc::kUnsupported, o.mtp ? "the checkpoint has no MTP head (mtp.* tensors)"
                                          : "the MTP head is not loaded (CudaOptions::mtp)");
  }
  if (n_tokens == 0) throw Error(Errc::kUsage, std::string(what) + ": no tokens");
  if (mtp_position != position) {
    throw Error(Errc::kUsage, std::string(what) + ": the MTP head is at position " +
                                  std::to_string(mtp_position) + ", the main model at " +
                                  std::to_string(position));
  }
}

int32_t CudaEngine::prefill_with_mtp(std::span<const int32_t> tokens, int32_t next, float* logits) {
  Impl& s = *impl_;
  s.check_mtp_prefill("prefill_with_mtp", tokens.size());
  const int64_t vocab = s.m->config.vocab_size;
  if (next < -1 || next >= vocab) {
    throw Error(Errc::kUsage, "prefill_with_mtp: the next token " + std::to_string(next) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  // All checked first: a pass's MTP rows embed the next pass's first token.
  for (const int32_t t : tokens) {
    if (t < 0 || t >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(t) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
  }
  // Each token's next: the one after it, `next` after the last.
  std::vector<int32_t> after(tokens.begin() + 1, tokens.end());
  after.push_back(next);
  return prefill_tokens(tokens, logits, after.data(), tokens.size() - (next < 0));
}

int32_t CudaEngine::prefill_tokens(std::span<const int32_t> tokens, float* logits,
                                   const int32_t* after, size_t entries) {
  Impl& s = *impl_;
  const size_t v = static_cast<size_t>(s.m->config.vocab_size);
  if (s.pf.cap == 0) {  // no prefill buffers: advance's pairs (the last row's logits kept)
    std::vector<float> two(logits ? 2 * v : 0);
    int32_t top[2] = {0, 0};
    size_t take = 0;
    for (size_t i = 0; i < tokens.size(); i += take) {
      take = std::min<size_t>(2, tokens.size() - i);
      const bool last = i + take == tokens.size();
      advance(tokens.subspan(i, take), top, last && logits ? two.data() : nullptr);
      for (size_t j = 0; after && j < take && i + j < entries; ++j)
        draft(static_cast<int>(j), after[i + j]);
    }
    if (logits) std::copy_n(two.begin() + static_cast<int64_t>((take - 1) * v), v, logits);
    if (after && take == 2) {  // draft(0, ...) goes on from the last token
      const size_t h = static_cast<size_t>(s.m->config.hidden_size);
      cuda::check(
          cudaMemcpyAsync(s.hidden, s.hidden + h, h * 4, cudaMemcpyDeviceToDevice, s.stream),
          "copy");
    }
    if (take == 2) {  // step_greedy goes on from the argmax (verify2 leaves the step's token)
      s.pinned[0] = top[1];
      cuda::check(cudaMemcpyAsync(s.token, s.pinned, sizeof(int), cudaMemcpyHostToDevice, s.stream),
                  "copy");
      cuda::check(cudaStreamSynchronize(s.stream), "prefill");  // the pinned word is read
    }
    return top[take - 1];
  }
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(s.pf.cap)) {
    const int n = static_cast<int>(std::min<size_t>(tokens.size() - i, s.pf.cap));
    const int rows = after ? static_cast<int>(std::min<size_t>(n, entries - i)) : 0;
    s.prefill_pass(tokens.data() + i, n, nullptr, nullptr, after ? after + i : nullptr, rows);
    s.mtp_position += rows;
  }
  if (after) s.upload_mtp_position();
  return s.last_argmax(logits);
}

void CudaEngine::Impl::upload_mtp_position() {
  pinned[10] = static_cast<int>(mtp_position);
  cuda::check(cudaMemcpyAsync(mtp_pos, pinned + 10, sizeof(int), cudaMemcpyHostToDevice, stream),
              "copy");
}

int32_t CudaEngine::Impl::last_argmax(float* out) {
  cuda::check(cudaMemcpyAsync(pinned + 1, next, sizeof(int), cudaMemcpyDeviceToHost, stream),
              "copy");
  if (out) queue_logits(logits, 1);
  cuda::check(cudaStreamSynchronize(stream), "prefill");
  if (out) take_logits(out, 1);
  return pinned[1];
}

void CudaEngine::Impl::prefill_rows(std::span<const int32_t> tokens, int32_t* top, float* out) {
  const size_t v = static_cast<size_t>(m->config.vocab_size);
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(pf.cap)) {
    const int n = static_cast<int>(std::min<size_t>(tokens.size() - i, pf.cap));
    prefill_pass(tokens.data() + i, n, top + i, out ? out + i * v : nullptr);
  }
  cuda::check(cudaStreamSynchronize(stream), "prefill");
}

}  // namespace qf::rt
