#include "qf/rt/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include "device_model.h"
#include "qf/error.h"
#include "qf/kern/attention.h"
#include "qf/kern/gdn.h"

namespace qf::rt {
namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw Error(Errc::kIo, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

// Records an event after each kernel family when profiling; does nothing otherwise.
struct Marks {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;
  std::vector<std::pair<std::string, uint64_t>> names;  // family and bytes, per interval
  void mark(const char* name, uint64_t bytes) {
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate");
    check(cudaEventRecord(e, stream), "cudaEventRecord");
    events.push_back(e);
    names.emplace_back(name, bytes);
  }
};

}  // namespace

struct CudaEngine::Impl {
  std::unique_ptr<cuda::DeviceModel> m;
  CudaOptions o;
  CudaLoadStats stats;
  cudaStream_t stream = nullptr;
  // The shared expert runs beside the router and routed experts (a branch of the graph): its
  // three short launches are latency-bound and hide behind the routed experts' loads.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaGraphExec_t graph = nullptr, mtp_graph = nullptr;
  kern::GdnShape gdn;
  kern::AttnShape attn;
  std::vector<float*> conv, ssm, k_cache, v_cache;  // per layer
  // Outputs of row groups are contiguous: gin = qkv | z | b | a, qkvp = q | k | v,
  // rl = router logits | shared gate logit, egu = [k, gate | up] (unused where the
  // experts are paired: gemv_swiglu writes eh directly), sgu = shared gate | up.
  float *x, *u, *mix, *gin, *qkv, *z, *b, *a, *core, *qkvp, *qproj, *kp, *vp, *att, *rl, *rlogits,
      *sgl, *rweights, *egu, *eh, *ey, *sgu, *sh, *sy, *hidden, *logits, *attn_scratch, *rope;
  int *ids, *token, *next, *pos, *argmax_scratch;
  // The MTP head's (where it is loaded): its layer's KV cache, the hidden state it takes, the
  // two norms side by side (fc's input), its normed output and logits; its token in (then its
  // argmax, for a chained draft) and position.
  float *mtp_k = nullptr, *mtp_v = nullptr, *mtp_in = nullptr, *cat = nullptr,
        *mtp_hidden = nullptr, *mtp_logits = nullptr;
  int *mtp_token = nullptr, *mtp_next = nullptr, *mtp_pos = nullptr;
  int* pinned = nullptr;  // host: the token in, the argmax out; the MTP head's the same; the
                          // verify's two tokens, two argmaxes and two positions
  // The two-token verify (speculative decoding): its tokens, positions and argmaxes, a word that
  // its memset nodes write (a full dependency between two launches, pdl.cuh), and each DeltaNet
  // layer's state after the first token, for a rejected second one.
  int *vtoken = nullptr, *vpos = nullptr, *vnext = nullptr, *fence_word = nullptr;
  std::vector<float*> ssm_saved;
  cudaGraphExec_t verify_graph = nullptr;
  int64_t position = 0, mtp_position = 0;
  Marks* marks = nullptr;

