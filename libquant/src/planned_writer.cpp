#include "planned_writer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/quant/formats.h"
#include "qf/tasks.h"

namespace qf::quant::detail {
namespace {

namespace fs = std::filesystem;

// File f's tensors in plan order, and the producer's declaration of each by name.
struct FileTensors {
  std::vector<ckpt::TensorSpec> specs;
  std::map<std::string, const ckpt::TensorDecl*> decl_of;
};

FileTensors tensors_of(const SynthPlan& plan, size_t file) {
  FileTensors t;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (plan.file_of[i] != file) continue;
    const ckpt::TensorDecl& d = plan.tensors[i];
    t.specs.push_back({d.name, d.dtype, d.shape});
    t.decl_of[d.name] = &d;
  }
  return t;
}

ckpt::FileDigest write_file(const fs::path& path, ckpt::HeaderPlan layout, const FileTensors& t,
                            const PlannedWrite& o, bool hash, const TensorProducer& produce) {
  ckpt::WriterOptions wo;
  wo.overwrite = true;  // inside our own staging directory
  wo.sparse_zeros = o.sparse_zeros;
  wo.hash = hash;
  wo.clone = o.clone;
  ckpt::SafetensorsWriter w(path, std::move(layout), wo);
  for (const ckpt::TensorInfo& info : w.plan().layout) {
    const uint64_t before = w.bytes_written();
    produce(*t.decl_of.at(info.name), w);
    QF_ASSERT(w.bytes_written() - before == info.n_bytes(), "producer wrote the wrong byte count");
  }
  w.commit();
  if (o.cloned_bytes) o.cloned_bytes->fetch_add(w.bytes_cloned(), std::memory_order_relaxed);
  return hash ? w.digest() : ckpt::FileDigest{};
}

// The digest of the file `layout` plans, from the bytes its tensors are copies of, read a MiB at
// a time (pread; hashing from 16 MiB mappings of them took more than twice the system time).
ckpt::FileDigest digest_from_sources(const std::string& name, const ckpt::HeaderPlan& layout,
                                     const FileTensors& t, const PlannedWrite& o) {
  ckpt::StreamHasher h(name, layout.layout);
  const auto prefix = ckpt::length_prefix(layout);
  h.header(prefix.data(), prefix.size());
  h.header(layout.header.data(), layout.header.size());
  std::vector<std::byte> buf(1u << 20);
  for (const ckpt::TensorInfo& info : layout.layout) {
    const ByteSource s = o.source(*t.decl_of.at(info.name));
    for (uint64_t done = 0; done < info.n_bytes();) {
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(buf.size(), info.n_bytes() - done));
      ckpt::pread_all(s.fd, buf.data(), take, s.offset + done, *s.path);
      h.data(buf.data(), take);
      done += take;
    }
  }
  return h.finish();
}

}  // namespace

void write_planned_checkpoint(const SynthPlan& plan, const fs::path& out_dir, const PlannedWrite& o,
                              const TensorProducer& produce,
                              const std::function<void(const fs::path&)>& finish) {
  std::error_code ec;
  if (!o.overwrite && fs::exists(out_dir, ec)) {
    throw Error(Errc::kExists, "'" + out_dir.string() + "' exists (use --force to overwrite)");
  }
  fs::path stage = out_dir;
  stage += ".tmp";
  fs::remove_all(stage, ec);  // leftovers of an interrupted run
  if (!fs::create_directories(stage, ec) && ec)
    throw_io("cannot create", stage.string(), ec.value());
  try {
    const size_t n_files = plan.files.size();
    std::vector<FileTensors> tensors(n_files);
    std::vector<ckpt::HeaderPlan> layouts(n_files);
    run_tasks(n_files, o.threads, [&] {
      return [&](size_t f) {
        tensors[f] = tensors_of(plan, f);
        layouts[f] =
            o.layout ? o.layout(f, tensors[f].specs)
                     : ckpt::plan_safetensors(tensors[f].specs, ckpt::Metadata{{"format", "pt"}});
      };
    });
    // Each file is a task; with o.source, and threads enough for a writer and a hasher a file,
    // its digest is another, handed out beside it. With fewer, the second pass over the sources
    // cost more than it saved (2 threads, 3 files, 4.1-4.7 s against 3.4-4.0 s on this VM); with
    // sparse sources too, as the writer hashes holes from zeros in memory and a second pass
    // reads them (122B-A10B of zeros on this VM, 32 threads: 39.2 s against 4.0 s).
    const unsigned threads =
        o.threads > 0 ? static_cast<unsigned>(o.threads) : std::thread::hardware_concurrency();
    const bool apart = o.hash && o.source && !o.sparse_zeros && threads >= 2 * n_files;
    const size_t per_file = apart ? 2 : 1;
    std::vector<ckpt::FileDigest> digests(n_files);
    run_tasks(n_files * per_file, o.threads, [&] {
      return [&](size_t i) {
        const size_t f = i / per_file;
        if (i % per_file == 1) {
          digests[f] = digest_from_sources(plan.files[f].name, layouts[f], tensors[f], o);
          return;
        }
        ckpt::FileDigest d = write_file(stage / plan.files[f].name, layouts[f], tensors[f], o,
                                        o.hash && !apart, produce);
        if (!apart) digests[f] = std::move(d);
      };
    });
    if (o.digests) {
      *o.digests = std::move(digests);
      std::sort(
          o.digests->begin(), o.digests->end(),
          [](const ckpt::FileDigest& a, const ckpt::FileDigest& b) { return a.name < b.name; });
    }

    ckpt::ShardIndex index;
    index.total_size = plan.tensor_bytes;
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      index.weight_map.emplace_back(plan.tensors[i].name, plan.files[plan.file_of[i]].name);
    }
    index.sort();
    ckpt::write_file_atomic(stage / ckpt::kIndexFileName, ckpt::serialize_index(index), true);
    finish(stage);
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
  ckpt::publish_directory(stage, out_dir, o.overwrite);
}

void write_converted(const MatrixView& v, ckpt::DType dtype, ckpt::SafetensorsWriter& w) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<float> f(kChunk);
  std::vector<std::byte> out(kChunk * 4);
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t i = 0; i < v.cols; i += kChunk) {
      const int64_t take = std::min(kChunk, v.cols - i);
      v.row_range(r, i, take, f.data());
      for (int64_t j = 0; j < take; ++j) {
        if (dtype == ckpt::DType::kF32) {
          std::memcpy(&out[j * 4], &f[j], 4);
        } else {
          const uint16_t h = dtype == ckpt::DType::kBF16 ? f32_to_bf16(f[j]) : f32_to_f16(f[j]);
          std::memcpy(&out[j * 2], &h, 2);
        }
      }
      w.write(out.data(), static_cast<size_t>(take) * ckpt::dtype_size(dtype));
    }
  }
}

void write_stage_manifest(const fs::path& stage, std::vector<ckpt::FileDigest> digests) {
  ckpt::Manifest m;
  m.files = std::move(digests);
  for (const auto& e : fs::directory_iterator(stage)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || name == ckpt::kManifestFileName) continue;
    m.files.push_back(ckpt::digest_file({e.path(), name, nullptr}));
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const ckpt::FileDigest& a, const ckpt::FileDigest& b) { return a.name < b.name; });
  ckpt::write_file_atomic(stage / ckpt::kManifestFileName, ckpt::serialize_manifest(m), true);
}

}  // namespace qf::quant::detail
