// Streaming safetensors writer: plan first, then stream bytes from any source.
//
// The plan (names, dtypes, shapes) fixes the header and every offset before a single data byte
// is written, so tensors of any size can be streamed through a fixed buffer: memory use does
// not depend on tensor size. Output is deterministic and matches the reference writer byte for
// byte: tensors sorted by descending dtype alignment then name, header padded with spaces to a
// multiple of 8. Writes are atomic: "<path>.tmp", fsync, rename, fsync of the directory.
#pragma once

#include <sys/types.h>
#include <cstddef>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/safetensors.h"

namespace qf::ckpt {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
};

// Bytes of a tensor; throws Error(kShapeOverflow / kMisalignedSlice) for impossible specs.
uint64_t tensor_bytes(const TensorSpec& spec);

struct HeaderPlan {
  std::string header;              // length prefix excluded; JSON padded to a multiple of 8
  std::vector<TensorInfo> layout;  // tensors in write order, with their data offsets
  uint64_t data_bytes = 0;

  uint64_t file_bytes() const { return 8 + header.size() + data_bytes; }
};

// Sorts and lays out `tensors`. `metadata` (nullopt: no __metadata__ key) is written first, in
// the order given. Throws Error(kDuplicateName) for a repeated name, kHeaderTooLarge above the
// reader's 100 MB cap, kHeaderNotUtf8 for a name that is not UTF-8.
HeaderPlan plan_safetensors(std::vector<TensorSpec> tensors,
                            const std::optional<Metadata>& metadata);

struct WriterOptions {
  bool overwrite = false;   // replace an existing file (the CLI's --force)
  bool preallocate = true;  // reserve the final size up front: a full disk fails at once
  bool kernel_copy = true;  // copy_from uses copy_file_range; off: always through the buffer
  // write_zeros leaves holes (a sparse file) instead of writing zero bytes, and copy_from keeps
  // the source's holes as holes; implies no preallocation. Readers see zeros either way.
  bool sparse_zeros = false;
  // Hash the file as it is written (digest() after commit): the checksum manifest without a
  // second read. copy_from then passes bytes through the buffer instead of the kernel.
  bool hash = false;
  size_t buffer_bytes = 8u << 20;
};

class SafetensorsWriter {
 public:
  // Creates "<path>.tmp" and writes the header. Throws Error(kExists) if `path` exists and
  // overwrite is off, Error(kIo) if the staging file cannot be created or space reserved.
  SafetensorsWriter(std::filesystem::path path, HeaderPlan plan, WriterOptions options = {});
  // Without commit(), the staging file is removed: an interrupted write leaves nothing behind.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const HeaderPlan& plan() const { return plan_; }
  const std::filesystem::path& path() const { return path_; }
  // Data-section bytes written so far.
  uint64_t bytes_written() const { return written_; }
  // Layout index of the tensor the next byte belongs to; zero-size tensors never are (they are
  // complete from the start). layout.size() once every byte is written.
  size_t current_tensor() const;

  // Appends the next bytes of the data section (they may span tensors). Writing past the planned
  // end is a caller bug and aborts.
  void write(const void* data, size_t n);
  void write(std::span<const std::byte> bytes) { write(bytes.data(), bytes.size()); }
  // Appends a whole tensor, which must be the next one in layout order and of planned size;
  // throws Error(kTensorSizeMismatch) or Error(kUsage) otherwise.
  void write_tensor(std::string_view name, std::span<const std::byte> bytes);
  // Appends n bytes of another file, starting at `offset`, without passing them through user
  // memory where the kernel can copy (copy_file_range; reflinks on CoW filesystems).
  void copy_from(int fd, uint64_t offset, uint64_t n, const std::filesystem::path& source);
  // Appends n zero bytes.
  void write_zeros(uint64_t n);

  // Requires every planned byte written; flushes, fsyncs and renames into place.
  void commit();
  // File and tensor hashes of the committed file (WriterOptions::hash).
  const FileDigest& digest() const;

 private:
  void flush();
  void check_room(uint64_t n) const;
  void copy_data(int fd, loff_t& in_off, uint64_t n, const std::filesystem::path& source);

  std::filesystem::path path_;
  std::filesystem::path tmp_;
  HeaderPlan plan_;
  WriterOptions options_;
  UniqueFd fd_;
  std::vector<std::byte> buf_;
  size_t buf_used_ = 0;
  uint64_t written_ = 0;
  bool committed_ = false;
  std::unique_ptr<StreamHasher> hasher_;
  std::optional<FileDigest> digest_;
};

}  // namespace qf::ckpt
