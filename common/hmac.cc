#include "common/hmac.h"

#include "common/sha256.h"

namespace chorus {
namespace {

constexpr size_t kBlockBytes = 64;  // SHA-256's block

// H((key ^ pad) || parts...), with the key already one block long.
std::string PaddedDigest(const std::string& block_key, unsigned char pad,
                         absl::string_view message) {
  std::string padded = block_key;
  for (char& c : padded) c = static_cast<char>(static_cast<unsigned char>(c) ^ pad);
  Sha256 h;
  h.Update(padded);
  h.Update(message);
  return h.Digest();
}

}  // namespace

std::string HmacSha256(absl::string_view key, absl::string_view message) {
  std::string block_key;
  if (key.size() > kBlockBytes) {
    Sha256 h;
    h.Update(key);
    block_key = h.Digest();
  } else {
    block_key = std::string(key);
  }
  block_key.resize(kBlockBytes, '\0');
  const std::string inner = PaddedDigest(block_key, 0x36, message);
  return PaddedDigest(block_key, 0x5c, inner);
}

std::string HmacSha256Hex(absl::string_view key, absl::string_view message) {
  return HexOf(HmacSha256(key, message));
}

}  // namespace chorus
