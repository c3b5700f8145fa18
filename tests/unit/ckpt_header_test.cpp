// Every validation rule of the safetensors reader, one test each, with the malformed file built
// in code; plus the valid corner cases the reference reader accepts.
#include <gtest/gtest.h>

#include <string>

#include "qf/ckpt/safetensors.h"
#include "test_support.h"

namespace qf::ckpt {
namespace {

using qf::test::safetensors_bytes;

HeaderParse parse(const std::string& file) {
  return parse_header({reinterpret_cast<const std::byte*>(file.data()), file.size()}, file.size());
}

std::string describe(const HeaderParse& p) {
  std::string s;
  for (const Problem& pr : p.problems) {
    s += std::string(errc_name(pr.code)) + ": " + format_problem(pr) + "\n";
  }
  return s.empty() ? "(no problems)" : s;
}

// Exactly one problem, of `code`, whose text mentions `needle`.
void expect_only(const std::string& file, Errc code, const std::string& needle) {
  const HeaderParse p = parse(file);
  ASSERT_EQ(p.problems.size(), 1u) << describe(p);
  EXPECT_EQ(p.problems[0].code, code) << describe(p);
  EXPECT_NE(format_problem(p.problems[0]).find(needle), std::string::npos)
      << "message lacks '" << needle << "': " << describe(p);
}

void expect_valid(const std::string& file) {
  const HeaderParse p = parse(file);
  EXPECT_TRUE(p.problems.empty()) << describe(p);
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

// ---- length prefix ------------------------------------------------------------------------

TEST(HeaderRules, TooSmall) {
  for (size_t n = 0; n < 8; ++n) {
    expect_only(std::string(n, '\0'), Errc::kHeaderTooSmall, std::to_string(n) + " bytes");
  }
}

TEST(HeaderRules, TooLargeCap) {
  // 100,000,001 > the 100 MB cap; checked before the file length, like the reference reader.
  expect_only(safetensors_bytes("{}", "", 100'000'001ull), Errc::kHeaderTooLarge, "100000001");
  expect_only(safetensors_bytes("{}", "", UINT64_MAX), Errc::kHeaderTooLarge, "exceeds");
}

TEST(HeaderRules, PastEndOfFile) {
  expect_only(safetensors_bytes("{}", "", 3), Errc::kHeaderPastEnd, "past the end");
  expect_only(safetensors_bytes("{}   ", "", 100'000'000ull), Errc::kHeaderPastEnd, "100000008");
}

// ---- header text ----------------------------------------------------------------------------

TEST(HeaderRules, NotUtf8) {
  for (const std::string& bad :
       std::vector<std::string>{std::string("\xFF"), std::string("\xC0\x80"),  // invalid, overlong
                                std::string("\xED\xA0\x80"),                   // surrogate
                                std::string("\xF4\x90\x80\x80"),               // > U+10FFFF
                                std::string("\xE4\xB8")}) {                    // truncated
    expect_only(safetensors_bytes("{\"a" + bad + "\":1}", ""), Errc::kHeaderNotUtf8,
                "not valid UTF-8");
  }
}

TEST(HeaderRules, BadJson) {
  const std::string ok = entry("a", "U8", "[1]", 0, 1);
  for (const std::string& h : std::vector<std::string>{
           "{" + ok + "}" + std::string(3, '\0'),  // NUL padding is not whitespace
           "{" + ok + ",}",                        // trailing comma
           "{" + ok,                               // unterminated
           "{'a':1}",                              // single quotes
           "{\"a\":NaN}",
           "{\"a\":01}",
           "{\"a\":1.}",
           "{\"a\":-}",
           "{/*c*/}",                                      // comments
           "{\"a\\q\":1}",                                 // invalid escape
           "{\"a\x01\":1}",                                // raw control character
           "{\"\\ud800\":1}",                              // lone surrogate escape
           std::string(200, '[') + std::string(200, ']'),  // deeper than 128
           "{} {}",
           "",
       }) {
    SCOPED_TRACE(h);
    expect_only(safetensors_bytes(h, 1), Errc::kHeaderBadJson, "header JSON invalid");
  }
}

TEST(HeaderRules, NotObject) {
  for (const std::string& h : std::vector<std::string>{"[]", "\"x\"", "1", "null", " [1, 2] "}) {
    expect_only(safetensors_bytes(h, ""), Errc::kHeaderNotObject, "not an object");
  }
}

// ---- tensor entries -----------------------------------------------------------------------

TEST(HeaderRules, BadEntry) {
  const std::string offs = "\"data_offsets\":[0,4]";
  for (const auto& [h, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{\"t\":[1,2]}", "expected an object"},
           {"{\"t\":{\"shape\":[1]," + offs + "}}", "missing field \"dtype\""},
           {"{\"t\":{\"dtype\":\"F32\"," + offs + "}}", "missing field \"shape\""},
           {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", "missing field \"data_offsets\""},
           {"{\"t\":{\"dtype\":7,\"shape\":[1]," + offs + "}}", "dtype is a number"},
           {"{\"t\":{\"dtype\":\"F32\",\"shape\":\"1\"," + offs + "}}", "shape is a string"},
           {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1.0]," + offs + "}}", "shape[0] is 1.0"},
           {"{\"t\":{\"dtype\":\"F32\",\"shape\":[true]," + offs + "}}", "shape[0] is a boolean"},
           {"{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1]," + offs + "}}",
            "\"dtype\" appears twice"},
       }) {
    SCOPED_TRACE(h);
    expect_only(safetensors_bytes(h, 4), Errc::kTensorBadEntry, needle);
  }
}

TEST(HeaderRules, DuplicateTensorName) {
  const std::string h =
      "{" + entry("w", "U8", "[4]", 0, 4) + "," + entry("w", "U8", "[4]", 4, 8) + "}";
  expect_only(safetensors_bytes(h, 8), Errc::kDuplicateName, "tensor 'w'");
}

TEST(HeaderRules, DuplicateMetadata) {
  expect_only(safetensors_bytes("{\"__metadata__\":{},\"__metadata__\":{}}", ""),
              Errc::kDuplicateName, "__metadata__ appears twice");
  expect_only(safetensors_bytes("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", ""),
              Errc::kDuplicateName, "key \"k\"");
}

TEST(HeaderRules, UnknownDtype) {
  for (const std::string& d : std::vector<std::string>{"F8_E4M3FN", "bf16", "Q4_0", "", "F128"}) {
    expect_only(safetensors_bytes("{" + entry("t", d, "[1]", 0, 1) + "}", 1), Errc::kUnknownDtype,
                "unknown dtype \"" + d + "\"");
  }
}

TEST(HeaderRules, NegativeDim) {
  const std::string h = "{\"t\":{\"dtype\":\"U8\",\"shape\":[2,-3],\"data_offsets\":[0,6]}}";
  expect_only(safetensors_bytes(h, 6), Errc::kNegativeDim, "shape[1] is negative (-3)");
}

TEST(HeaderRules, ShapeOverflow) {
  // 2^32 x 2^32 elements overflows the element count.
  expect_only(safetensors_bytes("{" + entry("a", "U8", "[4294967296,4294967296]", 0, 0) + "}", ""),
              Errc::kShapeOverflow, "overflows");
  // 2^59 elements fit, but 2^59 x 64 bits does not.
  expect_only(safetensors_bytes("{" + entry("b", "F64", "[576460752303423488]", 0, 0) + "}", ""),
              Errc::kShapeOverflow, "overflows");
  // A dimension beyond 2^64-1.
  expect_only(safetensors_bytes("{" + entry("c", "U8", "[18446744073709551616]", 0, 0) + "}", ""),
              Errc::kShapeOverflow, "does not fit in 64 bits");
}

TEST(HeaderRules, MisalignedSubByteSlice) {
  expect_only(safetensors_bytes("{" + entry("f4", "F4", "[3]", 0, 2) + "}", 2),
              Errc::kMisalignedSlice, "12 bits");
  expect_only(safetensors_bytes("{" + entry("f6", "F6_E2M3", "[5]", 0, 4) + "}", 4),
              Errc::kMisalignedSlice, "30 bits");
}

TEST(HeaderRules, TensorSizeMismatch) {
  expect_only(safetensors_bytes("{" + entry("t", "F32", "[2]", 0, 4) + "}", 4),
              Errc::kTensorSizeMismatch, "needs 8");
}

TEST(HeaderRules, BadOffsets) {
  for (const std::string& offs : std::vector<std::string>{
           "[0]", "[0,4,8]", "[-1,4]", "[0,4.0]", "[\"0\",4]", "{}", "[0,18446744073709551616]"}) {
    SCOPED_TRACE(offs);
    expect_only(safetensors_bytes(
                    "{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":" + offs + "}}", 4),
                Errc::kBadOffsets, "data_offsets");
  }
  expect_only(safetensors_bytes("{" + entry("t", "U8", "[4]", 8, 4) + "}", 4), Errc::kBadOffsets,
              "end before they begin");
}

