#include "qf/ckpt/writer.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <unordered_set>
#include <utility>

#include "qf/ckpt/json.h"

namespace qf::ckpt {
namespace {

// Runs of zeros shorter than this are written; longer ones become holes (filesystems allocate
// in 4 KiB blocks, so short holes save nothing).
constexpr uint64_t kMinHoleBytes = 64 * 1024;

}  // namespace

uint64_t tensor_bytes(const TensorSpec& spec) {
  uint64_t numel = 1;
  bool overflow = false;
  for (uint64_t d : spec.shape) overflow |= __builtin_mul_overflow(numel, d, &numel);
  uint64_t bits = 0;
  overflow |= __builtin_mul_overflow(numel, uint64_t{dtype_bits(spec.dtype)}, &bits);
  if (overflow) {
    throw Error(Errc::kShapeOverflow, "tensor '" + spec.name + "': shape " +
                                          shape_to_string(spec.shape) + " overflows 64 bits");
  }
  if (bits % 8 != 0) {
    throw Error(Errc::kMisalignedSlice,
                "tensor '" + spec.name + "': " + std::to_string(bits) + " bits is not whole bytes");
  }
  return bits / 8;
}

namespace {

// Pads the header (spaces) so the data section starts at `data_start_mod` modulo kCloneBlock
// when given, then enforces the readers' header size cap.
void place_data_start(HeaderPlan& plan, std::optional<uint64_t> data_start_mod) {
  std::string& h = plan.header;
  if (data_start_mod) {
    QF_ASSERT(*data_start_mod % 8 == 0 && *data_start_mod < kCloneBlock, "bad data start residue");
    const uint64_t now = (8 + h.size()) % kCloneBlock;
    h.resize(h.size() + (*data_start_mod + kCloneBlock - now) % kCloneBlock, ' ');
  }
  if (h.size() > kMaxHeaderBytes) {
    throw Error(Errc::kHeaderTooLarge, "planned header is " + std::to_string(h.size()) +
                                           " bytes, above the 100 MB limit readers enforce");
  }
}

// The header and offsets of `tensors` in the order given. The JSON is padded with spaces to a
// multiple of 8, or further so that the data section starts at `data_start_mod` modulo
// kCloneBlock when given.
HeaderPlan lay_out(std::vector<TensorSpec>& tensors, const std::optional<Metadata>& metadata,
                   std::optional<uint64_t> data_start_mod) {
  HeaderPlan plan;
  std::string& h = plan.header;
  h.reserve(64 + tensors.size() * 96);
  h += '{';
  bool first = true;
  if (metadata) {
    h += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata->size(); ++i) {
      if (i) h += ',';
      append_json_string(h, (*metadata)[i].first);
      h += ':';
      append_json_string(h, (*metadata)[i].second);
    }
    h += '}';
    first = false;
  }
  std::unordered_set<std::string_view> seen;
  seen.reserve(tensors.size());
  plan.layout.reserve(tensors.size());
  uint64_t offset = 0;
  for (TensorSpec& t : tensors) {
    if (seen.count(t.name))
      throw Error(Errc::kDuplicateName, "tensor '" + t.name + "' planned twice");
    if (utf8_error_offset(t.name)) {
      throw Error(Errc::kHeaderNotUtf8, "tensor name is not valid UTF-8: '" + t.name + "'");
    }
    const uint64_t n = tensor_bytes(t);
    if (!first) h += ',';
    first = false;
    append_json_string(h, t.name);
    h += ":{\"dtype\":\"";
    h += dtype_name(t.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[";
    h += std::to_string(offset);
    h += ',';
    h += std::to_string(offset + n);
    h += "]}";
    plan.layout.push_back({std::move(t.name), t.dtype, std::move(t.shape), offset, offset + n});
    seen.insert(plan.layout.back().name);  // layout was reserved: the view stays valid
    offset += n;
  }
  h += '}';
  h.resize((h.size() + 7) / 8 * 8, ' ');
  plan.data_bytes = offset;
  place_data_start(plan, data_start_mod);
  return plan;
}

}  // namespace

HeaderPlan plan_safetensors(std::vector<TensorSpec> tensors,
                            const std::optional<Metadata>& metadata) {
  // The reference writer's order: descending dtype (enum order is increasing alignment), then
  // name by bytes. std::string comparison is bytewise, as Rust's String Ord.
  std::sort(tensors.begin(), tensors.end(), [](const TensorSpec& a, const TensorSpec& b) {
    if (a.dtype != b.dtype) return a.dtype > b.dtype;
    return a.name < b.name;
  });
  return lay_out(tensors, metadata, std::nullopt);
}

HeaderPlan plan_safetensors_in_order(std::vector<TensorSpec> tensors,
                                     const std::optional<Metadata>& metadata,
                                     std::optional<uint64_t> data_start_mod) {
  return lay_out(tensors, metadata, data_start_mod);
}

HeaderPlan plan_safetensors_sharing(std::vector<TensorSpec> tensors,
                                    const std::optional<Metadata>& metadata,
                                    const std::vector<std::optional<uint64_t>>& source_offsets) {
  QF_ASSERT(source_offsets.size() == tensors.size(), "one source offset per tensor");
  constexpr uint64_t kB = kCloneBlock;
  HeaderPlan base = plan_safetensors_in_order(tensors, metadata);
  std::map<uint64_t, uint64_t> bytes_at;  // data start modulo kB -> bytes in place
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!source_offsets[i]) continue;
    const TensorInfo& t = base.layout[i];
    const uint64_t start = (*source_offsets[i] % kB + kB - t.begin % kB) % kB;
    if (start % 8 == 0) bytes_at[start] += t.n_bytes();
  }
  uint64_t best = (8 + base.header.size()) % kB, most = 0;
  for (const auto& [start, n] : bytes_at) {
    if (n > most) best = start, most = n;
  }
  HeaderPlan plan = std::move(base);  // padding moves the data section, not offsets in it
  place_data_start(plan, best);
  for (const TensorInfo& t : plan.layout) {
    if (t.begin % std::max<uint64_t>(1, dtype_bits(t.dtype) / 8) != 0) {
      return plan_safetensors(std::move(tensors), metadata);
    }
  }
  return plan;
}