  explicit Impl(std::unique_ptr<cuda::DeviceModel> model, const CudaOptions& options)
      : m(std::move(model)), o(options) {
    if (o.out_parts < 1 || o.out_parts > kern::kMaxNormParts) {
      throw Error(Errc::kUsage, "out_parts must be 1 to " + std::to_string(kern::kMaxNormParts) +
                                    ", not " + std::to_string(o.out_parts));
    }
    for (const std::string& name : o.skip) {
      if (std::find_if(std::begin(kSkippableLaunches), std::end(kSkippableLaunches),
                       [&](const char* n) { return name == n; }) == std::end(kSkippableLaunches)) {
        std::string all;
        for (const char* n : kSkippableLaunches) all += std::string(all.empty() ? "" : ", ") + n;
        throw Error(Errc::kUsage, "no launch named '" + name + "' to skip; one of: " + all);
      }
    }
    const ckpt::Qwen35Config& c = m->config;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaMallocHost(&pinned, 10 * sizeof(int)), "cudaMallocHost");
    gdn = {static_cast<int>(c.linear_num_key_heads),   static_cast<int>(c.linear_num_value_heads),
           static_cast<int>(c.linear_key_head_dim),    static_cast<int>(c.linear_value_head_dim),
           static_cast<int>(c.linear_conv_kernel_dim), static_cast<float>(c.rms_norm_eps)};
    attn.n_q_heads = static_cast<int>(c.num_attention_heads);
    attn.n_kv_heads = static_cast<int>(c.num_key_value_heads);
    attn.head_dim = static_cast<int>(c.head_dim);
    attn.rot_dim = static_cast<int>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
    attn.theta = static_cast<float>(c.rope_theta);
    attn.eps = static_cast<float>(c.rms_norm_eps);
    attn.max_len = static_cast<int>(o.max_context);
    const auto f = [&](int64_t n) {
      return static_cast<float*>(m->alloc(static_cast<size_t>(n) * 4));
    };
    const auto i = [&](int64_t n) {
      return static_cast<int*>(m->alloc(static_cast<size_t>(n) * 4));
    };
    const int64_t h = c.hidden_size, k = c.num_experts_per_tok, im = c.moe_intermediate_size,
                  is = c.shared_expert_intermediate_size;
    for (int64_t l = 0; l < c.num_layers(); ++l) {
      const bool full = c.full_attention[l];
      conv.push_back(full ? nullptr
                          : f(static_cast<int64_t>(kern::gdn_conv_state_floats(gdn)) + 1));
      ssm.push_back(
          full ? nullptr
               : f(c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim));
      k_cache.push_back(full ? f(o.max_context * c.kv_rows()) : nullptr);
      v_cache.push_back(full ? f(o.max_context * c.kv_rows()) : nullptr);
    }
    // Per-token buffers hold two rows (the verify's; a step uses the first).
    const int64_t nv = c.linear_num_value_heads;
    x = f(2 * h), u = f(2 * h), mix = f(2 * o.out_parts * h), core = f(2 * c.value_dim());
    gin = f(2 * gin_row());
    qkv = gin, z = qkv + c.conv_dim(), b = z + c.value_dim(), a = b + nv;
    qkvp = f(2 * qkvp_row());
    qproj = qkvp, kp = qproj + c.q_proj_rows(), vp = kp + c.kv_rows();
    att = f(2 * c.num_attention_heads * c.head_dim);
    rl = f(2 * (c.num_experts + 1)), rlogits = rl, sgl = rl + c.num_experts, rweights = f(2 * k);
    // eh and ey hold a ninth slot: the shared expert's, where it runs in the experts' launches;
    // or the verify's 2k slots.
    egu = f(2 * k * 2 * im), eh = f(2 * k * im + is), ey = f((2 * k + 1) * h);
    sgu = f(2 * 2 * is), sh = f(2 * is), sy = f(2 * h), hidden = f(2 * h);
    logits = f(2 * c.vocab_size);
    attn_scratch = f(static_cast<int64_t>(kern::attn_scratch_floats(attn)) + 1);
    rope = f(static_cast<int64_t>(kern::attn_rope_floats(attn)) + 1);
    check(kern::attn_rope_table(attn, rope, stream), "attn_rope_table");
    ids = i(2 * k), token = i(1), next = i(1), pos = i(1);
    vtoken = i(2), vpos = i(2), vnext = i(2), fence_word = i(1);
    std::vector<int> distinct(static_cast<size_t>(k));  // what --skip router-topk leaves there
    std::iota(distinct.begin(), distinct.end(), 0);
    check(cudaMemcpy(ids, distinct.data(), distinct.size() * sizeof(int), cudaMemcpyHostToDevice),
          "cudaMemcpy");
    argmax_scratch = i(kern::argmax_scratch_ints(static_cast<int>(c.vocab_size)));
    for (float* state : ssm) ssm_saved.push_back(state ? f(ssm_floats()) : nullptr);
    if (m->mtp) {
      mtp_k = f(o.max_context * c.kv_rows()), mtp_v = f(o.max_context * c.kv_rows());
      mtp_in = f(h), cat = f(2 * h), mtp_hidden = f(h), mtp_logits = f(c.vocab_size);
      mtp_token = i(1), mtp_next = i(1), mtp_pos = i(1);
    }
    stats.device_bytes = m->device_bytes;
    stats.host_bytes = m->host_bytes_read;
    stats.load_seconds = m->load_seconds;
    stats.weight_bytes = step_weight_bytes();
    stats.mtp_weight_bytes = mtp_weight_bytes();
    stats.shared_in_experts = std::all_of(m->layers.begin(), m->layers.end(), [&](const auto& l) {
      return shared_slots(l.moe).first.y != nullptr;
    });
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
    stats.device_name = prop.name;
    reset();
  }

  ~Impl() {
    if (graph) cudaGraphExecDestroy(graph);
    if (mtp_graph) cudaGraphExecDestroy(mtp_graph);
    if (verify_graph) cudaGraphExecDestroy(verify_graph);
    if (pinned) cudaFreeHost(pinned);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (side) cudaStreamDestroy(side);
    if (stream) cudaStreamDestroy(stream);
  }

  int64_t gin_row() const {  // qkv | z | b | a
    const ckpt::Qwen35Config& c = m->config;
    return c.conv_dim() + c.value_dim() + 2 * c.linear_num_value_heads;
  }
  int64_t qkvp_row() const { return m->config.q_proj_rows() + 2 * m->config.kv_rows(); }
  int64_t ssm_floats() const {
    const ckpt::Qwen35Config& c = m->config;
    return c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  }

  static uint64_t bytes(const cuda::RowGroup& g) {
    if (g.fused.n > 0) return kern::weight_bytes(g.fused);
    uint64_t total = 0;
    for (const kern::DeviceLinear& p : g.parts) total += kern::weight_bytes(p);
    return total;
  }

  // The weights one token reads from a layer (experts: the top-k).
  uint64_t layer_bytes(const cuda::DeviceLayer& l) const {
    const ckpt::Qwen35Config& c = m->config;
    uint64_t total = l.full_attention ? bytes(l.qkv) + kern::weight_bytes(l.o)
                                      : bytes(l.gdn_in) + kern::weight_bytes(l.out);
    total +=
        bytes(l.moe.router) + bytes(l.moe.shared_gate_up) + kern::weight_bytes(l.moe.shared_down);
    return total + c.num_experts_per_tok * (bytes(l.moe.gate_up) + kern::weight_bytes(l.moe.down));
  }

