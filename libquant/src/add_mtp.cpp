#include "qf/quant/add_mtp.h"

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/qwen35_schema.h"
#include "qf/ckpt/writer.h"
#include "qf/quant/model_check.h"
#include "qf/quant/stored_linear.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;

bool is_mtp(const std::string& name) {
  return name.rfind("mtp.", 0) == 0;
}

nlohmann::json read_config(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  std::error_code ec;
  if (!fs::exists(p, ec)) throw Error(Errc::kConfigInvalid, p.string() + ": missing");
  try {
    return nlohmann::json::parse(ckpt::read_text_file(p));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kConfigInvalid, p.string() + ": " + e.what());
  }
}

// Every expected MTP tensor of the target's model, in any stored format, is in the source, and
// the source has no other mtp.* tensor.
void check_against_config(const ckpt::Checkpoint& src, const std::set<std::string>& src_mtp,
                          const fs::path& target) {
  const nlohmann::json doc = read_config(target);
  const ckpt::Qwen35Config cfg =
      ckpt::qwen35_config_from_json(doc.dump(), (target / "config.json").string());
  if (cfg.mtp_num_hidden_layers == 0) {
    throw Error(Errc::kUnsupported, (target / "config.json").string() + " declares no MTP head");
  }
  const int64_t group = checkpoint_layout(doc, (target / "config.json").string()).group;
  ckpt::SchemaOptions so;
  so.vision = false;
  std::vector<ckpt::Problem> problems;
  std::vector<std::string> consumed;
  for (const ckpt::TensorDecl& d : ckpt::qwen35_tensors(cfg, ckpt::Qwen35Layout::kBf16, so)) {
    if (!is_mtp(d.name)) continue;
    if (!d.module.empty() && d.shape.size() == 2) {
      check_linear_module(src, d.module, d.n, d.k, group, 128, problems, &consumed);
    } else {
      check_plain_tensor(src, d.name, {d.dtype}, d.shape, problems, &consumed);
    }
  }
  const std::set<std::string> expected(consumed.begin(), consumed.end());
  for (const std::string& n : src_mtp) {
    if (!expected.count(n)) {
      problems.push_back({Errc::kModelTensorUnexpected, "", n,
                          "not part of the MTP head the target's config describes"});
    }
  }
  if (!problems.empty()) {
    throw Error(
        problems[0].code,
        "the source's MTP head does not fit " + (target / "config.json").string() + ": " +
            ckpt::format_problem(problems[0]) +
            (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : ""));
  }
}

// Per-tensor XXH3 of a safetensors file, by tensor name.
std::map<std::string, uint64_t> tensor_hashes(const fs::path& p) {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(p);
  const ckpt::FileDigest d = ckpt::digest_file({p, p.filename().string(), &f.header()});
  return {d.tensors.begin(), d.tensors.end()};
}

std::string method_name(ckpt::CopyMethod m) {
  switch (m) {
    case ckpt::CopyMethod::kReflink:
      return "reflink";
    case ckpt::CopyMethod::kHardLink:
      return "hardlink";
    case ckpt::CopyMethod::kCopy:
      return "copy";
  }
  return "copy";
}

}  // namespace

