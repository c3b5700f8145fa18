// Sharded checkpoints: index <-> shard agreement rules, one test each, plus lookups.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/validate.h"
#include "qf/ckpt/writer.h"
#include "test_support.h"

namespace qf::ckpt {
namespace {

namespace fs = std::filesystem;
using qf::test::TempDir;

constexpr const char* kS1 = "model-00001-of-00002.safetensors";
constexpr const char* kS2 = "model-00002-of-00002.safetensors";
constexpr const char* kMtp = "model_extra_tensors.safetensors";

// Writes a shard whose tensors are U8 [n] filled with the byte n.
uint64_t write_shard(const fs::path& path,
                     const std::vector<std::pair<std::string, uint64_t>>& ts) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, n] : ts) specs.push_back({name, DType::kU8, {n}});
  SafetensorsWriter w(path, plan_safetensors(specs, Metadata{{"format", "pt"}}));
  uint64_t total = 0;
  for (const TensorInfo& t : w.plan().layout) {
    w.write(std::string(t.n_bytes(), static_cast<char>(t.n_bytes())).data(), t.n_bytes());
    total += t.n_bytes();
  }
  w.commit();
  return total;
}

void write_index(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& map,
                 std::optional<uint64_t> total) {
  ShardIndex idx;
  idx.total_size = total;
  idx.weight_map = map;
  idx.sort();
  write_file_atomic(dir / kIndexFileName, serialize_index(idx), true);
}

// A valid model: two shards plus the MTP sidecar, all listed.
struct Model {
  TempDir dir;
  Model() {
    write_shard(dir / kS1, {{"a", 3}, {"b", 5}});
    write_shard(dir / kS2, {{"c", 7}});
    write_shard(dir / kMtp, {{"mtp.fc.weight", 11}});
    write_index(dir.path(), {{"a", kS1}, {"b", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}}, 26);
    qf::test::write_file(dir / "config.json", "{\"model_type\": \"qwen3_5_moe\"}");
    qf::test::write_file(dir / "tokenizer.json", "{}");
  }
};

std::vector<Problem> problems_of(const fs::path& p) {
  std::vector<Problem> out;
  Checkpoint::open_collect(p, out);
  return out;
}

std::string describe(const std::vector<Problem>& ps) {
  std::string s;
  for (const Problem& p : ps) s += std::string(errc_name(p.code)) + ": " + format_problem(p) + "\n";
  return s.empty() ? "(none)" : s;
}

void expect_only(const fs::path& p, Errc code, const std::string& needle) {
  const auto ps = problems_of(p);
  ASSERT_EQ(ps.size(), 1u) << describe(ps);
  EXPECT_EQ(ps[0].code, code) << describe(ps);
  EXPECT_NE(format_problem(ps[0]).find(needle), std::string::npos) << describe(ps);
}

TEST(Checkpoint, ValidModelResolvesNamesAcrossShardsAndSidecar) {
  Model m;
  EXPECT_TRUE(problems_of(m.dir.path()).empty()) << describe(problems_of(m.dir.path()));
  const Checkpoint c = Checkpoint::open(m.dir.path());
  EXPECT_EQ(c.n_tensors(), 4u);
  EXPECT_EQ(c.tensor_bytes(), 26u);
  EXPECT_EQ(c.tensor_files().size(), 3u);
  const TensorView v = c.view("mtp.fc.weight");
  EXPECT_EQ(v.bytes.size(), 11u);
  EXPECT_EQ(static_cast<int>(v.bytes[10]), 11);
  EXPECT_EQ(c.file_name(*c.find("c")->file), kS2);
  EXPECT_THROW(c.view("nope"), Error);
  std::map<std::string, FileRole> roles;
  for (const CheckpointFile& f : c.listing()) roles[f.name] = f.role;
  EXPECT_EQ(roles[kS1], FileRole::kShard);
  EXPECT_EQ(roles[kMtp], FileRole::kSidecar);
  EXPECT_EQ(roles["config.json"], FileRole::kConfig);
  EXPECT_EQ(roles["tokenizer.json"], FileRole::kTokenizer);
  EXPECT_EQ(roles[std::string(kIndexFileName)], FileRole::kIndex);
}