  uint64_t step_weight_bytes() const {
    uint64_t total =
        kern::weight_bytes(m->lm_head) + static_cast<uint64_t>(m->config.hidden_size) * 2;
    for (const cuda::DeviceLayer& l : m->layers) total += layer_bytes(l);
    return total;
  }

  // fc, the layer and the LM head, and the embedding row (BF16 or F32).
  uint64_t mtp_weight_bytes() const {
    if (!m->mtp) return 0;
    const uint64_t row = static_cast<uint64_t>(m->config.hidden_size) *
                         (m->embed_kind == kern::FloatKind::kBf16 ? 2 : 4);
    return kern::weight_bytes(m->mtp->fc) + layer_bytes(m->mtp->layer) +
           kern::weight_bytes(m->lm_head) + row;
  }

  // Whether the launch `name` (kSkippableLaunches) is left out (CudaOptions::skip).
  bool on(const char* name) const {
    return std::find(o.skip.begin(), o.skip.end(), name) == o.skip.end();
  }

  void mark(const char* name, uint64_t bytes) {
    if (marks) marks->mark(name, bytes);
  }

  // The out / o projection into mix, then x += mix and u = post_norm(x). A deep, narrow product
  // (K >= 2N: [3072 x 8192] on 122B) runs in o.out_parts K parts, more blocks with fewer units
  // each (one part fills 192 of the H200's 264 block slots), and the norm adds the parts.
  void out_proj_add_norm(const kern::DeviceLinear& w, const float* in, const float* norm,
                         const char* family) {
    const int h = static_cast<int>(m->config.hidden_size);
    const float eps = static_cast<float>(m->config.rms_norm_eps);
    kern::GemvBatch split;
    split.k_splits = o.out_parts;
    split.split_stride = static_cast<size_t>(h);
    if (o.out_parts > 1 && w.k >= 2 * w.n && kern::gemv_k_split_ok(w, split)) {
      if (on("out-proj")) gemv(w, in, mix, split, family);
      if (on("out-norm")) {
        check(kern::add_parts_rms_norm_1p(x, mix, o.out_parts, split.split_stride, norm, h, eps, u,
                                          stream),
              "add_rms_norm");
      }
    } else {
      if (on("out-proj")) gemv(w, in, mix, {}, family);
      if (on("out-norm")) {
        check(kern::add_rms_norm_1p(x, mix, norm, h, eps, u, stream), "add_rms_norm");
      }
    }
    mark("norms and elementwise", 0);
  }

  void gemv(const kern::DeviceLinear& w, const float* in, float* out, const kern::GemvBatch& batch,
            const char* family, cudaStream_t on = nullptr) {
    check(kern::gemv(w, in, out, batch, on ? on : stream), std::string("gemv ") + family);
    mark(family, kern::weight_bytes(w) * static_cast<uint64_t>(batch.n_slots));
  }

  // All parts of a group in one launch when fused; outputs at out + offset either way.
  void gemv(const cuda::RowGroup& g, const float* in, float* out, const kern::GemvBatch& batch,
            const char* family, cudaStream_t on = nullptr) {
    if (g.fused.n > 0) {
      gemv(g.fused, in, out, batch, family, on);
      return;
    }
    for (size_t j = 0; j < g.parts.size(); ++j) {
      gemv(g.parts[j], in, out + g.offsets[j], batch, family, on);
    }
  }

