#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(Crc32cTest, KnownValues) {
  // The check value of CRC-32C and the iSCSI test vectors (RFC 3720, B.4).
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46dd794eu);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, ExtendEqualsWholeAtEverySplit) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 131 + 7));
  const uint32_t whole = Crc32c(data);
  for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    const absl::string_view v(data);
    EXPECT_EQ(Crc32cExtend(Crc32c(v.substr(0, split)), v.substr(split)), whole)
        << "split at " << split;
  }
}

TEST(Crc32cTest, CombineEqualsWholeAtEverySplit) {
  std::string data;
  for (int i = 0; i < (5 << 20) + 3; ++i)
    data.push_back(static_cast<char>((i * 2654435761u) >> 13));
  const absl::string_view v(data);
  for (size_t whole_size : {size_t{0}, size_t{1}, size_t{1000}, data.size()}) {
    const absl::string_view w = v.substr(0, whole_size);
    const uint32_t whole = Crc32c(w);
    for (size_t split :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, w.size() / 3, size_t{1} << 20, w.size()}) {
      if (split > w.size()) continue;
      EXPECT_EQ(
          Crc32cCombine(Crc32c(w.substr(0, split)), Crc32c(w.substr(split)), w.size() - split),
          whole)
          << "size " << w.size() << " split at " << split;
    }
  }
  // Chained over 4 MB pieces, as a receiver of chunks does.
  uint32_t running = 0;
  for (size_t at = 0; at < v.size(); at += 4 << 20) {
    const absl::string_view piece = v.substr(at, 4 << 20);
    running = Crc32cCombine(running, Crc32c(piece), piece.size());
  }
  EXPECT_EQ(running, Crc32c(v));
}

// The SSE4.2 path runs three chains over blocks of 3 x 4096 bytes and joins
// them; a byte at a time runs none of that. Sizes around the block edges,
// from a zero and a non-zero starting CRC.
TEST(Crc32cTest, StripedBlocksEqualByteAtATime) {
  std::string data;
  for (int i = 0; i < 5 * 12288 + 100; ++i)
    data.push_back(static_cast<char>((i * 2246822519u) >> 11));
  const absl::string_view v(data);
  for (uint32_t start : {0u, 0xdeadbeefu}) {
    for (size_t size :
         {size_t{12287}, size_t{12288}, size_t{12289}, size_t{12288 + 4096}, size_t{2 * 12288 - 1},
          size_t{2 * 12288}, size_t{3 * 12288 + 7}, data.size()}) {
      const absl::string_view w = v.substr(0, size);
      uint32_t bytewise = start;
      for (size_t i = 0; i < w.size(); ++i) bytewise = Crc32cExtend(bytewise, w.substr(i, 1));
      EXPECT_EQ(Crc32cExtend(start, w), bytewise) << "size " << size << " from " << start;
    }
  }
  // Every one of the three stripes of a block is covered: a flip in each
  // changes the sum.
  const uint32_t whole = Crc32c(v.substr(0, 12288));
  for (size_t at : {size_t{5}, size_t{4096 + 5}, size_t{8192 + 5}}) {
    std::string flipped(v.substr(0, 12288));
    flipped[at] ^= 1;
    EXPECT_NE(Crc32c(flipped), whole) << "flip at " << at;
  }
}

TEST(Crc32cTest, DetectsOneFlippedBit) {
  std::string data(4096, 'x');
  const uint32_t before = Crc32c(data);
  data[1234] ^= 0x10;
  EXPECT_NE(Crc32c(data), before);
}

}  // namespace
}  // namespace chorus