// ---- tiling of the data section ------------------------------------------------------------

TEST(HeaderRules, GapAtStart) {
  expect_only(safetensors_bytes("{" + entry("a", "U8", "[4]", 4, 8) + "}", 8), Errc::kOffsetGap,
              "4 bytes belong to no tensor");
}

TEST(HeaderRules, GapBetweenTensors) {
  const std::string h =
      "{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 6, 10) + "}";
  expect_only(safetensors_bytes(h, 10), Errc::kOffsetGap, "tensor 'b'");
}

TEST(HeaderRules, Overlap) {
  const std::string h =
      "{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[8]", 4, 12) + "}";
  expect_only(safetensors_bytes(h, 12), Errc::kOffsetOverlap, "overlap tensor 'a'");
}

TEST(HeaderRules, TwoTensorsClaimSameBytes) {
  // The reference crate's test_json_attack: a polyglot that maps two names to one range.
  const std::string h =
      "{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[8]", 0, 8) + "}";
  expect_only(safetensors_bytes(h, 8), Errc::kOffsetOverlap, "tensor 'b'");
}

TEST(HeaderRules, OutOfBounds) {
  // The file is truncated: the tensor claims 16 bytes, 10 are present.
  expect_only(safetensors_bytes("{" + entry("a", "U8", "[16]", 0, 16) + "}", 10),
              Errc::kOffsetOutOfBounds, "only 10 bytes");
}

