#include "qf/ckpt/file_io.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "qf/error.h"

namespace qf::ckpt {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

UniqueFd open_read(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io("cannot open", path.string(), errno);
  return UniqueFd(fd);
}

MappedFile MappedFile::open(const std::filesystem::path& path) {
  MappedFile m;
  m.fd_ = open_read(path);
  struct stat st {};
  if (::fstat(m.fd_.get(), &st) != 0) throw_io("cannot stat", path.string(), errno);
  if (!S_ISREG(st.st_mode)) throw Error(Errc::kIo, "not a regular file: '" + path.string() + "'");
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_SHARED, m.fd_.get(), 0);
    if (p == MAP_FAILED) throw_io("cannot map", path.string(), errno);
    m.data_ = static_cast<const std::byte*>(p);
  }
  return m;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : fd_(std::move(o.fd_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    fd_ = std::move(o.fd_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes) {
  UniqueFd fd = open_read(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_io("cannot stat", path.string(), errno);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw Error(Errc::kIo, "file '" + path.string() + "' is " + std::to_string(size) +
                               " bytes, more than the " + std::to_string(max_bytes) +
                               " this reader accepts");
  }
  std::string out(size, '\0');
  pread_all(fd.get(), out.data(), size, 0, path);
  return out;
}

std::filesystem::path staging_path(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  p += ".tmp";
  return p;
}

void write_all(int fd, const void* buf, size_t n, const std::filesystem::path& path_for_errors) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_io("cannot write", path_for_errors.string(), errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void pread_all(int fd, void* buf, size_t n, uint64_t offset,
               const std::filesystem::path& path_for_errors) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_io("cannot read", path_for_errors.string(), errno);
    }
    if (r == 0) {
      throw Error(Errc::kIo, "unexpected end of file reading '" + path_for_errors.string() +
                                 "' at byte " + std::to_string(offset));
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

void fsync_dir(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io("cannot open directory", d.string(), errno);
  UniqueFd owned(fd);
  if (::fsync(fd) != 0 && errno != EINVAL) throw_io("cannot fsync directory", d.string(), errno);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content,
                       bool overwrite) {
  std::error_code ec;
  if (!overwrite && std::filesystem::exists(path, ec)) {
    throw Error(Errc::kExists, "'" + path.string() + "' exists (use --force to overwrite)");
  }
  const std::filesystem::path tmp = staging_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io("cannot create", tmp.string(), errno);
  UniqueFd owned(fd);
  try {
    write_all(fd, content.data(), content.size(), tmp);
    if (::fsync(fd) != 0) throw_io("cannot fsync", tmp.string(), errno);
    owned.reset();
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_io("cannot rename", tmp.string(), errno);
  } catch (...) {
    owned.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(path.parent_path());
}

CopyMethod copy_file_atomic(const std::filesystem::path& src, const std::filesystem::path& dst,
                            bool allow_hardlink, bool overwrite) {
  std::error_code ec;
  if (!overwrite && std::filesystem::exists(dst, ec)) {
    throw Error(Errc::kExists, "'" + dst.string() + "' exists (use --force to overwrite)");
  }
  const std::filesystem::path tmp = staging_path(dst);
  ::unlink(tmp.c_str());
  CopyMethod method = CopyMethod::kCopy;
  if (allow_hardlink && ::link(src.c_str(), tmp.c_str()) == 0) {
    method = CopyMethod::kHardLink;
  } else {
    UniqueFd in = open_read(src);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw_io("cannot create", tmp.string(), errno);
    UniqueFd out(fd);
    try {
      if (::ioctl(out.get(), FICLONE, in.get()) == 0) {
        method = CopyMethod::kReflink;
      } else {
        struct stat st {};
        if (::fstat(in.get(), &st) != 0) throw_io("cannot stat", src.string(), errno);
        uint64_t left = static_cast<uint64_t>(st.st_size);
        loff_t off = 0;
        bool kernel = true;
        while (left > 0) {
          if (kernel) {
            const ssize_t r = ::copy_file_range(in.get(), &off, out.get(), nullptr, left, 0);
            if (r > 0) {
              left -= static_cast<uint64_t>(r);
              continue;
            }
            if (r < 0 && errno == EINTR) continue;
            if (r == 0) throw Error(Errc::kIo, "'" + src.string() + "' shrank while being copied");
            if (errno != EXDEV && errno != ENOSYS && errno != EOPNOTSUPP && errno != EINVAL) {
              throw_io("cannot copy", src.string(), errno);
            }
            kernel = false;
          }
          char buf[1 << 16];
          const size_t take = static_cast<size_t>(std::min<uint64_t>(left, sizeof buf));
          pread_all(in.get(), buf, take, static_cast<uint64_t>(off), src);
          write_all(out.get(), buf, take, tmp);
          off += static_cast<loff_t>(take);
          left -= take;
        }
      }
      if (::fsync(out.get()) != 0) throw_io("cannot fsync", tmp.string(), errno);
    } catch (...) {
      out.reset();
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_io("cannot rename", tmp.string(), err);
  }
  fsync_dir(dst.parent_path());
  return method;
}

bool can_clone(const std::filesystem::path& src, const std::filesystem::path& dir) {
  constexpr uint64_t kBlock = 4096;
  struct stat st {};
  if (::stat(src.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) < kBlock) return false;
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  UniqueFd in_fd(in);
  const int out = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (out < 0) return false;
  UniqueFd out_fd(out);
  file_clone_range r{};
  r.src_fd = in;
  r.src_length = kBlock;
  return ::ioctl(out, FICLONERANGE, &r) == 0;
}

bool is_sparse_file(const std::filesystem::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 &&
         static_cast<uint64_t>(st.st_blocks) * 512 < static_cast<uint64_t>(st.st_size) * 9 / 10;
}

void publish_directory(const std::filesystem::path& stage, const std::filesystem::path& out,
                       bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::exists(out, ec)) {
    if (::rename(stage.c_str(), out.c_str()) != 0) throw_io("cannot rename", stage.string(), errno);
    fsync_dir(parent);
    return;
  }
  if (!overwrite)
    throw Error(Errc::kExists, "'" + out.string() + "' exists (use --force to overwrite)");
  if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_dir(parent);
    fs::remove_all(stage, ec);  // now the old directory
    return;
  }
  fs::path old = out;
  old += ".old";
  fs::remove_all(old, ec);
  if (::rename(out.c_str(), old.c_str()) != 0) throw_io("cannot rename", out.string(), errno);
  if (::rename(stage.c_str(), out.c_str()) != 0) throw_io("cannot rename", stage.string(), errno);
  fsync_dir(parent);
  fs::remove_all(old, ec);
}

}  // namespace qf::ckpt
