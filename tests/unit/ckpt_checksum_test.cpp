// Checksums: streamed per-file and per-tensor XXH3 against one-shot hashes, the manifest
// format, and validate --checksums create / verify / detect.
#include <gtest/gtest.h>
#include <xxhash.h>

#include "qf/ckpt/checksum.h"
#include "qf/ckpt/validate.h"
#include "qf/ckpt/writer.h"
#include "test_support.h"

namespace qf::ckpt {
namespace {

namespace fs = std::filesystem;
using qf::test::TempDir;

// A file whose tensors straddle the 1 MiB hashing blocks at awkward offsets.
fs::path write_model(const fs::path& dir, const std::string& name, uint64_t seed) {
  const std::vector<TensorSpec> specs = {
      {"a", DType::kU8, {1}},           {"big", DType::kF32, {700'001}},
      {"empty", DType::kBF16, {0}},     {"odd", DType::kBF16, {33, 31}},
      {"mid", DType::kU8, {1'048'575}}, {"zz_empty_last", DType::kU8, {0}}};
  SafetensorsWriter w(dir / name, plan_safetensors(specs, Metadata{{"format", "pt"}}));
  w.write(qf::test::pattern_bytes(w.plan().data_bytes, seed).data(), w.plan().data_bytes);
  w.commit();
  return dir / name;
}

TEST(Checksum, StreamedHashesEqualOneShotHashes) {
  TempDir dir;
  const fs::path p = write_model(dir.path(), "m.safetensors", 3);
  const SafetensorsFile f = SafetensorsFile::open(p);
  Progress progress;
  const FileDigest d = digest_file({p, "m.safetensors", &f.header()}, &progress);
  const std::string bytes = qf::test::read_file(p);
  EXPECT_EQ(d.size, bytes.size());
  EXPECT_EQ(d.xxh3, XXH3_64bits(bytes.data(), bytes.size()));
  EXPECT_EQ(progress.done.load(), bytes.size());
  ASSERT_EQ(d.tensors.size(), f.tensors().size());
  for (const auto& [name, h] : d.tensors) {
    const TensorView v = f.view(name);
    EXPECT_EQ(h, XXH3_64bits(v.bytes.data(), v.bytes.size())) << name;
  }
  const FileDigest plain = digest_file({p, "m.safetensors", nullptr});
  EXPECT_EQ(plain.xxh3, d.xxh3);
  EXPECT_FALSE(plain.has_tensors);
}

TEST(Checksum, ManifestRoundTrip) {
  Manifest m;
  m.files.push_back({"config.json", 10, 0x0123456789abcdefull, false, {}});
  m.files.push_back({"w\xC3\xA9.safetensors",
                     99,
                     0xffffffffffffffffull,
                     true,
                     {{"a", 1}, {"b\"q", 0xdeadbeefull}}});
  m.files.push_back({"x.safetensors", 8, 0, true, {}});
  const std::string text = serialize_manifest(m);
  const Manifest back = parse_manifest(text);
  ASSERT_EQ(back.files.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.files[i].name, m.files[i].name);
    EXPECT_EQ(back.files[i].size, m.files[i].size);
    EXPECT_EQ(back.files[i].xxh3, m.files[i].xxh3);
    EXPECT_EQ(back.files[i].has_tensors, m.files[i].has_tensors);
    EXPECT_EQ(back.files[i].tensors, m.files[i].tensors);
  }
  EXPECT_EQ(serialize_manifest(back), text);
}

TEST(Checksum, ManifestRejectsMalformed) {
  for (const char* bad :
       {"{", "{\"format\": \"other\", \"files\": {}}", "{\"files\": {}}",
        "{\"format\": \"qforge-manifest\", \"version\": 2, \"files\": {}}",
        "{\"format\": \"qforge-manifest\", \"files\": {\"a\": {\"size\": 1, \"xxh3\": \"XYZ\"}}}",
        "{\"format\": \"qforge-manifest\", \"files\": {\"a\": {\"size\": 1}}}",
        "{\"format\": \"qforge-manifest\", \"files\": {\"a\": {\"size\": 1, \"xxh3\": "
        "\"0000000000000000\"}, \"a\": {\"size\": 1, \"xxh3\": \"0000000000000000\"}}}"}) {
    SCOPED_TRACE(bad);
    try {
      parse_manifest(bad);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kManifestInvalid);
    }
  }
}

TEST(Checksum, ValidateCreatesVerifiesAndNamesTheCorruptTensor) {
  TempDir dir;
  write_model(dir.path(), "model.safetensors", 5);
  qf::test::write_file(dir / "config.json", "{}");
  ValidateOptions opts;
  opts.checksums = true;
  ValidateReport r = validate_checkpoint(dir.path(), opts);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.checksums, ChecksumAction::kCreated);
  ASSERT_TRUE(fs::exists(dir / "qforge-manifest.json"));
  r = validate_checkpoint(dir.path(), opts);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.checksums, ChecksumAction::kVerified);

  // Flip one byte inside tensor "mid"; the header stays valid.
  const SafetensorsFile f = SafetensorsFile::open(dir / "model.safetensors");
  const uint64_t at = f.header().data_offset() + f.find("mid")->begin + 12345;
  std::string bytes = qf::test::read_file(dir / "model.safetensors");
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  qf::test::write_file(dir / "model.safetensors", bytes);
  qf::test::write_file(dir / "extra.txt", "new");
  fs::remove(dir / "config.json");
  r = validate_checkpoint(dir.path(), opts);
  std::vector<std::string> seen;
  for (const Problem& p : r.problems)
    seen.push_back(std::string(errc_name(p.code)) + ":" + p.file + ":" + p.tensor);
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "manifest-missing-file:config.json:",
                      "checksum-mismatch:model.safetensors:",
                      "checksum-mismatch:model.safetensors:mid",
                      "manifest-extra-file:extra.txt:",
                  }));
}

TEST(Checksum, NoManifestForAnInvalidCheckpoint) {
  TempDir dir;
  write_model(dir.path(), "model-00001-of-00002.safetensors", 1);
  write_model(dir.path(), "model-00002-of-00002.safetensors", 2);  // no index: invalid
  ValidateOptions opts;
  opts.checksums = true;
  const ValidateReport r = validate_checkpoint(dir.path(), opts);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.checksums, ChecksumAction::kNotCreated);
  EXPECT_FALSE(fs::exists(dir / "qforge-manifest.json"));
}

TEST(Checksum, ParallelDigestEqualsSerial) {
  TempDir dir;
  std::vector<DigestJob> jobs;
  for (int i = 0; i < 5; ++i) {
    const std::string name = "f" + std::to_string(i) + ".safetensors";
    write_model(dir.path(), name, 10 + i);
    jobs.push_back({dir / name, name, nullptr});
  }
  const Manifest serial = digest_files(jobs, 1, nullptr);
  const Manifest parallel = digest_files(jobs, 3, nullptr);
  EXPECT_EQ(serialize_manifest(serial), serialize_manifest(parallel));
}

}  // namespace
}  // namespace qf::ckpt
