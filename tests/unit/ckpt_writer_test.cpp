// Streaming writer: layout, determinism, round trips, streaming from every source, atomicity.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <random>

#include "qf/ckpt/checksum.h"
#include "qf/ckpt/safetensors.h"
#include "qf/ckpt/writer.h"
#include "test_support.h"

namespace qf::ckpt {
namespace {

namespace fs = std::filesystem;
using qf::test::pattern_bytes;
using qf::test::TempDir;

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Writes `specs` with per-tensor pattern content, streaming in chunks of `chunk` bytes.
// Returns the content each tensor got.
std::map<std::string, std::string> write_patterned(const fs::path& path,
                                                   const std::vector<TensorSpec>& specs,
                                                   const std::optional<Metadata>& meta,
                                                   size_t chunk, WriterOptions opts = {}) {
  SafetensorsWriter w(path, plan_safetensors(specs, meta), opts);
  std::map<std::string, std::string> content;
  uint64_t seed = 1;
  for (const TensorInfo& t : w.plan().layout) content[t.name] = pattern_bytes(t.n_bytes(), seed++);
  for (const TensorInfo& t : w.plan().layout) {
    if (t.n_bytes() > 0) {
      EXPECT_EQ(w.plan().layout.at(w.current_tensor()).name, t.name);
    }
    const std::string& c = content[t.name];
    for (size_t off = 0; off < c.size(); off += chunk) {
      w.write(c.data() + off, std::min(chunk, c.size() - off));
    }
  }
  w.commit();
  return content;
}

TEST(Writer, ReferenceOrderPaddingAndAlignment) {
  const std::vector<TensorSpec> specs = {{"b", DType::kU8, {3}},     {"a", DType::kU8, {5}},
                                         {"w", DType::kBF16, {3}},   {"x", DType::kF32, {1}},
                                         {"q", DType::kI64, {1}},    {"s", DType::kF8E4M3, {7}},
                                         {"h", DType::kF16, {2, 2}}, {"z", DType::kBool, {1}}};
  const HeaderPlan plan = plan_safetensors(specs, Metadata{{"format", "pt"}});
  std::vector<std::string> order;
  for (const TensorInfo& t : plan.layout) order.push_back(t.name);
  // Descending dtype (I64 > F32 > BF16 > F16 > F8_E4M3 > U8 > BOOL), then by name.
  EXPECT_EQ(order, (std::vector<std::string>{"q", "x", "w", "h", "s", "a", "b", "z"}));
  EXPECT_EQ(plan.header.size() % 8, 0u);
  EXPECT_EQ(plan.header.substr(0, 31), "{\"__metadata__\":{\"format\":\"pt\"}");
  EXPECT_EQ(plan.header.find_first_not_of(' ', plan.header.rfind('}') + 1), std::string::npos);
  for (const TensorInfo& t : plan.layout) {
    EXPECT_EQ((8 + plan.header.size() + t.begin) % std::max(1u, dtype_size(t.dtype)), 0u) << t.name;
  }
}

TEST(Writer, RoundTripAwkwardSizesAndChunks) {
  TempDir dir;
  const std::vector<TensorSpec> specs = {{"one", DType::kU8, {1}},
                                         {"three", DType::kBF16, {3}},
                                         {"odd", DType::kF32, {31, 33}},
                                         {"big", DType::kI32, {127, 129}},
                                         {"empty", DType::kF32, {0, 5}},
                                         {"scalar", DType::kF64, {}},
                                         {"f4", DType::kF4, {2, 3}},
                                         {"fp8", DType::kF8E4M3, {129}},
                                         {"unicode \xC3\xA9\xE4\xB8\xAD", DType::kU16, {7}}};
  for (size_t chunk : {1u, 3u, 31u, 4096u, 1u << 20}) {
    SCOPED_TRACE(chunk);
    const fs::path p = dir / ("c" + std::to_string(chunk) + ".safetensors");
    WriterOptions opts;
    opts.buffer_bytes = 4096;  // make chunks cross buffer boundaries
    const auto content = write_patterned(p, specs, Metadata{{"format", "pt"}}, chunk, opts);
    const SafetensorsFile f = SafetensorsFile::open(p);
    ASSERT_EQ(f.tensors().size(), specs.size());
    for (const TensorSpec& s : specs) {
      const TensorInfo* t = f.find(s.name);
      ASSERT_NE(t, nullptr) << s.name;
      EXPECT_EQ(t->dtype, s.dtype);
      EXPECT_EQ(t->shape, s.shape);
      const TensorView v = f.view(*t);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size()),
                content.at(s.name));
    }
    EXPECT_EQ(f.header().metadata, (Metadata{{"format", "pt"}}));
  }
}