std::array<uint8_t, 8> length_prefix(const HeaderPlan& plan) {
  std::array<uint8_t, 8> prefix;
  const uint64_t n = plan.header.size();
  for (size_t i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(n >> (8 * i));
  return prefix;
}

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, HeaderPlan plan,
                                     WriterOptions options)
    : path_(std::move(path)), tmp_(staging_path(path_)), plan_(std::move(plan)), options_(options) {
  std::error_code ec;
  if (!options_.overwrite && std::filesystem::exists(path_, ec)) {
    throw Error(Errc::kExists, "'" + path_.string() + "' exists (use --force to overwrite)");
  }
  const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io("cannot create", tmp_.string(), errno);
  fd_ = UniqueFd(fd);
  if (options_.preallocate && !options_.sparse_zeros && !options_.clone && plan_.file_bytes() > 0) {
    if (::fallocate(fd, 0, 0, static_cast<off_t>(plan_.file_bytes())) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS) {
      const int err = errno;
      fd_.reset();
      ::unlink(tmp_.c_str());
      throw_io("cannot reserve " + std::to_string(plan_.file_bytes()) + " bytes for", tmp_.string(),
               err);
    }
  }
  buf_.resize(std::max<size_t>(options_.buffer_bytes, 4096));
  const std::array<uint8_t, 8> prefix = length_prefix(plan_);
  if (options_.hash) {
    hasher_ = std::make_unique<StreamHasher>(path_.filename().string(), plan_.layout);
    hasher_->header(prefix.data(), prefix.size());
    hasher_->header(plan_.header.data(), plan_.header.size());
  }
  std::memcpy(buf_.data(), prefix.data(), prefix.size());
  buf_used_ = 8;
  // Header bytes are not data bytes: route them around write()'s accounting.
  const std::string& h = plan_.header;
  for (size_t done = 0; done < h.size();) {
    const size_t take = std::min(h.size() - done, buf_.size() - buf_used_);
    std::memcpy(buf_.data() + buf_used_, h.data() + done, take);
    buf_used_ += take;
    done += take;
    if (buf_used_ == buf_.size()) flush();
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!committed_) {
    fd_.reset();
    ::unlink(tmp_.c_str());
  }
}