  // The shared expert as the routed launches' extra slots (kern::gemv_moe): its gate | up and
  // down products, or {} where the formats do not allow it (or it is off or skipped).
  std::pair<kern::SharedProduct, kern::SharedProduct> shared_slots(const cuda::DeviceMoe& w) const {
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

  // The routed experts' gate | up (paired: straight to eh) and down batches.
  std::pair<kern::GemvBatch, kern::GemvBatch> expert_batches() const {
    const ckpt::Qwen35Config& c = m->config;
    const int k = static_cast<int>(c.num_experts_per_tok);
    const size_t im = c.moe_intermediate_size, h = c.hidden_size;
    kern::GemvBatch down{k, ids, im, h};
    down.ids_early = true;  // written by router_topk, before the gate | up launch
    return {kern::GemvBatch{k, ids, 0, im}, down};
  }

  // The MoE block; its combine also applies the next norm (`next_norm`) into `next_out`.
  void moe(const cuda::DeviceMoe& w, const float* next_norm, float* next_out) {
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
      check(cudaEventRecord(fork, stream), "cudaEventRecord");
      check(cudaStreamWaitEvent(side, fork), "cudaStreamWaitEvent");
    }
    if (!slots && on("shared-expert")) {
      gemv(w.shared_gate_up, u, sgu, {}, "shared expert", sh_stream);
      if (on("shared-swiglu")) {
        check(kern::swiglu(sgu, sgu + is, is, 1, is, sh, sh_stream), "swiglu");
      }
      gemv(w.shared_down, sh, sy, {}, "shared expert", sh_stream);
    }
    if (branch) check(cudaEventRecord(join, side), "cudaEventRecord");
    if (on("router")) gemv(w.router, u, rl, {}, "router");  // and the shared expert's gate logit
    if (on("router-topk")) {
      check(kern::router_topk(rlogits, static_cast<int>(c.num_experts), k, ids, rweights, stream),
            "router_topk");
    }
    mark("router", 0);
    const uint64_t gate_up_bytes = kern::weight_bytes(w.gate_up.fused) * static_cast<uint64_t>(k);
    if (slots) {
      if (on("experts-gate-up")) {
        check(kern::gemv_moe(w.gate_up.fused, u, eh, pairs, true, sh_gate_up, stream),
              "gemv_moe gate | up");
      }
      mark("experts (INT4 MoE)", gate_up_bytes + kern::weight_bytes(sh_gate_up.w));
    } else if (w.gate_up.swiglu_pairs) {  // straight to eh = silu(gate) * up
      if (on("experts-gate-up")) {
        check(kern::gemv_swiglu(w.gate_up.fused, u, eh, pairs, stream), "gemv_swiglu experts");
      }
      mark("experts (INT4 MoE)", gate_up_bytes);
    } else if (on("experts-gate-up")) {
      gemv(w.gate_up, u, egu, {k, ids, 0, 2 * static_cast<size_t>(im)}, "experts (INT4 MoE)");
      check(kern::swiglu(egu, egu + im, im, k, 2 * static_cast<size_t>(im), eh, stream), "swiglu");
    }
    if (slots) {
      if (on("experts-down")) {
        check(kern::gemv_moe(w.down, eh, ey, down_batch, false, sh_down, stream), "gemv_moe down");
      }
      mark("experts (INT4 MoE)",
           kern::weight_bytes(w.down) * static_cast<uint64_t>(k) + kern::weight_bytes(sh_down.w));
    } else if (on("experts-down")) {
      gemv(w.down, eh, ey, down_batch, "experts (INT4 MoE)");
    }
    if (branch) check(cudaStreamWaitEvent(stream, join), "cudaStreamWaitEvent");
    if (on("moe-combine")) {
      check(kern::moe_combine_norm(ey, rweights, k, slots ? sh_down.y : sy, slots ? nullptr : sgl,
                                   h, x, next_norm, static_cast<float>(c.rms_norm_eps), next_out,
                                   stream),
            "moe_combine_norm");
    }
    mark("norms and elementwise", 0);
  }

  // A full-attention layer's mixer: q | k | v from u, attention at the device position `at`
  // (`rows_before` cached rows) over the cache kc / vc, the o projection, x += it and
  // u = post_norm(x).
  void attention_mixer(const cuda::DeviceLayer& w, float* kc, float* vc, const int* at,
                       int64_t rows_before) {
    gemv(w.qkv, u, qkvp, {}, "attention projections");
    if (on("attention")) {
      check(kern::attn_decode(attn, qproj, kp, vp, w.q_norm, w.k_norm, rope, at, nullptr, kc, vc,
                              att, attn_scratch, stream),
            "attn_decode");
    }
    mark("attention", 2ull * (rows_before + 1) * m->config.kv_rows() * 4);
    out_proj_add_norm(w.o, att, w.post_norm, "attention projections");
  }

  // The MTP head (CpuEngine::mtp_step): [norm(embed(token)) | norm(mtp_in)] -> fc -> its layer
  // -> norm -> the LM head, at mtp_pos. Uses the step's scratch (x, u, ...), not its state.
  void launch_mtp() {
    const ckpt::Qwen35Config& c = m->config;
    const cuda::DeviceMtp& t = *m->mtp;
    const int h = static_cast<int>(c.hidden_size);
    const float eps = static_cast<float>(c.rms_norm_eps);
    check(kern::embed(m->embed_kind, m->embed, h, mtp_token, x, stream), "embed");
    check(kern::rms_norm_1p(x, t.pre_fc_norm_embedding, h, 1, eps, cat, stream), "rms_norm");
    check(kern::rms_norm_1p(mtp_in, t.pre_fc_norm_hidden, h, 1, eps, cat + h, stream), "rms_norm");
    gemv(t.fc, cat, x, {}, "MTP fc");
    check(kern::rms_norm_1p(x, t.layer.input_norm, h, 1, eps, u, stream), "rms_norm");
    attention_mixer(t.layer, mtp_k, mtp_v, mtp_pos, mtp_position);
    moe(t.layer.moe, t.norm, mtp_hidden);
    gemv(m->lm_head, mtp_hidden, mtp_logits, {}, "LM head");
    check(
        kern::argmax(mtp_logits, static_cast<int>(c.vocab_size), mtp_next, argmax_scratch, stream),
        "argmax");
    check(kern::advance(mtp_next, mtp_token, mtp_pos, stream), "advance");
  }