TEST(Writer, DeterministicByteIdenticalOutput) {
  TempDir dir;
  std::vector<TensorSpec> specs = {{"m.b", DType::kBF16, {4, 4}}, {"m.a", DType::kI32, {9}}};
  write_patterned(dir / "1.safetensors", specs, Metadata{{"format", "pt"}}, 5);
  std::reverse(specs.begin(), specs.end());  // input order must not matter
  write_patterned(dir / "2.safetensors", specs, Metadata{{"format", "pt"}}, 7);
  EXPECT_EQ(qf::test::read_file(dir / "1.safetensors"), qf::test::read_file(dir / "2.safetensors"));
}

TEST(Writer, RandomPropertyRoundTrip) {
  TempDir dir;
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 40; ++iter) {
    std::vector<TensorSpec> specs;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      TensorSpec s;
      s.name = "t" + std::to_string(rng() % 1000) + "." + std::to_string(i);
      do {
        s.dtype = static_cast<DType>(rng() % kNumDTypes);
      } while (dtype_bits(s.dtype) % 8 != 0);
      const int rank = static_cast<int>(rng() % 4);
      for (int d = 0; d < rank; ++d) s.shape.push_back(rng() % 7);
      specs.push_back(s);
    }
    std::optional<Metadata> meta;
    if (rng() % 2)
      meta = Metadata{{"k" + std::to_string(rng() % 5), "v\n\"" + std::to_string(iter)}};
    const fs::path p = dir / ("r" + std::to_string(iter) + ".safetensors");
    const auto content = write_patterned(p, specs, meta, 1 + rng() % 64);
    const SafetensorsFile f = SafetensorsFile::open(p);
    ASSERT_EQ(f.tensors().size(), specs.size());
    EXPECT_EQ(f.header().has_metadata, meta.has_value());
    if (meta) {
      EXPECT_EQ(f.header().metadata, *meta);
    }
    for (const TensorSpec& s : specs) {
      const TensorView v = f.view(s.name);
      EXPECT_EQ(v.info->shape, s.shape);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size()),
                content.at(s.name));
    }
    // Rewriting what was read gives the same bytes.
    std::vector<TensorSpec> again;
    for (const TensorInfo& t : f.tensors()) again.push_back({t.name, t.dtype, t.shape});
    const fs::path p2 = dir / ("r" + std::to_string(iter) + "b.safetensors");
    SafetensorsWriter w(p2, plan_safetensors(again, meta));
    for (const TensorInfo& t : w.plan().layout) w.write(f.view(t.name).bytes);
    w.commit();
    EXPECT_EQ(qf::test::read_file(p), qf::test::read_file(p2));
  }
}

TEST(Writer, CopyFromAnotherFileKernelAndBufferedPaths) {
  TempDir dir;
  const std::string src = pattern_bytes(3'000'001, 9);
  qf::test::write_file(dir / "src.bin", src);
  for (bool kernel : {true, false}) {
    SCOPED_TRACE(kernel);
    const fs::path p = dir / (kernel ? "k.safetensors" : "b.safetensors");
    WriterOptions opts;
    opts.kernel_copy = kernel;
    opts.buffer_bytes = 65536;
    SafetensorsWriter w(
        p,
        plan_safetensors({{"x", DType::kU8, {1'000'000}}, {"y", DType::kU8, {1'000'001}}},
                         std::nullopt),
        opts);
    const UniqueFd fd = open_read(dir / "src.bin");
    w.copy_from(fd.get(), 17, 1'000'000, dir / "src.bin");
    w.write(src.data() + 5, 1);  // mixing sources keeps the order right
    w.copy_from(fd.get(), 2'000'000, 1'000'000, dir / "src.bin");
    w.commit();
    const SafetensorsFile f = SafetensorsFile::open(p);
    const auto x = f.view("x").bytes;
    const auto y = f.view("y").bytes;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(x.data()), x.size()),
              src.substr(17, 1'000'000));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(y.data()), y.size()),
              src.substr(5, 1) + src.substr(2'000'000, 1'000'000));
  }
}

