#include "qf/quant/model_check.h"

#include <fcntl.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "qf/ckpt/file_io.h"
#include "qf/ckpt/qwen35_schema.h"
#include "qf/quant/quant_config.h"
#include "qf/quant/stored_linear.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;
using ckpt::Problem;
using ckpt::Shape;

std::string describe(const ckpt::TensorInfo& t) {
  return std::string(ckpt::dtype_name(t.dtype)) + " " + ckpt::shape_to_string(t.shape);
}

uint64_t u(int64_t v) {
  return static_cast<uint64_t>(v);
}
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Checks one tensor's dtype and shape; records it as explained.
bool expect(const ckpt::Checkpoint& c, const std::string& name, std::initializer_list<DType> dtypes,
            const Shape& shape, std::vector<Problem>& problems,
            std::vector<std::string>* consumed) {
  const ckpt::TensorRef* r = c.find(name);
  if (!r) {
    problems.push_back(
        {Errc::kModelTensorMissing, "", name, "expected " + ckpt::shape_to_string(shape)});
    return false;
  }
  if (consumed) consumed->push_back(name);
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), r->info->dtype) != dtypes.end();
  if (!dtype_ok || r->info->shape != shape) {
    std::string want;
    for (DType d : dtypes) want += (want.empty() ? "" : "/") + std::string(ckpt::dtype_name(d));
    problems.push_back(
        {Errc::kModelTensorShape, c.file_name(*r->file), name,
         "is " + describe(*r->info) + ", expected " + want + " " + ckpt::shape_to_string(shape)});
    return false;
  }
  return true;
}

std::string linear_format(const ckpt::Checkpoint& c, const std::string& m, int64_t n, int64_t k,
                          int64_t group, int64_t block, std::vector<Problem>& problems,
                          std::vector<std::string>* consumed) {
  const ckpt::TensorRef* w = c.find(m + ".weight");
  const ckpt::TensorRef* qw = c.find(m + ".qweight");
  if (w && qw) {
    problems.push_back({Errc::kModelTensorUnexpected, "", m,
                        "has both weight and qweight; loaders would see two formats"});
    return "";
  }
  if (qw) {
    const uint64_t rows = qw->info->shape.empty() ? 0 : qw->info->shape[0];
    const int bits = rows * 8 == u(k) ? 4 : rows * 4 == u(k) ? 8 : 0;
    if (bits == 0) {
      problems.push_back({Errc::kModelTensorShape, c.file_name(*qw->file), m + ".qweight",
                          "is " + describe(*qw->info) + ", expected I32 [K/8 or K/4, N] with K = " +
                              std::to_string(k) + ", N = " + std::to_string(n)});
      if (consumed) consumed->push_back(m + ".qweight");
      return "";
    }
    const int64_t per_word = 32 / bits, groups = ceil_div(k, group);
    bool ok = expect(c, m + ".qweight", {DType::kI32}, {u(k / per_word), u(n)}, problems, consumed);
    ok &= expect(c, m + ".qzeros", {DType::kI32}, {u(groups), u(n / per_word)}, problems, consumed);
    ok &= expect(c, m + ".scales", {DType::kF16}, {u(groups), u(n)}, problems, consumed);
    return ok ? (bits == 4 ? "int4" : "int8") : "";
  }
  if (!w) {
    problems.push_back({Errc::kModelTensorMissing, "", m, "no weight and no qweight"});
    return "";
  }
  if (w->info->dtype == DType::kF8E4M3) {
    bool ok = expect(c, m + ".weight", {DType::kF8E4M3}, {u(n), u(k)}, problems, consumed);
    if (!c.find(m + ".weight_scale_inv")) {
      problems.push_back({Errc::kModelTensorMissing, c.file_name(*w->file), m + ".weight_scale_inv",
                          "an F8_E4M3 weight needs its block scale"});
      return "";
    }
    ok &= expect(c, m + ".weight_scale_inv", {DType::kF32, DType::kBF16, DType::kF16},
                 {u(ceil_div(n, block)), u(ceil_div(k, block))}, problems, consumed);
    return ok ? "fp8" : "";
  }
  // BF16 as released; F32 as `qforge dequantize --dtype f32` writes.
  if (!expect(c, m + ".weight", {DType::kBF16, DType::kF32}, {u(n), u(k)}, problems, consumed)) {
    return "";
  }
  return w->info->dtype == DType::kF32 ? "f32" : "bf16";
}

