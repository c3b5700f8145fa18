#include "qf/quant/dequantize.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "planned_writer.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/qwen35_schema.h"
#include "qf/error.h"
#include "qf/quant/formats.h"
#include "qf/quant/matrix.h"
#include "qf/quant/model_check.h"
#include "qf/quant/quant_config.h"
#include "qf/quant/synth.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;
using ckpt::TensorDecl;
using nlohmann::ordered_json;

constexpr int64_t kChunkBytes = 8 << 20;  // BF16 output rows converted at a time

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <class T>
const T* typed(const ckpt::TensorRef& r) {
  return r.file->view(*r.info).as<T>().data();
}

// One stored linear module [n, k], resolved to its format's tensors.
struct Module {
  enum class Kind { kFloat, kGptq, kFp8 } kind = Kind::kFloat;
  int64_t n = 0, k = 0;
  std::vector<const ckpt::TensorRef*> parts;  // released after use
  std::optional<MatrixView> w;                // float weight
  int bits = 0;                               // GPTQ: 4 or 8
  int64_t group = 0;
  const uint32_t* qweight = nullptr;
  const uint32_t* qzeros = nullptr;
  const uint16_t* scales = nullptr;
  const uint8_t* codes = nullptr;  // FP8
  std::optional<MatrixView> scale_inv;
  int64_t bn = 128, bk = 128;

  // Row r of the weight in f32, exactly as the format defines it.
  void row(int64_t r, float* out) const {
    switch (kind) {
      case Kind::kFloat:
        w->row(r, out);
        return;
      case Kind::kGptq: {
        const int per = 32 / bits;
        const uint32_t mask = (1u << bits) - 1;
        for (int64_t g0 = 0, g = 0; g0 < k; g0 += group, ++g) {
          const uint32_t zw = qzeros[g * (n / per) + r / per];
          const int32_t zero = static_cast<int32_t>((zw >> (bits * (r % per))) & mask) + 1;  // v1
          const float scale = f16_to_f32(scales[g * n + r]);
          for (int64_t c = g0; c < std::min(k, g0 + group); ++c) {
            const uint32_t code = (qweight[(c / per) * n + r] >> (bits * (c % per))) & mask;
            out[c] = scale * static_cast<float>(static_cast<int32_t>(code) - zero);
          }
        }
        return;
      }
      case Kind::kFp8:
        for (int64_t c = 0; c < k; ++c) {
          out[c] = e4m3fn_to_f32(codes[r * k + c]) * scale_inv->at(r / bn, c / bk);
        }
        return;
    }
  }
  void release() const {
    for (const ckpt::TensorRef* p : parts) p->file->release(p->info->begin, p->info->n_bytes());
  }
};

struct Context {
  const ckpt::Checkpoint* c;
  std::optional<IncResolver> inc;
  int64_t group = 128, block = 128;
  int inner_threads = 1;
};

Module resolve(const Context& x, const std::string& m, int64_t n, int64_t k) {
  const ckpt::Checkpoint& c = *x.c;
  Module s;
  s.n = n;
  s.k = k;
  if (const ckpt::TensorRef* qw = c.find(m + ".qweight")) {
    s.kind = Module::Kind::kGptq;
    s.bits = qw->info->shape[0] * 8 == static_cast<uint64_t>(k) ? 4 : 8;
    s.group = x.inc ? x.inc->group_size(m) : x.group;
    if (s.group <= 0) s.group = k;
    const ckpt::TensorRef* qz = c.find(m + ".qzeros");
    const ckpt::TensorRef* sc = c.find(m + ".scales");
    s.qweight = typed<uint32_t>(*qw);
    s.qzeros = typed<uint32_t>(*qz);
    s.scales = typed<uint16_t>(*sc);
    s.parts = {qw, qz, sc};
    return s;
  }
  const ckpt::TensorRef* w = c.find(m + ".weight");
  if (w->info->dtype == DType::kF8E4M3) {
    const ckpt::TensorRef* si = c.find(m + ".weight_scale_inv");
    s.kind = Module::Kind::kFp8;
    s.codes = typed<uint8_t>(*w);
    const auto sv = si->file->view(*si->info);
    s.scale_inv.emplace(sv.bytes.data(), si->info->dtype, static_cast<int64_t>(si->info->shape[0]),
                        static_cast<int64_t>(si->info->shape[1]));
    s.bn = s.bk = x.block;
    s.parts = {w, si};
    return s;
  }
  const auto v = w->file->view(*w->info);
  s.w.emplace(v.bytes.data(), w->info->dtype, n, k);
  s.parts = {w};
  return s;
}