  void launch_step() {
    const ckpt::Qwen35Config& c = m->config;
    const int h = static_cast<int>(c.hidden_size);
    const float eps = static_cast<float>(c.rms_norm_eps);
    check(kern::embed(m->embed_kind, m->embed, h, token, x, stream), "embed");
    check(kern::rms_norm_1p(x, m->layers[0].input_norm, h, 1, eps, u, stream), "rms_norm");
    mark("norms and elementwise", static_cast<uint64_t>(h) * 2);
    for (size_t l = 0; l < m->layers.size(); ++l) {
      const cuda::DeviceLayer& w = m->layers[l];  // u = input_norm(x) already
      if (w.full_attention) {
        attention_mixer(w, k_cache[l], v_cache[l], pos, position);
      } else {
        if (on("gdn-in-proj")) gemv(w.gdn_in, u, gin, {}, "DeltaNet projections");
        if (on("gdn-mixer")) {
          check(kern::gdn_decode(gdn, {w.conv, w.dt_bias, w.a_log, w.gdn_norm}, qkv, z, b, a, pos,
                                 {conv[l], ssm[l]}, core, stream),
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
    check(kern::argmax(logits, static_cast<int>(c.vocab_size), next, argmax_scratch, stream),
          "argmax");
    check(kern::advance(next, token, pos, stream), "advance");
    mark("argmax", 0);
  }

  // ---- The two-token verify (speculative decoding) ----
  // Its tokens at vpos[0] and vpos[1] = vpos[0] + 1, in one pass: every product reads its weights
  // for both rows in one launch (two slots of the one matrix), the mixers and the per-row
  // kernels run once per row. A memset node between the rows' DeltaNet and attention kernels
  // makes the second wait for the first to finish (their early loads read what it writes); for
  // DeltaNet it is the copy of the state after the first token, which a rejected second token
  // returns to (reject_last). The conv histories need no copy: the position's parity picks them.
  // (The DeltaNet kernel writing that state to a second buffer instead, no copy, measured the
  // same: H100, 122B, 4901-4928 against 4888-4904 us a verify pass in one run.)

  // `w` on two rows of input `in_stride` floats apart into rows `out_stride` apart.
  void gemv2(const kern::DeviceLinear& w, const float* in, size_t in_stride, float* out,
             size_t out_stride, const char* family, cudaStream_t on = nullptr, int k_splits = 1) {
    kern::DeviceLinear one = w;  // both slots read matrix 0
    one.w_stride = one.scale_stride = one.zero_stride = one.block_scale_stride = 0;
    kern::GemvBatch batch{2, nullptr, in_stride, out_stride};
    batch.k_splits = k_splits;
    batch.split_stride = k_splits > 1 ? static_cast<size_t>(m->config.hidden_size) : 0;
    gemv(one, in, out, batch, family, on);
  }
  void gemv2(const cuda::RowGroup& g, const float* in, size_t in_stride, float* out,
             size_t out_stride, const char* family, cudaStream_t on = nullptr) {
    if (g.fused.n > 0) {
      gemv2(g.fused, in, in_stride, out, out_stride, family, on);
      return;
    }
    for (size_t j = 0; j < g.parts.size(); ++j) {
      gemv2(g.parts[j], in, in_stride, out + g.offsets[j], out_stride, family, on);
    }
  }

  void fence() { check(cudaMemsetAsync(fence_word, 0, sizeof(int), stream), "memset"); }

  // out_proj_add_norm on both rows.
  void out_proj_add_norm2(const kern::DeviceLinear& w, const float* in, size_t in_stride,
                          const float* norm) {
    const int h = static_cast<int>(m->config.hidden_size);
    const float eps = static_cast<float>(m->config.rms_norm_eps);
    kern::GemvBatch split;
    split.k_splits = o.out_parts;
    const size_t row = static_cast<size_t>(o.out_parts) * h;
    const bool parts = o.out_parts > 1 && w.k >= 2 * w.n && kern::gemv_k_split_ok(w, split);
    gemv2(w, in, in_stride, mix, row, "projections", nullptr, parts ? o.out_parts : 1);
    check(kern::add_parts_rms_norm_1p(x, mix, parts ? o.out_parts : 1, h, norm, h, eps, u, stream,
                                      2, row),
          "add_rms_norm");
  }

  void moe2(const cuda::DeviceMoe& w, const float* next_norm, float* next_out) {
    const ckpt::Qwen35Config& c = m->config;
    const int h = static_cast<int>(c.hidden_size), k = static_cast<int>(c.num_experts_per_tok),
              im = static_cast<int>(c.moe_intermediate_size),
              is = static_cast<int>(c.shared_expert_intermediate_size),
              e = static_cast<int>(c.num_experts);
    const bool branch = o.parallel_shared;
    const cudaStream_t sh_stream = branch ? side : stream;
    if (branch) {
      check(cudaEventRecord(fork, stream), "cudaEventRecord");
      check(cudaStreamWaitEvent(side, fork), "cudaStreamWaitEvent");
    }
    gemv2(w.shared_gate_up, u, h, sgu, 2 * is, "shared expert", sh_stream);
    check(kern::swiglu(sgu, sgu + is, is, 2, 2 * static_cast<size_t>(is), sh, sh_stream), "swiglu");
    gemv2(w.shared_down, sh, is, sy, h, "shared expert", sh_stream);
    if (branch) check(cudaEventRecord(join, side), "cudaEventRecord");
    gemv2(w.router, u, h, rl, e + 1, "router");  // and the shared expert's gate logit
    check(kern::router_topk(rl, e, k, ids, rweights, stream, 2, static_cast<size_t>(e) + 1),
          "router_topk");
    // Both rows' experts in one launch: slots 0 .. k - 1 on row 0's u, k .. 2k - 1 on row 1's
    // (H100, 122B: a verify pass 5327-5329 -> 4914-4936 us against a launch per row).
    kern::GemvBatch both{2 * k, ids, static_cast<size_t>(h), static_cast<size_t>(im)};
    both.slots_per_x = k;
    if (w.gate_up.swiglu_pairs) {
      check(kern::gemv_swiglu(w.gate_up.fused, u, eh, both, stream), "gemv_swiglu experts");
    } else {
      both.y_stride = 2 * static_cast<size_t>(im);
      gemv(w.gate_up, u, egu, both, "experts (INT4 MoE)");
      check(kern::swiglu(egu, egu + im, im, 2 * k, 2 * static_cast<size_t>(im), eh, stream),
            "swiglu");
    }
    kern::GemvBatch down{2 * k, ids, static_cast<size_t>(im), static_cast<size_t>(h)};
    down.ids_early = true;  // written two launches back
    gemv(w.down, eh, ey, down, "experts (INT4 MoE)");
    if (branch) check(cudaStreamWaitEvent(stream, join), "cudaStreamWaitEvent");
    check(kern::moe_combine_norm(ey, rweights, k, sy, rl + e, h, x, next_norm,
                                 static_cast<float>(c.rms_norm_eps), next_out, stream, 2,
                                 static_cast<size_t>(e) + 1),
          "moe_combine_norm");
  }

  void launch_verify() {
    const ckpt::Qwen35Config& c = m->config;
    const int h = static_cast<int>(c.hidden_size);
    const float eps = static_cast<float>(c.rms_norm_eps);
    for (int r = 0; r < 2; ++r) {
      check(kern::embed(m->embed_kind, m->embed, h, vtoken + r, x + r * h, stream), "embed");
    }
    check(kern::rms_norm_1p(x, m->layers[0].input_norm, h, 2, eps, u, stream), "rms_norm");
    const size_t att_row = static_cast<size_t>(c.num_attention_heads * c.head_dim);
    for (size_t l = 0; l < m->layers.size(); ++l) {
      const cuda::DeviceLayer& w = m->layers[l];
      if (w.full_attention) {
        const int64_t qr = qkvp_row();
        gemv2(w.qkv, u, h, qkvp, qr, "attention projections");
        for (int r = 0; r < 2; ++r) {
          if (r == 1) fence();
          check(kern::attn_decode(attn, qproj + r * qr, kp + r * qr, vp + r * qr, w.q_norm,
                                  w.k_norm, rope, vpos + r, nullptr, k_cache[l], v_cache[l],
                                  att + r * att_row, attn_scratch, stream),
                "attn_decode");
        }
        out_proj_add_norm2(w.o, att, att_row, w.post_norm);
      } else {
        const int64_t gr = gin_row();
        gemv2(w.gdn_in, u, h, gin, gr, "DeltaNet projections");
        for (int r = 0; r < 2; ++r) {
          if (r == 1) {
            check(cudaMemcpyAsync(ssm_saved[l], ssm[l], static_cast<size_t>(ssm_floats()) * 4,
                                  cudaMemcpyDeviceToDevice, stream),
                  "copy");
          }
          check(kern::gdn_decode(gdn, {w.conv, w.dt_bias, w.a_log, w.gdn_norm}, qkv + r * gr,
                                 z + r * gr, b + r * gr, a + r * gr, vpos + r, {conv[l], ssm[l]},
                                 core + r * c.value_dim(), stream),
                "gdn_decode");
        }
        out_proj_add_norm2(w.out, core, static_cast<size_t>(c.value_dim()), w.post_norm);
      }
      const bool last = l + 1 == m->layers.size();
      moe2(w.moe, last ? m->final_norm : m->layers[l + 1].input_norm, last ? hidden : u);
    }
    gemv2(m->lm_head, hidden, h, logits, static_cast<size_t>(c.vocab_size), "LM head");
    for (int r = 0; r < 2; ++r) {
      check(kern::argmax(logits + r * c.vocab_size, static_cast<int>(c.vocab_size), vnext + r,
                         argmax_scratch, stream),
            "argmax");
    }
  }

  // launch_step or launch_mtp, captured into `exec` the first time (o.graph).
  template <class Launch>
  void run(cudaGraphExec_t& exec, Launch launch) {
    if (!o.graph) {
      launch();
      return;
    }
    if (!exec) {
      cudaGraph_t g;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
      launch();
      check(cudaStreamEndCapture(stream, &g), "end capture");
      check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(g);
    }
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  }
  void run_step() {
    run(graph, [&] { launch_step(); });
  }

  // CudaEngine::mtp_step from the hidden state at `src` (host or device, as `kind` says).
  int32_t mtp_step(int32_t next_token, const float* src, cudaMemcpyKind kind, float* out) {
    if (!m->mtp) {
      throw Error(Errc::kUnsupported, o.mtp ? "the checkpoint has no MTP head (mtp.* tensors)"
                                            : "the MTP head is not loaded (CudaOptions::mtp)");
    }
    const int64_t vocab = m->config.vocab_size;
    if (next_token < 0 || next_token >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(next_token) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
    before_step(mtp_position);
    pinned[2] = next_token;
    check(cudaMemcpyAsync(mtp_token, pinned + 2, sizeof(int), cudaMemcpyHostToDevice, stream),
          "copy");
    const size_t h_bytes = static_cast<size_t>(m->config.hidden_size) * 4;
    check(cudaMemcpyAsync(mtp_in, src, h_bytes, kind, stream), "copy");
    run(mtp_graph, [&] { launch_mtp(); });
    check(cudaMemcpyAsync(pinned + 3, mtp_next, sizeof(int), cudaMemcpyDeviceToHost, stream),
          "copy");
    if (out) {
      check(cudaMemcpyAsync(out, mtp_logits, static_cast<size_t>(vocab) * 4, cudaMemcpyDeviceToHost,
                            stream),
            "copy");
    }
    check(cudaStreamSynchronize(stream), "MTP step");
    ++mtp_position;
    return pinned[3];
  }

  void before_step(int64_t at) {
    if (at >= o.max_context) {
      throw Error(Errc::kUsage, "the context is full: " + std::to_string(o.max_context) +
                                    " tokens (raise --max-context)");
    }
  }

  void reset() {
    for (size_t l = 0; l < conv.size(); ++l) {
      if (!conv[l]) continue;
      check(cudaMemsetAsync(conv[l], 0, kern::gdn_conv_state_floats(gdn) * 4, stream), "memset");
      check(cudaMemsetAsync(ssm[l], 0, static_cast<size_t>(ssm_floats()) * 4, stream), "memset");
    }
    check(cudaMemsetAsync(pos, 0, sizeof(int), stream), "memset");
    if (mtp_pos) check(cudaMemsetAsync(mtp_pos, 0, sizeof(int), stream), "memset");
    check(cudaStreamSynchronize(stream), "reset");
    position = 0;
    mtp_position = 0;
  }
};

bool CudaEngine::available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) {
      *why = e != cudaSuccess ? std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")"
                              : "no CUDA device";
    }
    cudaGetLastError();
    return false;
  }
  return true;
}

CudaEngine::CudaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaEngine::CudaEngine(const Model& model, const CudaOptions& options) {
  std::string why;
  if (!available(&why)) throw Error(Errc::kUnsupported, "--device cuda: " + why);
  check(cudaSetDevice(options.device), "cudaSetDevice");
  impl_ =
      std::make_unique<Impl>(cuda::upload_model(model, options.fused_swiglu, options.mtp), options);
}

std::unique_ptr<CudaEngine> CudaEngine::synthetic(const ckpt::Qwen35Config& config, uint64_t seed,
                                                  const CudaOptions& options) {
  std::string why;
  if (!available(&why)) throw Error(Errc::kUnsupported, "--device cuda: " + why);
  check(cudaSetDevice(options.device), "cudaSetDevice");
  return std::unique_ptr<CudaEngine>(new CudaEngine(std::make_unique<Impl>(
      cuda::synthetic_model(config, seed, options.fused_swiglu, options.mtp), options)));
}

CudaEngine::~CudaEngine() = default;

const ckpt::Qwen35Config& CudaEngine::config() const {
  return impl_->m->config;
}
const CudaLoadStats& CudaEngine::load_stats() const {
  return impl_->stats;
}
void CudaEngine::reset() {
  impl_->reset();
}
int64_t CudaEngine::position() const {
  return impl_->position;
}

int32_t CudaEngine::step(int32_t token, float* logits) {
  Impl& s = *impl_;
  const int64_t vocab = s.m->config.vocab_size;
  if (token < 0 || token >= vocab) {
    throw Error(Errc::kUsage, "token id " + std::to_string(token) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  s.before_step(s.position);
  s.pinned[0] = token;
  check(cudaMemcpyAsync(s.token, s.pinned, sizeof(int), cudaMemcpyHostToDevice, s.stream), "copy");
  s.run_step();
  check(cudaMemcpyAsync(s.pinned + 1, s.next, sizeof(int), cudaMemcpyDeviceToHost, s.stream),
        "copy");
  if (logits) {
    check(cudaMemcpyAsync(logits, s.logits, static_cast<size_t>(vocab) * 4, cudaMemcpyDeviceToHost,
                          s.stream),
          "copy");
  }
  check(cudaStreamSynchronize(s.stream), "decode step");
  ++s.position;
  return s.pinned[1];
}

int32_t CudaEngine::step_greedy() {
  Impl& s = *impl_;
  s.before_step(s.position);
  s.run_step();
  check(cudaMemcpyAsync(s.pinned + 1, s.next, sizeof(int), cudaMemcpyDeviceToHost, s.stream),
        "copy");
  check(cudaStreamSynchronize(s.stream), "decode step");
  ++s.position;
  return s.pinned[1];
}

void CudaEngine::hidden(float* out) {
  Impl& s = *impl_;
  check(cudaMemcpyAsync(out, s.hidden, static_cast<size_t>(s.m->config.hidden_size) * 4,
                        cudaMemcpyDeviceToHost, s.stream),
        "copy");
  check(cudaStreamSynchronize(s.stream), "copying the hidden state");
}

bool CudaEngine::has_mtp() const {
  return impl_->m->mtp.has_value();
}
int64_t CudaEngine::mtp_position() const {
  return impl_->mtp_position;
}

int32_t CudaEngine::mtp_step(int32_t next_token, const float* hidden, float* logits) {
  Impl& s = *impl_;
  return s.mtp_step(next_token, hidden ? hidden : s.hidden,
                    hidden ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, logits);
}

void CudaEngine::verify2(const int32_t tokens[2], int32_t top[2]) {
  Impl& s = *impl_;
  const int64_t vocab = s.m->config.vocab_size;
  for (int r = 0; r < 2; ++r) {
    if (tokens[r] < 0 || tokens[r] >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(tokens[r]) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
  }
  s.before_step(s.position + 1);
  int* p = s.pinned + 4;  // tokens, positions, then the argmaxes
  p[0] = tokens[0], p[1] = tokens[1];
  p[2] = static_cast<int>(s.position), p[3] = static_cast<int>(s.position + 1);
  check(cudaMemcpyAsync(s.vtoken, p, 2 * sizeof(int), cudaMemcpyHostToDevice, s.stream), "copy");
  check(cudaMemcpyAsync(s.vpos, p + 2, 2 * sizeof(int), cudaMemcpyHostToDevice, s.stream), "copy");
  s.run(s.verify_graph, [&] { s.launch_verify(); });
  p[6] = static_cast<int>(s.position + 2);  // the single-token step's position after both
  check(cudaMemcpyAsync(s.pos, p + 6, sizeof(int), cudaMemcpyHostToDevice, s.stream), "copy");
  check(cudaMemcpyAsync(p + 4, s.vnext, 2 * sizeof(int), cudaMemcpyDeviceToHost, s.stream), "copy");
  check(cudaStreamSynchronize(s.stream), "verify");
  s.position += 2;
  top[0] = p[4], top[1] = p[5];
}

void CudaEngine::reject_last() {
  Impl& s = *impl_;
  if (s.position < 2) throw Error(Errc::kUsage, "reject_last without a two-token verify");
  for (size_t l = 0; l < s.ssm.size(); ++l) {
    if (!s.ssm[l]) continue;
    check(cudaMemcpyAsync(s.ssm[l], s.ssm_saved[l], static_cast<size_t>(s.ssm_floats()) * 4,
                          cudaMemcpyDeviceToDevice, s.stream),
          "copy");
  }
  s.pinned[9] = static_cast<int>(s.position - 1);
  check(cudaMemcpyAsync(s.pos, s.pinned + 9, sizeof(int), cudaMemcpyHostToDevice, s.stream),
        "copy");
  check(cudaStreamSynchronize(s.stream), "reject");
  s.position -= 1;
}

int32_t CudaEngine::draft(int row, int32_t next_token) {
  Impl& s = *impl_;
  if (row < 0 || row > 1) throw Error(Errc::kUsage, "draft: row must be 0 or 1");
  return s.mtp_step(next_token, s.hidden + static_cast<int64_t>(row) * s.m->config.hidden_size,
                    cudaMemcpyDeviceToDevice, nullptr);
}

std::vector<KernelShare> CudaEngine::profile_step() {
  Impl& s = *impl_;
  s.before_step(s.position);
  Marks marks;
  marks.stream = s.stream;
  marks.mark("start", 0);
  s.marks = &marks;
  s.launch_step();
  s.marks = nullptr;
  check(cudaStreamSynchronize(s.stream), "profiled step");
  ++s.position;
  std::vector<KernelShare> out;
  for (size_t i = 1; i < marks.events.size(); ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, marks.events[i - 1], marks.events[i]), "cudaEventElapsedTime");
    const auto& [name, bytes] = marks.names[i];
    auto it =
        std::find_if(out.begin(), out.end(), [&](const KernelShare& k) { return k.name == name; });
    if (it == out.end()) it = out.insert(out.end(), KernelShare{name, 0, 0});
    it->microseconds += ms * 1000.0;
    it->bytes += bytes;
  }
  for (cudaEvent_t e : marks.events) cudaEventDestroy(e);
  return out;
}

double CudaEngine::time_steps(int steps) {
  Impl& s = *impl_;
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  s.run_step();  // warm: captures the graph
  ++s.position;
  check(cudaEventRecord(a, s.stream), "cudaEventRecord");
  for (int i = 0; i < steps; ++i) {
    s.before_step(s.position);
    s.run_step();
    ++s.position;
  }
  check(cudaEventRecord(b, s.stream), "cudaEventRecord");
  check(cudaEventSynchronize(b), "timed steps");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1000.0 / steps;
}

double CudaEngine::time_mtp_steps(int steps) {
  Impl& s = *impl_;
  if (!s.m->mtp) throw Error(Errc::kUnsupported, "no MTP head to time (CudaOptions::mtp)");
  if (steps < 1 || s.mtp_position + steps + 1 > s.o.max_context) {
    throw Error(Errc::kUsage,
                "time_mtp_steps: " + std::to_string(steps) + " steps do not fit the MTP context");
  }
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  const size_t h_bytes = static_cast<size_t>(s.m->config.hidden_size) * 4;
  const auto one = [&] {
    check(cudaMemcpyAsync(s.mtp_in, s.hidden, h_bytes, cudaMemcpyDeviceToDevice, s.stream), "copy");
    s.run(s.mtp_graph, [&] { s.launch_mtp(); });
    ++s.mtp_position;
  };
  one();  // warm: captures the graph
  check(cudaEventRecord(a, s.stream), "cudaEventRecord");
  for (int i = 0; i < steps; ++i) one();
  check(cudaEventRecord(b, s.stream), "cudaEventRecord");
  check(cudaEventSynchronize(b), "timed MTP steps");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1000.0 / steps;
}

double device_copy_bandwidth(uint64_t bytes) {
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "warm copy");
  const int reps = 10;
  check(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < reps; ++i)
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
  check(cudaEventRecord(b), "cudaEventRecord");
  check(cudaEventSynchronize(b), "copies");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

}  // namespace qf::rt