TEST(Writer, WriteTensorChecksOrderAndSize) {
  TempDir dir;
  SafetensorsWriter w(
      dir / "o.safetensors",
      plan_safetensors({{"a", DType::kU8, {2}}, {"b", DType::kU8, {3}}}, std::nullopt));
  const std::string two = "xy", three = "xyz";
  try {
    w.write_tensor("b", as_bytes(three));
    FAIL() << "out of order write accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
    EXPECT_NE(std::string(e.what()).find("next is 'a'"), std::string::npos);
  }
  EXPECT_THROW(w.write_tensor("a", as_bytes(three)), Error);
  w.write_tensor("a", as_bytes(two));
  w.write_tensor("b", as_bytes(three));
  EXPECT_EQ(w.current_tensor(), 2u);
  w.commit();
  // Zero-size tensors are written (with no bytes) in their place in the order.
  SafetensorsWriter z(
      dir / "z.safetensors",
      plan_safetensors({{"a", DType::kU8, {2}}, {"b", DType::kU8, {0}}, {"c", DType::kU8, {1}}},
                       std::nullopt));
  EXPECT_THROW(z.write_tensor("b", {}), Error);
  z.write_tensor("a", as_bytes(two));
  z.write_tensor("b", {});
  z.write_tensor("c", as_bytes(std::string("x")));
  z.commit();
  EXPECT_TRUE(fs::exists(dir / "o.safetensors"));
}

TEST(Writer, AtomicNothingVisibleUntilCommit) {
  TempDir dir;
  const fs::path p = dir / "a.safetensors";
  {
    SafetensorsWriter w(p, plan_safetensors({{"a", DType::kF32, {1000}}}, std::nullopt));
    w.write_zeros(100);
    EXPECT_FALSE(fs::exists(p));
    EXPECT_TRUE(fs::exists(staging_path(p)));
    // Destroyed without commit: an interrupted write.
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(staging_path(p)));

  SafetensorsWriter w(p, plan_safetensors({{"a", DType::kF32, {1000}}}, std::nullopt));
  w.write_zeros(3999);
  EXPECT_THROW(w.commit(), Error);  // one byte short
  EXPECT_FALSE(fs::exists(p));
}

TEST(Writer, RefusesToOverwriteUnlessAsked) {
  TempDir dir;
  const fs::path p = dir / "e.safetensors";
  qf::test::write_file(p, "keep me");
  try {
    SafetensorsWriter w(p, plan_safetensors({}, std::nullopt));
    FAIL() << "overwrote an existing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kExists);
  }
  EXPECT_EQ(qf::test::read_file(p), "keep me");
  WriterOptions opts;
  opts.overwrite = true;
  SafetensorsWriter w(p, plan_safetensors({{"a", DType::kU8, {1}}}, std::nullopt), opts);
  w.write_zeros(1);
  w.commit();
  EXPECT_NO_THROW(SafetensorsFile::open(p));
}

TEST(Writer, PlanRejectsImpossibleInput) {
  EXPECT_THROW(plan_safetensors({{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}}, std::nullopt),
               Error);
  EXPECT_THROW(plan_safetensors({{"a", DType::kF4, {3}}}, std::nullopt), Error);
  EXPECT_THROW(plan_safetensors({{"a", DType::kU8, {1ull << 63, 4}}}, std::nullopt), Error);
  EXPECT_THROW(plan_safetensors({{"bad\xFF", DType::kU8, {1}}}, std::nullopt), Error);
}

}  // namespace
}  // namespace qf::ckpt