// Writes rows of `s` as BF16, a chunk at a time; a BF16 weight is copied byte for byte.
void write_bf16(const Context& x, const Module& s, ckpt::SafetensorsWriter& w) {
  if (s.kind == Module::Kind::kFloat && s.w->dtype == DType::kBF16) {
    const ckpt::TensorRef* r = s.parts[0];
    w.copy_from(r->file->map().fd(), r->file->header().data_offset() + r->info->begin,
                r->info->n_bytes(), r->file->path());
    s.release();
    return;
  }
  const int64_t rows = std::max<int64_t>(1, kChunkBytes / (s.k * 2));
  std::vector<uint16_t> out(static_cast<size_t>(std::min(rows, s.n) * s.k));
  for (int64_t r0 = 0; r0 < s.n; r0 += rows) {
    const int64_t r1 = std::min(s.n, r0 + rows);
    parallel_for(r1 - r0, x.inner_threads, 1, [&](int64_t a, int64_t b) {
      std::vector<float> f(static_cast<size_t>(s.k));
      for (int64_t i = a; i < b; ++i) {
        s.row(r0 + i, f.data());
        uint16_t* o = out.data() + i * s.k;
        for (int64_t c = 0; c < s.k; ++c) o[c] = f32_to_bf16(f[c]);
      }
    });
    w.write(out.data(), static_cast<size_t>((r1 - r0) * s.k) * 2);
  }
  s.release();
}

// A non-linear tensor (or a fused expert tensor stored as such): copied, or converted between
// float dtypes (BF16 -> F32 exact, F32 -> BF16 to nearest even).
void write_plain(const ckpt::TensorRef& r, DType dtype, ckpt::SafetensorsWriter& w) {
  if (r.info->dtype == dtype) {
    w.copy_from(r.file->map().fd(), r.file->header().data_offset() + r.info->begin,
                r.info->n_bytes(), r.file->path());
  } else {
    const int64_t numel = static_cast<int64_t>(ckpt::shape_numel(r.info->shape));
    detail::write_converted(MatrixView(r.file->view(*r.info).bytes.data(), r.info->dtype, 1, numel),
                            dtype, w);
  }
  r.file->release(r.info->begin, r.info->n_bytes());
}

void produce(const Context& x, const TensorDecl& d, ckpt::SafetensorsWriter& w) {
  const ckpt::Checkpoint& c = *x.c;
  if (!d.module.empty() && d.shape.size() == 2) {
    write_bf16(x, resolve(x, d.module, d.n, d.k), w);
    return;
  }
  if (const ckpt::TensorRef* same = c.find(d.name)) {  // shapes were checked against config.json
    write_plain(*same, d.dtype, w);
    return;
  }
  // Fused routed experts from per-expert modules: expert by expert, gate rows before up rows.
  const bool gate_up = ends_with(d.name, ".experts.gate_up_proj");
  if (!gate_up && !ends_with(d.name, ".experts.down_proj")) {
    throw Error(Errc::kTensorNotFound, "the input has no tensor '" + d.name + "'");
  }
  const std::string prefix = d.name.substr(0, d.name.rfind('.') + 1);  // "...experts."
  const int64_t e_count = static_cast<int64_t>(d.shape[0]), rows = static_cast<int64_t>(d.shape[1]),
                cols = static_cast<int64_t>(d.shape[2]);
  for (int64_t e = 0; e < e_count; ++e) {
    const std::string em = prefix + std::to_string(e) + ".";
    if (gate_up) {
      write_bf16(x, resolve(x, em + "gate_proj", rows / 2, cols), w);
      write_bf16(x, resolve(x, em + "up_proj", rows / 2, cols), w);
    } else {
      write_bf16(x, resolve(x, em + "down_proj", rows, cols), w);
    }
  }
}

ordered_json read_config(const fs::path& p) {
  try {
    return ordered_json::parse(ckpt::read_text_file(p));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kConfigInvalid, p.string() + ": " + e.what());
  }
}

}  // namespace

