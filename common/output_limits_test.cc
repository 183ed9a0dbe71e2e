#include "common/output_limits.h"

#include <deque>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(BoundOutputLineTest, ShortLinesPassUnchanged) {
  EXPECT_EQ(BoundOutputLine("step 10 loss 0.5"), "step 10 loss 0.5");
  EXPECT_EQ(BoundOutputLine(""), "");
  EXPECT_EQ(BoundOutputLine("na\xC3\xAFve \xE2\x9C\x93"), "na\xC3\xAFve \xE2\x9C\x93");
}

TEST(BoundOutputLineTest, LongLineIsCutWithAMarkerSayingHowMuchWasDropped) {
  const std::string line(5 << 20, 'x');
  const std::string bounded = BoundOutputLine(line);
  EXPECT_EQ(bounded, absl::StrCat(std::string(kMaxOutputLineBytes, 'x'), " [",
                                  line.size() - kMaxOutputLineBytes,
                                  " bytes of this line dropped]"));
  EXPECT_LT(bounded.size(), kMaxOutputLineBytes + 64);
}

TEST(BoundOutputLineTest, BytesDroppedEarlierAreCounted) {
  EXPECT_EQ(BoundOutputLine("abc", 1000), "abc [1000 bytes of this line dropped]");
}

TEST(BoundOutputLineTest, CutsAtACharacterBoundary) {
  // "é" is two bytes: a cut after 5 bytes would split the third one.
  const std::string bounded = BoundOutputLine("\xC3\xA9\xC3\xA9\xC3\xA9", 0, 5);
  EXPECT_EQ(bounded, "\xC3\xA9\xC3\xA9 [2 bytes of this line dropped]");
}

