#include "qf/ckpt/validate.h"

#include <chrono>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"

namespace qf::ckpt {
namespace {

namespace fs = std::filesystem;

std::vector<DigestJob> digest_jobs(const Checkpoint& c, const fs::path& path) {
  std::vector<DigestJob> jobs;
  auto header_of = [&](const std::string& name) -> const Header* {
    for (const auto* list : {&c.tensor_files(), &c.stray_files()}) {
      for (const SafetensorsFile& f : *list) {
        if (c.file_name(f) == name) return f.header_valid() ? &f.header() : nullptr;
      }
    }
    return nullptr;
  };
  if (c.is_single_file()) {
    const std::string name = path.filename().string();
    jobs.push_back({path, name, header_of(name)});
    return jobs;
  }
  for (const CheckpointFile& f : c.listing()) {
    if (f.role == FileRole::kManifest) continue;
    jobs.push_back({c.root() / f.name, f.name, header_of(f.name)});
  }
  return jobs;
}

}  // namespace

fs::path manifest_path_for(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path / kManifestFileName;
  fs::path p = path;
  p += ".";
  p += kManifestFileName;
  return p;
}

ValidateReport validate_checkpoint(const fs::path& path, const ValidateOptions& options) {
  ValidateReport report;
  const Checkpoint c = Checkpoint::open_collect(path, report.problems);
  report.n_model_files = c.tensor_files().size();
  report.n_files = c.listing().size();
  report.n_tensors = c.n_tensors();
  report.tensor_bytes = c.tensor_bytes();
  if (options.extra_checks) options.extra_checks(c, report.problems);
  if (!options.checksums) return report;

  report.manifest_path = manifest_path_for(path);
  std::error_code ec;
  const bool have_manifest = fs::exists(report.manifest_path, ec);
  if (!have_manifest && !report.ok()) {
    report.checksums = ChecksumAction::kNotCreated;  // never certify a broken checkpoint
    return report;
  }
  std::optional<Manifest> recorded;
  if (have_manifest) {
    try {
      recorded = parse_manifest(read_text_file(report.manifest_path, 1ull << 30));
    } catch (const Error& e) {
      if (e.code() != Errc::kManifestInvalid) throw;
      report.problems.push_back(
          {Errc::kManifestInvalid, report.manifest_path.filename().string(), "", e.what()});
      return report;
    }
  }

  const std::vector<DigestJob> jobs = digest_jobs(c, path);
  if (options.progress) {
    uint64_t total = 0;
    for (const DigestJob& j : jobs) total += fs::file_size(j.path, ec);
    options.progress->total = total;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Manifest measured = digest_files(jobs, options.threads, options.progress);
  report.hash_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const FileDigest& f : measured.files) report.hashed_bytes += f.size;

  if (recorded) {
    report.checksums = ChecksumAction::kVerified;
    for (Problem& p : compare_manifests(*recorded, measured)) report.problems.push_back(p);
  } else {
    write_file_atomic(report.manifest_path, serialize_manifest(measured), /*overwrite=*/false);
    report.checksums = ChecksumAction::kCreated;
  }
  return report;
}

}  // namespace qf::ckpt