AddMtpReport add_mtp(const fs::path& source, const fs::path& target, const AddMtpOptions& o) {
  AddMtpReport rep;
  const ckpt::Checkpoint src = ckpt::Checkpoint::open(source);
  std::map<std::string, std::set<std::string>> mtp_by_file;  // source file -> its mtp tensors
  std::set<std::string> src_mtp;
  bool mixed = false;  // some MTP tensor shares a file with non-MTP tensors
  for (const ckpt::SafetensorsFile& f : src.tensor_files()) {
    size_t n_mtp = 0;
    for (const ckpt::TensorInfo& t : f.tensors()) {
      if (!is_mtp(t.name)) continue;
      mtp_by_file[src.file_name(f)].insert(t.name);
      src_mtp.insert(t.name);
      ++n_mtp;
    }
    mixed |= n_mtp > 0 && n_mtp != f.tensors().size();
  }
  rep.found = src_mtp.size();
  if (src_mtp.empty()) {
    throw Error(Errc::kTensorNotFound,
                "'" + source.string() + "' has no mtp.* tensors: nothing to add");
  }
  check_against_config(src, src_mtp, target);

  // The target may lack exactly what we add (an unlisted or missing sidecar): open it leniently.
  std::vector<ckpt::Problem> target_problems;
  const ckpt::Checkpoint tgt = ckpt::Checkpoint::open_collect(target, target_problems);
  if (tgt.is_single_file()) throw Error(Errc::kUsage, "--target must be a checkpoint directory");
  for (const ckpt::Problem& p : target_problems) {
    const bool tolerated = p.code == Errc::kStrayFile || p.code == Errc::kIndexTensorUnlisted ||
                           p.code == Errc::kTotalSizeMismatch || p.code == Errc::kIndexMissing ||
                           (p.code == Errc::kIndexMissingFile && mtp_by_file.count(p.file));
    if (!tolerated) throw Error(p.code, "target: " + ckpt::format_problem(p));
  }

  // A complete head already listed (possibly in another format than the source's) is kept.
  std::set<std::string> tgt_mtp;
  for (const ckpt::SafetensorsFile& f : tgt.tensor_files()) {
    for (const ckpt::TensorInfo& t : f.tensors()) {
      if (is_mtp(t.name)) tgt_mtp.insert(t.name);
    }
  }
  if (!tgt_mtp.empty() && !o.force) {
    try {
      check_against_config(tgt, tgt_mtp, target);
    } catch (const Error& e) {
      throw Error(e.code(), "the target lists an incomplete MTP head (" + std::string(e.what()) +
                                "); --force replaces it with the source's");
    }
    std::set<std::string> files;
    for (const std::string& n : tgt_mtp) files.insert(tgt.file_name(*tgt.find(n)->file));
    rep.files.assign(files.begin(), files.end());
    rep.already = tgt_mtp.size();
    rep.transfer = "already present";
    rep.total_size_before = rep.total_size_after =
        tgt.index() ? tgt.index()->total_size.value_or(0) : 0;
    return rep;
  }

  // Where each MTP tensor will live in the target.
  std::map<std::string, std::string> file_of;  // tensor -> target file
  if (mixed) {
    for (const std::string& n : src_mtp) file_of[n] = std::string(ckpt::kMtpSidecarName);
  } else {
    for (const auto& [file, names] : mtp_by_file) {
      for (const std::string& n : names) file_of[n] = file;
    }
  }
  std::set<std::string> target_files;
  for (const auto& [n, f] : file_of) target_files.insert(f);
  rep.files.assign(target_files.begin(), target_files.end());

  // Bring the files (or find them already there, identical).
  std::vector<std::string> transfers;
  for (const std::string& f : target_files) {
    const fs::path dst = target / f;
    std::error_code ec;
    if (fs::exists(dst, ec)) {  // already there: fine if it holds the same MTP tensors
      const auto have = tensor_hashes(dst);
      bool same = have.size() == (mixed ? src_mtp.size() : mtp_by_file.at(f).size());
      for (const auto& [srcf, names] : mtp_by_file) {
        if (!mixed && srcf != f) continue;
        const auto src_hashes = tensor_hashes(src.root() / srcf);
        for (const std::string& n : names) {
          const auto h = have.find(n);
          same &= h != have.end() && h->second == src_hashes.at(n);
        }
      }
      if (same) {
        transfers.push_back("already present");
        continue;
      }
      if (!o.force) {
        throw Error(Errc::kExists, "'" + dst.string() +
                                       "' exists and differs from the source's MTP tensors "
                                       "(--force replaces it)");
      }
    }
    if (o.dry_run) {
      transfers.push_back(mixed ? "extract"
                                : (o.link ? "hardlink, reflink or copy" : "reflink or copy"));
      continue;
    }
    if (!mixed) {
      transfers.push_back(method_name(ckpt::copy_file_atomic(src.root() / f, dst, o.link, true)));
      continue;
    }
    // Extract the MTP tensors from mixed shards into a sidecar of their own.
    std::vector<ckpt::TensorSpec> specs;
    for (const std::string& n : src_mtp) {
      const ckpt::TensorRef* r = src.find(n);
      specs.push_back({n, r->info->dtype, r->info->shape});
    }
    ckpt::WriterOptions wo;
    wo.overwrite = true;
    ckpt::SafetensorsWriter w(dst, ckpt::plan_safetensors(specs, ckpt::Metadata{{"format", "pt"}}),
                              wo);
    for (const ckpt::TensorInfo& t : w.plan().layout) {
      const ckpt::TensorRef* r = src.find(t.name);
      w.copy_from(r->file->map().fd(), r->file->header().data_offset() + r->info->begin,
                  t.n_bytes(), r->file->path());
    }
    w.commit();
    transfers.push_back("extract");
  }
  std::set<std::string> distinct(transfers.begin(), transfers.end());
  for (const std::string& t : distinct) rep.transfer += (rep.transfer.empty() ? "" : ", ") + t;

  // The index: exactly the MTP names added, total_size recomputed over every listed file.
  ckpt::ShardIndex index = tgt.index() ? *tgt.index() : ckpt::ShardIndex{};
  if (!tgt.index()) {
    for (const ckpt::SafetensorsFile& f : tgt.tensor_files()) {
      for (const ckpt::TensorInfo& t : f.tensors()) {
        if (!file_of.count(t.name)) index.weight_map.emplace_back(t.name, tgt.file_name(f));
      }
    }
  }
  std::map<std::string, std::string> listed(index.weight_map.begin(), index.weight_map.end());
  rep.total_size_before = index.total_size.value_or(0);
  for (const auto& [n, f] : file_of) {
    const auto it = listed.find(n);
    if (it == listed.end()) {
      listed[n] = f;
      ++rep.added;
    } else if (it->second == f) {
      ++rep.already;
    } else {
      throw Error(Errc::kIndexWrongFile, "the target's index maps '" + n + "' to '" + it->second +
                                             "', the MTP sidecar is '" + f + "'");
    }
  }
  if (o.dry_run) return rep;
  index.weight_map.assign(listed.begin(), listed.end());
  std::set<std::string> referenced;
  for (const auto& [n, f] : index.weight_map) referenced.insert(f);
  uint64_t total = 0;
  for (const std::string& f : referenced) {
    const ckpt::SafetensorsFile sf = ckpt::SafetensorsFile::open(target / f);
    for (const ckpt::TensorInfo& t : sf.tensors()) total += t.n_bytes();
  }
  index.total_size = total;
  rep.total_size_after = total;
  const bool index_changed = rep.added > 0 || rep.total_size_before != total;
  if (index_changed) {
    ckpt::write_file_atomic(target / ckpt::kIndexFileName, ckpt::serialize_index(index), true);
  }

  // A checksum manifest must describe the new files.
  const fs::path manifest = target / ckpt::kManifestFileName;
  std::error_code ec;
  const bool files_changed =
      std::any_of(transfers.begin(), transfers.end(),
                  [](const std::string& t) { return t != "already present"; });
  if (fs::exists(manifest, ec) && (index_changed || files_changed)) {
    ckpt::Manifest m = ckpt::parse_manifest(ckpt::read_text_file(manifest));
    std::set<std::string> redo(target_files);
    redo.insert(std::string(ckpt::kIndexFileName));
    std::erase_if(m.files, [&](const ckpt::FileDigest& d) { return redo.count(d.name) > 0; });
    for (const std::string& f : redo) {
      const fs::path p = target / f;
      const bool st = f != ckpt::kIndexFileName;
      std::optional<ckpt::SafetensorsFile> sf;
      if (st) sf.emplace(ckpt::SafetensorsFile::open(p));
      m.files.push_back(ckpt::digest_file({p, f, st ? &sf->header() : nullptr}));
    }
    std::sort(m.files.begin(), m.files.end(),
              [](const ckpt::FileDigest& a, const ckpt::FileDigest& b) { return a.name < b.name; });
    ckpt::write_file_atomic(manifest, ckpt::serialize_manifest(m), true);
    rep.manifest_updated = true;
  }
  return rep;
}

}  // namespace qf::quant