namespace qf::ckpt {
namespace {

// The digest computed while writing equals digest_file of the finished file, whatever mix of
// write paths produced it; sparse copies keep the source's holes.
TEST(Writer, StreamedDigestEqualsDigestOfTheFileOnEveryPath) {
  TempDir dir;
  // A sparse source: 3 MiB of data, a 2 MiB hole, 1 MiB of data.
  const fs::path src = dir / "src.bin";
  {
    SafetensorsWriter w(src,
                        plan_safetensors({{"a", DType::kU8, {3u << 20}},
                                          {"b", DType::kU8, {2u << 20}},
                                          {"c", DType::kU8, {1u << 20}}},
                                         std::nullopt),
                        [] {
                          WriterOptions o;
                          o.sparse_zeros = true;
                          return o;
                        }());
    w.write(pattern_bytes(3u << 20, 1).data(), 3u << 20);
    w.write_zeros(2u << 20);
    w.write(pattern_bytes(1u << 20, 2).data(), 1u << 20);
    w.commit();
  }
  const SafetensorsFile s = SafetensorsFile::open(src);
  for (bool sparse : {false, true}) {
    for (bool kernel : {false, true}) {
      SCOPED_TRACE(std::to_string(sparse) + std::to_string(kernel));
      WriterOptions o;
      o.hash = true;
      o.sparse_zeros = sparse;
      o.kernel_copy = kernel;
      o.buffer_bytes = 1u << 16;
      const fs::path out = dir / ("out" + std::to_string(sparse) + std::to_string(kernel));
      SafetensorsWriter w(out,
                          plan_safetensors({{"copy", DType::kU8, {6u << 20}},
                                            {"gen", DType::kBF16, {100001}},
                                            {"z", DType::kF32, {70000}},
                                            {"e", DType::kF32, {0}}},
                                           Metadata{{"format", "pt"}}),
                          o);
      for (const TensorInfo& t : w.plan().layout) {
        if (t.name == "copy") w.copy_from(s.map().fd(), s.header().data_offset(), t.n_bytes(), src);
        if (t.name == "gen") w.write(pattern_bytes(t.n_bytes(), 3).data(), t.n_bytes());
        if (t.name == "z") w.write_zeros(t.n_bytes());
      }
      w.commit();
      const SafetensorsFile f = SafetensorsFile::open(out);
      const FileDigest want = digest_file({out, out.filename().string(), &f.header()});
      EXPECT_EQ(w.digest().xxh3, want.xxh3);
      EXPECT_EQ(w.digest().size, want.size);
      EXPECT_EQ(w.digest().tensors, want.tensors);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.view("copy").bytes.data()), 6u << 20),
                std::string(reinterpret_cast<const char*>(s.view("a").bytes.data()), 6u << 20));
      struct stat st {};
      ASSERT_EQ(::stat(out.c_str(), &st), 0);
      if (sparse) {  // the 2 MiB hole survived the copy
        EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, f.file_size() - (1u << 20));
      }
    }
  }
}

// In-order plans keep the order given and place the data section at the residue asked for.
TEST(Writer, InOrderPlanKeepsOrderAndPlacesTheDataSection) {
  const std::vector<TensorSpec> specs = {
      {"b", DType::kBF16, {3}}, {"a", DType::kF32, {2}}, {"c", DType::kU8, {5}}};
  for (uint64_t residue : {uint64_t{0}, uint64_t{8}, uint64_t{200}, kCloneBlock - 8}) {
    SCOPED_TRACE(residue);
    const HeaderPlan plan = plan_safetensors_in_order(specs, Metadata{{"format", "pt"}}, residue);
    EXPECT_EQ((8 + plan.header.size()) % kCloneBlock, residue);
    EXPECT_LT(plan.header.size(),
              plan_safetensors_in_order(specs, std::nullopt).header.size() + kCloneBlock + 64);
    ASSERT_EQ(plan.layout.size(), 3u);
    EXPECT_EQ(plan.layout[0].name, "b");
    EXPECT_EQ(plan.layout[1].name, "a");
    EXPECT_EQ(plan.layout[1].begin, 6u);
    EXPECT_EQ(plan.layout[2].begin, 14u);
    TempDir dir;
    const fs::path p = dir / "x.safetensors";
    SafetensorsWriter w(p, plan);
    w.write(pattern_bytes(19, 1).data(), 19);
    w.commit();
    const SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.header().data_offset() % kCloneBlock, residue);
    EXPECT_EQ(f.find("a")->begin, 6u);
  }
}

