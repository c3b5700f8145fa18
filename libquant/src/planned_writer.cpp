#include "planned_writer.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/quant/formats.h"
#include "qf/tasks.h"

namespace qf::quant::detail {
namespace {

namespace fs = std::filesystem;

ckpt::FileDigest write_file(const fs::path& path, const SynthPlan& plan, size_t file,
                            const PlannedWrite& o, const TensorProducer& produce) {
  std::vector<ckpt::TensorSpec> specs;
  std::map<std::string, const ckpt::TensorDecl*> decl_of;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (plan.file_of[i] != file) continue;
    const ckpt::TensorDecl& d = plan.tensors[i];
    specs.push_back({d.name, d.dtype, d.shape});
    decl_of[d.name] = &d;
  }
  ckpt::WriterOptions wo;
  wo.overwrite = true;  // inside our own staging directory
  wo.sparse_zeros = o.sparse_zeros;
  wo.hash = o.hash;
  wo.clone = o.clone;
  ckpt::SafetensorsWriter w(
      path,
      o.layout ? o.layout(file, std::move(specs))
               : ckpt::plan_safetensors(std::move(specs), ckpt::Metadata{{"format", "pt"}}),
      wo);
  for (const ckpt::TensorInfo& t : w.plan().layout) {
    const uint64_t before = w.bytes_written();
    produce(*decl_of.at(t.name), w);
    QF_ASSERT(w.bytes_written() - before == t.n_bytes(), "producer wrote the wrong byte count");
  }
  w.commit();
  if (o.cloned_bytes) o.cloned_bytes->fetch_add(w.bytes_cloned(), std::memory_order_relaxed);
  return o.hash ? w.digest() : ckpt::FileDigest{};
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
    std::vector<ckpt::FileDigest> digests(plan.files.size());
    run_tasks(plan.files.size(), o.threads, [&] {
      return [&](size_t f) {
        digests[f] = write_file(stage / plan.files[f].name, plan, f, o, produce);
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
