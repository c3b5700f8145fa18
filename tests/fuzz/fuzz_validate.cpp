// libFuzzer target for model-aware validation (`qforge validate`): the input is a config.json
// (its quantization_config included) beside a fixed set of tensors, the r1 engine fixture's
// BF16 model (tests/golden/data/models/r1-hd64-e4k2), copied once per process into a temporary
// directory. Config values decide every expected name, shape and group, so a config is the
// input that reaches the most arithmetic. Properties: validation ends with a report whatever
// the config says (only Error(kIo) may be thrown, and nothing here makes I/O fail), every
// problem carries a known code, and the fixture's own config validates clean (the seed).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "json_mutator.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/validate.h"
#include "qf/error.h"
#include "qf/quant/model_check.h"

namespace {

namespace fs = std::filesystem;
using namespace qf;

// The temporary directory, removed when the process ends normally.
struct WorkDir {
  fs::path path;
  std::string fixture_config;  // the fixture's own config.json
  WorkDir() {
    path = fs::temp_directory_path() / ("qf-fuzz-validate-" + std::to_string(getpid()));
    fs::create_directories(path);
    const fs::path model = QF_FIXTURE_MODEL;
    fs::copy_file(model / "model.safetensors", path / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    std::ifstream f(model / "config.json", std::ios::binary);
    fixture_config.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  ~WorkDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

QF_FUZZ_JSON_MUTATOR(0, "model_type", "text_config", "vision_config", "quantization_config",
                     "quant_method", "bits", "group_size", "sym", "weight_block_size",
                     "extra_config", "modules_to_not_convert", "packing_format",
                     "block_name_to_quantize", "qforge", "hybrid", "lm_head", "hidden_size",
                     "num_hidden_layers", "num_experts", "moe_intermediate_size",
                     "mtp_num_hidden_layers", "layer_types", "head_dim", "vocab_size",
                     "tie_word_embeddings")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const WorkDir work;
  const fs::path& dir = work.path;
  {
    std::ofstream f(dir / "config.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  ckpt::ValidateOptions opts;
  opts.threads = 1;
  quant::ModelCheckStats stats;
  opts.extra_checks = [&](const ckpt::Checkpoint& c, std::vector<ckpt::Problem>& problems) {
    stats = quant::check_qwen35_model(c, quant::ModelCheckOptions{}, problems);
  };
  ckpt::ValidateReport r;
  try {
    r = ckpt::validate_checkpoint(dir, opts);
  } catch (const Error& e) {
    fuzz::fail("validation threw", e.what());
  }
  for (const ckpt::Problem& p : r.problems) {
    QF_FUZZ_CHECK(static_cast<int>(p.code) < kNumErrc && !p.message.empty(), p.message);
  }
  if (std::string_view(reinterpret_cast<const char*>(data), size) == work.fixture_config) {
    QF_FUZZ_CHECK(r.ok() && stats.checked,
                  r.problems.empty() ? "not checked" : r.problems[0].message);
  }
  return 0;
}