TEST(HeaderRules, TrailingBytes) {
  expect_only(safetensors_bytes("{" + entry("a", "U8", "[4]", 0, 4) + "}", 7), Errc::kTrailingBytes,
              "3 trailing bytes");
  expect_only(safetensors_bytes("{}", 1), Errc::kTrailingBytes, "1 trailing bytes");
}

TEST(HeaderRules, MetadataNotString) {
  for (const std::string& m :
       std::vector<std::string>{"{\"a\":1}", "{\"a\":null}", "{\"a\":{}}", "{\"a\":[\"x\"]}"}) {
    expect_only(safetensors_bytes("{\"__metadata__\":" + m + "}", ""), Errc::kMetadataNotString,
                "__metadata__[\"a\"]");
  }
  expect_only(safetensors_bytes("{\"__metadata__\":[\"x\"]}", ""), Errc::kMetadataNotString,
              "must be an object");
}

TEST(HeaderRules, ProblemsAreCollectedAcrossTensors) {
  const std::string h = "{" + entry("a", "F32", "[1]", 0, 2) + "," + entry("b", "Q8", "[2]", 2, 4) +
                        "," + entry("c", "U8", "[2]", 6, 8) + "}";
  const HeaderParse p = parse(safetensors_bytes(h, 8));
  ASSERT_EQ(p.problems.size(), 3u) << describe(p);
  EXPECT_EQ(p.problems[0].code, Errc::kTensorSizeMismatch);
  EXPECT_EQ(p.problems[1].code, Errc::kUnknownDtype);
  EXPECT_EQ(p.problems[2].code, Errc::kOffsetGap);
  EXPECT_EQ(p.header.tensors.size(), 1u);  // only "c" is well-formed
  EXPECT_EQ(p.header.rejected, (std::vector<std::string>{"a", "b"}));
}

// ---- valid files the reference reader accepts ------------------------------------------------

TEST(HeaderValid, KeyOrderDiffersFromOffsetOrder) {
  const std::string h = "{" + entry("z_first_in_data", "U8", "[4]", 0, 4) + "," +
                        entry("a_second", "F32", "[1]", 4, 8) + "}";
  const std::string h2 = "{" + entry("a_second", "F32", "[1]", 4, 8) + "," +
                         entry("z_first_in_data", "U8", "[4]", 0, 4) + "}";
  for (const std::string& hh : {h, h2}) {
    const HeaderParse p = parse(safetensors_bytes(hh, 8));
    ASSERT_TRUE(p.problems.empty()) << describe(p);
    ASSERT_EQ(p.header.tensors.size(), 2u);
    EXPECT_EQ(p.header.tensors[0].name, "z_first_in_data");  // sorted by offset
    EXPECT_EQ(p.header.tensors[1].name, "a_second");
  }
}

TEST(HeaderValid, WhitespacePaddingBothEnds) {
  const std::string body = "{" + entry("a", "U8", "[1]", 0, 1) + "}";
  expect_valid(safetensors_bytes(" \t\r\n" + body + "  \n\t\r   ", 1));
}

