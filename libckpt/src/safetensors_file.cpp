#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "qf/ckpt/problem.h"
#include "qf/ckpt/safetensors.h"

namespace qf::ckpt {

void TensorView::check_as(size_t size, size_t align) const {
  const uint32_t bits = dtype_bits(info->dtype);
  if (bits != size * 8) {
    throw Error(Errc::kUnsupported, "tensor '" + info->name + "' is " +
                                        std::string(dtype_name(info->dtype)) + " (" +
                                        std::to_string(bits) + "-bit), not a " +
                                        std::to_string(size * 8) + "-bit element type");
  }
  if (reinterpret_cast<uintptr_t>(bytes.data()) % align != 0) {
    throw Error(Errc::kUnsupported, "tensor '" + info->name + "' is not " + std::to_string(align) +
                                        "-byte aligned in its file; copy it before typed access");
  }
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  std::vector<Problem> problems;
  SafetensorsFile f = open_collect(path, path.string(), problems);
  if (!problems.empty()) throw Error(problems.front().code, format_problem(problems.front()));
  return f;
}

SafetensorsFile SafetensorsFile::open_collect(const std::filesystem::path& path,
                                              std::string_view display_name,
                                              std::vector<Problem>& problems) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = MappedFile::open(path);
  HeaderParse parse = parse_header({f.map_.data(), f.map_.size()}, f.map_.size());
  f.header_valid_ = parse.problems.empty();
  for (Problem& p : parse.problems) {
    p.file = display_name;
    problems.push_back(std::move(p));
  }
  f.header_ = std::move(parse.header);
  f.build_lookup();
  return f;
}

void SafetensorsFile::build_lookup() {
  by_name_.clear();
  by_name_.reserve(header_.tensors.size());
  for (uint32_t i = 0; i < header_.tensors.size(); ++i) {
    by_name_.emplace(header_.tensors[i].name, i);
  }
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  return {&info, {map_.data() + header_.data_offset() + info.begin, info.n_bytes()}};
}

void SafetensorsFile::release(uint64_t begin, uint64_t n) const {
  if (!map_.data() || n == 0) return;
  static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t lo = (header_.data_offset() + begin) / kPage * kPage;
  const uint64_t hi = std::min(map_.size(), header_.data_offset() + begin + n);
  ::madvise(const_cast<std::byte*>(map_.data()) + lo, hi - lo, MADV_DONTNEED);
}

void SafetensorsFile::drop_cached(uint64_t begin, uint64_t n) const {
  release(begin, n);
  if (map_.fd() >= 0 && n > 0) {
    ::posix_fadvise(map_.fd(), static_cast<off_t>(header_.data_offset() + begin),
                    static_cast<off_t>(n), POSIX_FADV_DONTNEED);
  }
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (!info) {
    throw Error(Errc::kTensorNotFound,
                path_.string() + ": no tensor named '" + std::string(name) + "'");
  }
  return view(*info);
}

}  // namespace qf::ckpt
