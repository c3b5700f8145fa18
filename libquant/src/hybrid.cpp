#include "qf/quant/hybrid.h"

#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "planned_writer.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/quant/fp8_block.h"
#include "qf/quant/metrics.h"
#include "qf/quant/quant_config.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;
using nlohmann::ordered_json;

// The FP8 checkpoint, opened lazily: names come from its index; only the files that hold
// tensors we use are mapped.
class Fp8Source {
 public:
  explicit Fp8Source(const fs::path& dir) : dir_(dir) {
    const fs::path index = dir / ckpt::kIndexFileName;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw Error(Errc::kIo, "'" + dir.string() + "': no such checkpoint directory");
    }
    if (fs::exists(index, ec)) {
      ckpt::IndexParse ip = ckpt::parse_index(ckpt::read_text_file(index));
      if (!ip.problems.empty()) {
        throw Error(ip.problems[0].code,
                    index.string() + ": " + ckpt::format_problem(ip.problems[0]));
      }
      for (auto& [name, file] : ip.index.weight_map) file_of_[name] = file;
    } else {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".safetensors") continue;
        for (const ckpt::TensorInfo& t : open(e.path().filename().string()).tensors()) {
          file_of_[t.name] = e.path().filename().string();
        }
      }
      if (file_of_.empty()) {
        throw Error(Errc::kTensorNotFound, "'" + dir.string() + "' holds no index and no tensors");
      }
    }
    const fs::path cfg = dir / "config.json";
    if (fs::exists(cfg, ec)) {
      try {
        const auto doc = nlohmann::json::parse(ckpt::read_text_file(cfg));
        const auto q =
            doc.is_object() ? doc.value("quantization_config", nlohmann::json()) : nlohmann::json();
        check_quantization_config(q, cfg.string() + ": quantization_config");
        if (q.is_object() && q.contains("weight_block_size")) {
          block_n_ = q["weight_block_size"][0].get<int64_t>();
          block_k_ = q["weight_block_size"][1].get<int64_t>();
        }
      } catch (const nlohmann::json::exception& e) {
        throw Error(Errc::kConfigInvalid, cfg.string() + ": " + e.what());
      }
    }
  }

  const std::map<std::string, std::string>& names() const { return file_of_; }
  bool has(const std::string& name) const { return file_of_.count(name) > 0; }
  int64_t block_n() const { return block_n_; }
  int64_t block_k() const { return block_k_; }

  // The tensor and its file; throws if the index promises what the file lacks.
  std::pair<const ckpt::SafetensorsFile*, const ckpt::TensorInfo*> find(const std::string& name) {
    const ckpt::SafetensorsFile& f = open(file_of_.at(name));
    const ckpt::TensorInfo* t = f.find(name);
    if (!t) {
      throw Error(Errc::kIndexTensorMissing, (dir_ / file_of_.at(name)).string() +
                                                 ": the index lists '" + name +
                                                 "' but the file lacks it");
    }
    return {&f, t};
  }
  std::vector<std::string> files_read() const {
    std::vector<std::string> out;
    for (const auto& [name, f] : files_) out.push_back(name);
    return out;
  }

 private:
  const ckpt::SafetensorsFile& open(const std::string& file) {
    auto it = files_.find(file);
    if (it == files_.end())
      it = files_.emplace(file, ckpt::SafetensorsFile::open(dir_ / file)).first;
    return it->second;
  }

  fs::path dir_;
  std::map<std::string, std::string> file_of_;
  std::map<std::string, ckpt::SafetensorsFile> files_;
  int64_t block_n_ = 128, block_k_ = 128;
};

struct Replacement {
  std::string module;
  const ckpt::TensorRef* bf16;  // Intel's weight
  const ckpt::SafetensorsFile* fp8_file;
  const ckpt::TensorInfo* weight;
  const ckpt::TensorInfo* scale;
};