TEST(HeaderValid, EmptyAndScalarAndZeroSizeTensors) {
  expect_valid(safetensors_bytes("{}", ""));
  const std::string h =
      "{" + entry("empty", "F32", "[0]", 0, 0) + "," + entry("empty2", "BF16", "[2,0,3]", 0, 0) +
      "," + entry("scalar", "F64", "[]", 0, 8) + "," + entry("tail", "U8", "[0]", 8, 8) + "}";
  const HeaderParse p = parse(safetensors_bytes(h, 8));
  ASSERT_TRUE(p.problems.empty()) << describe(p);
  ASSERT_EQ(p.header.tensors.size(), 4u);
  EXPECT_EQ(shape_numel(p.header.tensors[2].shape), 1u);  // scalar
}

TEST(HeaderValid, EveryDtypeWithItsSize) {
  std::string h = "{";
  uint64_t off = 0;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType d = static_cast<DType>(i);
    const uint64_t n = 8 * dtype_bits(d) / 8;  // 8 elements: whole bytes for F4/F6 too
    if (i) h += ",";
    h += entry("t" + std::to_string(i), std::string(dtype_name(d)), "[8]", off, off + n);
    off += n;
  }
  h += "}";
  const HeaderParse p = parse(safetensors_bytes(h, off));
  ASSERT_TRUE(p.problems.empty()) << describe(p);
  EXPECT_EQ(p.header.tensors.size(), static_cast<size_t>(kNumDTypes));
}

TEST(HeaderValid, MetadataNullUnknownFieldsAndEscapedNames) {
  const std::string h =
      "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"\\u00e9\\n\"},"
      "\"a\\u00e9\\\"\\\\\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
      "\"extra\":{\"nested\":[1,2,{}]}}}";
  const HeaderParse p = parse(safetensors_bytes(h, 1));
  ASSERT_TRUE(p.problems.empty()) << describe(p);
  ASSERT_EQ(p.header.tensors.size(), 1u);
  EXPECT_EQ(p.header.tensors[0].name, "a\xC3\xA9\"\\\xF0\x9F\x98\x80");
  ASSERT_EQ(p.header.metadata.size(), 2u);
  EXPECT_EQ(p.header.metadata[1].second, "\xC3\xA9\n");
  expect_valid(safetensors_bytes("{\"__metadata__\":null}", ""));
}

TEST(HeaderValid, SubByteTypesOnByteBoundaries) {
  expect_valid(safetensors_bytes("{" + entry("f4", "F4", "[2,3]", 0, 3) + "}", 3));
  expect_valid(safetensors_bytes("{" + entry("f6", "F6_E3M2", "[4]", 0, 3) + "}", 3));
}

// ---- the file-level reader --------------------------------------------------------------------

TEST(SafetensorsFile, OpenFailsFastWithTheRulesCodeAndTheFileName) {
  qf::test::TempDir dir;
  const auto path = dir / "bad.safetensors";
  qf::test::write_file(path, safetensors_bytes("{" + entry("a", "U8", "[4]", 4, 8) + "}", 8));
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kOffsetGap);
    EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile::open(dir / "missing.safetensors"), Error);
}

TEST(SafetensorsFile, ZeroCopyViewsAndTypedAccess) {
  qf::test::TempDir dir;
  const auto path = dir / "ok.safetensors";
  // Header padded to 8 so the data section is aligned; "f" lands at data offset 4.
  std::string h = "{" + entry("u", "U8", "[4]", 0, 4) + "," + entry("f", "F32", "[2]", 4, 12) + "}";
  h.resize((h.size() + 7) / 8 * 8, ' ');
  std::string data = "abcd";
  const float vals[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(vals), sizeof vals);
  qf::test::write_file(path, safetensors_bytes(h, data));
  const SafetensorsFile f = SafetensorsFile::open(path);
  const TensorView u = f.view("u");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(u.bytes.data()), u.bytes.size()), "abcd");
  EXPECT_EQ(u.bytes.data(), f.map().data() + 8 + h.size());  // a view into the mapping
  const auto fv = f.view("f").as<float>();
  ASSERT_EQ(fv.size(), 2u);
  EXPECT_EQ(fv[0], 1.5f);
  EXPECT_EQ(fv[1], -2.0f);
  EXPECT_THROW(f.view("u").as<float>(), Error);  // U8 is not a 32-bit type
  EXPECT_THROW(f.view("nope"), Error);
}

}  // namespace
}  // namespace qf::ckpt
