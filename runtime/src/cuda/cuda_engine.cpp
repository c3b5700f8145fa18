#include "qf/rt/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include "engine_impl.h"
#include "qf/error.h"
#include "qf/kern/attention.h"
#include "qf/kern/gdn.h"
#include "qf/rt/generate.h"

namespace qf::rt {

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
  check_cuda_options(options);
  std::string why;
  if (!available(&why)) throw Error(Errc::kUnsupported, "--device cuda: " + why);
  cuda::check(cudaSetDevice(options.device), "cudaSetDevice");
  impl_ =
      std::make_unique<Impl>(cuda::upload_model(model, options.fused_swiglu, options.mtp), options);
}

std::unique_ptr<CudaEngine> CudaEngine::synthetic(const ckpt::Qwen35Config& config, uint64_t seed,
                                                  const CudaOptions& options,
                                                  SyntheticFormat format) {
  check_cuda_options(options);
  std::string why;
  if (!available(&why)) throw Error(Errc::kUnsupported, "--device cuda: " + why);
  cuda::check(cudaSetDevice(options.device), "cudaSetDevice");
  return std::unique_ptr<CudaEngine>(new CudaEngine(std::make_unique<Impl>(
      cuda::synthetic_model(config, seed, options.fused_swiglu, options.mtp, format), options)));
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

void CudaEngine::snapshot() {
  Impl& s = *impl_;
  if (!s.o.snapshots) throw Error(Errc::kUsage, "snapshot: CudaOptions::snapshots is off");
  s.settle();
  s.copy_gdn_states(s.conv, s.ssm, s.conv_snap, s.ssm_snap);
  cuda::check(cudaStreamSynchronize(s.stream), "snapshot");
  s.snap_position = s.position;
  s.snap_mtp_position = s.mtp_position;
}

void CudaEngine::restore_snapshot() {
  Impl& s = *impl_;
  if (s.snap_position < 0) throw Error(Errc::kUsage, "restore_snapshot: no snapshot was taken");
  s.verified = 0;
  s.pending = 0;  // the snapshot's states were settled
  s.copy_gdn_states(s.conv_snap, s.ssm_snap, s.conv, s.ssm);
  s.pinned[9] = static_cast<int>(s.snap_position);
  cuda::check(cudaMemcpyAsync(s.pos, s.pinned + 9, sizeof(int), cudaMemcpyHostToDevice, s.stream),
              "copy");
  if (s.mtp_pos) {  // the MTP head's cache rows before its position stay valid as the main's
    s.pinned[10] = static_cast<int>(s.snap_mtp_position);
    cuda::check(
        cudaMemcpyAsync(s.mtp_pos, s.pinned + 10, sizeof(int), cudaMemcpyHostToDevice, s.stream),
        "copy");
  }
  cuda::check(cudaStreamSynchronize(s.stream), "restore_snapshot");
  s.position = s.snap_position;
  s.mtp_position = s.snap_mtp_position;
}

int32_t CudaEngine::step(int32_t token, float* logits) {
  return impl_->step(token, {logits, 0, nullptr});
}

int32_t CudaEngine::Impl::step(int32_t id, const Out& out) {
  Impl& s = *this;
  s.verified = 0;
  const int64_t vocab = s.m->config.vocab_size;
  if (id < 0 || id >= vocab) {
    throw Error(Errc::kUsage, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
  }
  s.before_step(s.position);
  s.pinned[0] = id;
  cuda::check(cudaMemcpyAsync(s.token, s.pinned, sizeof(int), cudaMemcpyHostToDevice, s.stream),
              "copy");
  s.run_step();
  cuda::check(cudaMemcpyAsync(s.pinned + 1, s.next, sizeof(int), cudaMemcpyDeviceToHost, s.stream),
              "copy");
  s.queue_out(s.logits, 1, out);
  cuda::check(cudaStreamSynchronize(s.stream), "decode step");
  s.take_out(1, out);
  ++s.position;
  return s.pinned[1];
}

static_assert(kTopKCandidates == kern::kTopKMax, "generate asks step_top for what it selects");

int32_t CudaEngine::step_top(int32_t token, int k, TopLogits& out) {
  Impl::check_top_k(k);
  return impl_->step(token, {nullptr, k, &out});
}

int32_t CudaEngine::step_greedy() {
  Impl& s = *impl_;
  s.verified = 0;
  s.before_step(s.position);
  s.run_step();
  cuda::check(cudaMemcpyAsync(s.pinned + 1, s.next, sizeof(int), cudaMemcpyDeviceToHost, s.stream),
              "copy");
  cuda::check(cudaStreamSynchronize(s.stream), "decode step");
  ++s.position;
  return s.pinned[1];
}

void CudaEngine::hidden(float* out) {
  Impl& s = *impl_;
  cuda::check(cudaMemcpyAsync(out, s.hidden, static_cast<size_t>(s.m->config.hidden_size) * 4,
                              cudaMemcpyDeviceToHost, s.stream),
              "copy");
  cuda::check(cudaStreamSynchronize(s.stream), "copying the hidden state");
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
                    hidden ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                    {logits, 0, nullptr});
}

void CudaEngine::verify2(const int32_t tokens[2], int32_t top[2], float* logits) {
  impl_->verify({tokens, 2}, top, {logits, 0, nullptr});
}

void CudaEngine::verify2_top(const int32_t tokens[2], int32_t top[2], int k, TopLogits out[2]) {
  Impl::check_top_k(k);
  impl_->verify({tokens, 2}, top, {nullptr, k, out});
}

void CudaEngine::verify(std::span<const int32_t> tokens, int32_t* top, float* logits) {
  impl_->verify(tokens, top, {logits, 0, nullptr});
}

void CudaEngine::Impl::verify(std::span<const int32_t> tokens, int32_t* top, const Out& out) {
  Impl& s = *this;
  const int n = static_cast<int>(tokens.size());
  if (n < 2 || n > kMaxVerify) {
    throw Error(Errc::kUsage, "verify: " + std::to_string(n) + " tokens (2 to " +
                                  std::to_string(kMaxVerify) + " a pass)");
  }
  const int64_t vocab = s.m->config.vocab_size;
  for (int r = 0; r < n; ++r) {
    if (tokens[r] < 0 || tokens[r] >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(tokens[r]) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
  }
  s.before_step(s.position + n - 1);
  int* p = s.pinned;
  for (int r = 0; r < n; ++r) {
    p[kPinTokens + r] = tokens[r];
    p[kPinPositions + r] = static_cast<int>(s.position + r);
  }
  p[kPinStepPos] = static_cast<int>(s.position + n);  // the single-token step's after them
  cuda::check(
      cudaMemcpyAsync(s.vtoken, p + kPinTokens, n * sizeof(int), cudaMemcpyHostToDevice, s.stream),
      "copy");
  cuda::check(
      cudaMemcpyAsync(s.vpos, p + kPinPositions, n * sizeof(int), cudaMemcpyHostToDevice, s.stream),
      "copy");
  s.put_fold_word(s.pending);  // the last verify's kept tokens, folded by this one
  s.run(n == 2 ? s.verify_graph : s.verify3_graph, [&] { s.launch_verify(n); });
  cuda::check(
      cudaMemcpyAsync(s.pos, p + kPinStepPos, sizeof(int), cudaMemcpyHostToDevice, s.stream),
      "copy");
  cuda::check(
      cudaMemcpyAsync(p + kPinArgmax, s.vnext, n * sizeof(int), cudaMemcpyDeviceToHost, s.stream),
      "copy");
  s.queue_out(s.logits, n, out);
  cuda::check(cudaStreamSynchronize(s.stream), "verify");
  s.take_out(n, out);
  s.position += n;
  s.verified = s.m->mtp.has_value() ? n : 0;  // it defers the DeltaNet states with the head only
  if (s.verified > 0) {                       // every token kept, until reject says otherwise
    s.pending = n;
    s.parity ^= 1;
  }
  std::copy_n(p + kPinArgmax, n, top);
}

void CudaEngine::advance(std::span<const int32_t> tokens, int32_t* top, float* logits) {
  const size_t v = static_cast<size_t>(impl_->m->config.vocab_size);
  if (tokens.empty()) throw Error(Errc::kUsage, "advance: no tokens");
  if (tokens.size() >= 3 && impl_->pf.cap > 0) {
    impl_->prefill_rows(tokens, top, logits);
    return;
  }
  for (size_t i = 0; i < tokens.size();) {  // pairs, then a step for an odd count
    if (i + 2 <= tokens.size()) {
      verify2(tokens.data() + i, top + i, logits ? logits + i * v : nullptr);
      i += 2;
    } else {
      top[i] = step(tokens[i], logits ? logits + i * v : nullptr);
      i += 1;
    }
  }
}

void CudaEngine::reject_last() {
  reject(1);
}

void CudaEngine::reject(int n) {
  Impl& s = *impl_;
  if (s.verified == 0 || n < 1 || n >= s.verified) {
    throw Error(Errc::kUsage, "reject " + std::to_string(n) +
                                  ": the last call was not a verify of more tokens with the MTP "
                                  "head loaded");
  }
  // The states wait for the next verify or settle() to fold the kept tokens: the rejected ones
  // are simply not folded (the conv rings keep every position's history).
  s.pending -= n;
  s.verified = 0;
  s.pinned[9] = static_cast<int>(s.position - n);
  cuda::check(cudaMemcpyAsync(s.pos, s.pinned + 9, sizeof(int), cudaMemcpyHostToDevice, s.stream),
              "copy");
  cuda::check(cudaStreamSynchronize(s.stream), "reject");
  s.position -= n;
}

int32_t CudaEngine::draft(int row, int32_t next_token, float* logits) {
  Impl& s = *impl_;
  if (row < 0 || row >= Impl::kMaxVerify) {
    throw Error(Errc::kUsage, "draft: row must be 0 to " + std::to_string(Impl::kMaxVerify - 1));
  }
  return s.mtp_step(next_token, s.hidden + static_cast<int64_t>(row) * s.m->config.hidden_size,
                    cudaMemcpyDeviceToDevice, {logits, 0, nullptr});
}

int32_t CudaEngine::draft_top(int row, int32_t next_token, int k, TopLogits& out) {
  Impl& s = *impl_;
  if (row < 0 || row >= Impl::kMaxVerify) {
    throw Error(Errc::kUsage, "draft: row must be 0 to " + std::to_string(Impl::kMaxVerify - 1));
  }
  Impl::check_top_k(k);
  return s.mtp_step(next_token, s.hidden + static_cast<int64_t>(row) * s.m->config.hidden_size,
                    cudaMemcpyDeviceToDevice, {nullptr, k, &out});
}

int32_t CudaEngine::draft_chain(int32_t next_token, float* logits) {
  Impl& s = *impl_;
  if (s.m->mtp && s.mtp_position == 0) {
    throw Error(Errc::kUsage, "draft_chain: the MTP head has made no step to go on from");
  }
  return s.mtp_step(next_token, s.mtp_hidden, cudaMemcpyDeviceToDevice, {logits, 0, nullptr});
}

void CudaEngine::mtp_rewind(int n) {
  Impl& s = *impl_;
  if (n < 0 || n > s.mtp_position) {
    throw Error(Errc::kUsage, "mtp_rewind " + std::to_string(n) + " from MTP position " +
                                  std::to_string(s.mtp_position));
  }
  if (n == 0) return;
  s.mtp_position -= n;
  s.upload_mtp_position();
  cuda::check(cudaStreamSynchronize(s.stream), "mtp_rewind");  // the pinned word is read
}

namespace {

// Time and bytes per family between the events `marks` recorded (after the stream's sync).
std::vector<KernelShare> shares_of(cuda::Marks& marks) {
  std::vector<KernelShare> out;
  for (size_t i = 1; i < marks.events.size(); ++i) {
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, marks.events[i - 1], marks.events[i]),
                "cudaEventElapsedTime");
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

}  // namespace

std::vector<KernelShare> CudaEngine::profile_step() {
  Impl& s = *impl_;
  s.verified = 0;
  s.before_step(s.position);
  s.settle();  // before the marks: not the step's work
  cuda::Marks marks;
  marks.stream = s.stream;
  marks.mark("start", 0);
  s.marks = &marks;
  s.launch_step();
  s.marks = nullptr;
  cuda::check(cudaStreamSynchronize(s.stream), "profiled step");
  ++s.position;
  return shares_of(marks);
}

std::vector<KernelShare> CudaEngine::profile_prefill(std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  if (s.pf.cap == 0) throw Error(Errc::kUsage, "profile_prefill: prefill_chunk is 0");
  const int n = static_cast<int>(std::min<size_t>(tokens.size(), s.pf.cap));
  if (n == 0) throw Error(Errc::kUsage, "profile_prefill: no tokens");
  cuda::Marks marks;
  marks.stream = s.stream;
  s.marks = &marks;
  try {
    s.prefill_pass(tokens.data(), n, nullptr, nullptr);
  } catch (...) {
    s.marks = nullptr;
    throw;
  }
  s.marks = nullptr;
  cuda::check(cudaStreamSynchronize(s.stream), "profiled prefill");
  return shares_of(marks);
}

namespace {

// Mean microseconds of `n` calls of `one` on `stream`, between two events, after one warm call
// (which captures a graph).
template <class F>
double mean_us(cudaStream_t stream, int n, F one) {
  cudaEvent_t a, b;
  cuda::check(cudaEventCreate(&a), "cudaEventCreate");
  cuda::check(cudaEventCreate(&b), "cudaEventCreate");
  one();
  cuda::check(cudaEventRecord(a, stream), "cudaEventRecord");
  for (int i = 0; i < n; ++i) one();
  cuda::check(cudaEventRecord(b, stream), "cudaEventRecord");
  cuda::check(cudaEventSynchronize(b), "timed steps");
  float ms = 0;
  cuda::check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1000.0 / n;
}

}  // namespace

double CudaEngine::time_steps(int steps) {
  Impl& s = *impl_;
  s.verified = 0;
  return mean_us(s.stream, steps, [&] {
    s.before_step(s.position);
    s.run_step();
    ++s.position;
  });
}

double CudaEngine::time_mtp_steps(int steps) {
  Impl& s = *impl_;
  if (!s.m->mtp) throw Error(Errc::kUnsupported, "no MTP head to time (CudaOptions::mtp)");
  if (steps < 1 || s.mtp_position + steps + 1 > s.o.max_context) {
    throw Error(Errc::kUsage,
                "time_mtp_steps: " + std::to_string(steps) + " steps do not fit the MTP context");
  }
  const size_t h_bytes = static_cast<size_t>(s.m->config.hidden_size) * 4;
  return mean_us(s.stream, steps, [&] {
    cuda::check(cudaMemcpyAsync(s.mtp_in, s.hidden, h_bytes, cudaMemcpyDeviceToDevice, s.stream),
                "copy");
    s.run(s.mtp_graph, [&] { s.launch_mtp(); });
    ++s.mtp_position;
  });
}

double device_copy_bandwidth(uint64_t bytes) {
  void *src = nullptr, *dst = nullptr;
  cuda::check(cudaMalloc(&src, bytes), "cudaMalloc");
  cuda::check(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaEvent_t a, b;
  cuda::check(cudaEventCreate(&a), "cudaEventCreate");
  cuda::check(cudaEventCreate(&b), "cudaEventCreate");
  cuda::check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "warm copy");
  const int reps = 10;
  cuda::check(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < reps; ++i)
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
  cuda::check(cudaEventRecord(b), "cudaEventRecord");
  cuda::check(cudaEventSynchronize(b), "copies");
  float ms = 0;
  cuda::check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

}  // namespace qf::rt
