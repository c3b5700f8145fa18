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
#include "qf/quant/stored_linear.h"
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

struct Context {
  const ckpt::Checkpoint* c;
  LinearLayout layout;
  DType dtype = DType::kBF16;  // of every weight written
  int inner_threads = 1;
};

StoredLinear resolve(const Context& x, const std::string& m, int64_t n, int64_t k) {
  return resolve_linear(*x.c, x.layout, m, n, k);
}

// Writes rows of `s` in x.dtype (BF16 to nearest even, or F32), a chunk at a time; a weight
// already stored in that dtype is copied byte for byte.
void write_rows(const Context& x, const StoredLinear& s, ckpt::SafetensorsWriter& w) {
  if (s.kind == StoredLinear::Kind::kFloat && s.w->dtype == x.dtype) {
    const ckpt::TensorRef* r = s.parts[0];
    w.copy_from(r->file->map().fd(), r->file->header().data_offset() + r->info->begin,
                r->info->n_bytes(), r->file->path());
    s.release();
    return;
  }
  const bool f32 = x.dtype == DType::kF32;
  const int64_t elem = f32 ? 4 : 2;
  const int64_t rows = std::max<int64_t>(1, kChunkBytes / (s.k * elem));
  std::vector<float> wide(f32 ? static_cast<size_t>(std::min(rows, s.n) * s.k) : 0);
  std::vector<uint16_t> narrow(f32 ? 0 : static_cast<size_t>(std::min(rows, s.n) * s.k));
  for (int64_t r0 = 0; r0 < s.n; r0 += rows) {
    const int64_t r1 = std::min(s.n, r0 + rows);
    parallel_for(r1 - r0, x.inner_threads, 1, [&](int64_t a, int64_t b) {
      std::vector<float> f(static_cast<size_t>(s.k));
      for (int64_t i = a; i < b; ++i) {
        if (f32) {
          s.row(r0 + i, wide.data() + i * s.k);
          continue;
        }
        s.row(r0 + i, f.data());
        uint16_t* o = narrow.data() + i * s.k;
        for (int64_t c = 0; c < s.k; ++c) o[c] = f32_to_bf16(f[c]);
      }
    });
    const size_t n_bytes = static_cast<size_t>((r1 - r0) * s.k * elem);
    if (f32) {
      w.write(wide.data(), n_bytes);
    } else {
      w.write(narrow.data(), n_bytes);
    }
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
    write_rows(x, resolve(x, d.module, d.n, d.k), w);
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
      write_rows(x, resolve(x, em + "gate_proj", rows / 2, cols), w);
      write_rows(x, resolve(x, em + "up_proj", rows / 2, cols), w);
    } else {
      write_rows(x, resolve(x, em + "down_proj", rows, cols), w);
    }
  }
}

// Every BF16 tensor of the plan becomes F32 (same files, twice the bytes).
void widen_to_f32(SynthPlan& plan) {
  for (SynthFile& f : plan.files) f.tensor_bytes = 0;
  plan.tensor_bytes = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    TensorDecl& d = plan.tensors[i];
    if (d.dtype == DType::kBF16) d.dtype = DType::kF32;
    const uint64_t b = ckpt::tensor_bytes({d.name, d.dtype, d.shape});
    plan.files[plan.file_of[i]].tensor_bytes += b;
    plan.tensor_bytes += b;
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

  const CheckpointLayout layout = checkpoint_layout(nlohmann::json(config), cfg_path.string());
  Context x;
  x.c = &c;
  x.layout = layout.linear();
  x.dtype = o.dtype;

  SynthOptions so;
  so.layout = ckpt::Qwen35Layout::kBf16;
  so.schema.mtp = stats.has_mtp;
  so.schema.vision = stats.has_vision;
  so.shard_bytes = o.shard_bytes;
  so.shards = o.shards;
  const ckpt::Qwen35Config cfg = ckpt::qwen35_config_from_json(config.dump(), cfg_path.string());
  SynthPlan plan = plan_synth(cfg, so);
  if (o.dtype == DType::kF32) widen_to_f32(plan);
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
