// HMAC-SHA256 (RFC 2104 over common/sha256.h): a keyed digest that only a
// holder of the key can compute, e.g. a credential derived from a secret.
//
// Thread-safe: a pure function.
//
// Example:
//   std::string tag = HmacSha256Hex(secret, "job-000001");   // 64 hex digits
#ifndef CHORUS_COMMON_HMAC_H_
#define CHORUS_COMMON_HMAC_H_

#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

// The 32-byte HMAC-SHA256 of `message` under `key` (any length: keys longer
// than SHA-256's 64-byte block are hashed first, as the RFC says).
std::string HmacSha256(absl::string_view key, absl::string_view message);
// The same, as 64 lowercase hex digits.
std::string HmacSha256Hex(absl::string_view key, absl::string_view message);

}  // namespace chorus

#endif  // CHORUS_COMMON_HMAC_H_
