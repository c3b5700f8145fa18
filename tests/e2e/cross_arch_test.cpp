// The aarch64 build (the Spark's Grace CPU, cross-built and run under qemu-user by `make
// aarch64`) and the x86-64 build turn the same inputs into the same bytes: on every engine
// fixture, the Spark recipe's checkpoints (INT4 and FP8 sources, the hybrid with its INT8 LM head
// where the vocabulary packs) and the CPU engine's logits and MTP logits on the model and on each
// of them. QF_HOST_QFORGE names the x86-64 qforge; without it (any native build) the test skips.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "model_fixtures.h"
#include "qf/rt/model.h"
#include "test_support.h"

namespace qf::test {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = QF_MODEL_GOLDEN_DIR;
const std::string kHost = QF_HOST_QFORGE;

// Every file under a and b, by relative path: the names and bytes that differ.
std::string tree_differences(const fs::path& a, const fs::path& b) {
  std::string out;
  for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(from)) {
      if (!e.is_regular_file()) continue;
      const fs::path rel = fs::relative(e.path(), from), other = to / rel;
      if (!fs::exists(other)) {
        out += rel.string() + ": only under " + from.string() + "\n";
      } else if (from == a && read_file(e.path()) != read_file(other)) {
        out += rel.string() + ": bytes differ\n";
      }
    }
  }
  return out;
}

class CrossArch : public ::testing::TestWithParam<std::string> {};

TEST_P(CrossArch, SameCheckpointsAndLogits) {
  if (kHost.empty()) GTEST_SKIP() << "QF_HOST_QFORGE is not set: only `make aarch64` compares";
  const fs::path src = kDir / GetParam() / "model";
  const int64_t vocab = rt::Model::load(src)->config().vocab_size;
  TempDir tmp;
  std::string tokens;
  for (int t = 3; t < 340; t += 7) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  for (const std::string side : {"host", "this"}) {
    const std::string bin = side == "host" ? kHost : QF_BIN;
    const fs::path work = tmp / side;
    ASSERT_NO_FATAL_FAILURE(build_hybrid(bin, src, work, vocab));
    for (const fs::path& m : {src, work / "int4", work / "fp8", work / "hybrid"}) {
      const std::string out =
          (work / ("logits-" + m.filename().string() + ".safetensors")).string();
      const CommandResult r = run_command(bin + " logits --model " + m.string() + " --tokens " +
                                          tokens + " --mtp --out " + out + " 2>&1");
      ASSERT_EQ(r.exit_code, 0) << side << " " << m << "\n" << r.out;
    }
  }
  EXPECT_EQ(tree_differences(tmp / "host", tmp / "this"), "");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CrossArch, ::testing::ValuesIn(model_fixtures()),
                         fixture_test_name);

}  // namespace
}  // namespace qf::test