// What the quantization_config says about a module stored as `format`.
void check_quant_config(const nlohmann::json& qcfg, const IncResolver* inc,
                        const std::string& module, const std::string& format,
                        std::vector<Problem>& problems) {
  if (format.empty()) return;
  // The MoE router is built unquantized by vLLM (quant_config=None) and transformers (a plain
  // parameter, not nn.Linear), whatever quantization_config says: it only has to be BF16.
  constexpr std::string_view kRouter = ".mlp.gate";
  if (module.size() > kRouter.size() && module.substr(module.size() - kRouter.size()) == kRouter) {
    if (format != "bf16" && format != "f32") {
      problems.push_back(
          {Errc::kQuantConfigMismatch, "", module,
           "the MoE router is stored " + format + "; loaders build it unquantized (BF16)"});
    }
    return;
  }
  const std::string method = qcfg.is_object() ? qcfg.value("quant_method", "") : "";
  if (inc) {
    const int bits = inc->bits(module);
    const int stored = format == "int4" ? 4 : format == "int8" ? 8 : 16;
    if ((stored < 16) != (bits < 16) || (stored < 16 && bits != stored)) {
      problems.push_back({Errc::kQuantConfigMismatch, "", module,
                          "stored " + format + " but quantization_config gives it " +
                              std::to_string(bits) + " bits (INC would expect " +
                              (bits < 16 ? "qweight/qzeros/scales" : "a 16-bit weight") + ")"});
    }
  } else if (method == "fp8") {
    bool not_converted = module == "lm_head";  // transformers never converts lm_head
    for (const auto& key : qcfg.value("modules_to_not_convert", nlohmann::json::array())) {
      if (key.is_string() && module.find(key.get<std::string>()) != std::string::npos)
        not_converted = true;
    }
    if (format == "fp8" && not_converted) {
      problems.push_back({Errc::kQuantConfigMismatch, "", module,
                          "stored FP8 but listed in modules_to_not_convert"});
    } else if (format != "fp8" && !not_converted) {
      problems.push_back({Errc::kQuantConfigMismatch, "", module,
                          "stored " + format +
                              " but the fp8 quantization_config expects FP8 (add it to "
                              "modules_to_not_convert)"});
    }
  } else if (format != "bf16" && format != "f32") {
    problems.push_back({Errc::kQuantConfigMismatch, "", module,
                        "stored " + format + " but config.json has no quantization_config for it"});
  }
}

// GPTQ qzeros of a symmetric config must all hold the symmetric constant (v1: zero - 1).
void check_qzeros(const ckpt::Checkpoint& c, const std::string& module, const std::string& format,
                  std::vector<Problem>& problems) {
  const uint32_t want = format == "int4" ? 0x77777777u : 0x7F7F7F7Fu;
  // pread without readahead, not the mapping: tens of thousands of small reads would otherwise
  // each pull in (and keep mapped) 128 KiB of their neighbours.
  const ckpt::TensorRef* ref = c.find(module + ".qzeros");
  std::vector<uint32_t> words(ref->info->n_bytes() / 4);
  const int fd = ref->file->map().fd();
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  ckpt::pread_all(fd, words.data(), words.size() * 4,
                  ref->file->header().data_offset() + ref->info->begin, ref->file->path());
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_NORMAL);
  size_t bad = 0;
  for (const uint32_t w : words) bad += w != want;
  if (bad) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08X", want);
    problems.push_back(
        {Errc::kQZerosNotSymmetric, c.file_name(*c.find(module + ".qzeros")->file),
         module + ".qzeros",
         std::to_string(bad) + " words differ from " + hex + " (sym in quantization_config)"});
  }
}

// Counts NaN/Inf in a float tensor's bytes.
uint64_t count_non_finite(DType dtype, const std::byte* p, uint64_t n) {
  uint64_t bad = 0;
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16: {
      const uint16_t mask = dtype == DType::kBF16 ? 0x7F80 : 0x7C00;
      for (uint64_t i = 0; i + 2 <= n; i += 2) {
        uint16_t h;
        std::memcpy(&h, p + i, 2);
        bad += (h & mask) == mask;
      }
      return bad;
    }
    case DType::kF32:
      for (uint64_t i = 0; i + 4 <= n; i += 4) {
        uint32_t w;
        std::memcpy(&w, p + i, 4);
        bad += (w & 0x7F800000u) == 0x7F800000u;
      }
      return bad;
    case DType::kF8E4M3:
      for (uint64_t i = 0; i < n; ++i) bad += (static_cast<uint8_t>(p[i]) & 0x7F) == 0x7F;
      return bad;
    case DType::kF8E5M2:
      for (uint64_t i = 0; i < n; ++i) bad += (static_cast<uint8_t>(p[i]) & 0x7C) == 0x7C;
      return bad;
    default:
      return 0;
  }
}

