// Interop with the official Python `safetensors` package (installed by .ci/run), both ways,
// bit-exact for every dtype, plus byte-identical output to its writer and to json.dumps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qf/ckpt/checksum.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/safetensors.h"
#include "qf/ckpt/writer.h"
#include "test_support.h"

namespace qf::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using qf::test::TempDir;

std::string from_hex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::string to_hex(std::span<const std::byte> b) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s += kHex[static_cast<int>(x) >> 4];
    s += kHex[static_cast<int>(x) & 15];
  }
  return s;
}

// Runs py_write.py once for the whole suite.
class PythonWrites : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const auto r = qf::test::run_command(std::string(QF_PYTHON) + " " + QF_INTEROP_DIR +
                                         "/py_write.py " + dir_->path().string());
    ASSERT_EQ(r.exit_code, 0) << "py_write.py failed (pip install safetensors numpy):\n" << r.err;
    expected_ = json::parse(qf::test::read_file(dir_->path() / "expected.json"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static TempDir* dir_;
  static json expected_;
};
TempDir* PythonWrites::dir_ = nullptr;
json PythonWrites::expected_;

TEST_F(PythonWrites, QforgeReadsEveryFileBitExact) {
  ASSERT_EQ(expected_.size(), 3u);
  for (const auto& [fname, spec] : expected_.items()) {
    SCOPED_TRACE(fname);
    const SafetensorsFile f = SafetensorsFile::open(dir_->path() / fname);
    ASSERT_EQ(f.tensors().size(), spec["tensors"].size());
    for (const auto& [name, t] : spec["tensors"].items()) {
      SCOPED_TRACE(name);
      const TensorInfo* info = f.find(name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(dtype_name(info->dtype), t["dtype"].get<std::string>());
      EXPECT_EQ(info->shape, t["shape"].get<Shape>());
      EXPECT_EQ(to_hex(f.view(*info).bytes), t["hex"].get<std::string>());
    }
    if (spec["metadata"].is_null()) {
      EXPECT_FALSE(f.header().has_metadata);
    } else {
      std::map<std::string, std::string> got(f.header().metadata.begin(),
                                             f.header().metadata.end());
      using StringMap = std::map<std::string, std::string>;
      EXPECT_EQ(got, spec["metadata"].get<StringMap>());
    }
  }
}

TEST_F(PythonWrites, QforgeWriterIsByteIdenticalToTheReferenceWriter) {
  const json& spec = expected_["all_dtypes.safetensors"];
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> bytes;
  for (const auto& [name, t] : spec["tensors"].items()) {
    specs.push_back(
        {name, *dtype_from_name(t["dtype"].get<std::string>()), t["shape"].get<Shape>()});
    bytes[name] = from_hex(t["hex"].get<std::string>());
  }
  const fs::path out = dir_->path() / "rewritten.safetensors";
  SafetensorsWriter w(out, plan_safetensors(specs, Metadata{{"format", "pt"}}));
  for (const TensorInfo& t : w.plan().layout) w.write(bytes[t.name].data(), bytes[t.name].size());
  w.commit();
  EXPECT_EQ(qf::test::read_file(out), qf::test::read_file(dir_->path() / "all_dtypes.safetensors"));
}

TEST_F(PythonWrites, IndexSerializationMatchesJsonDumps) {
  const std::string text = qf::test::read_file(dir_->path() / "index.json");
  const IndexParse p = parse_index(text);
  ASSERT_TRUE(p.problems.empty());
  EXPECT_EQ(serialize_index(p.index), text);
}

TEST_F(PythonWrites, ChecksumsMatchPythonXxhash) {
  const fs::path hashes = dir_->path() / "xxh3.json";
  ASSERT_TRUE(fs::exists(hashes)) << "python-xxhash missing (pip install xxhash)";
  const json want = json::parse(qf::test::read_file(hashes));
  for (const auto& [fname, h] : want.items()) {
    const SafetensorsFile f = SafetensorsFile::open(dir_->path() / fname);
    const FileDigest d = digest_file({dir_->path() / fname, fname, &f.header()});
    EXPECT_EQ(hex64(d.xxh3), h["file"].get<std::string>()) << fname;
    for (const auto& [tensor, th] : d.tensors) {
      EXPECT_EQ(hex64(th), h["tensors"][tensor].get<std::string>()) << fname << " " << tensor;
    }
  }
}

// Both layouts: the reference writer's order, and the in-order layout build-hybrid uses to share
// blocks (names in reverse order within each dtype, the header padded to put the data section
// 8 bytes short of a 4 KiB boundary).
class QforgeWrites : public ::testing::TestWithParam<bool> {};

TEST_P(QforgeWrites, PythonReadsEveryDtypeBitExact) {
  const bool in_order = GetParam();
  TempDir dir;
  std::vector<TensorSpec> specs;
  const std::vector<Shape> shapes = {{3, 5}, {1}, {0}, {2, 0, 3}, {}, {4, 2, 2}};
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dt = static_cast<DType>(d);
    for (size_t i = 0; i < shapes.size(); ++i) {
      Shape s = shapes[i];
      if (dtype_bits(dt) % 8 != 0 && shape_numel(s) % 8 != 0) s = {8};  // whole bytes for F4/F6
      specs.push_back({"t." + std::string(dtype_name(dt)) + "." + std::to_string(i), dt, s});
    }
  }
  const Metadata meta = {{"format", "pt"}, {"qforge.note", "caf\xC3\xA9 \"q\"\n"}};
  const fs::path path = dir / "qforge.safetensors";
  std::sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
    return a.dtype != b.dtype ? a.dtype > b.dtype : a.name > b.name;
  });
  SafetensorsWriter w(path, in_order ? plan_safetensors_in_order(specs, meta, kCloneBlock - 8)
                                     : plan_safetensors(specs, meta));
  if (in_order) {
    EXPECT_EQ((8 + w.plan().header.size()) % kCloneBlock, kCloneBlock - 8);
    EXPECT_EQ(w.plan().layout.front().name, specs.front().name);
  }
  json expected = {{"metadata", {{"format", "pt"}, {"qforge.note", "caf\xC3\xA9 \"q\"\n"}}},
                   {"tensors", json::object()}};
  uint64_t seed = 7;
  for (const TensorInfo& t : w.plan().layout) {
    std::string b = qf::test::pattern_bytes(t.n_bytes(), seed++);
    if (t.dtype == DType::kBool) {
      for (char& c : b) c = static_cast<char>(c & 1);
    }
    w.write(b.data(), b.size());
    expected["tensors"][t.name] = {
        {"dtype", dtype_name(t.dtype)},
        {"shape", t.shape},
        {"hex", to_hex({reinterpret_cast<const std::byte*>(b.data()), b.size()})}};
  }
  w.commit();
  qf::test::write_file(dir / "expected.json", expected.dump());
  const auto r =
      qf::test::run_command(std::string(QF_PYTHON) + " " + QF_INTEROP_DIR + "/py_read.py " +
                            path.string() + " " + (dir / "expected.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("checked " + std::to_string(specs.size()) + " tensors: OK"),
            std::string::npos)
      << r.out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, QforgeWrites, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "InOrder" : "Sorted"; });

}  // namespace
}  // namespace qf::ckpt