TEST(Checkpoint, IndexNamesMissingFile) {
  Model m;
  fs::remove(m.dir / kMtp);
  expect_only(m.dir.path(), Errc::kIndexMissingFile, "maps 1 tensors to this file");
  EXPECT_THROW(Checkpoint::open(m.dir.path()), Error);
}

TEST(Checkpoint, IndexEntryNotInShard) {
  Model m;
  write_index(m.dir.path(),
              {{"a", kS1}, {"b", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}, {"ghost", kS2}}, 26);
  expect_only(m.dir.path(), Errc::kIndexTensorMissing, "tensor 'ghost'");
}

TEST(Checkpoint, ShardTensorNotInIndex) {
  Model m;
  write_index(m.dir.path(), {{"a", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}}, 26);
  expect_only(m.dir.path(), Errc::kIndexTensorUnlisted, "tensor 'b'");
  EXPECT_NO_THROW(Checkpoint::open(m.dir.path()));  // loaders read whole files anyway
}

TEST(Checkpoint, IndexMapsTensorToWrongFile) {
  Model m;
  write_index(m.dir.path(), {{"a", kS1}, {"b", kS2}, {"c", kS2}, {"mtp.fc.weight", kMtp}}, 26);
  expect_only(m.dir.path(), Errc::kIndexWrongFile, "but it is in 'model-00001-of-00002");
}

TEST(Checkpoint, SameNameInTwoFiles) {
  Model m;
  fs::remove(m.dir / kMtp);
  write_shard(m.dir / kMtp, {{"mtp.fc.weight", 11}, {"c", 7}});
  write_index(m.dir.path(), {{"a", kS1}, {"b", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}}, 33);
  const auto ps = problems_of(m.dir.path());
  ASSERT_GE(ps.size(), 1u);
  EXPECT_EQ(ps[0].code, Errc::kDuplicateAcrossFiles) << describe(ps);
  EXPECT_EQ(ps[0].tensor, "c");
  EXPECT_THROW(Checkpoint::open(m.dir.path()), Error);
}

TEST(Checkpoint, TotalSizeWrongOrMissing) {
  Model m;
  write_index(m.dir.path(), {{"a", kS1}, {"b", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}}, 15);
  expect_only(m.dir.path(), Errc::kTotalSizeMismatch, "total_size is 15 but the tensors hold 26");
  write_index(m.dir.path(), {{"a", kS1}, {"b", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}},
              std::nullopt);
  expect_only(m.dir.path(), Errc::kTotalSizeMismatch, "missing");
  EXPECT_NO_THROW(Checkpoint::open(m.dir.path()));
}

TEST(Checkpoint, StraySafetensorsFile) {
  Model m;
  write_shard(m.dir / "lm_head_int8.safetensors", {{"x", 2}});
  expect_only(m.dir.path(), Errc::kStrayFile, "lm_head_int8.safetensors");
  const Checkpoint c = Checkpoint::open(m.dir.path());
  EXPECT_EQ(c.find("x"), nullptr);  // not part of the model
  EXPECT_EQ(c.stray_files().size(), 1u);
}

TEST(Checkpoint, StrayFileHeaderProblemsAreReportedButDoNotStopLoading) {
  Model m;
  qf::test::write_file(m.dir / "junk.safetensors", "1234");
  const auto ps = problems_of(m.dir.path());
  ASSERT_EQ(ps.size(), 2u) << describe(ps);
  EXPECT_EQ(ps[0].code, Errc::kStrayFile);
  EXPECT_EQ(ps[1].code, Errc::kHeaderTooSmall);
  EXPECT_NO_THROW(Checkpoint::open(m.dir.path()));
}

TEST(Checkpoint, SeveralFilesButNoIndex) {
  Model m;
  fs::remove(m.dir / kIndexFileName);
  expect_only(m.dir.path(), Errc::kIndexMissing, "3 .safetensors files but no");
}

TEST(Checkpoint, BrokenConfigAndIndexJson) {
  Model m;
  qf::test::write_file(m.dir / "config.json", "{\"a\": 1,}");
  expect_only(m.dir.path(), Errc::kConfigInvalid, "config.json");
  Model m2;
  qf::test::write_file(m2.dir / kIndexFileName, "{\"weight_map\": ");
  const auto ps = problems_of(m2.dir.path());
  ASSERT_GE(ps.size(), 1u);
  EXPECT_EQ(ps[0].code, Errc::kIndexInvalid) << describe(ps);
}