TEST(BoundOutputLineTest, InvalidUtf8BecomesReplacementCharacters) {
  // A lone continuation byte, a truncated sequence, an overlong '/' and a
  // surrogate: none may reach a proto3 string field.
  EXPECT_EQ(BoundOutputLine("a\x80z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(BoundOutputLine("b\xE2\x9C"), "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(BoundOutputLine("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(BoundOutputLine("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // Binary output stays within the limit even though each byte grows.
  const std::string binary(100000, '\xFF');
  const std::string bounded = BoundOutputLine(binary);
  EXPECT_LT(bounded.size(), kMaxOutputLineBytes + 64);
  EXPECT_THAT(bounded, EndsWith(" bytes of this line dropped]"));
}

TEST(BoundReceivedLineTest, ABoundedLinePassesUnchangedAnUnboundedOneIsCut) {
  const std::string bounded = BoundOutputLine(std::string(1 << 20, 'x'));
  EXPECT_EQ(BoundReceivedLine(bounded), bounded);
  const std::string cut = BoundReceivedLine(std::string(1 << 20, 'y'));
  EXPECT_LE(cut.size(), kMaxBoundedLineBytes + 64);
  EXPECT_THAT(cut, EndsWith(" bytes of this line dropped]"));
  EXPECT_EQ(BoundReceivedLine("a\x80"), "a\xEF\xBF\xBD");
}

TEST(BoundTailTest, KeepsTheNewestLinesWithinLinesAndBytes) {
  std::deque<std::string> tail;
  for (int i = 0; i < 30; ++i) tail.push_back(absl::StrCat("line ", i));
  BoundTail(tail);
  ASSERT_EQ(tail.size(), kMaxTailLines);
  EXPECT_EQ(tail.front(), "line 10");
  EXPECT_EQ(tail.back(), "line 29");

  tail.clear();
  for (int i = 0; i < 10; ++i) tail.push_back(std::string(kMaxTailBytes / 4, 'a' + i));
  BoundTail(tail);
  size_t bytes = 0;
  for (const std::string& line : tail) bytes += line.size();
  EXPECT_LE(bytes, kMaxTailBytes);
  EXPECT_EQ(tail.size(), 4u);
  EXPECT_EQ(tail.back()[0], 'j');
}

TEST(BoundTailTest, TheNewestLineAlwaysStays) {
  std::deque<std::string> tail = {"old", std::string(kMaxTailBytes + 1, 'n')};
  BoundTail(tail);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail.front().size(), kMaxTailBytes + 1);
}

TEST(KeepEndTest, KeepsTheEndAndSaysHowMuchWasCut) {
  EXPECT_EQ(KeepEnd("short", 10), "short");
  EXPECT_EQ(KeepEnd("0123456789ValueError: bad", 17), "[8 bytes cut] 89ValueError: bad");
  // Never starts inside a character.
  EXPECT_EQ(KeepEnd("ab\xC3\xA9z", 2), "[4 bytes cut] z");
}

TEST(BoundReasonTest, LongReasonsAreCut) {
  EXPECT_EQ(BoundReason("rank 0 exited with code 3"), "rank 0 exited with code 3");
  const std::string reason(kMaxReasonBytes + 100, 'r');
  const std::string bounded = BoundReason(reason);
  EXPECT_THAT(bounded, StartsWith(std::string(kMaxReasonBytes, 'r')));
  EXPECT_THAT(bounded, EndsWith(" [100 bytes cut]"));
}

// Note [Rank error record]: the message of a .npy member's damaged header
// quotes the header, which ends in a newline.
TEST(EscapeErrorTextTest, ControlCharactersAndBadBytesAreEscapedOnOneLine) {
  EXPECT_EQ(EscapeErrorText("header \"{'descr': '<f4', }\n\" lacks shape"),
            "header \"{'descr': '<f4', }\\n\" lacks shape");
  EXPECT_EQ(EscapeErrorText("a\r\tb\x01\x7f"), "a\\r\\tb\\x01\\x7f");
  // Not UTF-8 (a binary byte of a file): its value; UTF-8 and backslashes
  // stay as they are.
  EXPECT_EQ(EscapeErrorText("\x93NUMPY caf\xC3\xA9 C:\\x"), "\\x93NUMPY caf\xC3\xA9 C:\\x");
}

TEST(EscapeErrorTextTest, ALongTextKeepsItsStartAndEndAroundAMarker) {
  const std::string text = absl::StrCat("where: ", std::string(3000, 'h'), " what");
  const std::string escaped = EscapeErrorText(text, 30);
  EXPECT_EQ(escaped, absl::StrCat("where: ", std::string(13, 'h'), " [2982 bytes cut] ",
                                  std::string(5, 'h'), " what"));
  EXPECT_EQ(EscapeErrorText(text), EscapeErrorText(text, kMaxErrorRecordBytes));
  EXPECT_LE(EscapeErrorText(text).size(), kMaxErrorRecordBytes + 32);
}

TEST(EscapeErrorTextTest, TheCutNeverSplitsAnEscapeOrACharacter) {
  // 20 newlines are 40 escaped bytes: 20 for the start, 10 for the end.
  EXPECT_EQ(EscapeErrorText(std::string(20, '\n'), 30),
            "\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n [10 bytes cut] \\n\\n\\n\\n\\n");
  // A three-byte character is kept whole or cut whole.
  const std::string euro = "\xE2\x82\xAC";
  std::string many;
  for (int i = 0; i < 10; ++i) many += euro;
  EXPECT_EQ(EscapeErrorText(many, 10), absl::StrCat(euro + euro, " [21 bytes cut] ", euro));
}

TEST(RankErrorRecordTest, TheLastRecordIsFoundAmongLaterLines) {
  const std::string record = RankErrorRecord("data.shards: a.tar at byte offset 1536\nlacks shape");
  EXPECT_EQ(record, "chorus-rank: data.shards: a.tar at byte offset 1536\\nlacks shape");
  std::deque<std::string> lines = {RankErrorRecord("older"), record,
                                   "[chorus-rank] I0101 gloo: connection closed", "lacks shape"};
  ASSERT_NE(LastErrorRecord(lines), nullptr);
  EXPECT_EQ(*LastErrorRecord(lines), record);
  EXPECT_EQ(LastErrorRecord({"Traceback", "ValueError: bad"}), nullptr);
}

}  // namespace
}  // namespace chorus
