// POSIX file helpers: owned descriptors, read-only mappings, atomic small-file writes.
// Linux/glibc on x86-64 and aarch64; every failure throws Error(kIo) naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace qf::ckpt {

// Owns one file descriptor; move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// Opens read-only (O_CLOEXEC); throws Error(kIo).
UniqueFd open_read(const std::filesystem::path& path);

// A whole file mapped read-only and shared. Empty files have data() == nullptr. Move-only.
class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile open(const std::filesystem::path& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// Reads a whole (small) file; throws Error(kIo) if it is larger than max_bytes.
std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes = 1ull << 30);

// "<path>.tmp": where atomic writers stage their output.
std::filesystem::path staging_path(const std::filesystem::path& path);

// Writes `content` to staging_path(path), fsyncs, renames over `path` and fsyncs the directory.
// Refuses (Error(kExists)) an existing `path` unless overwrite is set.
void write_file_atomic(const std::filesystem::path& path, std::string_view content, bool overwrite);

// Writes all of buf at the file position, retrying short writes and EINTR; throws Error(kIo).
void write_all(int fd, const void* buf, size_t n, const std::filesystem::path& path_for_errors);
// Reads exactly n bytes at `offset` (pread); throws Error(kIo) on error or early EOF.
void pread_all(int fd, void* buf, size_t n, uint64_t offset,
               const std::filesystem::path& path_for_errors);

enum class CopyMethod { kReflink, kHardLink, kCopy };

// Copies `src` to `dst` through "<dst>.tmp" + rename: a reflink where the filesystem shares
// extents (btrfs, XFS), else a hard link when allowed and on the same filesystem, else a kernel
// copy (copy_file_range, falling back to read/write). Refuses (Error(kExists)) an existing dst
// unless overwrite. Returns what it did.
CopyMethod copy_file_atomic(const std::filesystem::path& src, const std::filesystem::path& dst,
                            bool allow_hardlink, bool overwrite);

// True when a new file in `dir` can share blocks of `src` (FICLONERANGE: XFS, btrfs), tried
// on an unnamed temporary file. False for files shorter than one block.
bool can_clone(const std::filesystem::path& src, const std::filesystem::path& dir);

// True when less than 90% of the file's length is allocated on disk (it has holes, e.g. a
// synthetic checkpoint of zeros): writers copying from it should keep the holes.
bool is_sparse_file(const std::filesystem::path& path);

// fsync of a directory so that a rename inside it is durable.
void fsync_dir(const std::filesystem::path& dir);

// Moves the finished directory `stage` to `out`. An existing `out` is refused (Error(kExists))
// unless overwrite; then the two are swapped in one step (renameat2 RENAME_EXCHANGE) and the old
// one removed, so `out` always names a complete directory. Where the filesystem cannot swap, out
// is renamed to "<out>.old" first (a crash in between leaves "<out>.old" and the stage).
void publish_directory(const std::filesystem::path& stage, const std::filesystem::path& out,
                       bool overwrite);

}  // namespace qf::ckpt
