// CudaEngine::Impl's buffers and state: allocation at load, the bytes a step reads, reset, and
// the MTP head's step (engine_impl.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine_impl.h"

namespace qf::rt {

CudaEngine::Impl::Impl(std::unique_ptr<cuda::DeviceModel> model, const CudaOptions& options)
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
  if (o.mtp_vocab != 0) {  // negative sizes are refused too
    check_mtp_vocab(o.mtp_vocab, c.vocab_size);
    if (o.mtp_vocab == c.vocab_size) o.mtp_vocab = 0;
  }
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::check(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cudaEventCreate");
  cuda::check(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "cudaEventCreate");
  cuda::check(cudaMallocHost(&pinned, kPinWords * sizeof(int)), "cudaMallocHost");
  cuda::check(cudaMallocHost(&pinned_logits, static_cast<size_t>(kMaxVerify * c.vocab_size) * 4),
              "cudaMallocHost");
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
  attn.kv = o.kv_cache == KvCacheType::kFp8    ? kern::KvType::kFp8
            : o.kv_cache == KvCacheType::kBf16 ? kern::KvType::kBf16
                                               : kern::KvType::kF32;
  const auto kv_cache_alloc = [&] {
    return m->alloc(static_cast<size_t>(o.max_context * c.kv_rows()) * kern::attn_kv_bytes(attn));
  };
  const auto f = [&](int64_t n) {
    return static_cast<float*>(m->alloc(static_cast<size_t>(n) * 4));
  };
  const auto i = [&](int64_t n) { return static_cast<int*>(m->alloc(static_cast<size_t>(n) * 4)); };
  const int64_t h = c.hidden_size, k = c.num_experts_per_tok, im = c.moe_intermediate_size,
                is = c.shared_expert_intermediate_size;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const bool full = c.full_attention[l];
    conv.push_back(full ? nullptr : f(static_cast<int64_t>(kern::gdn_conv_state_floats(gdn)) + 1));
    ssm.push_back(full ? nullptr : f(ssm_floats()));
    k_cache.push_back(full ? kv_cache_alloc() : nullptr);
    v_cache.push_back(full ? kv_cache_alloc() : nullptr);
  }
  // Per-token buffers hold kMaxVerify rows (the verify's; a step uses the first).
  const int64_t nv = c.linear_num_value_heads, rows = kMaxVerify;
  x = f(rows * h), u = f(rows * h), mix = f(rows * o.out_parts * h);
  core = f(rows * c.value_dim());
  gin = f(rows * gin_row());
  qkv = gin, z = qkv + c.conv_dim(), b = z + c.value_dim(), a = b + nv;
  qkvp = f(rows * qkvp_row());
  qproj = qkvp, kp = qproj + c.q_proj_rows(), vp = kp + c.kv_rows();
  att = f(rows * c.num_attention_heads * c.head_dim);
  rl = f(rows * (c.num_experts + 1)), rlogits = rl, sgl = rl + c.num_experts;
  rweights = f(rows * k);
  // eh and ey hold a ninth slot: the shared expert's, where it runs in the experts' launches;
  // or the verify's rows x k slots.
  egu = f(rows * k * 2 * im), eh = f(rows * k * im + is), ey = f((rows * k + 1) * h);
  sgu = f(rows * 2 * is), sh = f(rows * is), sy = f(rows * h), hidden = f(rows * h);
  logits = f(rows * c.vocab_size);
  attn_scratch =
      f(static_cast<int64_t>(std::max(kern::attn_scratch_floats(attn),
                                      kern::attn_decode_rows_scratch_floats(attn, rows))) +
        1);
  rope = f(static_cast<int64_t>(kern::attn_rope_floats(attn)) + 1);
  cuda::check(kern::attn_rope_table(attn, rope, stream), "attn_rope_table");
  ids = i(rows * k), token = i(1), next = i(1), pos = i(1);
  vtoken = i(rows), vpos = i(rows), vnext = i(rows);
  std::vector<int> distinct(static_cast<size_t>(k));  // what --skip router-topk leaves there
  std::iota(distinct.begin(), distinct.end(), 0);
  cuda::check(
      cudaMemcpy(ids, distinct.data(), distinct.size() * sizeof(int), cudaMemcpyHostToDevice),
      "cudaMemcpy");
  argmax_scratch = i(kern::argmax_scratch_ints(static_cast<int>(c.vocab_size)));
  const size_t top_bytes = 2 * kTopSlot * sizeof(int);
  top_out = i(2 * kTopSlot);
  const size_t scratch_bytes = kern::logits_topk_scratch_bytes(static_cast<int>(c.vocab_size));
  top_scratch = m->alloc(scratch_bytes);
  cuda::check(cudaMemset(top_scratch, 0, scratch_bytes), "cudaMemset");
  cuda::check(cudaMallocHost(&pinned_top, top_bytes), "cudaMallocHost");
  // The verify's deferred DeltaNet updates (speculative decoding: with the MTP head).
  const int64_t replay_floats =
      2 * kern::kGdnMaxTokens * static_cast<int64_t>(kern::gdn_replay_entry_floats(gdn));
  for (float* state : ssm) replay.push_back(state && m->mtp ? f(replay_floats) : nullptr);
  fold_word = i(2);
  cuda::check(cudaMemset(fold_word, 0, 2 * sizeof(int)), "cudaMemset");
  for (size_t l = 0; l < ssm.size() && o.snapshots; ++l) {
    conv_snap.push_back(ssm[l] ? f(static_cast<int64_t>(kern::gdn_conv_state_floats(gdn)) + 1)
                               : nullptr);
    ssm_snap.push_back(ssm[l] ? f(ssm_floats()) : nullptr);
  }
  if (m->mtp) {
    mtp_k = kv_cache_alloc(), mtp_v = kv_cache_alloc();
    mtp_in = f(h), cat = f(2 * h), mtp_hidden = f(h), mtp_logits = f(c.vocab_size);
    mtp_token = i(1), mtp_next = i(1), mtp_pos = i(1);
    // Past the draft vocabulary the head's logits are -inf, written once: no launch writes them.
    const int64_t drafts = mtp_lm_head().n;
    const std::vector<float> none(static_cast<size_t>(c.vocab_size - drafts),
                                  -std::numeric_limits<float>::infinity());
    cuda::check(
        cudaMemcpy(mtp_logits + drafts, none.data(), none.size() * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  }
  alloc_prefill();
  stats.device_bytes = m->device_bytes;
  stats.host_bytes = m->host_bytes_read;
  stats.load_seconds = m->load_seconds;
  stats.weight_bytes = step_weight_bytes();
  stats.mtp_weight_bytes = mtp_weight_bytes();
  stats.shared_in_experts = std::all_of(m->layers.begin(), m->layers.end(), [&](const auto& l) {
    return shared_slots(l.moe).first.y != nullptr;
  });
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
  stats.device_name = prop.name;
  reset();
}

CudaEngine::Impl::~Impl() {
  if (graph) cudaGraphExecDestroy(graph);
  if (mtp_graph) cudaGraphExecDestroy(mtp_graph);
  if (mtp_entry_graph) cudaGraphExecDestroy(mtp_entry_graph);
  if (verify_graph) cudaGraphExecDestroy(verify_graph);
  if (verify3_graph) cudaGraphExecDestroy(verify3_graph);
  if (prefill_graph) cudaGraphExecDestroy(prefill_graph);
  if (pf.pinned) cudaFreeHost(pf.pinned);
  if (pinned) cudaFreeHost(pinned);
  if (pinned_logits) cudaFreeHost(pinned_logits);
  if (pinned_top) cudaFreeHost(pinned_top);
  if (sc.pinned) cudaFreeHost(sc.pinned);
  if (fork) cudaEventDestroy(fork);
  if (join) cudaEventDestroy(join);
  if (side) cudaStreamDestroy(side);
  if (stream) cudaStreamDestroy(stream);
}

uint64_t CudaEngine::Impl::layer_bytes(const cuda::DeviceLayer& l) const {
  const ckpt::Qwen35Config& c = m->config;
  uint64_t total = l.full_attention ? bytes(l.qkv) + kern::weight_bytes(l.o)
                                    : bytes(l.gdn_in) + kern::weight_bytes(l.out);
  total +=
      bytes(l.moe.router) + bytes(l.moe.shared_gate_up) + kern::weight_bytes(l.moe.shared_down);
  return total + c.num_experts_per_tok * (bytes(l.moe.gate_up) + kern::weight_bytes(l.moe.down));
}

uint64_t CudaEngine::Impl::step_weight_bytes() const {
  uint64_t total =
      kern::weight_bytes(m->lm_head) + static_cast<uint64_t>(m->config.hidden_size) * 2;
  for (const cuda::DeviceLayer& l : m->layers) total += layer_bytes(l);
  return total;
}

uint64_t CudaEngine::Impl::mtp_weight_bytes() const {
  if (!m->mtp) return 0;
  const uint64_t row = static_cast<uint64_t>(m->config.hidden_size) *
                       (m->embed_kind == kern::FloatKind::kBf16 ? 2 : 4);
  return kern::weight_bytes(m->mtp->fc) + layer_bytes(m->mtp->layer) +
         kern::weight_bytes(mtp_lm_head()) + row;
}

void CudaEngine::Impl::check_top_k(int k) {
  if (k < 1 || k > kern::kTopKMax) {
    throw Error(Errc::kUsage, "the top k of the logits: k must be 1 to " +
                                  std::to_string(kern::kTopKMax) + ", not " + std::to_string(k));
  }
}

void CudaEngine::Impl::queue_top(const float* dev, int rows, int k) {
  const int vocab = static_cast<int>(m->config.vocab_size);
  for (int r = 0; r < rows; ++r) {  // one launch at a time on the scratch: stream order
    int* row_ids = top_out + r * kTopSlot;
    float* vals = reinterpret_cast<float*>(row_ids + kern::kTopKMax);
    cuda::check(kern::logits_topk(dev + static_cast<int64_t>(r) * vocab, vocab, k, row_ids, vals,
                                  vals + kern::kTopKMax, top_scratch, stream),
                "logits_topk");
  }
  cuda::check(cudaMemcpyAsync(pinned_top, top_out, static_cast<size_t>(rows * kTopSlot) * 4,
                              cudaMemcpyDeviceToHost, stream),
              "copy");
}

void CudaEngine::Impl::take_top(int rows, int k, TopLogits* out) const {
  read_top(pinned_top, rows, k, out);
}

void CudaEngine::Impl::read_top(const int* slots, int rows, int k, TopLogits* out) {
  for (int r = 0; r < rows; ++r) {
    const int* row_ids = slots + r * kTopSlot;
    const float* vals = reinterpret_cast<const float*>(row_ids + kern::kTopKMax);
    const float* norm = vals + kern::kTopKMax;
    out[r].ids.assign(row_ids, row_ids + k);
    out[r].logits.assign(vals, vals + k);
    out[r].log_z = static_cast<double>(norm[0]) + std::log(static_cast<double>(norm[1]));
  }
}

int32_t CudaEngine::Impl::mtp_step(int32_t next_token, const float* src, cudaMemcpyKind kind,
                                   const Out& out) {
  if (!m->mtp) {
    throw Error(Errc::kUnsupported, o.mtp ? "the checkpoint has no MTP head (mtp.* tensors)"
                                          : "the MTP head is not loaded (CudaOptions::mtp)");
  }
  const int64_t vocab = m->config.vocab_size;
  if (next_token < 0 || next_token >= vocab) {
    throw Error(Errc::kUsage, "token id " + std::to_string(next_token) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  before_step(mtp_position);
  pinned[2] = next_token;
  cuda::check(cudaMemcpyAsync(mtp_token, pinned + 2, sizeof(int), cudaMemcpyHostToDevice, stream),
              "copy");
  const size_t h_bytes = static_cast<size_t>(m->config.hidden_size) * 4;
  cuda::check(cudaMemcpyAsync(mtp_in, src, h_bytes, kind, stream), "copy");
  run(mtp_graph, [&] { launch_mtp(); });
  cuda::check(cudaMemcpyAsync(pinned + 3, mtp_next, sizeof(int), cudaMemcpyDeviceToHost, stream),
              "copy");
  queue_out(mtp_logits, 1, out);
  cuda::check(cudaStreamSynchronize(stream), "MTP step");
  take_out(1, out);
  ++mtp_position;
  return pinned[3];
}

void CudaEngine::mtp_entries(int first_row, std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  if (!s.m->mtp) {
    throw Error(Errc::kUnsupported, s.o.mtp ? "the checkpoint has no MTP head (mtp.* tensors)"
                                            : "the MTP head is not loaded (CudaOptions::mtp)");
  }
  const int n = static_cast<int>(tokens.size());
  if (first_row < 0 || first_row + n > Impl::kMaxVerify) {
    throw Error(Errc::kUsage, "mtp_entries: rows " + std::to_string(first_row) + " .. " +
                                  std::to_string(first_row + n - 1) + " (0 to " +
                                  std::to_string(Impl::kMaxVerify - 1) + ")");
  }
  const int64_t vocab = s.m->config.vocab_size;
  for (const int32_t t : tokens) {
    if (t < 0 || t >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(t) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
  }
  if (n == 0) return;
  s.before_step(s.mtp_position + n - 1);
  const size_t h = static_cast<size_t>(s.m->config.hidden_size);
  for (int r = 0; r < n; ++r) {  // the pinned words are read before the stream's sync below
    s.pinned[Impl::kPinEntryTokens + r] = tokens[static_cast<size_t>(r)];
  }
  for (int r = 0; r < n; ++r) {
    cuda::check(cudaMemcpyAsync(s.mtp_token, s.pinned + Impl::kPinEntryTokens + r, sizeof(int),
                                cudaMemcpyHostToDevice, s.stream),
                "copy");
    cuda::check(cudaMemcpyAsync(s.mtp_in, s.hidden + (first_row + r) * h, h * 4,
                                cudaMemcpyDeviceToDevice, s.stream),
                "copy");
    s.run(s.mtp_entry_graph, [&] { s.launch_mtp_entry(); });
  }
  cuda::check(cudaStreamSynchronize(s.stream), "mtp_entries");
  s.mtp_position += n;
}

void CudaEngine::Impl::copy_gdn_states(const std::vector<float*>& conv_from,
                                       const std::vector<float*>& ssm_from,
                                       const std::vector<float*>& conv_to,
                                       const std::vector<float*>& ssm_to) {
  const size_t conv_bytes = (kern::gdn_conv_state_floats(gdn) + 1) * 4;
  for (size_t l = 0; l < ssm_from.size(); ++l) {
    if (!ssm_from[l]) continue;
    cuda::check(
        cudaMemcpyAsync(conv_to[l], conv_from[l], conv_bytes, cudaMemcpyDeviceToDevice, stream),
        "copy");
    cuda::check(cudaMemcpyAsync(ssm_to[l], ssm_from[l], static_cast<size_t>(ssm_floats()) * 4,
                                cudaMemcpyDeviceToDevice, stream),
                "copy");
  }
}

void CudaEngine::Impl::put_fold_word(int count) {
  if (fold_on_device[0] == count && fold_on_device[1] == parity) return;
  pinned[kPinFold] = count;
  pinned[kPinFold + 1] = parity;
  cuda::check(cudaMemcpyAsync(fold_word, pinned + kPinFold, 2 * sizeof(int), cudaMemcpyHostToDevice,
                              stream),
              "copy");
  fold_on_device[0] = count, fold_on_device[1] = parity;
}

void CudaEngine::Impl::settle() {
  if (pending == 0) return;
  put_fold_word(pending);
  for (size_t l = 0; l < ssm.size(); ++l) {
    if (!replay[l]) continue;
    cuda::check(kern::gdn_fold(gdn, {replay[l], fold_word, false}, ssm[l], stream), "gdn_fold");
  }
  pending = 0;
}

void CudaEngine::Impl::reset() {
  verified = 0;
  pending = 0;
  for (size_t l = 0; l < conv.size(); ++l) {
    if (!conv[l]) continue;
    cuda::check(cudaMemsetAsync(conv[l], 0, kern::gdn_conv_state_floats(gdn) * 4, stream),
                "memset");
    cuda::check(cudaMemsetAsync(ssm[l], 0, static_cast<size_t>(ssm_floats()) * 4, stream),
                "memset");
  }
  cuda::check(cudaMemsetAsync(pos, 0, sizeof(int), stream), "memset");
  if (mtp_pos) cuda::check(cudaMemsetAsync(mtp_pos, 0, sizeof(int), stream), "memset");
  cuda::check(cudaStreamSynchronize(stream), "reset");
  position = 0;
  mtp_position = 0;
}

}  // namespace qf::rt
