// Speculative decoding's verify pass (CudaEngine::verify): two or three tokens at vpos[0],
// vpos[0] + 1, ... in one graph each (engine_impl.h). All tokens' routed experts, residual
// norms, router top-k and MoE combine run in one launch each; every other product runs as a
// slot a token of the one matrix (side by side, so the later reads of a weight mostly hit L2:
// faster than one weight stream for both, branch x-rows). The DeltaNet kernel takes every row
// in one launch (kern::gdn_decode_tokens: the state read once and kept in registers; with the
// MTP head it stays as before the rows, their updates deferred until the kept ones are known,
// so rejecting copies nothing; the conv ring keeps every row's history), and so does
// attention (kern::attn_decode_rows: the rows appended, then the decode's kernel over its
// splits for every row, then the combine).
#include "engine_impl.h"

namespace qf::rt {

void CudaEngine::Impl::gemv_rows(int rows, const kern::DeviceLinear& w, const float* in,
                                 size_t in_stride, float* out, size_t out_stride,
                                 const char* family, cudaStream_t on, int k_splits) {
  const kern::DeviceLinear one = one_matrix(w);  // every slot reads matrix 0
  kern::GemvBatch batch{rows, nullptr, in_stride, out_stride};
  batch.k_splits = k_splits;
  batch.split_stride = k_splits > 1 ? static_cast<size_t>(m->config.hidden_size) : 0;
  gemv(one, in, out, batch, family, on);
}

void CudaEngine::Impl::gemv_rows(int rows, const cuda::RowGroup& g, const float* in,
                                 size_t in_stride, float* out, size_t out_stride,
                                 const char* family, cudaStream_t on) {
  each_part(g, out, [&](const kern::DeviceLinear& w, float* dst) {
    gemv_rows(rows, w, in, in_stride, dst, out_stride, family, on);
  });
}

void CudaEngine::Impl::out_proj_add_norm_rows(int rows, const kern::DeviceLinear& w,
                                              const float* in, size_t in_stride,
                                              const float* norm) {
  const int h = static_cast<int>(m->config.hidden_size);
  const float eps = static_cast<float>(m->config.rms_norm_eps);
  kern::GemvBatch split;
  split.k_splits = o.out_parts;
  const size_t row = static_cast<size_t>(o.out_parts) * h;
  const bool parts = o.out_parts > 1 && w.k >= 2 * w.n && kern::gemv_k_split_ok(w, split);
  gemv_rows(rows, w, in, in_stride, mix, row, "projections", nullptr, parts ? o.out_parts : 1);
  cuda::check(kern::add_parts_rms_norm_1p(x, mix, parts ? o.out_parts : 1, h, norm, h, eps, u,
                                          stream, rows, row),
              "add_rms_norm");
}

void CudaEngine::Impl::experts_by_slot(const cuda::DeviceMoe& w, const float* in, int rows,
                                       const int* ids_in, float* gu_out, float* h_out, float* y_out,
                                       bool ids_early) {
  const ckpt::Qwen35Config& c = m->config;
  const int k = static_cast<int>(c.num_experts_per_tok), slots = rows * k,
            im = static_cast<int>(c.moe_intermediate_size);
  const size_t h = static_cast<size_t>(c.hidden_size), im_ = static_cast<size_t>(im);
  kern::GemvBatch gu{slots, ids_in, h, im_};
  gu.slots_per_x = k;  // slots r k .. r k + k - 1 on row r's input
  if (w.gate_up.swiglu_pairs) {
    cuda::check(kern::gemv_swiglu(w.gate_up.fused, in, h_out, gu, stream), "gemv_swiglu experts");
  } else {
    gu.y_stride = 2 * im_;
    gemv(w.gate_up, in, gu_out, gu, "experts (INT4 MoE)");
    cuda::check(kern::swiglu(gu_out, gu_out + im, im, slots, 2 * im_, h_out, stream), "swiglu");
  }
  kern::GemvBatch down{slots, ids_in, im_, h};
  down.ids_early = ids_early;
  gemv(w.down, h_out, y_out, down, "experts (INT4 MoE)");
}

void CudaEngine::Impl::moe_verify(int rows, const cuda::DeviceMoe& w, const float* next_norm,
                                  float* next_out) {
  const ckpt::Qwen35Config& c = m->config;
  const int h = static_cast<int>(c.hidden_size), k = static_cast<int>(c.num_experts_per_tok),
            is = static_cast<int>(c.shared_expert_intermediate_size),
            e = static_cast<int>(c.num_experts);
  const bool branch = o.parallel_shared;
  const cudaStream_t sh_stream = branch ? side : stream;
  if (branch) {
    cuda::check(cudaEventRecord(fork, stream), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(side, fork), "cudaStreamWaitEvent");
  }
  gemv_rows(rows, w.shared_gate_up, u, h, sgu, 2 * is, "shared expert", sh_stream);
  cuda::check(kern::swiglu(sgu, sgu + is, is, rows, 2 * static_cast<size_t>(is), sh, sh_stream),
              "swiglu");
  gemv_rows(rows, w.shared_down, sh, is, sy, h, "shared expert", sh_stream);
  if (branch) cuda::check(cudaEventRecord(join, side), "cudaEventRecord");
  gemv_rows(rows, w.router, u, h, rl, e + 1, "router");  // and the shared expert's gate logit
  cuda::check(kern::router_topk(rl, e, k, ids, rweights, stream, rows, static_cast<size_t>(e) + 1),
              "router_topk");
  // Every row's experts in one launch each (H100, 122B: a two-token pass 5327-5329 -> 4914-4936
  // us against a launch per row); the down product's ids were written two launches back.
  experts_by_slot(w, u, rows, ids, egu, eh, ey, true);
  if (branch) cuda::check(cudaStreamWaitEvent(stream, join), "cudaStreamWaitEvent");
  cuda::check(kern::moe_combine_norm(ey, rweights, k, sy, rl + e, h, x, next_norm,
                                     static_cast<float>(c.rms_norm_eps), next_out, stream, rows,
                                     static_cast<size_t>(e) + 1),
              "moe_combine_norm");
}

void CudaEngine::Impl::launch_verify(int rows) {
  const ckpt::Qwen35Config& c = m->config;
  const int h = static_cast<int>(c.hidden_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int r = 0; r < rows; ++r) {
    cuda::check(kern::embed(m->embed_kind, m->embed, h, vtoken + r, x + r * h, stream), "embed");
  }
  cuda::check(kern::rms_norm_1p(x, m->layers[0].input_norm, h, rows, eps, u, stream), "rms_norm");
  const size_t att_row = static_cast<size_t>(c.num_attention_heads * c.head_dim);
  for (size_t l = 0; l < m->layers.size(); ++l) {
    const cuda::DeviceLayer& w = m->layers[l];
    if (w.full_attention) {
      const int64_t qr = qkvp_row();
      gemv_rows(rows, w.qkv, u, h, qkvp, qr, "attention projections");
      cuda::check(kern::attn_decode_rows(attn, qproj, kp, vp, static_cast<size_t>(qr), rows,
                                         w.q_norm, w.k_norm, rope, vpos, k_cache[l], v_cache[l],
                                         att, att_row, attn_scratch, stream, attn_decode_path()),
                  "attn_decode_rows");
      out_proj_add_norm_rows(rows, w.o, att, att_row, w.post_norm);
    } else {
      const int64_t gr = gin_row();
      gemv_rows(rows, w.gdn_in, u, h, gin, gr, "DeltaNet projections");
      // Every row in one launch, the state read once; with the MTP head the kept tokens of the
      // last verify folded in first and this one's updates deferred (engine_impl.h: replay),
      // without it (prefill's pairs, never rejected) the state written after the last row.
      const kern::GdnReplay deferred{replay[l], fold_word, replay[l] != nullptr};
      cuda::check(
          kern::gdn_decode_tokens(gdn, {w.conv, w.dt_bias, w.a_log, w.gdn_norm}, qkv, z, b, a,
                                  static_cast<size_t>(gr), rows, vpos, {conv[l], ssm[l]}, deferred,
                                  core, static_cast<size_t>(c.value_dim()), stream),
          "gdn_decode_tokens");
      out_proj_add_norm_rows(rows, w.out, core, static_cast<size_t>(c.value_dim()), w.post_norm);
    }
    const bool last = l + 1 == m->layers.size();
    moe_verify(rows, w.moe, last ? m->final_norm : m->layers[l + 1].input_norm, last ? hidden : u);
  }
  gemv_rows(rows, m->lm_head, hidden, h, logits, static_cast<size_t>(c.vocab_size), "LM head");
  for (int r = 0; r < rows; ++r) {
    cuda::check(kern::argmax(logits + r * c.vocab_size, static_cast<int>(c.vocab_size), vnext + r,
                             argmax_scratch, stream),
                "argmax");
  }
}

}  // namespace qf::rt