void scan_values(const ckpt::Checkpoint& c, const ModelCheckOptions& o, ModelCheckStats& stats,
                 std::vector<Problem>& problems) {
  const auto& files = c.tensor_files();
  if (o.progress) {
    uint64_t total = 0;
    for (const auto& f : files) total += f.header().data_bytes;
    o.progress->total = total;
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::atomic<uint64_t> scanned{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < files.size();) {
      const ckpt::SafetensorsFile& f = files[i];
      for (const ckpt::TensorInfo& t : f.tensors()) {
        const ckpt::TensorView v = f.view(t);
        const uint64_t bad = count_non_finite(t.dtype, v.bytes.data(), v.bytes.size());
        f.release(t.begin, t.n_bytes());
        scanned += t.n_bytes();
        if (o.progress) o.progress->done.fetch_add(t.n_bytes(), std::memory_order_relaxed);
        if (bad) {
          std::lock_guard<std::mutex> lock(mu);
          problems.push_back({Errc::kNonFiniteValues, c.file_name(f), t.name,
                              std::to_string(bad) + " NaN/Inf values"});
        }
      }
    }
  };
  int threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  stats.scanned_bytes = scanned;
}

}  // namespace

std::string check_linear_module(const ckpt::Checkpoint& c, const std::string& module, int64_t n,
                                int64_t k, int64_t group, int64_t block,
                                std::vector<Problem>& problems,
                                std::vector<std::string>* consumed) {
  return linear_format(c, module, n, k, group, block, problems, consumed);
}

bool check_plain_tensor(const ckpt::Checkpoint& c, const std::string& name,
                        std::initializer_list<DType> dtypes, const Shape& shape,
                        std::vector<Problem>& problems, std::vector<std::string>* consumed) {
  return expect(c, name, dtypes, shape, problems, consumed);
}

