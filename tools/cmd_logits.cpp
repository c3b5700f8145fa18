// qforge logits --model DIR (--tokens 1,2,3 | --text T) --out FILE: an engine's (--device cpu
// or cuda) F32 logits at every position of a prompt (and the MTP head's with --mtp), as
// safetensors.
#include <chrono>
#include <cstdio>
#include <memory>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/ckpt/writer.h"
#include "qf/error.h"
#include "qf/rt/cpu_engine.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/tokenizer.h"
#include "token_args.h"

namespace qf::tools {
namespace {

struct LogitsArgs {
  std::string model, tokens, text, out, device = "cpu";
  bool mtp = false, force = false, json = false;
  int threads = 0;
  rt::KvCacheType kv_cache = rt::KvCacheType::kF32;
};

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span<const float>(v));
}

// Logits at every position, and with `mtp` the MTP head's at t + 2 from the hidden state at t
// and the token at t + 1.
void cpu_logits(const rt::Model& model, const std::vector<int32_t>& ids, bool mtp_too, int threads,
                rt::KvCacheType kv, std::vector<float>& logits, std::vector<float>& mtp) {
  const int64_t vocab = model.config().vocab_size, t_len = static_cast<int64_t>(ids.size());
  const size_t h = static_cast<size_t>(model.config().hidden_size);
  rt::CpuEngine engine(model, threads, kv);
  std::vector<float> hidden(static_cast<size_t>(t_len) * h);
  for (int64_t t = 0; t < t_len; ++t) {
    engine.step(ids[static_cast<size_t>(t)], logits.data() + t * vocab);
    std::copy(engine.hidden().begin(), engine.hidden().end(), hidden.begin() + t * h);
  }
  if (!mtp_too) return;
  mtp.resize(static_cast<size_t>((t_len - 1) * vocab));
  for (int64_t t = 0; t + 1 < t_len; ++t) {
    engine.mtp_step(ids[static_cast<size_t>(t + 1)], hidden.data() + t * h, mtp.data() + t * vocab);
  }
}

// The same on the CUDA engine: with the MTP head two positions a pass (verify2: two steps'
// logits), the head taking each position's hidden state on the device right after the pass (its
// state is its own, so the order does not change the result); without it every position in one
// call (advance: batched prefill, equal to steps up to the order of the sums).
void cuda_logits(const rt::Model& model, const std::vector<int32_t>& ids, bool mtp_too,
                 rt::KvCacheType kv, std::vector<float>& logits, std::vector<float>& mtp) {
  const int64_t vocab = model.config().vocab_size, t_len = static_cast<int64_t>(ids.size());
  rt::CudaOptions o;
  o.max_context = std::max<int64_t>(t_len, 16);
  o.mtp = mtp_too;
  o.kv_cache = kv;
  rt::CudaEngine engine(model, o);
  if (mtp_too) mtp.resize(static_cast<size_t>((t_len - 1) * vocab));
  std::vector<int32_t> top(static_cast<size_t>(t_len));
  for (int64_t t = 0; t < t_len;) {
    const int take = static_cast<int>(mtp_too ? std::min<int64_t>(2, t_len - t) : t_len - t);
    engine.advance({ids.data() + t, static_cast<size_t>(take)}, top.data() + t,
                   logits.data() + t * vocab);
    for (int r = 0; r < take; ++r, ++t) {
      if (mtp_too && t + 1 < t_len) {
        engine.draft(r, ids[static_cast<size_t>(t + 1)], mtp.data() + t * vocab);
      }
    }
  }
}

int run(const LogitsArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::unique_ptr<rt::Model> model = rt::Model::load(a.model);
  const std::vector<int32_t> ids = prompt_ids(a.model, a.tokens, a.text);
  const int64_t vocab = model->config().vocab_size, t_len = static_cast<int64_t>(ids.size());
  if (a.mtp && !model->mtp()) {
    throw Error(Errc::kUnsupported, a.model + " has no MTP head (mtp.* tensors); drop --mtp");
  }
  std::vector<float> logits(static_cast<size_t>(t_len * vocab)), mtp;
  if (a.device == "cuda") {
    cuda_logits(*model, ids, a.mtp, a.kv_cache, logits, mtp);
  } else {
    cpu_logits(*model, ids, a.mtp, a.threads, a.kv_cache, logits, mtp);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<ckpt::TensorSpec> specs = {
      {"tokens", ckpt::DType::kI32, {static_cast<uint64_t>(t_len)}},
      {"logits", ckpt::DType::kF32, {static_cast<uint64_t>(t_len), static_cast<uint64_t>(vocab)}}};
  if (a.mtp && t_len > 1) {
    specs.push_back({"mtp_logits",
                     ckpt::DType::kF32,
                     {static_cast<uint64_t>(t_len - 1), static_cast<uint64_t>(vocab)}});
  }
  ckpt::WriterOptions wo;
  wo.overwrite = a.force;
  ckpt::SafetensorsWriter w(a.out, ckpt::plan_safetensors(specs, ckpt::Metadata{{"format", "pt"}}),
                            wo);
  for (const ckpt::TensorInfo& info : w.plan().layout) {
    if (info.name == "tokens") w.write_tensor(info.name, std::as_bytes(std::span(ids)));
    if (info.name == "logits") w.write_tensor(info.name, bytes_of(logits));
    if (info.name == "mtp_logits") w.write_tensor(info.name, bytes_of(mtp));
  }
  w.commit();

  const float* last = logits.data() + (t_len - 1) * vocab;
  const int64_t top = std::max_element(last, last + vocab) - last;
  if (a.json) {
    const nlohmann::json j = {{"model", a.model},  {"out", a.out}, {"tokens", t_len},
                              {"vocab", vocab},    {"mtp", a.mtp}, {"last_argmax", top},
                              {"seconds", seconds}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s: logits [%lld, %lld]%s for %lld tokens in %.2f s; last position argmax %lld\n",
              a.out.c_str(), static_cast<long long>(t_len), static_cast<long long>(vocab),
              a.mtp ? " and mtp_logits" : "", static_cast<long long>(t_len), seconds,
              static_cast<long long>(top));
  return kExitOk;
}

}  // namespace

Command add_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* sub = app.add_subcommand(
      "logits", "F32 logits at every position of a prompt, from the CPU reference engine or CUDA");
  sub->add_option("--model", a->model, "model directory (any layout qforge reads)")->required();
  auto* tokens = sub->add_option("--tokens", a->tokens, "prompt as token ids: 1,2,3");
  auto* text = sub->add_option("--text", a->text, "prompt text (tokenized with tokenizer.json)");
  tokens->excludes(text);
  sub->add_option("--out", a->out, "output .safetensors: tokens I32 [T], logits F32 [T, V]")
      ->required();
  sub->add_flag("--mtp", a->mtp, "also mtp_logits F32 [T-1, V]: the MTP head at t+2 for t < T-1");
  sub->add_flag("--force", a->force, "replace an existing OUT");
  sub->add_option("--device", a->device, "cpu (the reference engine) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  add_threads_option(sub, &a->threads, "worker threads");
  add_kv_cache_option(sub, &a->kv_cache);
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "The reference engine runs the prompt one token at a time in fp32, weights reconstructed\n"
      "exactly from their stored format (BF16, INT4/INT8 GPTQ, FP8 block).\n\n"
      "Example:\n  qforge logits --model /models/tiny --text \"Hello\" --out "
      "/tmp/logits.safetensors");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
