#include "ckpt_edit.h"

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "test_support.h"

namespace qf::test {

namespace fs = std::filesystem;

void copy_checkpoint(const fs::path& in, const fs::path& out, const CheckpointEdit& edit) {
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(in);
  fs::create_directories(out);
  ckpt::ShardIndex index;
  uint64_t total = 0;
  bool first = true;
  for (const ckpt::SafetensorsFile& f : c.tensor_files()) {
    const std::string fname = c.file_name(f);
    std::vector<ckpt::TensorSpec> specs;
    for (const ckpt::TensorInfo& t : f.tensors()) {
      if (edit.drop.count(t.name)) {
        if (edit.keep_index_entries) index.weight_map.emplace_back(t.name, fname);
        continue;
      }
      const auto r = edit.retype.find(t.name);
      specs.push_back(r != edit.retype.end() ? r->second
                                             : ckpt::TensorSpec{t.name, t.dtype, t.shape});
    }
    if (first) {
      for (const auto& [name, spec] : edit.add) specs.push_back(spec);
      first = false;
    }
    ckpt::SafetensorsWriter w(out / fname,
                              ckpt::plan_safetensors(specs, ckpt::Metadata{{"format", "pt"}}));
    for (const ckpt::TensorInfo& t : w.plan().layout) {
      const ckpt::TensorInfo* src = f.find(t.name);
      if (src && !edit.retype.count(t.name)) {
        std::string bytes(reinterpret_cast<const char*>(f.view(*src).bytes.data()), src->n_bytes());
        if (edit.patch) edit.patch(t.name, bytes);
        w.write(bytes.data(), bytes.size());
      } else {
        w.write_zeros(t.n_bytes());
      }
      index.weight_map.emplace_back(t.name, fname);
      total += t.n_bytes();
    }
    w.commit();
  }
  index.total_size = total;
  index.sort();
  ckpt::write_file_atomic(out / ckpt::kIndexFileName, ckpt::serialize_index(index), true);
  for (const ckpt::CheckpointFile& f : c.listing()) {
    if (f.role == ckpt::FileRole::kShard || f.role == ckpt::FileRole::kSidecar ||
        f.role == ckpt::FileRole::kIndex || f.role == ckpt::FileRole::kManifest) {
      continue;
    }
    std::string text = read_file(c.root() / f.name);
    if (f.name == "config.json" && edit.config) edit.config(text);
    write_file(out / f.name, text);
  }
}

}  // namespace qf::test
