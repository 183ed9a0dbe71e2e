#include "common/hmac.h"

#include <string>

#include "gtest/gtest.h"

namespace chorus {
namespace {

// RFC 4231 section 4: every test case whose output is not truncated.
TEST(HmacSha256Test, Rfc4231TestVectors) {
  // Test case 1: a 20-byte key.
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3: 50 bytes of 0xdd under 20 bytes of 0xaa.
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 4: a 25-byte key 0x01..0x19, 50 bytes of 0xcd.
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(HmacSha256Hex(key4, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Test case 6: a 131-byte key, longer than the block (hashed first).
  EXPECT_EQ(HmacSha256Hex(std::string(131, '\xaa'),
                          "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Test case 7: a long key and a long message.
  EXPECT_EQ(HmacSha256Hex(std::string(131, '\xaa'),
                          "This is a test using a larger than block-size key and a larger than "
                          "block-size data. The key needs to be hashed before being used by the "
                          "HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256Test, RawDigestIsThirtyTwoBytesOfTheHex) {
  const std::string raw = HmacSha256("Jefe", "what do ya want for nothing?");
  ASSERT_EQ(raw.size(), 32u);
  EXPECT_EQ(static_cast<unsigned char>(raw[0]), 0x5b);
  EXPECT_EQ(static_cast<unsigned char>(raw[31]), 0x43);
}

}  // namespace
}  // namespace chorus
