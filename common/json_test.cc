#include "common/json.h"

#include <cmath>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// What a JSON parser reads back from `literal` (protobuf's, which rejects
// invalid JSON and ill-formed UTF-8).
std::string Parse(const std::string& literal) {
  google::protobuf::Value value;
  const auto status = google::protobuf::util::JsonStringToMessage(literal, &value);
  EXPECT_TRUE(status.ok()) << literal << ": " << status.ToString();
  EXPECT_EQ(value.kind_case(), google::protobuf::Value::kStringValue) << literal;
  return value.string_value();
}

TEST(JsonStringTest, PlainTextIsOnlyQuoted) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("job-000001 SUCCEEDED"), "\"job-000001 SUCCEEDED\"");
  EXPECT_EQ(JsonString("a/b <c> & {d}"), "\"a/b <c> & {d}\"");
}

TEST(JsonStringTest, AFailureReasonWithQuotesBackslashNewlineApostropheAndUtf8RoundTrips) {
  const std::string reason =
      "rank 1: can't open \"C:\\data\\x.pt\"\nnext line\tafter a tab: caf\xc3\xa9 \xe2\x9c\x93 "
      "\xf0\x9f\x98\x80";
  const std::string literal = JsonString(reason);
  EXPECT_EQ(literal,
            "\"rank 1: can't open \\\"C:\\\\data\\\\x.pt\\\"\\nnext line\\tafter a tab: "
            "caf\xc3\xa9 \xe2\x9c\x93 "
            "\xf0\x9f\x98\x80\"");
  EXPECT_EQ(Parse(literal), reason);
}

TEST(JsonStringTest, ControlCharactersAreEscaped) {
  const std::string text = std::string("\x01\x1f\r\b\f\x7f", 6) + std::string(1, '\0');
  const std::string literal = JsonString(text);
  EXPECT_EQ(literal, "\"\\u0001\\u001f\\r\\b\\f\x7f\\u0000\"");
  EXPECT_EQ(Parse(literal), text);
}

TEST(JsonStringTest, IllFormedUtf8BecomesReplacementCharacters) {
  // A stray continuation byte, a truncated sequence, an overlong '/', a
  // surrogate, a code point beyond U+10FFFF, and 0xff.
  EXPECT_EQ(JsonString("a\x80z"), "\"a\\ufffdz\"");
  EXPECT_EQ(JsonString("a\xc3"), "\"a\\ufffd\"");
  EXPECT_EQ(JsonString("\xc0\xaf"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(Parse(JsonString("ok \xe2\x82 then \xff")),
            "ok \xef\xbf\xbd\xef\xbf\xbd then \xef\xbf\xbd");
}

TEST(JsonNumberTest, FixedDecimalsAndNullForWhatJsonCannotHold) {
  EXPECT_EQ(JsonNumber(0.912345678, 6), "0.912346");
  EXPECT_EQ(JsonNumber(-2.5, 2), "-2.50");
  EXPECT_EQ(JsonNumber(12, 0), "12");
  EXPECT_EQ(JsonNumber(std::nan(""), 6), "null");
  EXPECT_EQ(JsonNumber(HUGE_VAL, 3), "null");
  EXPECT_EQ(JsonNumber(-HUGE_VAL, 3), "null");
}

}  // namespace
}  // namespace chorus
