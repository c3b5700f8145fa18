#include "qf/quant/synth.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "planned_writer.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/shard_plan.h"
#include "qf/ckpt/writer.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::TensorDecl;

constexpr size_t kChunkBytes = 4u << 20;

}  // namespace

SynthPlan plan_synth(const ckpt::Qwen35Config& config, const SynthOptions& o) {
  SynthPlan plan;
  plan.tensors = ckpt::qwen35_tensors(config, o.layout, o.schema);
  std::vector<uint64_t> main_sizes;
  std::vector<size_t> main_idx;
  std::map<std::string, std::vector<size_t>> sidecars;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorDecl& d = plan.tensors[i];
    if (d.file.empty()) {
      main_sizes.push_back(ckpt::tensor_bytes({d.name, d.dtype, d.shape}));
      main_idx.push_back(i);
    } else {
      sidecars[d.file].push_back(i);
    }
  }
  const std::vector<size_t> shard = o.shards > 0
                                        ? ckpt::plan_shards_by_count(main_sizes, o.shards)
                                        : ckpt::plan_shards_by_size(main_sizes, o.shard_bytes);
  const size_t n_shards = shard.empty() ? 0 : shard.back() + 1;
  plan.file_of.assign(plan.tensors.size(), 0);
  for (size_t s = 0; s < n_shards; ++s)
    plan.files.push_back({ckpt::shard_file_name(s, n_shards), 0, 0});
  for (size_t j = 0; j < main_idx.size(); ++j) plan.file_of[main_idx[j]] = shard[j];
  for (const auto& [name, idx] : sidecars) {
    plan.files.push_back({name, 0, 0});
    for (size_t i : idx) plan.file_of[i] = plan.files.size() - 1;
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorDecl& d = plan.tensors[i];
    const uint64_t b = ckpt::tensor_bytes({d.name, d.dtype, d.shape});
    SynthFile& f = plan.files[plan.file_of[i]];
    ++f.n_tensors;
    f.tensor_bytes += b;
    plan.tensor_bytes += b;
  }
  return plan;
}

std::string synth_quantization_config(const ckpt::Qwen35Config& c, const SynthOptions& o) {
  using nlohmann::json;
  const int64_t n_layers =
      o.schema.layers < 0 ? c.num_layers() : std::min(o.schema.layers, c.num_layers());
  if (o.layout == ckpt::Qwen35Layout::kIntelInt4) {
    // AutoRound's export (checkpoint-formats.md §2.7): shared experts and their gate stay 16-bit
    // through per-module extra_config entries.
    json extra = json::object();
    auto keep_16bit = [&](const std::string& layer) {
      for (const char* m : {"mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                            "mlp.shared_expert.down_proj", "mlp.shared_expert_gate"}) {
        extra[layer + m] = {{"bits", 16}, {"data_type", "float"}};
      }
    };
    for (int64_t i = 0; i < n_layers; ++i)
      keep_16bit("model.language_model.layers." + std::to_string(i) + ".");
    std::string blocks = "model.language_model.layers";
    if (o.schema.mtp_int4 && o.schema.mtp) {
      blocks += ",mtp.layers";
      for (int64_t i = 0; i < c.mtp_num_hidden_layers; ++i)
        keep_16bit("mtp.layers." + std::to_string(i) + ".");
    }
    return json{{"quant_method", "auto-round"},
                {"packing_format", "auto_round:auto_gptq"},
                {"bits", 4},
                {"group_size", o.schema.group_size},
                {"sym", true},
                {"data_type", "int"},
                {"block_name_to_quantize", blocks},
                {"extra_config", extra}}
        .dump();
  }
  if (o.layout == ckpt::Qwen35Layout::kQwenFp8) {
    // Substrings, as transformers matches them; Qwen's exact list is not known (formats doc §3.3).
    const json keep =
        json::array({"lm_head", "model.visual", "mtp.fc", "mlp.gate", "shared_expert_gate",
                     "linear_attn.in_proj_a", "linear_attn.in_proj_b"});
    return json{{"quant_method", "fp8"},
                {"fmt", "e4m3"},
                {"activation_scheme", "dynamic"},
                {"weight_block_size", {o.schema.fp8_block, o.schema.fp8_block}},
                {"modules_to_not_convert", keep}}
        .dump();
  }
  return "";
}

ckpt::Qwen35Config effective_config(const ckpt::Qwen35Config& config, const SynthOptions& o) {
  ckpt::Qwen35Config c = config;
  if (o.schema.layers >= 0 && o.schema.layers < c.num_layers()) {
    c.full_attention.resize(static_cast<size_t>(o.schema.layers));  // a smaller, whole model
  }
  if (!o.schema.mtp) c.mtp_num_hidden_layers = 0;
  if (!o.schema.vision) c.vision.depth = 0;
  return c;
}

void write_configs(const fs::path& stage, const ckpt::Qwen35Config& config, const SynthOptions& o) {
  const std::string qcfg = synth_quantization_config(config, o);
  ckpt::write_file_atomic(stage / "config.json", ckpt::qwen35_config_json(config, qcfg), true);
  if (o.layout == ckpt::Qwen35Layout::kIntelInt4) {
    ckpt::write_file_atomic(stage / "quantization_config.json",
                            nlohmann::json::parse(qcfg).dump(2) + "\n", true);
  }
}

SynthPlan synth_checkpoint(const ckpt::Qwen35Config& config, const fs::path& out_dir,
                           const SynthOptions& o, ckpt::Progress* progress) {
  const ckpt::Qwen35Config cfg = effective_config(config, o);
  SynthPlan plan = plan_synth(cfg, o);
  if (progress) progress->total = plan.tensor_bytes;
  detail::PlannedWrite pw;
  pw.overwrite = o.overwrite;
  pw.sparse_zeros = o.values == SynthValues::kZeros;
  pw.threads = o.threads;
  auto produce = [&](const TensorDecl& d, ckpt::SafetensorsWriter& w) {
    const uint64_t n = ckpt::tensor_bytes({d.name, d.dtype, d.shape});
    if (o.values == SynthValues::kZeros && d.role != ckpt::TensorRole::kQZeros) {
      w.write_zeros(n);
    } else {
      std::vector<std::byte> buf(static_cast<size_t>(std::min<uint64_t>(kChunkBytes, n)));
      for (uint64_t off = 0; off < n; off += kChunkBytes) {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, n - off));
        synth_tensor_bytes(d, o.values, o.seed, off, {buf.data(), take});
        w.write(buf.data(), take);
      }
    }
    if (progress) progress->done.fetch_add(n, std::memory_order_relaxed);
  };
  detail::write_planned_checkpoint(plan, out_dir, pw, produce,
                                   [&](const fs::path& stage) { write_configs(stage, cfg, o); });
  return plan;
}

}  // namespace qf::quant
