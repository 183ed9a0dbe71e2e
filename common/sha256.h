// SHA-256 of byte strings, in lowercase hex, incrementally or at once.
//
// Thread-compatible: one Sha256 per thread.
//
// Example:
//   Sha256 h;
//   h.Update(chunk1);
//   h.Update(chunk2);
//   std::string hex = h.HexDigest();   // == Sha256Hex(chunk1 + chunk2)
#ifndef CHORUS_COMMON_SHA256_H_
#define CHORUS_COMMON_SHA256_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // The digest of everything added, as 32 raw bytes or 64 lowercase hex
  // digits; the object is spent after either.
  std::string Digest();
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Sha256Hex(absl::string_view bytes);

// Lowercase hex of raw bytes ("\x01\xab" -> "01ab").
std::string HexOf(absl::string_view bytes);

}  // namespace chorus

#endif  // CHORUS_COMMON_SHA256_H_