DequantizeReport dequantize_checkpoint(const fs::path& input, const fs::path& out,
                                       const DequantizeOptions& o, ckpt::Progress* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!o.force && !o.dry_run && fs::exists(out, ec)) {
    throw Error(Errc::kExists, "'" + out.string() + "' exists (use --force to overwrite)");
  }
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(input);
  if (c.is_single_file()) throw Error(Errc::kUsage, "dequantize needs a checkpoint directory");
  const fs::path cfg_path = c.root() / "config.json";
  if (!fs::exists(cfg_path, ec)) throw Error(Errc::kConfigInvalid, cfg_path.string() + ": missing");
  ordered_json config = read_config(cfg_path);

  // The input must be a consistent Qwen3.5-MoE checkpoint: every module then resolves.
  std::vector<ckpt::Problem> problems;
  const ModelCheckStats stats = check_qwen35_model(c, {}, problems);
  if (!stats.checked) {
    throw Error(Errc::kUnsupported, cfg_path.string() + ": " + stats.skipped_because);
  }
  if (!problems.empty()) {
    throw Error(problems[0].code,
                "the input fails the model checks: " + ckpt::format_problem(problems[0]) +
                    (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) +
                                               " more; qforge validate lists them)"
                                         : ""));
  }
  DequantizeReport rep;
  rep.modules_by_format = stats.modules_by_format;
  rep.mtp = stats.has_mtp;
  rep.vision = stats.has_vision;

  Context x;
  x.c = &c;
  const nlohmann::json qcfg(config.value("quantization_config", ordered_json()));
  if (is_inc_config(qcfg)) {
    x.inc.emplace(qcfg);
    const std::string packing = qcfg.value("packing_format", "auto_round:auto_gptq");
    if (packing != "auto_round:auto_gptq") {
      throw Error(Errc::kUnsupported, cfg_path.string() + ": packing_format \"" + packing +
                                          "\" (only auto_round:auto_gptq, GPTQ v1 zeros, is read)");
    }
  }
  if (qcfg.is_object() && qcfg.contains("group_size") && qcfg["group_size"].is_number_integer())
    x.group = qcfg["group_size"].get<int64_t>();
  if (qcfg.is_object() && qcfg.contains("weight_block_size"))
    x.block = qcfg["weight_block_size"][0].get<int64_t>();
  if (config.contains("qforge") && config["qforge"].contains("hybrid")) {
    x.block = config["qforge"]["hybrid"]["weight_block_size"][0].get<int64_t>();
  }

  SynthOptions so;
  so.layout = ckpt::Qwen35Layout::kBf16;
  so.schema.mtp = stats.has_mtp;
  so.schema.vision = stats.has_vision;
  so.shard_bytes = o.shard_bytes;
  so.shards = o.shards;
  const ckpt::Qwen35Config cfg = ckpt::qwen35_config_from_json(config.dump(), cfg_path.string());
  const SynthPlan plan = plan_synth(cfg, so);
  rep.n_tensors = plan.tensors.size();
  rep.tensor_bytes = plan.tensor_bytes;
  for (const SynthFile& f : plan.files) rep.files.push_back(f.name);
  if (o.dry_run) return rep;

  config.erase("quantization_config");
  config.erase("qforge");
  const int cores = o.threads > 0
                        ? o.threads
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  x.inner_threads = std::max(1, cores / static_cast<int>(std::max<size_t>(1, plan.files.size())));
  if (progress) progress->total = plan.tensor_bytes;
  std::vector<ckpt::FileDigest> digests;
  detail::PlannedWrite pw;
  pw.overwrite = o.force;
  pw.hash = o.checksums;
  pw.threads = o.threads;
  pw.digests = &digests;
  pw.sparse_zeros =
      std::any_of(c.tensor_files().begin(), c.tensor_files().end(),
                  [](const ckpt::SafetensorsFile& f) { return ckpt::is_sparse_file(f.path()); });
  detail::write_planned_checkpoint(
      plan, out, pw,
      [&](const TensorDecl& d, ckpt::SafetensorsWriter& w) {
        produce(x, d, w);
        if (progress) progress->done.fetch_add(ckpt::tensor_bytes({d.name, d.dtype, d.shape}));
      },
      [&](const fs::path& stage) {
        ckpt::write_file_atomic(stage / "config.json", config.dump(2) + "\n", true);
        for (const ckpt::CheckpointFile& f : c.listing()) {  // tokenizer, generation config, ...
          if ((f.role == ckpt::FileRole::kTokenizer || f.role == ckpt::FileRole::kOther) &&
              !ends_with(f.name, ".tmp")) {
            fs::copy_file(c.root() / f.name, stage / f.name, fs::copy_options::overwrite_existing);
          }
        }
        if (o.checksums) detail::write_stage_manifest(stage, digests);
      });
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qf::quant