TEST(Checkpoint, BadShardHeaderNamesTheFile) {
  Model m;
  std::string bytes = qf::test::read_file(m.dir / kS2);
  bytes.push_back('!');  // one trailing byte
  qf::test::write_file(m.dir / kS2, bytes);
  const auto ps = problems_of(m.dir.path());
  ASSERT_EQ(ps.size(), 1u) << describe(ps);
  EXPECT_EQ(ps[0].code, Errc::kTrailingBytes);
  EXPECT_EQ(ps[0].file, kS2);
}

TEST(Checkpoint, ValidateReportsEveryProblemAtOnce) {
  Model m;
  write_shard(m.dir / "stray.safetensors", {{"s", 1}});
  write_index(m.dir.path(), {{"a", kS1}, {"c", kS2}, {"mtp.fc.weight", kMtp}, {"ghost", kS2}}, 1);
  const ValidateReport r = validate_checkpoint(m.dir.path(), {});
  std::set<Errc> codes;
  for (const Problem& p : r.problems) codes.insert(p.code);
  EXPECT_EQ(codes, (std::set<Errc>{Errc::kStrayFile, Errc::kIndexTensorMissing,
                                   Errc::kIndexTensorUnlisted, Errc::kTotalSizeMismatch}))
      << describe(r.problems);
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  write_shard(dir / "weights.safetensors", {{"w", 4}});
  const Checkpoint c = Checkpoint::open(dir / "weights.safetensors");
  EXPECT_TRUE(c.is_single_file());
  EXPECT_EQ(c.n_tensors(), 1u);
  EXPECT_EQ(c.listing().size(), 1u);
  EXPECT_EQ(c.listing()[0].role, FileRole::kShard);
  EXPECT_THROW(Checkpoint::open(dir / "missing"), Error);
}

// Pages of [p, p + n) (page-aligned p) in the page cache.
size_t resident_pages(const std::byte* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), pages = (n + page - 1) / page;
  std::vector<unsigned char> v(pages);
  if (::mincore(const_cast<std::byte*>(p), n, v.data()) != 0) return SIZE_MAX;
  size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

TEST(SafetensorsFile, DropCachedKeepsTheBytesAndEmptiesThePageCache) {
  TempDir dir;
  const fs::path path = dir / "big.safetensors";
  write_shard(path, {{"a", 4096}, {"w", 16u << 20}});  // w: 16 MiB of the byte 0 (n mod 256)
  ::sync();  // clean pages only: dirty ones stay cached until written back
  const SafetensorsFile f = SafetensorsFile::open(path);
  const TensorInfo& w = *f.find("w");
  const TensorView v = f.view(w);
  uint64_t sum = 0;
  for (std::byte b : v.bytes) sum += static_cast<uint8_t>(b);  // fault every page in
  EXPECT_EQ(sum, 0u);
  const std::byte* map = f.map().data();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t lo = (f.header().data_offset() + w.begin + page - 1) / page * page;
  const size_t hi = (f.header().data_offset() + w.end) / page * page;
  ASSERT_GT(hi, lo);
  const size_t before = resident_pages(map + lo, hi - lo);
  f.drop_cached(w.begin, w.n_bytes());
  const size_t after = resident_pages(map + lo, hi - lo);
  // The bytes are still there: read back from the file.
  for (size_t i = 0; i < v.bytes.size(); i += 4096) ASSERT_EQ(v.bytes[i], std::byte{0}) << i;
  struct statfs fs_info {};
  ASSERT_EQ(::statfs(path.c_str(), &fs_info), 0);
  if (fs_info.f_type == 0x01021994 /* tmpfs */ || fs_info.f_type == 0x794c7630 /* overlay */) {
    GTEST_SKIP() << "the page-cache check needs a disk filesystem: TMPDIR is tmpfs or overlayfs";
  }
  EXPECT_EQ(before, (hi - lo) / page);
  // Large folios (up to 2 MiB) are kept whole, so the one the tensor shares with the header and
  // "a", and the last one, may stay.
  EXPECT_LE(after, 2 * (size_t{2} << 20) / page) << "of " << (hi - lo) / page << " pages";
}

}  // namespace
}  // namespace qf::ckpt
