// qforge inspect PATH: what a checkpoint holds, by dtype, by format family and by file.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "output.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/summary.h"

namespace qf::tools {
namespace {

struct InspectArgs {
  std::string path;
  bool tensors = false;
  bool json = false;
};

struct Listed {
  const ckpt::TensorInfo* t;
  std::string file;
};

std::vector<Listed> sorted_tensors(const ckpt::Checkpoint& c) {
  std::vector<Listed> out;
  out.reserve(c.n_tensors());
  for (const ckpt::SafetensorsFile& f : c.tensor_files()) {
    const std::string name = c.file_name(f);
    for (const ckpt::TensorInfo& t : f.tensors()) out.push_back({&t, name});
  }
  std::sort(out.begin(), out.end(),
            [](const Listed& a, const Listed& b) { return a.t->name < b.t->name; });
  return out;
}

void print_json(const InspectArgs& args, const ckpt::Checkpoint& c, const ckpt::Summary& s,
                const std::vector<ckpt::Problem>& problems) {
  nlohmann::json j;
  j["path"] = args.path;
  j["n_tensors"] = s.n_tensors;
  j["tensor_bytes"] = s.tensor_bytes;
  j["has_index"] = c.index().has_value();
  j["by_dtype"] = nlohmann::json::object();
  for (const ckpt::DTypeStat& d : s.by_dtype) {
    j["by_dtype"][std::string(ckpt::dtype_name(d.dtype))] = {{"tensors", d.n_tensors},
                                                             {"bytes", d.bytes}};
  }
  j["by_format"] = nlohmann::json::array();
  for (const ckpt::FormatStat& f : s.by_format) {
    j["by_format"].push_back({{"family", f.family},
                              {"members", f.members},
                              {"modules", f.n_modules},
                              {"tensors", f.n_tensors},
                              {"bytes", f.bytes}});
  }
  j["files"] = nlohmann::json::array();
  for (const ckpt::FileStat& f : s.files) {
    j["files"].push_back({{"name", f.name},
                          {"role", ckpt::file_role_name(f.role)},
                          {"tensors", f.n_tensors},
                          {"file_bytes", f.file_bytes},
                          {"header_bytes", f.header_bytes},
                          {"tensor_bytes", f.tensor_bytes}});
  }
  j["other_files"] = nlohmann::json::array();
  for (const ckpt::CheckpointFile& f : c.listing()) {
    if (f.name.size() < 12 || f.name.substr(f.name.size() - 12) != ".safetensors") {
      j["other_files"].push_back(
          {{"name", f.name}, {"role", ckpt::file_role_name(f.role)}, {"bytes", f.size}});
    }
  }
  j["problems"] = problems_json(problems);
  if (args.tensors) {
    nlohmann::json arr = nlohmann::json::array();
    for (const Listed& l : sorted_tensors(c)) {
      arr.push_back({{"name", l.t->name},
                     {"dtype", ckpt::dtype_name(l.t->dtype)},
                     {"shape", l.t->shape},
                     {"file", l.file},
                     {"data_offsets", {l.t->begin, l.t->end}}});
    }
    j["tensors"] = std::move(arr);
  }
  std::printf("%s\n", j.dump(2).c_str());
}

void print_human(const InspectArgs& args, const ckpt::Checkpoint& c, const ckpt::Summary& s) {
  size_t n_shards = 0, n_sidecars = 0, n_strays = 0;
  for (const ckpt::FileStat& f : s.files) {
    n_shards += f.role == ckpt::FileRole::kShard;
    n_sidecars += f.role == ckpt::FileRole::kSidecar;
    n_strays += f.role == ckpt::FileRole::kStray;
  }
  std::printf("%s: %zu shard%s", args.path.c_str(), n_shards, n_shards == 1 ? "" : "s");
  if (n_sidecars) std::printf(", %zu sidecar%s", n_sidecars, n_sidecars == 1 ? "" : "s");
  if (n_strays) std::printf(", %zu stray", n_strays);
  if (c.index()) {
    std::printf(", index with %s entries", with_commas(c.index()->weight_map.size()).c_str());
  }
  std::printf("\n%-22s %10s %14s\n", "tensors", with_commas(s.n_tensors).c_str(),
              human_bytes(s.tensor_bytes).c_str());

  std::printf("\n%-22s %10s %14s\n", "by dtype", "tensors", "bytes");
  for (const ckpt::DTypeStat& d : s.by_dtype) {
    std::printf("  %-20s %10s %14s\n", std::string(ckpt::dtype_name(d.dtype)).c_str(),
                with_commas(d.n_tensors).c_str(), human_bytes(d.bytes).c_str());
  }
  std::printf("\n%-22s %10s %10s %14s  %s\n", "by format", "modules", "tensors", "bytes",
              "members");
  for (const ckpt::FormatStat& f : s.by_format) {
    std::printf("  %-20s %10s %10s %14s  %s\n", f.family.c_str(), with_commas(f.n_modules).c_str(),
                with_commas(f.n_tensors).c_str(), human_bytes(f.bytes).c_str(), f.members.c_str());
  }
  size_t width = 4;
  for (const ckpt::FileStat& f : s.files) width = std::max(width, f.name.size());
  const int w = static_cast<int>(width);
  std::printf("\n%-*s  %-8s %10s %12s %14s\n", w + 2, "files", "role", "tensors", "header", "file");
  for (const ckpt::FileStat& f : s.files) {
    std::printf("  %-*s  %-8s %10s %12s %14s\n", w, f.name.c_str(),
                std::string(ckpt::file_role_name(f.role)).c_str(), with_commas(f.n_tensors).c_str(),
                human_bytes(f.header_bytes).c_str(), human_bytes(f.file_bytes).c_str());
  }
  if (!args.tensors) return;
  std::printf("\n%-40s %-8s %-22s %-36s %s\n", "tensor", "dtype", "shape", "file", "data_offsets");
  for (const Listed& l : sorted_tensors(c)) {
    std::printf("%-40s %-8s %-22s %-36s [%llu, %llu]\n", l.t->name.c_str(),
                std::string(ckpt::dtype_name(l.t->dtype)).c_str(),
                ckpt::shape_to_string(l.t->shape).c_str(), l.file.c_str(),
                static_cast<unsigned long long>(l.t->begin),
                static_cast<unsigned long long>(l.t->end));
  }
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "Summarize a checkpoint: tensors and bytes by dtype, format family and file");
  sub->add_option("PATH", args->path, "checkpoint directory or .safetensors file")->required();
  sub->add_flag("--tensors", args->tensors, "also list every tensor: name, dtype, shape, offsets");
  sub->add_flag("--json", args->json, "machine-readable output on stdout");
  sub->footer(
      "Reads headers only. Exits 2 if the checkpoint cannot be loaded (run `qforge validate`\n"
      "for the full list of problems).\n\n"
      "Example:\n  qforge inspect /models/Qwen3.5-122B-A10B-int4-AutoRound --json");
  return {sub, [args] {
            std::vector<ckpt::Problem> problems;
            const ckpt::Checkpoint c = ckpt::Checkpoint::open_collect(args->path, problems);
            const ckpt::Summary s = ckpt::summarize(c);
            if (args->json) {
              print_json(*args, c, s, problems);
            } else {
              print_human(*args, c, s);
            }
            const bool fatal = c.first_fatal(problems) != nullptr;
            if (!problems.empty()) {
              std::fprintf(stderr,
                           "qforge inspect: warning: %zu problem%s found; run `qforge validate "
                           "%s` for the list\n",
                           problems.size(), problems.size() == 1 ? "" : "s", args->path.c_str());
            }
            return fatal ? kExitInvalid : kExitOk;
          }};
}

}  // namespace qf::tools