size_t SafetensorsWriter::current_tensor() const {
  const auto& l = plan_.layout;
  const auto it = std::upper_bound(l.begin(), l.end(), written_,
                                   [](uint64_t w, const TensorInfo& t) { return w < t.end; });
  return static_cast<size_t>(it - l.begin());
}

void SafetensorsWriter::check_room(uint64_t n) const {
  QF_ASSERT(!committed_, "write after commit");
  QF_ASSERT(n <= plan_.data_bytes - written_, "write past the planned end of the data section");
}

void SafetensorsWriter::flush() {
  if (buf_used_ == 0) return;
  write_all(fd_.get(), buf_.data(), buf_used_, tmp_);
  buf_used_ = 0;
}

void SafetensorsWriter::write(const void* data, size_t n) {
  check_room(n);
  settle();
  const auto* p = static_cast<const std::byte*>(data);
  if (hasher_) hasher_->data(p, n);
  if (n >= buf_.size()) {  // large writes go straight from the caller's memory
    flush();
    write_all(fd_.get(), p, n, tmp_);
    written_ += n;
    return;
  }
  while (n > 0) {
    const size_t take = std::min(n, buf_.size() - buf_used_);
    std::memcpy(buf_.data() + buf_used_, p, take);
    buf_used_ += take;
    p += take;
    n -= take;
    written_ += take;
    if (buf_used_ == buf_.size()) flush();
  }
}

void SafetensorsWriter::write_tensor(std::string_view name, std::span<const std::byte> bytes) {
  // The named tensor must start where the data written so far ends (zero-size tensors share
  // that position with the tensor after them).
  const auto& l = plan_.layout;
  auto it = std::lower_bound(l.begin(), l.end(), written_,
                             [](const TensorInfo& t, uint64_t w) { return t.begin < w; });
  while (it != l.end() && it->begin == written_ && it->name != name) ++it;
  if (it == l.end() || it->name != name || it->begin != written_) {
    const size_t next = current_tensor();
    throw Error(Errc::kUsage, "tensor '" + std::string(name) + "' written out of plan order" +
                                  (next < l.size() ? " (next is '" + l[next].name + "')" : ""));
  }
  if (bytes.size() != it->n_bytes()) {
    throw Error(Errc::kTensorSizeMismatch, "tensor '" + std::string(name) + "': got " +
                                               std::to_string(bytes.size()) + " bytes, planned " +
                                               std::to_string(it->n_bytes()));
  }
  write(bytes.data(), bytes.size());
}

void SafetensorsWriter::copy_from(int fd, uint64_t offset, uint64_t n,
                                  const std::filesystem::path& source) {
  check_room(n);
  auto in_off = static_cast<loff_t>(offset);
  if (!options_.sparse_zeros) {
    copy_data(fd, in_off, n, source);
    return;
  }
  // Keep the source's holes: SEEK_DATA / SEEK_HOLE find them (filesystems without support
  // report the whole file as data, which is still correct).
  while (n > 0) {
    loff_t data = ::lseek(fd, in_off, SEEK_DATA);
    if (data < 0) data = errno == ENXIO ? in_off + static_cast<loff_t>(n) : in_off;
    const uint64_t hole = std::min<uint64_t>(n, static_cast<uint64_t>(data - in_off));
    if (hole > 0) {
      write_zeros(hole);
      in_off += static_cast<loff_t>(hole);
      n -= hole;
      continue;
    }
    loff_t next_hole = ::lseek(fd, in_off, SEEK_HOLE);
    if (next_hole < 0) next_hole = in_off + static_cast<loff_t>(n);
    const uint64_t run = std::min<uint64_t>(n, static_cast<uint64_t>(next_hole - in_off));
    copy_data(fd, in_off, run, source);
    n -= run;
  }
}

