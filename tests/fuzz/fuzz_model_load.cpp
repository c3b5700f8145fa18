// libFuzzer target for the model loader (rt::Model::load, what `generate`, `serve`, `logits` and
// both engines run first) and validation, over a checkpoint whose safetensors header is the
// input: the r1 engine fixture's BF16 model (tests/golden/data/models/r1-hd64-e4k2), its
// config.json as it is, model.safetensors written as the input (padded with spaces to a multiple
// of 8, as writers pad) followed by the fixture's data section. The names, dtypes, shapes and
// offsets decide what the model checks and the loader meet. Properties: validation with the
// model checks ends with a report (nothing thrown: nothing here makes I/O fail); Model::load loads
// or throws a qf::Error, never another exception; a checkpoint that validates clean loads; the
// fixture's own header does both (the seed).
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "json_mutator.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/validate.h"
#include "qf/error.h"
#include "qf/quant/model_check.h"
#include "qf/rt/model.h"

namespace {

namespace fs = std::filesystem;
using namespace qf;

// The temporary directory, removed when the process ends normally.
struct WorkDir {
  fs::path path;
  std::string header;  // the fixture's header JSON, padding included
  std::string data;    // the fixture's data section
  WorkDir() {
    path = fs::temp_directory_path() / ("qf-fuzz-model-load-" + std::to_string(getpid()));
    fs::create_directories(path);
    const fs::path model = QF_FIXTURE_MODEL;
    fs::copy_file(model / "config.json", path / "config.json",
                  fs::copy_options::overwrite_existing);
    const std::string file = ckpt::read_text_file(model / "model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
    header = file.substr(8, n);
    data = file.substr(8 + n);
  }
  ~WorkDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

QF_FUZZ_JSON_MUTATOR(0, "dtype", "shape", "data_offsets", "__metadata__", "format",
                     "model.language_model.embed_tokens.weight", "lm_head.weight",
                     "model.language_model.norm.weight",
                     "model.language_model.layers.0.linear_attn.conv1d.weight",
                     "model.language_model.layers.0.linear_attn.A_log",
                     "model.language_model.layers.0.mlp.gate.weight",
                     "model.language_model.layers.0.mlp.experts.gate_up_proj",
                     "model.language_model.layers.3.self_attn.q_norm.weight", "mtp.fc.weight")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const WorkDir work;
  const fs::path& dir = work.path;
  std::string header(reinterpret_cast<const char*>(data), size);
  header.resize((header.size() + 7) / 8 * 8, ' ');
  {
    std::string prefix(8, '\0');
    for (size_t i = 0; i < 8; ++i) prefix[i] = static_cast<char>(header.size() >> (8 * i));
    std::ofstream f(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
    f << prefix << header << work.data;
  }
  ckpt::ValidateOptions opts;
  opts.threads = 1;
  opts.extra_checks = [&](const ckpt::Checkpoint& c, std::vector<ckpt::Problem>& problems) {
    quant::check_qwen35_model(c, quant::ModelCheckOptions{}, problems);
  };
  ckpt::ValidateReport r;
  try {
    r = ckpt::validate_checkpoint(dir, opts);
  } catch (const Error& e) {
    fuzz::fail("validation threw", e.what());
  }
  std::string why;
  try {
    rt::Model::load(dir);
  } catch (const Error& e) {
    why = e.what();
  } catch (const std::exception& e) {
    fuzz::fail("Model::load threw other than qf::Error", e.what());
  }
  QF_FUZZ_CHECK(!r.ok() || why.empty(), "validates clean but does not load: " + why);
  if (header == work.header) {
    QF_FUZZ_CHECK(r.ok() && why.empty(), r.problems.empty() ? why : r.problems[0].message);
  }
  return 0;
}
