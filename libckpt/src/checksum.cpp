#include "qf/ckpt/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "qf/ckpt/file_io.h"
#include "qf/ckpt/json.h"

namespace qf::ckpt {
namespace {

constexpr size_t kBlockBytes = 1u << 20;  // small enough that the second hash pass hits L2

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
  if (s.size() != 16) bad_manifest(where + ": expected 16 hex digits, got \"" + std::string(s) + "\"");
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

FileDigest digest_file(const DigestJob& job, Progress* progress) {
  UniqueFd fd = open_read(job.path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_io("cannot stat", job.path.string(), errno);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  FileDigest out;
  out.name = job.name;
  out.size = static_cast<uint64_t>(st.st_size);

  // Tensors tile the data section in offset order (a valid header guarantees it), so one
  // running state suffices: it is fed the part of each block inside the current tensor.
  const std::vector<TensorInfo>* tensors = job.header ? &job.header->tensors : nullptr;
  const uint64_t data_off = job.header ? job.header->data_offset() : 0;
  out.has_tensors = tensors != nullptr;
  size_t ti = 0;
  bool tensor_open = false;
  StatePtr file_state = new_state();
  StatePtr tensor_state = new_state();
  auto skip_empty = [&] {
    while (tensors && ti < tensors->size() && (*tensors)[ti].n_bytes() == 0) {
      out.tensors.emplace_back((*tensors)[ti].name, XXH3_64bits(nullptr, 0));
      ++ti;
    }
  };

  std::unique_ptr<std::byte[]> buf(new std::byte[kBlockBytes]);
  for (uint64_t lo = 0; lo < out.size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlockBytes, out.size - lo));
    pread_all(fd.get(), buf.get(), n, lo, job.path);
    XXH3_64bits_update(file_state.get(), buf.get(), n);
    const uint64_t hi = lo + n;
    uint64_t pos = std::max(lo, data_off);
    while (tensors) {
      skip_empty();
      if (ti == tensors->size()) break;
      const TensorInfo& t = (*tensors)[ti];
      pos = std::max(pos, data_off + t.begin);
      if (pos >= hi) break;
      if (!tensor_open) {
        XXH3_64bits_reset(tensor_state.get());
        tensor_open = true;
      }
      const uint64_t end = std::min(hi, data_off + t.end);
      XXH3_64bits_update(tensor_state.get(), buf.get() + (pos - lo), end - pos);
      pos = end;
      if (pos == data_off + t.end) {
        out.tensors.emplace_back(t.name, XXH3_64bits_digest(tensor_state.get()));
        tensor_open = false;
        ++ti;
      }
    }
    if (progress) progress->done.fetch_add(n, std::memory_order_relaxed);
    lo = hi;
  }
  skip_empty();
  if (tensors && ti != tensors->size()) {
    throw Error(Errc::kIo, "'" + job.path.string() + "' is shorter than its header says " +
                               "(did it change while being hashed?)");
  }
  out.xxh3 = XXH3_64bits_digest(file_state.get());
  std::sort(out.tensors.begin(), out.tensors.end());
  return out;
}

Manifest digest_files(const std::vector<DigestJob>& jobs, int threads, Progress* progress) {
  std::vector<size_t> order(jobs.size());
  std::vector<uint64_t> sizes(jobs.size(), 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    order[i] = i;
    std::error_code ec;
    sizes[i] = std::filesystem::file_size(jobs[i].path, ec);
  }
  // Largest first, so the last thread to finish is not stuck with the biggest shard.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, std::min<int>(threads, static_cast<int>(jobs.size())));

  Manifest m;
  m.files.resize(jobs.size());
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  std::exception_ptr err;
  auto worker = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) {
      try {
        m.files[order[k]] = digest_file(jobs[order[k]], progress);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!err) err = std::current_exception();
        next = order.size();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (err) std::rethrow_exception(err);
  std::sort(m.files.begin(), m.files.end(),
            [](const FileDigest& a, const FileDigest& b) { return a.name < b.name; });
  return m;
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
    if (m.files[i].name == m.files[i - 1].name) bad_manifest("lists '" + m.files[i].name + "' twice");
  }
  return m;
}

std::vector<Problem> compare_manifests(const Manifest& recorded, const Manifest& measured) {
  std::vector<Problem> out;
  auto find = [](const Manifest& m, const std::string& name) -> const FileDigest* {
    const auto it = std::lower_bound(
        m.files.begin(), m.files.end(), name,
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
    out.push_back({Errc::kChecksumMismatch, want.name, "",
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
          out.push_back({Errc::kChecksumMismatch, want.name, a[i].first,
                         "xxh3 is " + hex64(b[j].second) + ", the manifest says " +
                             hex64(a[i].second)});
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