// Copies with cloning on give the same file and digest as plain copies, whether the filesystem
// shares blocks (TMPDIR on XFS or btrfs) or refuses (then the copy falls back). Contiguous copies
// from one source gather into one run, so only its two ragged ends are copied.
TEST(Writer, ClonedCopiesEqualPlainCopies) {
  TempDir dir;
  const fs::path src = dir / "src.bin";
  const uint64_t kA = (3u << 20) + 1000, kB = (1u << 20) + 5;
  {
    SafetensorsWriter w(
        src, plan_safetensors_in_order({{"a", DType::kU8, {kA}}, {"b", DType::kU8, {kB}}},
                                       std::nullopt, 24));
    w.write(pattern_bytes(kA, 7).data(), kA);
    w.write(pattern_bytes(kB, 8).data(), kB);
    w.commit();
  }
  const SafetensorsFile s = SafetensorsFile::open(src);
  const uint64_t src_a = s.header().data_offset() + s.find("a")->begin;
  // The output starts "a" 104 bytes into its data section; place that at a's residue.
  const std::vector<TensorSpec> specs = {{"gen", DType::kU8, {104}},
                                         {"a", DType::kU8, {kA}},
                                         {"mid", DType::kU8, {4096 * 3 + 8}},
                                         {"b", DType::kU8, {kB}}};
  const uint64_t residue = (src_a % kCloneBlock + kCloneBlock - 104) % kCloneBlock;
  ASSERT_EQ(residue % 8, 0u);
  const bool can = can_clone(src, dir.path());
  std::string want;
  for (bool clone : {false, true}) {
    SCOPED_TRACE(clone);
    WriterOptions o;
    o.hash = true;
    o.clone = clone;
    o.buffer_bytes = 1u << 16;
    const fs::path out = dir / (clone ? "cloned" : "plain");
    SafetensorsWriter w(out, plan_safetensors_in_order(specs, std::nullopt, residue), o);
    w.write(pattern_bytes(104, 3).data(), 104);
    // "a" in three contiguous pieces: one run.
    w.copy_from(s.map().fd(), src_a, 5000, src);
    w.copy_from(s.map().fd(), src_a + 5000, 1u << 20, src);
    w.copy_from(s.map().fd(), src_a + 5000 + (1u << 20), kA - 5000 - (1u << 20), src);
    w.write_zeros(4096 * 3 + 8);
    w.copy_from(s.map().fd(), s.header().data_offset() + s.find("b")->begin, kB, src);
    w.commit();
    const SafetensorsFile f = SafetensorsFile::open(out);
    EXPECT_EQ(w.digest().xxh3, digest_file({out, out.filename().string(), &f.header()}).xxh3);
    const std::string got = qf::test::read_file(out);
    if (want.empty()) want = got;
    EXPECT_EQ(got, want);
    EXPECT_EQ(f.view("a").bytes.size(), kA);
    EXPECT_TRUE(
        std::equal(f.view("a").bytes.begin(), f.view("a").bytes.end(), s.view("a").bytes.begin()));
    if (clone && can) {
      // a: all whole blocks of one run; b lands at another residue: copied.
      EXPECT_EQ(w.bytes_cloned(), (src_a + kA) / kCloneBlock * kCloneBlock -
                                      (src_a + kCloneBlock - 1) / kCloneBlock * kCloneBlock);
    } else {
      EXPECT_EQ(w.bytes_cloned(), 0u);
    }
  }
  if (!can)
    std::printf("note: %s does not share blocks; TMPDIR on XFS or btrfs tests it\n",
                dir.path().c_str());
}

}  // namespace
}  // namespace qf::ckpt
