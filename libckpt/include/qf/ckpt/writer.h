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

#include <array>
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

// The file's first 8 bytes: the header's length, little-endian.
std::array<uint8_t, 8> length_prefix(const HeaderPlan& plan);

// Sorts and lays out `tensors`. `metadata` (nullopt: no __metadata__ key) is written first, in
// the order given. Throws Error(kDuplicateName) for a repeated name, kHeaderTooLarge above the
// reader's 100 MB cap, kHeaderNotUtf8 for a name that is not UTF-8.
HeaderPlan plan_safetensors(std::vector<TensorSpec> tensors,
                            const std::optional<Metadata>& metadata);

// Block size of extent sharing: a byte range can be cloned only between offsets that agree
// modulo this (the common 4 KiB filesystem block; XFS and btrfs use it by default).
inline constexpr uint64_t kCloneBlock = 4096;

// As plan_safetensors, but in the order given, and with the header padded (spaces) so that the
// data section starts at `data_start_mod` modulo kCloneBlock when given (a multiple of 8). Lets
// a rewritten file keep the source's byte positions modulo the block size, so that unchanged
// runs of tensors can share the source's blocks (WriterOptions::clone). Alignment of each
// tensor to its dtype is the caller's to check.
HeaderPlan plan_safetensors_in_order(std::vector<TensorSpec> tensors,
                                     const std::optional<Metadata>& metadata,
                                     std::optional<uint64_t> data_start_mod = std::nullopt);

// The plan for a file rebuilt from others: `tensors` in the order given, with the data section
// placed (plan_safetensors_in_order) so that the most bytes sit at their source's file offset
// modulo kCloneBlock; `source_offsets[i]` is that offset for tensor i, nullopt for new bytes.
// Falls back to plan_safetensors (sorted) when the order would misalign a tensor for its dtype.
HeaderPlan plan_safetensors_sharing(std::vector<TensorSpec> tensors,
                                    const std::optional<Metadata>& metadata,
                                    const std::vector<std::optional<uint64_t>>& source_offsets);

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
  // copy_from shares the source's blocks (FICLONERANGE) for every whole block whose source and
  // destination offsets agree modulo kCloneBlock, on filesystems that can (XFS, btrfs); the rest
  // is copied. The bytes are read from the source only when hashing. Implies no preallocation:
  // shared blocks take no space. The first refusal turns it off for this writer.
  bool clone = false;
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
  // Of those, bytes that share the source's blocks (WriterOptions::clone).
  uint64_t bytes_cloned() const { return cloned_; }
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
  void copy_bytes(int fd, loff_t& in_off, uint64_t n, const std::filesystem::path& source);
  void settle();
  void hash_source(int fd, uint64_t src, uint64_t n, const std::filesystem::path& source);
  bool clone_blocks(int fd, uint64_t src, uint64_t n, uint64_t dst,
                    const std::filesystem::path& source);

  struct Pending {  // a copy not yet written (WriterOptions::clone)
    int fd = -1;
    uint64_t src = 0, n = 0;  // source range
    uint64_t dst = 0;         // its file offset in the output
    std::filesystem::path source;
  };

  std::filesystem::path path_;
  std::filesystem::path tmp_;
  HeaderPlan plan_;
  WriterOptions options_;
  UniqueFd fd_;
  std::vector<std::byte> buf_;
  size_t buf_used_ = 0;
  uint64_t written_ = 0;
  uint64_t cloned_ = 0;
  Pending pending_;
  bool committed_ = false;
  std::unique_ptr<StreamHasher> hasher_;
  std::optional<FileDigest> digest_;
};

}  // namespace qf::ckpt
