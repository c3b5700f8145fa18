// model.safetensors.index.json parsing and Hugging Face-compatible serialization.
#include <gtest/gtest.h>

#include "qf/ckpt/index.h"

namespace qf::ckpt {
namespace {

bool has(const IndexParse& p, Errc code, const std::string& needle) {
  for (const Problem& pr : p.problems) {
    if (pr.code == code && format_problem(pr).find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(Index, ParsesAndLooksUp) {
  const IndexParse p = parse_index(R"({
    "metadata": {"total_size": 18446744073709551615, "format": "pt"},
    "weight_map": {"b": "model-00002-of-00002.safetensors", "a": "model-00001-of-00002.safetensors",
                   "mtp.fc.weight": "model_extra_tensors.safetensors"}})");
  ASSERT_TRUE(p.problems.empty());
  EXPECT_EQ(p.index.total_size, UINT64_MAX);
  ASSERT_EQ(p.index.weight_map.size(), 3u);
  EXPECT_EQ(p.index.weight_map[0].first, "a");  // sorted
  EXPECT_EQ(*p.index.file_of("mtp.fc.weight"), "model_extra_tensors.safetensors");
  EXPECT_EQ(p.index.file_of("zzz"), nullptr);
  EXPECT_EQ(p.index.files(), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                       "model-00002-of-00002.safetensors",
                                                       "model_extra_tensors.safetensors"}));
  EXPECT_EQ(p.index.extra_metadata.size(), 1u);
}

TEST(Index, ReportsEveryBadEntry) {
  const IndexParse p = parse_index(R"({"metadata": {"total_size": -3},
    "weight_map": {"a": "../etc/x.safetensors", "b": "sub/x.safetensors", "c": 5,
                   "d": "x.bin", "e": "ok.safetensors", "e": "other.safetensors"}})");
  EXPECT_TRUE(has(p, Errc::kIndexInvalid, "total_size -3"));
  EXPECT_TRUE(has(p, Errc::kIndexInvalid, "../etc/x.safetensors"));
  EXPECT_TRUE(has(p, Errc::kIndexInvalid, "sub/x.safetensors"));
  EXPECT_TRUE(has(p, Errc::kIndexInvalid, "tensor 'c'"));
  EXPECT_TRUE(has(p, Errc::kIndexInvalid, "x.bin"));
  EXPECT_TRUE(has(p, Errc::kDuplicateName, "tensor 'e'"));
  EXPECT_EQ(p.problems.size(), 6u);
  ASSERT_EQ(p.index.weight_map.size(), 1u);
  EXPECT_EQ(p.index.weight_map[0].second, "ok.safetensors");  // the first of the duplicates
}

TEST(Index, StructuralProblems) {
  EXPECT_TRUE(has(parse_index("{\"weight_map\": {"), Errc::kIndexInvalid, "invalid JSON"));
  EXPECT_TRUE(has(parse_index("[]"), Errc::kIndexInvalid, "not a JSON object"));
  EXPECT_TRUE(has(parse_index("{\"metadata\": {}}"), Errc::kIndexInvalid, "no \"weight_map\""));
  EXPECT_TRUE(has(parse_index("{\"weight_map\": []}"), Errc::kIndexInvalid, "not an object"));
  EXPECT_TRUE(has(parse_index("{\"weight_map\": {}} x"), Errc::kIndexInvalid, "trailing"));
  EXPECT_TRUE(has(parse_index("{\"weight_map\": {\"\xFF\": 1}}"), Errc::kIndexInvalid, "UTF-8"));
}

TEST(Index, SerializesLikeJsonDumpsIndent2SortKeys) {
  ShardIndex idx;
  idx.total_size = 1234;
  idx.weight_map = {{"z", "model-00002-of-00002.safetensors"},
                    {"a\xC3\xA9", "model-00001-of-00002.safetensors"}};
  idx.sort();
  // json.dumps({...}, indent=2, sort_keys=True) + "\n" gives exactly this (checked against
  // Python in the interop test).
  EXPECT_EQ(serialize_index(idx),
            "{\n  \"metadata\": {\n    \"total_size\": 1234\n  },\n  \"weight_map\": {\n"
            "    \"a\\u00e9\": \"model-00001-of-00002.safetensors\",\n"
            "    \"z\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  const IndexParse back = parse_index(serialize_index(idx));
  ASSERT_TRUE(back.problems.empty());
  EXPECT_EQ(back.index.weight_map, idx.weight_map);
  EXPECT_EQ(back.index.total_size, 1234u);
}

TEST(Index, KeepsUnknownMembersOnRewrite) {
  const IndexParse p = parse_index(
      R"({"weight_map": {"a": "m.safetensors"}, "metadata": {"total_size": 4, "x": [1,2]}, "y": true})");
  ASSERT_TRUE(p.problems.empty());
  const std::string s = serialize_index(p.index);
  EXPECT_NE(s.find("\"x\": [1,2]"), std::string::npos) << s;
  EXPECT_NE(s.find("\"y\": true"), std::string::npos) << s;
  const IndexParse back = parse_index(s);
  EXPECT_TRUE(back.problems.empty());
  EXPECT_EQ(back.index.extra_top, p.index.extra_top);
}

}  // namespace
}  // namespace qf::ckpt