std::string describe(const ckpt::TensorInfo& t) {
  return std::string(ckpt::dtype_name(t.dtype)) + " " + ckpt::shape_to_string(t.shape);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The module of a shared-expert projection's weight ("<...>.mlp.shared_expert.gate_proj" of
// "<...>.mlp.shared_expert.gate_proj.weight"; also up and down), else empty. A string test, not a
// std::regex: it runs over every tensor name (94,271 at 35B-A3B), where std::regex took 0.15 s.
std::string_view shared_expert_module(std::string_view name) {
  constexpr std::string_view kWeight = ".weight", kMlp = ".mlp.shared_expert.";
  if (!name.ends_with(kWeight)) return {};
  const std::string_view module = name.substr(0, name.size() - kWeight.size());
  for (std::string_view proj : {"gate_proj", "up_proj", "down_proj"}) {
    if (module.ends_with(proj) && module.substr(0, module.size() - proj.size()).ends_with(kMlp)) {
      return module;
    }
  }
  return {};
}

std::vector<Replacement> find_replacements(const ckpt::Checkpoint& int4, Fp8Source& fp8,
                                           const HybridOptions& o) {
  std::vector<Replacement> out;
  std::map<std::string, int> projections_per_mlp;
  for (const ckpt::SafetensorsFile& f : int4.tensor_files()) {
    for (const ckpt::TensorInfo& t : f.tensors()) {
      const std::string module(shared_expert_module(t.name));
      if (module.empty()) continue;
      const bool mtp = module.rfind("mtp.", 0) == 0;
      if (mtp && !o.mtp) continue;
      if (t.dtype != DType::kBF16) {
        throw Error(Errc::kUnsupported, "INT4 input: '" + t.name + "' is " + describe(t) +
                                            ", expected BF16 (is this already a hybrid?)");
      }
      const std::string w = module + ".weight", s = module + ".weight_scale_inv";
      if (!fp8.has(w) || !fp8.has(s)) {
        if (mtp) continue;  // replaced only where both checkpoints have the MTP layer
        throw Error(Errc::kTensorNotFound,
                    "the FP8 checkpoint has no '" + (fp8.has(w) ? s : w) + "'");
      }
      const auto [file, weight] = fp8.find(w);
      const auto [sfile, scale] = fp8.find(s);
      if (weight->dtype != DType::kF8E4M3 || weight->shape != t.shape) {
        throw Error(Errc::kUnsupported, "FP8 '" + w + "' is " + describe(*weight) +
                                            ", INT4 input has " + describe(t) +
                                            ": expected F8_E4M3 of the same shape");
      }
      const ckpt::Shape grid = {
          static_cast<uint64_t>(ceil_div(static_cast<int64_t>(t.shape[0]), fp8.block_n())),
          static_cast<uint64_t>(ceil_div(static_cast<int64_t>(t.shape[1]), fp8.block_k()))};
      if (scale->shape != grid || (scale->dtype != DType::kF32 && scale->dtype != DType::kBF16 &&
                                   scale->dtype != DType::kF16)) {
        throw Error(Errc::kUnsupported,
                    "FP8 '" + s + "' is " + describe(*scale) + ", expected F32/BF16/F16 " +
                        ckpt::shape_to_string(grid) + " for " + std::to_string(fp8.block_n()) +
                        "x" + std::to_string(fp8.block_k()) + " blocks");
      }
      if (sfile != file) {
        throw Error(Errc::kUnsupported, "FP8 '" + w + "' and its scale sit in different files");
      }
      out.push_back({module, int4.find(t.name), file, weight, scale});
      ++projections_per_mlp[module.substr(0, module.rfind('.'))];
    }
  }
  for (const auto& [mlp, n] : projections_per_mlp) {
    if (n != 3) {  // vLLM fuses gate and up: the three projections must share one format
      throw Error(Errc::kUnsupported, mlp + ": only " + std::to_string(n) +
                                          " of gate/up/down_proj can be replaced; all three must");
    }
  }
  if (out.empty()) {
    throw Error(Errc::kTensorNotFound,
                "the INT4 input has no BF16 shared-expert projection to replace");
  }
  std::sort(out.begin(), out.end(),
            [](const Replacement& a, const Replacement& b) { return a.module < b.module; });
  return out;
}

// FP8 tensors the hybrid leaves out, by reason; unexpected ones are counted separately.
std::vector<HybridCategory> categorize(const ckpt::Checkpoint& int4, const Fp8Source& fp8,
                                       const std::vector<Replacement>& used, size_t& unexpected,
                                       std::vector<std::string>& unexpected_names) {
  std::set<std::string> used_names;
  for (const Replacement& r : used) {
    used_names.insert(r.module + ".weight");
    used_names.insert(r.module + ".weight_scale_inv");
  }
  std::map<std::string, HybridCategory> cats;
  auto add = [&](const char* name, const char* meaning, const std::string& tensor) {
    HybridCategory& c = cats[name];
    c.name = name;
    c.meaning = meaning;
    ++c.n_tensors;
    if (c.examples.size() < 3) c.examples.push_back(tensor);
  };
  constexpr std::string_view kScale = ".weight_scale_inv", kWeight = ".weight";
  for (const auto& [name, file] : fp8.names()) {
    if (used_names.count(name)) continue;
    const std::string_view n = name;
    std::string base;
    bool fp8_part = false;  // an FP8 weight or its scale
    if (n.size() > kScale.size() && n.substr(n.size() - kScale.size()) == kScale) {
      base = name.substr(0, name.size() - kScale.size());
      fp8_part = true;
    } else if (n.size() > kWeight.size() && n.substr(n.size() - kWeight.size()) == kWeight) {
      base = name.substr(0, name.size() - kWeight.size());
      fp8_part = fp8.has(base + std::string(kScale));
    }
    if (name.find(".experts.") != std::string::npos) {
      add("routed-experts", "routed experts (main and MTP): the INT4 checkpoint's experts stay",
          name);
    } else if (!base.empty() && int4.find(base + ".qweight")) {
      add("int4-in-int4-checkpoint",
          "modules the INT4 checkpoint keeps as INT4 (attention, linear attention)", name);
    } else if (fp8_part && int4.find(base + ".weight")) {
      add("bf16-in-int4-checkpoint",
          "FP8 modules the INT4 checkpoint keeps in BF16 (not shared experts)", name);
    } else if (!fp8_part && int4.find(name)) {
      add("same-name-kept",
          "same name in the INT4 checkpoint (norms, gates, embeddings, lm_head, vision): kept",
          name);
    } else if (name.rfind("mtp.", 0) == 0) {
      add("mtp-absent-from-int4", "MTP tensors the INT4 checkpoint does not have", name);
    } else {
      ++unexpected;
      if (unexpected_names.size() < 5) unexpected_names.push_back(name);
    }
  }
  std::vector<HybridCategory> out;
  for (auto& [k, c] : cats) out.push_back(std::move(c));
  return out;
}

double cosine(const Replacement& r) {
  const int64_t n = static_cast<int64_t>(r.weight->shape[0]),
                k = static_cast<int64_t>(r.weight->shape[1]);
  std::vector<float> deq(static_cast<size_t>(n * k)), ref(static_cast<size_t>(n * k));
  const auto codes = r.fp8_file->view(*r.weight).bytes;
  const auto scale = r.fp8_file->view(*r.scale);
  dequantize_fp8_block(
      reinterpret_cast<const uint8_t*>(codes.data()),
      MatrixView(scale.bytes.data(), r.scale->dtype, static_cast<int64_t>(r.scale->shape[0]),
                 static_cast<int64_t>(r.scale->shape[1])),
      n, k, ceil_div(n, static_cast<int64_t>(r.scale->shape[0])),
      ceil_div(k, static_cast<int64_t>(r.scale->shape[1])), deq.data(), 1);
  const auto bf = r.bf16->file->view(*r.bf16->info);
  const MatrixView mv(bf.bytes.data(), DType::kBF16, n, k);
  for (int64_t i = 0; i < n; ++i) mv.row(i, ref.data() + i * k);
  // Mapped pages count as ours until dropped: keep memory bounded over hundreds of modules.
  r.fp8_file->release(r.weight->begin, r.weight->n_bytes());
  r.fp8_file->release(r.scale->begin, r.scale->n_bytes());
  r.bf16->file->release(r.bf16->info->begin, r.bf16->info->n_bytes());
  return error_stats(ref.data(), deq.data(), n * k).cosine;
}

struct Source {
  const ckpt::SafetensorsFile* file;
  const ckpt::TensorInfo* info;

  detail::ByteSource bytes() const {
    return {file->map().fd(), file->header().data_offset() + info->begin, &file->path()};
  }
};

}  // namespace