// Appends n bytes of fd from in_off (advanced). When cloning, contiguous copies from one file
// gather into one pending run, settled when anything else is written: one clone per run, and
// only its unaligned ends copied.
void SafetensorsWriter::copy_data(int fd, loff_t& in_off, uint64_t n,
                                  const std::filesystem::path& source) {
  const auto src = static_cast<uint64_t>(in_off);
  in_off += static_cast<loff_t>(n);
  if (options_.clone) {
    if (pending_.n > 0 && pending_.fd == fd && pending_.src + pending_.n == src) {
      pending_.n += n;
    } else {
      settle();
      flush();
      pending_ = {fd, src, n, 8 + plan_.header.size() + written_, source};
    }
    written_ += n;
    return;
  }
  flush();
  loff_t at = static_cast<loff_t>(src);
  copy_bytes(fd, at, n, source);
  written_ += n;
}

// Writes the pending run at its place (the current file position): whole blocks shared with the
// source where the offsets agree modulo kCloneBlock and the filesystem allows, the rest copied.
void SafetensorsWriter::settle() {
  if (pending_.n == 0) return;
  const Pending p = std::exchange(pending_, Pending{});
  auto in = static_cast<loff_t>(p.src);
  uint64_t n = p.n;
  if (options_.clone && p.dst % kCloneBlock == p.src % kCloneBlock) {
    const uint64_t head = (kCloneBlock - p.src % kCloneBlock) % kCloneBlock;
    const uint64_t body = n > head ? (n - head) / kCloneBlock * kCloneBlock : 0;
    if (body > 0) {
      copy_bytes(p.fd, in, head, p.source);
      n -= head;
      if (clone_blocks(p.fd, static_cast<uint64_t>(in), body, p.dst + head, p.source)) {
        in += static_cast<loff_t>(body);
        n -= body;
      }
    }
  }
  copy_bytes(p.fd, in, n, p.source);
}

// Shares n bytes (whole blocks) of fd at src into the output at dst, leaves the file position
// after them and hashes them from the source. False, and cloning off, where the filesystem
// refuses.
bool SafetensorsWriter::clone_blocks(int fd, uint64_t src, uint64_t n, uint64_t dst,
                                     const std::filesystem::path& source) {
  file_clone_range r{};
  r.src_fd = fd;
  r.src_offset = src;
  r.src_length = n;
  r.dest_offset = dst;
  if (::ioctl(fd_.get(), FICLONERANGE, &r) != 0) {
    options_.clone = false;  // EOPNOTSUPP (ext4, tmpfs), EXDEV (another filesystem), ...
    return false;
  }
  if (::lseek(fd_.get(), static_cast<off_t>(dst + n), SEEK_SET) < 0) {
    throw_io("cannot seek in", tmp_.string(), errno);
  }
  if (hasher_) hash_source(fd, src, n, source);
  cloned_ += n;
  return true;
}

// Feeds n bytes of fd at src to the hasher straight from a read-only mapping of the source, a
// window at a time: no copy (pread of the same bytes ran at 2.5 GB/s, all of it in the copy).
void SafetensorsWriter::hash_source(int fd, uint64_t src, uint64_t n,
                                    const std::filesystem::path& source) {
  static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kWindow = 64u << 20;
  for (uint64_t done = 0; done < n;) {
    const uint64_t at = src + done, lo = at / kPage * kPage;
    const uint64_t take = std::min(n - done, kWindow);
    const size_t len = static_cast<size_t>(at + take - lo);
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(lo));
    if (p == MAP_FAILED) throw_io("cannot map", source.string(), errno);
    ::madvise(p, len, MADV_SEQUENTIAL);
    hasher_->data(static_cast<const std::byte*>(p) + (at - lo), static_cast<size_t>(take));
    ::munmap(p, len);
    done += take;
  }
}

