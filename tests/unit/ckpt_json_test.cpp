// JSON pull reader, UTF-8 validator and string writer.
#include <gtest/gtest.h>

#include "qf/ckpt/json.h"

namespace qf::ckpt {
namespace {

TEST(JsonReader, NumbersKeepSixtyFourBitsExactly) {
  JsonReader r("[0, 18446744073709551615, 18446744073709551616, -5, 1.5, 2e3, 9007199254740993]");
  r.begin_array();
  std::vector<JsonNumber> nums;
  while (r.next_element()) nums.push_back(r.read_number());
  r.expect_end();
  ASSERT_EQ(nums.size(), 7u);
  EXPECT_TRUE(nums[0].fits_u64);
  EXPECT_EQ(nums[0].magnitude, 0u);
  EXPECT_TRUE(nums[1].fits_u64);
  EXPECT_EQ(nums[1].magnitude, UINT64_MAX);
  EXPECT_FALSE(nums[2].fits_u64);  // 2^64
  EXPECT_TRUE(nums[3].negative);
  EXPECT_EQ(nums[3].magnitude, 5u);
  EXPECT_FALSE(nums[4].integral);
  EXPECT_FALSE(nums[5].integral);
  EXPECT_EQ(nums[6].magnitude, 9007199254740993ull);  // 2^53 + 1: a double would round it
}

TEST(JsonReader, StringsDecodeEveryEscape) {
  JsonReader r(R"("a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u4e2d\ud83d\ude00")");
  std::string s;
  r.read_string(s);
  r.expect_end();
  EXPECT_EQ(s, "a\"b\\c/d\b\f\n\r\tA\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
}

TEST(JsonReader, RejectsWhatSerdeRejects) {
  for (const char* bad : {"[1,]",
                          "{\"a\":1,}",
                          "[01]",
                          "[-]",
                          "[1.]",
                          "[1e]",
                          "[.5]",
                          "[+1]",
                          "\"\\ud800\"",
                          "\"\\udc00\"",
                          "\"\\ud800\\u0041\"",
                          "\"\\x\"",
                          "\"abc",
                          "[1 2]",
                          "{\"a\" 1}",
                          "{1:2}",
                          "tru",
                          "nul",
                          "[NaN]",
                          "[Infinity]"}) {
    SCOPED_TRACE(bad);
    JsonReader r(bad);
    EXPECT_THROW(
        {
          r.skip_value();
          r.expect_end();
        },
        JsonSyntaxError);
  }
}

TEST(JsonReader, DepthLimit) {
  const std::string ok = std::string(128, '[') + std::string(128, ']');
  JsonReader r1(ok);
  EXPECT_NO_THROW(r1.skip_value());
  const std::string deep = std::string(129, '[') + std::string(129, ']');
  JsonReader r2(deep);
  EXPECT_THROW(r2.skip_value(), JsonSyntaxError);
}

TEST(JsonReader, SkipValueReturnsRawText) {
  JsonReader r(R"({"k": {"x": [1, "two", null, true]}, "z": 3})");
  r.begin_object();
  std::string key;
  ASSERT_TRUE(r.next_key(key));
  EXPECT_EQ(r.skip_value(), R"({"x": [1, "two", null, true]})");
  ASSERT_TRUE(r.next_key(key));
  EXPECT_EQ(key, "z");
  EXPECT_EQ(r.read_number().magnitude, 3u);
  EXPECT_FALSE(r.next_key(key));
  r.expect_end();
}

TEST(Utf8, AcceptsValidRejectsInvalid) {
  EXPECT_FALSE(utf8_error_offset("plain ascii, long enough to use the 8-byte path"));
  EXPECT_FALSE(utf8_error_offset("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"));
  EXPECT_EQ(utf8_error_offset("abc\x80"), 3u);               // lone continuation
  EXPECT_EQ(utf8_error_offset("ab\xC1\xBF"), 2u);            // overlong 2-byte
  EXPECT_EQ(utf8_error_offset("\xE0\x9F\xBF"), 0u);          // overlong 3-byte
  EXPECT_EQ(utf8_error_offset("\xF0\x8F\xBF\xBF"), 0u);      // overlong 4-byte
  EXPECT_EQ(utf8_error_offset("xx\xED\xB0\x80"), 2u);        // surrogate
  EXPECT_EQ(utf8_error_offset("\xF4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(utf8_error_offset("12345678\xF0\x9F\x98"), 8u);  // truncated at the end
  EXPECT_EQ(utf8_error_offset(std::string("a\xF8\x88\x80\x80\x80", 6)), 1u);  // 5-byte form
}

TEST(JsonWriter, SerdeAndPythonStyles) {
  const std::string in = "a\"\\/\b\f\n\r\t\x01\x1f\x7f\xC3\xA9\xF0\x9F\x98\x80";
  std::string serde;
  append_json_string(serde, in, false);
  EXPECT_EQ(serde, "\"a\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xC3\xA9\xF0\x9F\x98\x80\"");
  std::string py;
  append_json_string(py, in, true);
  EXPECT_EQ(py, "\"a\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\u00e9\\ud83d\\ude00\"");
  // Both read back to the input.
  for (const std::string& s : {serde, py}) {
    JsonReader r(s);
    std::string back;
    r.read_string(back);
    EXPECT_EQ(back, in);
  }
}

}  // namespace
}  // namespace qf::ckpt
