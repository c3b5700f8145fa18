// The decode step's launches and the MTP head's, captured into their CUDA graphs
// (engine_impl.h): embedding, per layer the mixer (Gated DeltaNet or gated attention) and the
// MoE block, the LM head and argmax.
#include "engine_impl.h"

namespace qf::rt {

void CudaEngine::Impl::out_proj_add_norm(const kern::DeviceLinear& w, const float* in,
                                         const float* norm, const char* family) {
  const int h = static_cast<int>(m->config.hidden_size);
  const float eps = static_cast<float>(m->config.rms_norm_eps);
  kern::GemvBatch split;
  split.k_splits = o.out_parts;
  split.split_stride = static_cast<size_t>(h);
  if (o.out_parts > 1 && w.k >= 2 * w.n && kern::gemv_k_split_ok(w, split)) {
    if (on("out-proj")) gemv(w, in, mix, split, family);
    if (on("out-norm")) {
      cuda::check(kern::add_parts_rms_norm_1p(x, mix, o.out_parts, split.split_stride, norm, h, eps,
                                              u, stream),
                  "add_rms_norm");
    }
  } else {
    if (on("out-proj")) gemv(w, in, mix, {}, family);
    if (on("out-norm")) {
      cuda::check(kern::add_rms_norm_1p(x, mix, norm, h, eps, u, stream), "add_rms_norm");
    }
  }
  mark("norms and elementwise", 0);
}

void CudaEngine::Impl::gemv(const kern::DeviceLinear& w, const float* in, float* out,
                            const kern::GemvBatch& batch, const char* family, cudaStream_t on) {
  cuda::check(kern::gemv(w, in, out, batch, on ? on : stream), std::string("gemv ") + family);
  mark(family, kern::weight_bytes(w) * static_cast<uint64_t>(batch.n_slots));
}

void CudaEngine::Impl::gemv(const cuda::RowGroup& g, const float* in, float* out,
                            const kern::GemvBatch& batch, const char* family, cudaStream_t on) {
  each_part(g, out,
            [&](const kern::DeviceLinear& w, float* dst) { gemv(w, in, dst, batch, family, on); });
}

std::pair<kern::SharedProduct, kern::SharedProduct> CudaEngine::Impl::shared_slots(
    const cuda::DeviceMoe& w) const {
  const ckpt::Qwen35Config& c = m->config;
  const size_t k = c.num_experts_per_tok, im = c.moe_intermediate_size, h = c.hidden_size;
  if (!o.shared_in_experts || !on("shared-expert") || !w.gate_up.swiglu_pairs ||
      w.shared_gate_up.fused.n == 0) {
    return {};
  }
  const auto [pairs, down] = expert_batches();
  const kern::SharedProduct gu{w.shared_gate_up.fused, u, eh + k * im};
  // Its sigmoid gate (the router GEMV's last logit) folded into the down product's epilogue.
  const kern::SharedProduct dn{w.shared_down, eh + k * im, ey + k * h, sgl};
  if (!kern::gemv_moe_ok(w.gate_up.fused, pairs, true, gu) ||
      !kern::gemv_moe_ok(w.down, down, false, dn)) {
    return {};
  }
  return {gu, dn};
}

std::pair<kern::GemvBatch, kern::GemvBatch> CudaEngine::Impl::expert_batches() const {
  const ckpt::Qwen35Config& c = m->config;
  const int k = static_cast<int>(c.num_experts_per_tok);
  const size_t im = c.moe_intermediate_size, h = c.hidden_size;
  kern::GemvBatch down{k, ids, im, h};
  down.ids_early = true;  // written by router_topk, before the gate | up launch
  return {kern::GemvBatch{k, ids, 0, im}, down};
}

void CudaEngine::Impl::moe(const cuda::DeviceMoe& w, const float* next_norm, float* next_out) {
  const ckpt::Qwen35Config& c = m->config;
  const int h = static_cast<int>(c.hidden_size), k = static_cast<int>(c.num_experts_per_tok),
            im = static_cast<int>(c.moe_intermediate_size),
            is = static_cast<int>(c.shared_expert_intermediate_size);
  const auto [pairs, down_batch] = expert_batches();
  const auto [sh_gate_up, sh_down] = shared_slots(w);
  const bool slots = sh_gate_up.y != nullptr;  // the shared expert rides in the routed launches
  // Else its own launches; the profile (marks) times families one after another: no branch then.
  const bool branch = !slots && o.parallel_shared && !marks;
  const cudaStream_t sh_stream = branch ? side : stream;
  if (branch) {
    cuda::check(cudaEventRecord(fork, stream), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(side, fork), "cudaStreamWaitEvent");
  }
  if (!slots && on("shared-expert")) {
    gemv(w.shared_gate_up, u, sgu, {}, "shared expert", sh_stream);
    if (on("shared-swiglu")) {
      cuda::check(kern::swiglu(sgu, sgu + is, is, 1, is, sh, sh_stream), "swiglu");
    }
    gemv(w.shared_down, sh, sy, {}, "shared expert", sh_stream);
  }
  if (branch) cuda::check(cudaEventRecord(join, side), "cudaEventRecord");
  if (on("router")) gemv(w.router, u, rl, {}, "router");  // and the shared expert's gate logit
  if (on("router-topk")) {
    cuda::check(
        kern::router_topk(rlogits, static_cast<int>(c.num_experts), k, ids, rweights, stream),
        "router_topk");
  }
  mark("router", 0);
  const uint64_t gate_up_bytes = kern::weight_bytes(w.gate_up.fused) * static_cast<uint64_t>(k);
  if (slots) {
    if (on("experts-gate-up")) {
      cuda::check(kern::gemv_moe(w.gate_up.fused, u, eh, pairs, true, sh_gate_up, stream),
                  "gemv_moe gate | up");
    }
    mark("experts (INT4 MoE)", gate_up_bytes + kern::weight_bytes(sh_gate_up.w));
  } else if (w.gate_up.swiglu_pairs) {  // straight to eh = silu(gate) * up
    if (on("experts-gate-up")) {
      cuda::check(kern::gemv_swiglu(w.gate_up.fused, u, eh, pairs, stream), "gemv_swiglu experts");
    }
    mark("experts (INT4 MoE)", gate_up_bytes);
  } else if (on("experts-gate-up")) {
    gemv(w.gate_up, u, egu, {k, ids, 0, 2 * static_cast<size_t>(im)}, "experts (INT4 MoE)");
    cuda::check(kern::swiglu(egu, egu + im, im, k, 2 * static_cast<size_t>(im), eh, stream),
                "swiglu");
  }
  if (slots) {
    if (on("experts-down")) {
      cuda::check(kern::gemv_moe(w.down, eh, ey, down_batch, false, sh_down, stream),
                  "gemv_moe down");
    }
    mark("experts (INT4 MoE)",
         kern::weight_bytes(w.down) * static_cast<uint64_t>(k) + kern::weight_bytes(sh_down.w));
  } else if (on("experts-down")) {
    gemv(w.down, eh, ey, down_batch, "experts (INT4 MoE)");
  }
  if (branch) cuda::check(cudaStreamWaitEvent(stream, join), "cudaStreamWaitEvent");
  if (on("moe-combine")) {
    cuda::check(
        kern::moe_combine_norm(ey, rweights, k, slots ? sh_down.y : sy, slots ? nullptr : sgl, h, x,
                               next_norm, static_cast<float>(c.rms_norm_eps), next_out, stream),
        "moe_combine_norm");
  }
  mark("norms and elementwise", 0);
}

void CudaEngine::Impl::attention_mixer(const cuda::DeviceLayer& w, void* kc, void* vc,
                                       const int* at, int64_t rows_before) {
  gemv(w.qkv, u, qkvp, {}, "attention projections");
  if (on("attention")) {
    cuda::check(kern::attn_decode(attn, qproj, kp, vp, w.q_norm, w.k_norm, rope, at, nullptr, kc,
                                  vc, att, attn_scratch, stream, attn_decode_path()),
                "attn_decode");
  }
  mark("attention", 2ull * (rows_before + 1) * m->config.kv_rows() * kern::attn_kv_bytes(attn));
  out_proj_add_norm(w.o, att, w.post_norm, "attention projections");
}

void CudaEngine::Impl::mtp_layer_input() {
  const ckpt::Qwen35Config& c = m->config;
  const cuda::DeviceMtp& t = *m->mtp;
  const int h = static_cast<int>(c.hidden_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  cuda::check(kern::embed(m->embed_kind, m->embed, h, mtp_token, x, stream), "embed");
  cuda::check(kern::rms_norm_1p(x, t.pre_fc_norm_embedding, h, 1, eps, cat, stream), "rms_norm");
  cuda::check(kern::rms_norm_1p(mtp_in, t.pre_fc_norm_hidden, h, 1, eps, cat + h, stream),
              "rms_norm");
  gemv(t.fc, cat, x, {}, "MTP fc");
  cuda::check(kern::rms_norm_1p(x, t.layer.input_norm, h, 1, eps, u, stream), "rms_norm");
}

void CudaEngine::Impl::launch_mtp() {
  const cuda::DeviceMtp& t = *m->mtp;
  mtp_layer_input();
  attention_mixer(t.layer, mtp_k, mtp_v, mtp_pos, mtp_position);
  moe(t.layer.moe, t.norm, mtp_hidden);
  const kern::DeviceLinear head = mtp_lm_head();  // the rows of the draft vocabulary
  gemv(head, mtp_hidden, mtp_logits, {}, "LM head");
  cuda::check(kern::argmax(mtp_logits, head.n, mtp_next, argmax_scratch, stream), "argmax");
  cuda::check(kern::advance(mtp_next, mtp_token, mtp_pos, stream), "advance");
}

void CudaEngine::Impl::kv_rows(const cuda::RowGroup& g) {
  const ckpt::Qwen35Config& c = m->config;
  if (g.fused.n == 0) {
    gemv(g.parts[1], u, kp, {}, "attention projections");
    gemv(g.parts[2], u, vp, {}, "attention projections");
    return;
  }
  const kern::DeviceLinear& f = g.fused;
  if (f.kind != kern::WeightKind::kBf16 && f.kind != kern::WeightKind::kF32) {
    gemv(g, u, qkvp, {}, "attention projections");
    return;
  }
  kern::DeviceLinear kv = f;  // rows q_rows .. of a row-major matrix: k, then v (kp, vp)
  const size_t elem = f.kind == kern::WeightKind::kBf16 ? 2 : 4;
  kv.w = static_cast<const char*>(f.w) + static_cast<size_t>(c.q_proj_rows()) * f.k * elem;
  kv.n = static_cast<int>(2 * c.kv_rows());
  gemv(kv, u, kp, {}, "attention projections");
}

void CudaEngine::Impl::launch_mtp_entry() {
  const cuda::DeviceMtp& t = *m->mtp;
  mtp_layer_input();
  kv_rows(t.layer.qkv);
  cuda::check(
      kern::attn_decode(attn, qproj, kp, vp, t.layer.q_norm, t.layer.k_norm, rope, mtp_pos, nullptr,
                        mtp_k, mtp_v, att, attn_scratch, stream, attn_decode_path()),
      "attn_decode");
  cuda::check(kern::advance(mtp_token, mtp_token, mtp_pos, stream), "advance");
}

void CudaEngine::Impl::launch_step() {
  const ckpt::Qwen35Config& c = m->config;
  const int h = static_cast<int>(c.hidden_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  cuda::check(kern::embed(m->embed_kind, m->embed, h, token, x, stream), "embed");
  cuda::check(kern::rms_norm_1p(x, m->layers[0].input_norm, h, 1, eps, u, stream), "rms_norm");
  mark("norms and elementwise", static_cast<uint64_t>(h) * 2);
  for (size_t l = 0; l < m->layers.size(); ++l) {
    const cuda::DeviceLayer& w = m->layers[l];  // u = input_norm(x) already
    if (w.full_attention) {
      attention_mixer(w, k_cache[l], v_cache[l], pos, position);
    } else {
      if (on("gdn-in-proj")) gemv(w.gdn_in, u, gin, {}, "DeltaNet projections");
      if (on("gdn-mixer")) {
        cuda::check(kern::gdn_decode(gdn, {w.conv, w.dt_bias, w.a_log, w.gdn_norm}, qkv, z, b, a,
                                     pos, {conv[l], ssm[l]}, core, stream),
                    "gdn_decode");
      }
      mark("DeltaNet recurrence",
           2ull * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4);
      out_proj_add_norm(w.out, core, w.post_norm, "DeltaNet projections");
    }
    const bool last = l + 1 == m->layers.size();
    moe(w.moe, last ? m->final_norm : m->layers[l + 1].input_norm, last ? hidden : u);
  }
  // gemv + argmax: kern::lm_head (logits and argmax in one launch) measured slower here (H200,
  // 122B synthetic, context 1024: 2934 against 2825 us per step; 35B 1681 against 1633).
  gemv(m->lm_head, hidden, logits, {}, "LM head");
  cuda::check(kern::argmax(logits, static_cast<int>(c.vocab_size), next, argmax_scratch, stream),
              "argmax");
  cuda::check(kern::advance(next, token, pos, stream), "advance");
  mark("argmax", 0);
}

}  // namespace qf::rt
