// safetensors files: header model, strict header parser and zero-copy reader.
//
// Layout (safetensors README "Format"): u64 little-endian N, then N bytes of UTF-8 JSON (may be
// padded with whitespace), then the data section; data_offsets are relative to the data
// section, which must be tiled exactly once by the tensors sorted by offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "qf/ckpt/dtype.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/problem.h"
#include "qf/error.h"

namespace qf::ckpt {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's cap

using Shape = std::vector<uint64_t>;  // outermost dimension first; {} is a scalar
using Metadata = std::vector<std::pair<std::string, std::string>>;  // __metadata__ entries

// Element count of a shape already validated against overflow (1 for a scalar).
uint64_t shape_numel(const Shape& shape);
// "[248320, 3072]"
std::string shape_to_string(const Shape& shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0;  // data_offsets[0], relative to the data section
  uint64_t end = 0;    // data_offsets[1], one past the last byte
  uint64_t n_bytes() const { return end - begin; }
};

struct Header {
  uint64_t header_bytes = 0;  // N, including padding
  uint64_t data_bytes = 0;    // file size - 8 - N
  // Well-formed entries, sorted by (begin, end). Entries that broke a per-tensor rule are not
  // here; their names are in `rejected` so callers can avoid follow-on "missing" reports.
  std::vector<TensorInfo> tensors;
  std::vector<std::string> rejected;
  bool has_metadata = false;
  Metadata metadata;  // __metadata__ entries in header order

  uint64_t data_offset() const { return 8 + header_bytes; }
};

struct HeaderParse {
  Header header;
  std::vector<Problem> problems;  // empty iff every rule holds
};

// Parses and checks a header against every rule of the reference reader (safetensors crate
// `read_metadata` + `validate`), plus explicit duplicate-name rejection. `prefix` is the start
// of the file and must hold at least min(file_size, 8 + N) bytes; `file_size` is the whole
// file's size. A structural failure (length, UTF-8, JSON) yields one problem and stops;
// per-tensor and offset problems are all collected. Never throws on bad input.
HeaderParse parse_header(std::span<const std::byte> prefix, uint64_t file_size);

// Bytes of one tensor inside a mapped file. The data section starts 8-byte aligned only when
// the writer padded the header, so check alignment (as<T>) before reinterpreting.
struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const std::byte> bytes;

  // Typed view; throws Error(kUnsupported) when the dtype size or alignment does not fit T.
  template <class T>
  std::span<const T> as() const {
    check_as(sizeof(T), alignof(T));
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }

 private:
  void check_as(size_t size, size_t align) const;
};

// A read-only mapped safetensors file. Opening maps the file and parses the header only; tensor
// bytes are touched when a caller reads a view. Move-only; views die with the object.
class SafetensorsFile {
 public:
  // Throws Error for the first problem (fail fast), or Error(kIo).
  static SafetensorsFile open(const std::filesystem::path& path);
  // Appends every header problem to `problems` (file = `display_name`) and returns the file
  // with its well-formed tensors; throws only Error(kIo).
  static SafetensorsFile open_collect(const std::filesystem::path& path,
                                      std::string_view display_name,
                                      std::vector<Problem>& problems);

  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return map_.size(); }
  const Header& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  // True when the header broke no rule (open() only returns such files).
  bool header_valid() const { return header_valid_; }

  const TensorInfo* find(std::string_view name) const;
  TensorView view(const TensorInfo& info) const;
  // Throws Error(kTensorNotFound) naming the file.
  TensorView view(std::string_view name) const;
  const MappedFile& map() const { return map_; }
  // Drops this process's mapping of the pages holding [begin, begin + n) of the data section
  // (they stay in the page cache): streaming readers call it so RSS does not grow with the
  // file. Later reads fault the pages back in.
  void release(uint64_t begin, uint64_t n) const;
  // release(), and the pages leave the page cache too (posix_fadvise DONTNEED): for a loader
  // that copies the bytes elsewhere (the GPU) and will not read them again, so that the file's
  // pages do not hold the memory a unified-memory GPU needs. Later reads go to the disk.
  void drop_cached(uint64_t begin, uint64_t n) const;

 private:
  SafetensorsFile() = default;
  void build_lookup();

  std::filesystem::path path_;
  MappedFile map_;
  Header header_;
  bool header_valid_ = false;
  std::unordered_map<std::string_view, uint32_t> by_name_;  // views into header_.tensors names
};

}  // namespace qf::ckpt