ModelCheckStats check_qwen35_model(const ckpt::Checkpoint& c, const ModelCheckOptions& o,
                                   std::vector<Problem>& problems) {
  ModelCheckStats stats;
  const fs::path cfg_path = c.root() / "config.json";
  std::error_code ec;
  if (c.is_single_file() || !fs::exists(cfg_path, ec)) {
    stats.skipped_because = "no config.json";
    if (o.scan_values) scan_values(c, o, stats, problems);
    return stats;
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(ckpt::read_text_file(cfg_path));
  } catch (const nlohmann::json::exception&) {
    stats.skipped_because = "config.json is not valid JSON";  // reported by the structural checks
    return stats;
  }
  if (doc.is_object() && doc.contains("model_type") && !doc["model_type"].is_string()) {
    stats.skipped_because = "model_type is not a string";
    problems.push_back(
        {Errc::kConfigInvalid, "", "",
         "config.json: model_type must be a string, not " + doc["model_type"].dump()});
    return stats;
  }
  const std::string model_type = doc.is_object() ? doc.value("model_type", "") : "";
  if (model_type != "qwen3_5_moe" && model_type != "qwen3_5_moe_text") {
    stats.skipped_because = "model_type \"" + model_type + "\" is not qwen3_5_moe";
    if (o.scan_values) scan_values(c, o, stats, problems);
    return stats;
  }
  // A malformed config is a Qwen3.5 config with problems (checked), reported as such.
  stats.checked = true;
  ckpt::Qwen35Config cfg;
  CheckpointLayout layout;
  try {
    cfg = ckpt::qwen35_config_from_json(doc.dump(), "config.json");
    layout = checkpoint_layout(doc, "config.json");
  } catch (const Error& e) {
    problems.push_back({e.code(), "", "", e.what()});  // the message names config.json
    return stats;
  }
  const nlohmann::json qcfg = doc.value("quantization_config", nlohmann::json());
  const int64_t group = layout.group, block = layout.block;
  const bool sym = !qcfg.is_object() || qcfg.value("sym", true);

  for (const ckpt::SafetensorsFile& f : c.tensor_files()) {
    for (const ckpt::TensorInfo& t : f.tensors()) {
      stats.has_mtp |= t.name.rfind("mtp.", 0) == 0;
      stats.has_vision |= t.name.rfind("model.visual.", 0) == 0;
    }
  }
  if (cfg.mtp_num_hidden_layers > 0 && !stats.has_mtp) {
    problems.push_back({Errc::kModelTensorMissing, "", "mtp.*",
                        "config.json declares an MTP head (mtp_num_hidden_layers = " +
                            std::to_string(cfg.mtp_num_hidden_layers) +
                            ") but no mtp.* tensor is listed: speculative decoding will not work "
                            "(qforge add-mtp restores it)"});
  }
  ckpt::SchemaOptions so;
  so.mtp = stats.has_mtp;
  so.vision = stats.has_vision;
  const std::vector<ckpt::TensorDecl> decls =
      ckpt::qwen35_tensors(cfg, ckpt::Qwen35Layout::kBf16, so);

  std::vector<std::string> consumed;
  std::optional<IncResolver> inc;
  if (is_inc_config(qcfg)) inc.emplace(qcfg);
  auto module = [&](const std::string& m, int64_t n, int64_t k) {
    int64_t g = inc ? inc->group_size(m) : group;
    if (g <= 0) g = k;  // group_size -1: one group per row
    const std::string fmt = linear_format(c, m, n, k, g, block, problems, &consumed);
    if (fmt.empty()) return;
    ++stats.modules_by_format[fmt];
    check_quant_config(qcfg, inc ? &*inc : nullptr, m, fmt, problems);
    if (sym && (fmt == "int4" || fmt == "int8") && inc) check_qzeros(c, m, fmt, problems);
  };
  for (const ckpt::TensorDecl& d : decls) {
    const bool fused_gate_up =
        d.name.size() > 21 && d.name.substr(d.name.size() - 21) == ".experts.gate_up_proj";
    const bool fused_down =
        d.name.size() > 18 && d.name.substr(d.name.size() - 18) == ".experts.down_proj";
    if (fused_gate_up || fused_down) {
      if (c.find(d.name)) {
        expect(c, d.name, {DType::kBF16, DType::kF32}, d.shape, problems, &consumed);
        if (fused_gate_up) {
          ++stats.modules_by_format[c.find(d.name)->info->dtype == DType::kF32 ? "fused-f32"
                                                                               : "fused-bf16"];
        }
        continue;
      }
      const std::string prefix = d.name.substr(0, d.name.rfind('.') + 1);  // "...experts."
      const int64_t e_count = static_cast<int64_t>(d.shape[0]);
      for (int64_t e = 0; e < e_count; ++e) {
        const std::string em = prefix + std::to_string(e) + ".";
        if (fused_gate_up) {
          const int64_t i = static_cast<int64_t>(d.shape[1] / 2),
                        h = static_cast<int64_t>(d.shape[2]);
          module(em + "gate_proj", i, h);
          module(em + "up_proj", i, h);
        } else {
          module(em + "down_proj", static_cast<int64_t>(d.shape[1]),
                 static_cast<int64_t>(d.shape[2]));
        }
      }
      continue;
    }
    if (!d.module.empty() && d.shape.size() == 2) {
      module(d.module, d.n, d.k);
      continue;
    }
    // Plain tensors. A_log and the gated norm are FP32 in Qwen's releases, BF16 in Intel's.
    if (d.role == ckpt::TensorRole::kALog || (d.role == ckpt::TensorRole::kNormPlain &&
                                              d.name.find("linear_attn") != std::string::npos)) {
      expect(c, d.name, {DType::kF32, DType::kBF16}, d.shape, problems, &consumed);
    } else if (d.dtype == DType::kBF16) {
      expect(c, d.name, {DType::kBF16, DType::kF32}, d.shape, problems, &consumed);
    } else {
      expect(c, d.name, {d.dtype}, d.shape, problems, &consumed);
    }
  }
  // Everything the config does not explain.
  std::set<std::string_view> explained(consumed.begin(), consumed.end());
  for (const ckpt::SafetensorsFile& f : c.tensor_files()) {
    for (const ckpt::TensorInfo& t : f.tensors()) {
      if (!explained.count(t.name)) {
        problems.push_back({Errc::kModelTensorUnexpected, c.file_name(f), t.name,
                            describe(t) + " is not part of the model config.json describes"});
      }
    }
  }
  if (o.scan_values) scan_values(c, o, stats, problems);
  return stats;
}

}  // namespace qf::quant