// Writes n bytes of fd from in_off (advanced) at the file position: through the kernel when
// allowed and nobody needs to see the bytes, else through the (empty) buffer.
void SafetensorsWriter::copy_bytes(int fd, loff_t& in_off, uint64_t n,
                                   const std::filesystem::path& source) {
  bool kernel_copy = options_.kernel_copy && !hasher_;
  while (n > 0 && kernel_copy) {
    const ssize_t r = ::copy_file_range(fd, &in_off, fd_.get(), nullptr, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL) {
        kernel_copy = false;  // fall back to a user-space copy below
        break;
      }
      throw_io("cannot copy from", source.string(), errno);
    }
    if (r == 0) {
      throw Error(Errc::kIo, "unexpected end of file copying from '" + source.string() + "'");
    }
    n -= static_cast<uint64_t>(r);
  }
  while (n > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, buf_.size()));
    pread_all(fd, buf_.data(), take, static_cast<uint64_t>(in_off), source);
    if (hasher_) hasher_->data(buf_.data(), take);
    write_all(fd_.get(), buf_.data(), take, tmp_);
    in_off += static_cast<loff_t>(take);
    n -= take;
  }
}

void SafetensorsWriter::write_zeros(uint64_t n) {
  check_room(n);
  settle();
  if (hasher_) {
    static const std::vector<std::byte> kZeros(1u << 16);
    for (uint64_t left = n; left > 0;) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(left, kZeros.size()));
      hasher_->data(kZeros.data(), take);
      left -= take;
    }
  }
  if (options_.sparse_zeros && n >= kMinHoleBytes) {
    flush();
    if (::lseek(fd_.get(), static_cast<off_t>(n), SEEK_CUR) < 0) {
      throw_io("cannot seek in", tmp_.string(), errno);
    }
    written_ += n;
    return;
  }
  while (n > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, buf_.size() - buf_used_));
    std::memset(buf_.data() + buf_used_, 0, take);
    buf_used_ += take;
    n -= take;
    written_ += take;
    if (buf_used_ == buf_.size()) flush();
  }
}

void SafetensorsWriter::commit() {
  QF_ASSERT(!committed_, "commit twice");
  if (written_ != plan_.data_bytes) {
    throw Error(Errc::kTensorSizeMismatch, "'" + path_.string() + "': " + std::to_string(written_) +
                                               " of " + std::to_string(plan_.data_bytes) +
                                               " data bytes written at commit");
  }
  settle();
  flush();
  // A trailing hole left by sparse write_zeros does not extend the file by itself.
  if (::ftruncate(fd_.get(), static_cast<off_t>(plan_.file_bytes())) != 0) {
    throw_io("cannot set the size of", tmp_.string(), errno);
  }
  if (::fsync(fd_.get()) != 0) throw_io("cannot fsync", tmp_.string(), errno);
  fd_.reset();
  std::error_code ec;
  if (!options_.overwrite && std::filesystem::exists(path_, ec)) {
    throw Error(Errc::kExists, "'" + path_.string() + "' appeared while writing");
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw_io("cannot rename", tmp_.string(), errno);
  committed_ = true;
  if (hasher_) digest_ = hasher_->finish();
  fsync_dir(path_.parent_path());
}

const FileDigest& SafetensorsWriter::digest() const {
  QF_ASSERT(digest_.has_value(), "digest() needs WriterOptions::hash and a committed file");
  return *digest_;
}

}  // namespace qf::ckpt