HybridReport build_hybrid(const fs::path& int4_dir, const fs::path& fp8_dir,
                          const fs::path& out_dir, const HybridOptions& o,
                          ckpt::Progress* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!o.force && !o.dry_run && fs::exists(out_dir, ec)) {
    throw Error(Errc::kExists, "'" + out_dir.string() + "' exists (use --force to overwrite)");
  }
  const ckpt::Checkpoint int4 = ckpt::Checkpoint::open(int4_dir);
  if (int4.is_single_file()) throw Error(Errc::kUsage, "--int4 must be a checkpoint directory");
  Fp8Source fp8(fp8_dir);
  HybridReport rep;
  const std::vector<Replacement> repl = find_replacements(int4, fp8, o);
  for (const Replacement& r : repl) {
    rep.modules.push_back(r.module);
    (r.module.rfind("mtp.", 0) == 0 ? rep.n_mtp : rep.n_main)++;
  }
  rep.scale_dtype = std::string(ckpt::dtype_name(repl.front().scale->dtype));
  std::vector<std::string> unexpected_names;
  rep.unused = categorize(int4, fp8, repl, rep.n_unexpected, unexpected_names);
  if (rep.n_unexpected > 0 && !o.force) {
    std::string list;
    for (const std::string& n : unexpected_names) list += (list.empty() ? "" : ", ") + n;
    throw Error(Errc::kUnsupported, std::to_string(rep.n_unexpected) +
                                        " FP8 tensors match nothing in the INT4 checkpoint (e.g. " +
                                        list + "): not the same model? (--force to go on)");
  }
  for (const ckpt::CheckpointFile& f : int4.listing()) {
    if (f.role == ckpt::FileRole::kStray) rep.strays_ignored.push_back(f.name);
  }

  // The output plan: Intel's files with their tensors in the same data order, each replaced
  // weight now F8_E4M3 in its place and the scales at the end of the file. Unchanged runs keep
  // their byte positions modulo the block size (see layout below), so a filesystem that shares
  // extents stores them once.
  std::map<std::string, const Replacement*> by_weight;
  for (const Replacement& r : repl) by_weight[r.module + ".weight"] = &r;
  SynthPlan plan;
  std::map<std::string, Source> source_of;
  bool sparse = false;
  for (const ckpt::SafetensorsFile& f : int4.tensor_files()) {
    HybridReport::File rf{int4.file_name(f), 0, 0};
    plan.files.push_back({rf.name, 0, 0});
    sparse |= ckpt::is_sparse_file(f.path());
    auto add = [&](const ckpt::SafetensorsFile* file, const ckpt::TensorInfo* t) {
      ckpt::TensorDecl d;
      d.name = t->name;
      d.dtype = t->dtype;
      d.shape = t->shape;
      plan.tensors.push_back(d);
      plan.file_of.push_back(plan.files.size() - 1);
      source_of[t->name] = {file, t};
      ++rf.n_tensors;
      rf.tensor_bytes += t->n_bytes();
      plan.tensor_bytes += t->n_bytes();
    };
    std::vector<const ckpt::TensorInfo*> in_data_order;
    for (const ckpt::TensorInfo& t : f.tensors()) in_data_order.push_back(&t);
    std::stable_sort(
        in_data_order.begin(), in_data_order.end(),
        [](const ckpt::TensorInfo* a, const ckpt::TensorInfo* b) { return a->begin < b->begin; });
    std::vector<const Replacement*> scales;
    for (const ckpt::TensorInfo* t : in_data_order) {
      rep.bytes_in += t->n_bytes();
      const auto it = by_weight.find(t->name);
      if (it == by_weight.end()) {
        add(&f, t);
      } else {
        add(it->second->fp8_file, it->second->weight);
        scales.push_back(it->second);
        sparse |= ckpt::is_sparse_file(it->second->fp8_file->path());
      }
    }
    for (const Replacement* r : scales) add(r->fp8_file, r->scale);
    rep.files.push_back(rf);
  }
  rep.bytes_out = plan.tensor_bytes;
  rep.fp8_files_read = fp8.files_read();

  // Configs: edit a copy now so a bad config fails before anything is written.
  const fs::path cfg_path = int4.root() / "config.json";
  if (!fs::exists(cfg_path, ec)) throw Error(Errc::kConfigInvalid, cfg_path.string() + ": missing");
  ordered_json config;
  try {
    config = ordered_json::parse(ckpt::read_text_file(cfg_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kConfigInvalid, cfg_path.string() + ": " + e.what());
  }
  if (!config.contains("quantization_config") ||
      !is_inc_config(nlohmann::json(config["quantization_config"]))) {
    throw Error(Errc::kUnsupported,
                cfg_path.string() + ": not an AutoRound (auto-round) INT4 checkpoint's config");
  }
  const fs::path qcfg_path = int4.root() / "quantization_config.json";
  const bool has_qcfg_file = fs::exists(qcfg_path, ec);
  ordered_json qcfg_file;
  if (has_qcfg_file) qcfg_file = ordered_json::parse(ckpt::read_text_file(qcfg_path));
  const nlohmann::json qcfg(config["quantization_config"]);
  for (const Replacement& r : repl) {
    if (inc_module_bits(qcfg, r.module) >= 16) continue;
    const ordered_json entry = {{"bits", 16}, {"data_type", "float"}};
    config["quantization_config"]["extra_config"][r.module] = entry;
    if (has_qcfg_file) qcfg_file["extra_config"][r.module] = entry;
    rep.config_edits.push_back(r.module);
  }
  config["qforge"]["hybrid"] = {{"fp8_format", "float8_e4m3fn"},
                                {"weight_block_size", {fp8.block_n(), fp8.block_k()}},
                                {"scale", "weight_scale_inv"},
                                {"scale_dtype", rep.scale_dtype},
                                {"modules", rep.modules}};

  if (o.check) {
    for (const Replacement& r : repl) {
      const double c = cosine(r);
      if (c < rep.min_cosine) {
        rep.min_cosine = c;
        rep.min_cosine_module = r.module;
      }
    }
    if (rep.min_cosine < o.min_cosine && !o.force) {
      throw Error(Errc::kUnsupported, "FP8 '" + rep.min_cosine_module + "' has cosine " +
                                          std::to_string(rep.min_cosine) +
                                          " against the INT4 checkpoint's BF16 weights: the inputs "
                                          "are not the same model (--force to go on)");
    }
  }
  if (o.dry_run) return rep;

  if (progress) progress->total = plan.tensor_bytes;
  std::vector<ckpt::FileDigest> digests;
  detail::PlannedWrite pw;
  pw.overwrite = o.force;
  pw.sparse_zeros = sparse;
  pw.hash = o.checksums;
  pw.threads = o.threads;
  pw.digests = &digests;
  pw.layout = [&](size_t, std::vector<ckpt::TensorSpec> specs) {
    std::vector<std::optional<uint64_t>> at;
    for (const ckpt::TensorSpec& t : specs) {
      const Source& s = source_of.at(t.name);
      at.push_back(s.file->header().data_offset() + s.info->begin);
    }
    return ckpt::plan_safetensors_sharing(std::move(specs), ckpt::Metadata{{"format", "pt"}}, at);
  };
  const fs::path out_parent = out_dir.has_parent_path() ? out_dir.parent_path() : fs::path(".");
  pw.clone = ckpt::can_clone(int4.tensor_files().front().path(), out_parent);
  std::atomic<uint64_t> cloned{0};
  pw.cloned_bytes = &cloned;
  pw.source = [&](const ckpt::TensorDecl& d) { return source_of.at(d.name).bytes(); };
  auto produce = [&](const ckpt::TensorDecl& d, ckpt::SafetensorsWriter& w) {
    const Source& s = source_of.at(d.name);
    const detail::ByteSource from = s.bytes();
    w.copy_from(from.fd, from.offset, s.info->n_bytes(), *from.path);
    s.file->release(s.info->begin, s.info->n_bytes());
    if (progress) progress->done.fetch_add(s.info->n_bytes(), std::memory_order_relaxed);
  };
  detail::write_planned_checkpoint(plan, out_dir, pw, produce, [&](const fs::path& stage) {
    ckpt::write_file_atomic(stage / "config.json", config.dump(2) + "\n", true);
    if (has_qcfg_file) {
      ckpt::write_file_atomic(stage / "quantization_config.json", qcfg_file.dump(2) + "\n", true);
    }
    for (const ckpt::CheckpointFile& f : int4.listing()) {  // tokenizer, generation config, ...
      if (f.role == ckpt::FileRole::kTokenizer || f.role == ckpt::FileRole::kOther) {
        fs::copy_file(int4.root() / f.name, stage / f.name, fs::copy_options::overwrite_existing);
      }
    }
    if (o.checksums) detail::write_stage_manifest(stage, digests);
  });
  rep.bytes_shared = cloned.load();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qf::quant
