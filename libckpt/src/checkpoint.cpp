#include "qf/ckpt/checkpoint.h"

#include <algorithm>
#include <array>
#include <map>
#include <regex>
#include <set>
#include <unordered_set>

#include "qf/ckpt/json.h"

namespace qf::ckpt {
namespace {

namespace fs = std::filesystem;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_shard_name(std::string_view name) {
  // model-00001-of-00014.safetensors (Hugging Face numbering) or the unsharded model.safetensors
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == "model.safetensors" || std::regex_match(name.begin(), name.end(), kShard);
}

bool is_tokenizer_file(std::string_view name) {
  static constexpr std::array<std::string_view, 11> kNames = {"tokenizer.json",
                                                              "tokenizer_config.json",
                                                              "vocab.json",
                                                              "merges.txt",
                                                              "special_tokens_map.json",
                                                              "added_tokens.json",
                                                              "chat_template.jinja",
                                                              "chat_template.json",
                                                              "generation_config.json",
                                                              "preprocessor_config.json",
                                                              "video_preprocessor_config.json"};
  return std::find(kNames.begin(), kNames.end(), name) != kNames.end();
}

void check_json_file(const fs::path& path, const std::string& name,
                     std::vector<Problem>& problems) {
  const std::string text = read_text_file(path, 64u << 20);
  if (const auto bad = utf8_error_offset(text)) {
    problems.push_back(
        {Errc::kConfigInvalid, name, "", "byte " + std::to_string(*bad) + " is not valid UTF-8"});
    return;
  }
  try {
    JsonReader r(text);
    if (r.peek() != JsonType::kObject) {
      problems.push_back({Errc::kConfigInvalid, name, "", "top level is not a JSON object"});
      return;
    }
    r.skip_value();
    r.expect_end();
  } catch (const JsonSyntaxError& e) {
    problems.push_back({Errc::kConfigInvalid, name, "",
                        "invalid JSON at byte " + std::to_string(e.offset()) + ": " + e.what()});
  }
}

}  // namespace

std::string_view file_role_name(FileRole role) {
  switch (role) {
    case FileRole::kShard:
      return "shard";
    case FileRole::kSidecar:
      return "sidecar";
    case FileRole::kStray:
      return "stray";
    case FileRole::kIndex:
      return "index";
    case FileRole::kConfig:
      return "config";
    case FileRole::kQuantConfig:
      return "quant-config";
    case FileRole::kManifest:
      return "manifest";
    case FileRole::kTokenizer:
      return "tokenizer";
    case FileRole::kOther:
      return "other";
  }
  return "other";
}

bool is_loader_fatal(Errc code) {
  switch (code) {
    case Errc::kIndexTensorUnlisted:  // loaders read every tensor of a referenced file anyway
    case Errc::kTotalSizeMismatch:    // no loader reads it
    case Errc::kStrayFile:
    case Errc::kIndexMissing:
    case Errc::kConfigInvalid:  // reported when the config is needed
      return false;
    default:
      return true;
  }
}

Checkpoint Checkpoint::open(const fs::path& path) {
  std::vector<Problem> problems;
  Checkpoint c = open_collect(path, problems);
  if (const Problem* p = c.first_fatal(problems)) throw Error(p->code, format_problem(*p));
  return c;
}

const Problem* Checkpoint::first_fatal(const std::vector<Problem>& problems) const {
  std::set<std::string_view> strays;
  for (const auto& f : listing_) {
    if (f.role == FileRole::kStray) strays.insert(f.name);
  }
  for (const Problem& p : problems) {
    if (is_loader_fatal(p.code) && !strays.count(p.file)) return &p;
  }
  return nullptr;
}

Checkpoint Checkpoint::open_collect(const fs::path& path, std::vector<Problem>& problems) {
  Checkpoint c;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    throw Error(Errc::kIo, "'" + path.string() + "': no such file or directory");
  }
  std::vector<std::string> names;
  if (fs::is_regular_file(st)) {
    c.single_file_ = true;
    c.root_ = path.parent_path();
    names.push_back(path.filename().string());
  } else if (fs::is_directory(st)) {
    c.root_ = path;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.' || !e.is_regular_file(ec)) continue;
      names.push_back(name);
    }
    if (ec) throw_io("cannot list directory", path.string(), ec.value());
    std::sort(names.begin(), names.end());
  } else {
    throw Error(Errc::kIo, "'" + path.string() + "' is neither a file nor a directory");
  }

  const bool has_index =
      !c.single_file_ && std::binary_search(names.begin(), names.end(), kIndexFileName);
  std::set<std::string> referenced;
  std::map<std::string, size_t> entries_per_file;
  if (has_index) {
    IndexParse ip = parse_index(read_text_file(c.root_ / kIndexFileName));
    for (Problem& p : ip.problems) {
      p.file = std::string(kIndexFileName);
      problems.push_back(std::move(p));
    }
    c.index_ = std::move(ip.index);
    for (const auto& [tensor, file] : c.index_->weight_map) ++entries_per_file[file];
    for (const auto& [file, n] : entries_per_file) referenced.insert(file);
  }

  std::vector<std::string> st_names;
  for (const std::string& n : names) {
    if (ends_with(n, ".safetensors")) st_names.push_back(n);
  }
  if (has_index) {
    for (const auto& [file, n] : entries_per_file) {
      if (!std::binary_search(st_names.begin(), st_names.end(), file)) {
        problems.push_back({Errc::kIndexMissingFile, file, "",
                            "the index maps " + std::to_string(n) +
                                " tensors to this file, which does not exist"});
      }
    }
  } else if (!c.single_file_ && st_names.size() != 1) {
    problems.push_back({Errc::kIndexMissing, "", "",
                        st_names.empty()
                            ? "no .safetensors files in the directory"
                            : std::to_string(st_names.size()) + " .safetensors files but no " +
                                  std::string(kIndexFileName)});
  }

  for (const std::string& n : names) {
    CheckpointFile f{n, FileRole::kOther, 0};
    f.size = fs::file_size(c.root_ / n, ec);
    if (ends_with(n, ".safetensors")) {
      const bool in_model = !has_index || referenced.count(n);
      f.role = !in_model                            ? FileRole::kStray
               : c.single_file_ || is_shard_name(n) ? FileRole::kShard
                                                    : FileRole::kSidecar;
      if (f.role == FileRole::kStray) {
        problems.push_back({Errc::kStrayFile, n, "",
                            "no index entry references this file: vLLM never loads it, but its "
                            "quantization probes still read its header"});
      }
      auto& dst = in_model ? c.files_ : c.strays_;
      dst.push_back(SafetensorsFile::open_collect(c.root_ / n, n, problems));
    } else if (n == kIndexFileName) {
      f.role = FileRole::kIndex;
    } else if (n == "config.json" || n == "quantization_config.json") {
      f.role = n == "config.json" ? FileRole::kConfig : FileRole::kQuantConfig;
      check_json_file(c.root_ / n, n, problems);
    } else if (n == kManifestFileName) {
      f.role = FileRole::kManifest;
    } else if (is_tokenizer_file(n)) {
      f.role = FileRole::kTokenizer;
    }
    c.listing_.push_back(std::move(f));
  }

  // Name lookups across files; the same name in two files is ambiguous for every loader.
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const SafetensorsFile& f : c.files_) {
    const std::string fname = c.file_name(f);
    by_file.emplace(fname, &f);
    for (const TensorInfo& t : f.tensors()) {
      c.tensor_bytes_ += t.n_bytes();
      const auto [it, inserted] = c.by_name_.emplace(t.name, TensorRef{&f, &t});
      if (!inserted) {
        problems.push_back({Errc::kDuplicateAcrossFiles, fname, t.name,
                            "also in '" + c.file_name(*it->second.file) + "'"});
      }
    }
  }
  if (!c.index_) return c;

  // Index <-> files agreement.
  bool complete = true;  // every referenced file exists and parsed cleanly
  for (const auto& [file, n] : entries_per_file) {
    const auto it = by_file.find(file);
    if (it == by_file.end() || !it->second->header().rejected.empty()) complete = false;
  }
  for (const auto& [name, file] : c.index_->weight_map) {
    const auto fit = by_file.find(file);
    if (fit == by_file.end() || fit->second->find(name)) continue;
    const auto& rejected = fit->second->header().rejected;
    if (std::find(rejected.begin(), rejected.end(), name) != rejected.end()) continue;
    if (const TensorRef* ref = c.find(name)) {
      problems.push_back({Errc::kIndexWrongFile, file, name,
                          "the index maps the tensor to this file, but it is in '" +
                              c.file_name(*ref->file) + "'"});
    } else {
      problems.push_back(
          {Errc::kIndexTensorMissing, file, name, "listed in the index but not in the file"});
    }
  }
  std::unordered_set<std::string_view> listed;
  listed.reserve(c.index_->weight_map.size());
  for (const auto& [name, file] : c.index_->weight_map) listed.insert(name);
  for (const SafetensorsFile& f : c.files_) {
    for (const TensorInfo& t : f.tensors()) {
      if (!listed.count(t.name)) {
        problems.push_back({Errc::kIndexTensorUnlisted, c.file_name(f), t.name,
                            "in the file but not in the index's weight_map"});
      }
    }
  }
  if (complete) {
    const std::string idx(kIndexFileName);
    const std::string actual = std::to_string(c.tensor_bytes_);
    if (!c.index_->total_size) {
      problems.push_back({Errc::kTotalSizeMismatch, idx, "",
                          "metadata.total_size is missing; the tensors hold " + actual + " bytes"});
    } else if (*c.index_->total_size != c.tensor_bytes_) {
      problems.push_back({Errc::kTotalSizeMismatch, idx, "",
                          "metadata.total_size is " + std::to_string(*c.index_->total_size) +
                              " but the tensors hold " + actual + " bytes"});
    }
  }
  return c;
}

const TensorRef* Checkpoint::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

TensorView Checkpoint::view(std::string_view name) const {
  const TensorRef* ref = find(name);
  if (!ref) {
    throw Error(Errc::kTensorNotFound,
                root_.string() + ": no tensor named '" + std::string(name) + "'");
  }
  return ref->file->view(*ref->info);
}

std::string Checkpoint::file_name(const SafetensorsFile& f) const {
  return f.path().filename().string();
}

}  // namespace qf::ckpt
