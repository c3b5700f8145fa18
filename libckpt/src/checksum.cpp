#include "qf/ckpt/checksum.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// libxxhash's run-time choice of AVX2 / AVX-512 for XXH3 (about twice its SSE2 baseline); the
// header redirects the XXH3 calls below. Same hashes on every path; aarch64 uses NEON as built.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cerrno>
#include <memory>

#include "qf/ckpt/file_io.h"
#include "qf/ckpt/json.h"
#include "qf/tasks.h"

namespace qf::ckpt {
namespace {

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using StatePtr = std::unique_ptr<XXH3_state_t, StateDeleter>;

StatePtr new_state() {
  StatePtr s(XXH3_createState());
  QF_ASSERT(s != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(s.get());
  return s;
}

[[noreturn]] void bad_manifest(const std::string& what) {
  throw Error(Errc::kManifestInvalid, "checksum manifest: " + what);
}

uint64_t parse_hex64(std::string_view s, const std::string& where) {
  if (s.size() != 16)
    bad_manifest(where + ": expected 16 hex digits, got \"" + std::string(s) + "\"");
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      bad_manifest(where + ": \"" + std::string(s) + "\" is not lowercase hex");
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

void parse_file_entry(JsonReader& r, FileDigest& f) {
  r.begin_object();
  std::string key, s;
  bool have_size = false, have_hash = false;
  while (r.next_key(key)) {
    if (key == "size") {
      const JsonNumber n = r.read_number();
      if (!n.fits_u64 || n.negative) bad_manifest(f.name + ": size is not a byte count");
      f.size = n.magnitude;
      have_size = true;
    } else if (key == "xxh3") {
      r.read_string(s);
      f.xxh3 = parse_hex64(s, f.name);
      have_hash = true;
    } else if (key == "tensors") {
      f.has_tensors = true;
      r.begin_object();
      std::string tensor;
      while (r.next_key(tensor)) {
        r.read_string(s);
        f.tensors.emplace_back(tensor, parse_hex64(s, f.name + ": tensor '" + tensor + "'"));
      }
      std::sort(f.tensors.begin(), f.tensors.end());
    } else {
      r.skip_value();
    }
  }
  if (!have_size || !have_hash) bad_manifest(f.name + ": needs both \"size\" and \"xxh3\"");
}

}  // namespace

std::string hex64(uint64_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kHex[v & 0xF];
  return s;
}

namespace {

constexpr uint64_t kWindowBytes = 8u << 20;

// Drops our mapping of [p, p + n) once hashed: the pages stay in the page cache, but the
// process's RSS does not grow with the file.
void release(const std::byte* p, uint64_t n) {
  static const uintptr_t kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) & ~(kPage - 1);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// Maps a window's pages in one call instead of one page fault per 64 KiB (Linux >= 5.14;
// elsewhere the hint is ignored and pages fault in as read).
void prefault(const std::byte* p, uint64_t n) {
#ifdef MADV_POPULATE_READ
  static const uintptr_t kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
  ::madvise(reinterpret_cast<void*>(lo), reinterpret_cast<uintptr_t>(p) + n - lo,
            MADV_POPULATE_READ);
#else
  (void)p;
  (void)n;
#endif
}

// XXH3-64 of [p, p + n), window by window.
uint64_t hash_range(const std::byte* p, uint64_t n, Progress* progress) {
  if (n <= kWindowBytes) {
    const uint64_t h = XXH3_64bits(p, n);
    release(p, n);  // a file of many small tensors must not accumulate either
    if (progress) progress->done.fetch_add(n, std::memory_order_relaxed);
    return h;
  }
  StatePtr state = new_state();
  for (uint64_t off = 0; off < n; off += kWindowBytes) {
    const uint64_t take = std::min(kWindowBytes, n - off);
    prefault(p + off, take);
    XXH3_64bits_update(state.get(), p + off, take);
    release(p + off, take);
    if (progress) progress->done.fetch_add(take, std::memory_order_relaxed);
  }
  return XXH3_64bits_digest(state.get());
}

struct MappedJob {
  MappedFile map;
  const Header* header;
};

MappedJob map_job(const DigestJob& job) {
  MappedJob m{MappedFile::open(job.path), job.header};
  if (job.header && job.header->data_offset() + job.header->data_bytes != m.map.size()) {
    throw Error(Errc::kIo, "'" + job.path.string() + "' changed size since its header was read");
  }
  if (m.map.data()) ::madvise(const_cast<std::byte*>(m.map.data()), m.map.size(), MADV_SEQUENTIAL);
  return m;
}

uint64_t hash_whole(const MappedJob& m, Progress* progress) {
  return hash_range(m.map.data(), m.map.size(), progress);
}

std::vector<std::pair<std::string, uint64_t>> hash_tensors(const MappedJob& m) {
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(m.header->tensors.size());
  const std::byte* data = m.map.data() + m.header->data_offset();
  for (const TensorInfo& t : m.header->tensors) {
    out.emplace_back(t.name, hash_range(data + t.begin, t.n_bytes(), nullptr));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

FileDigest digest_file(const DigestJob& job, Progress* progress) {
  const MappedJob m = map_job(job);
  FileDigest out;
  out.name = job.name;
  out.size = m.map.size();
  out.xxh3 = hash_whole(m, progress);
  out.has_tensors = job.header != nullptr;
  if (out.has_tensors) out.tensors = hash_tensors(m);
  return out;
}

Manifest digest_files(const std::vector<DigestJob>& jobs, int threads, Progress* progress) {
  // Two tasks per safetensors file (the whole-file hash and the tensor hashes), so the work
  // spreads over all cores even for a single large file. Largest files first.
  struct Task {
    size_t job;
    bool tensors;
    uint64_t bytes;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(jobs[i].path, ec);
    tasks.push_back({i, false, size});
    if (jobs[i].header) tasks.push_back({i, true, size});
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.bytes > b.bytes; });

  Manifest m;
  m.files.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    m.files[i].name = jobs[i].name;
    m.files[i].has_tensors = jobs[i].header != nullptr;
  }
  run_tasks(tasks.size(), threads, [&] {
    return [&](size_t k) {
      const Task& t = tasks[k];
      const MappedJob mj = map_job(jobs[t.job]);
      FileDigest& f = m.files[t.job];  // each task writes its own fields
      if (t.tensors) {
        f.tensors = hash_tensors(mj);
      } else {
        f.size = mj.map.size();
        f.xxh3 = hash_whole(mj, progress);
      }
    };
  });
  std::sort(m.files.begin(), m.files.end(),
            [](const FileDigest& a, const FileDigest& b) { return a.name < b.name; });
  return m;
}

struct StreamHasher::State {
  std::string name;
  const std::vector<TensorInfo>* layout;
  StatePtr file = new_state();
  StatePtr tensor = new_state();
  uint64_t size = 0;
  uint64_t pos = 0;  // data-section bytes seen
  size_t ti = 0;     // tensor being hashed
  bool open = false;
  std::vector<std::pair<std::string, uint64_t>> tensors;

  void close_empty() {  // zero-size tensors at the current position
    while (ti < layout->size() && (*layout)[ti].n_bytes() == 0 && (*layout)[ti].begin <= pos) {
      tensors.emplace_back((*layout)[ti].name, XXH3_64bits(nullptr, 0));
      ++ti;
    }
  }
};

StreamHasher::StreamHasher(std::string name, const std::vector<TensorInfo>& layout)
    : s_(std::make_unique<State>()) {
  s_->name = std::move(name);
  s_->layout = &layout;
}

StreamHasher::~StreamHasher() = default;

void StreamHasher::header(const void* p, size_t n) {
  XXH3_64bits_update(s_->file.get(), p, n);
  s_->size += n;
}

void StreamHasher::data(const void* p, size_t n) {
  State& s = *s_;
  XXH3_64bits_update(s.file.get(), p, n);
  s.size += n;
  const auto* b = static_cast<const std::byte*>(p);
  const uint64_t end = s.pos + n;
  while (true) {
    s.close_empty();
    if (s.ti == s.layout->size() || s.pos >= end) break;
    const TensorInfo& t = (*s.layout)[s.ti];
    if (!s.open) {
      XXH3_64bits_reset(s.tensor.get());
      s.open = true;
    }
    const uint64_t take = std::min(end, t.end) - s.pos;
    XXH3_64bits_update(s.tensor.get(), b, take);
    b += take;
    s.pos += take;
    if (s.pos == t.end) {
      s.tensors.emplace_back(t.name, XXH3_64bits_digest(s.tensor.get()));
      s.open = false;
      ++s.ti;
    }
  }
}

FileDigest StreamHasher::finish() {
  State& s = *s_;
  s.close_empty();
  QF_ASSERT(s.ti == s.layout->size(), "StreamHasher::finish before the last tensor byte");
  FileDigest d;
  d.name = s.name;
  d.size = s.size;
  d.xxh3 = XXH3_64bits_digest(s.file.get());
  d.has_tensors = true;
  d.tensors = std::move(s.tensors);
  std::sort(d.tensors.begin(), d.tensors.end());
  return d;
}

std::string serialize_manifest(const Manifest& manifest) {
  std::string s =
      "{\n  \"format\": \"qforge-manifest\",\n  \"version\": 1,\n  \"hash\": \"xxh3-64\",\n"
      "  \"files\": {";
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    const FileDigest& f = manifest.files[i];
    s += i ? ",\n    " : "\n    ";
    append_json_string(s, f.name, true);
    s += ": {\"size\": " + std::to_string(f.size) + ", \"xxh3\": \"" + hex64(f.xxh3) + "\"";
    if (f.has_tensors) {
      s += ", \"tensors\": {";
      for (size_t k = 0; k < f.tensors.size(); ++k) {
        s += k ? ",\n      " : "\n      ";
        append_json_string(s, f.tensors[k].first, true);
        s += ": \"" + hex64(f.tensors[k].second) + "\"";
      }
      s += f.tensors.empty() ? "}" : "\n    }";
    }
    s += "}";
  }
  s += manifest.files.empty() ? "}\n}\n" : "\n  }\n}\n";
  return s;
}

Manifest parse_manifest(std::string_view text) {
  if (const auto bad = utf8_error_offset(text)) {
    bad_manifest("byte " + std::to_string(*bad) + " is not valid UTF-8");
  }
  Manifest m;
  try {
    JsonReader r(text);
    r.begin_object();
    std::string key, s;
    bool have_format = false;
    while (r.next_key(key)) {
      if (key == "format" || key == "hash") {
        r.read_string(s);
        const char* want = key == "format" ? "qforge-manifest" : "xxh3-64";
        if (s != want) bad_manifest("\"" + key + "\" is \"" + s + "\", expected \"" + want + "\"");
        have_format |= key == "format";
      } else if (key == "version") {
        const JsonNumber n = r.read_number();
        if (!n.fits_u64 || n.magnitude != 1) {
          bad_manifest("version " + std::string(n.text) + " is not supported (expected 1)");
        }
      } else if (key == "files") {
        r.begin_object();
        std::string name;
        while (r.next_key(name)) {
          FileDigest f;
          f.name = name;
          parse_file_entry(r, f);
          m.files.push_back(std::move(f));
        }
      } else {
        r.skip_value();
      }
    }
    r.expect_end();
    if (!have_format) bad_manifest("missing \"format\": \"qforge-manifest\"");
  } catch (const JsonSyntaxError& e) {
    bad_manifest("invalid JSON at byte " + std::to_string(e.offset()) + ": " + e.what());
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const FileDigest& a, const FileDigest& b) { return a.name < b.name; });
  for (size_t i = 1; i < m.files.size(); ++i) {
    if (m.files[i].name == m.files[i - 1].name)
      bad_manifest("lists '" + m.files[i].name + "' twice");
  }
  return m;
}

std::vector<Problem> compare_manifests(const Manifest& recorded, const Manifest& measured) {
  std::vector<Problem> out;
  auto find = [](const Manifest& m, const std::string& name) -> const FileDigest* {
    const auto it =
        std::lower_bound(m.files.begin(), m.files.end(), name,
                         [](const FileDigest& f, const std::string& n) { return f.name < n; });
    return it != m.files.end() && it->name == name ? &*it : nullptr;
  };
  for (const FileDigest& want : recorded.files) {
    const FileDigest* got = find(measured, want.name);
    if (!got) {
      out.push_back({Errc::kManifestMissingFile, want.name, "",
                     "listed in the manifest but missing from the directory"});
      continue;
    }
    if (got->size == want.size && got->xxh3 == want.xxh3) continue;
    out.push_back(
        {Errc::kChecksumMismatch, want.name, "",
         got->size != want.size
             ? "size is " + std::to_string(got->size) + " bytes, the manifest says " +
                   std::to_string(want.size)
             : "xxh3 is " + hex64(got->xxh3) + ", the manifest says " + hex64(want.xxh3)});
    if (!want.has_tensors || !got->has_tensors) continue;
    // Name the tensors that changed (both lists are sorted by name).
    size_t i = 0, j = 0;
    const auto& a = want.tensors;
    const auto& b = got->tensors;
    while (i < a.size() || j < b.size()) {
      if (j == b.size() || (i < a.size() && a[i].first < b[j].first)) {
        out.push_back({Errc::kChecksumMismatch, want.name, a[i].first,
                       "in the manifest but no longer in the file"});
        ++i;
      } else if (i == a.size() || b[j].first < a[i].first) {
        out.push_back({Errc::kChecksumMismatch, want.name, b[j].first,
                       "in the file but not in the manifest"});
        ++j;
      } else {
        if (a[i].second != b[j].second) {
          out.push_back(
              {Errc::kChecksumMismatch, want.name, a[i].first,
               "xxh3 is " + hex64(b[j].second) + ", the manifest says " + hex64(a[i].second)});
        }
        ++i;
        ++j;
      }
    }
  }
  for (const FileDigest& got : measured.files) {
    if (!find(recorded, got.name)) {
      out.push_back({Errc::kManifestExtraFile, got.name, "", "present but not in the manifest"});
    }
  }
  return out;
}

}  // namespace qf::ckpt
