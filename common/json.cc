#include "common/json.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace chorus {
namespace {

// The length of the well-formed UTF-8 sequence at the start of `s`
// (Unicode Table 3-7: no overlong forms, no surrogates, at most U+10FFFF),
// or 0 if there is none.
size_t Utf8SequenceLength(absl::string_view s) {
  auto byte = [&s](size_t i) { return static_cast<unsigned char>(s[i]); };
  auto in = [&](size_t i, unsigned char lo, unsigned char hi) {
    return i < s.size() && byte(i) >= lo && byte(i) <= hi;
  };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xc2 && b0 <= 0xdf) return in(1, 0x80, 0xbf) ? 2 : 0;
  if (b0 >= 0xe0 && b0 <= 0xef) {
    const unsigned char lo = b0 == 0xe0 ? 0xa0 : 0x80;
    const unsigned char hi = b0 == 0xed ? 0x9f : 0xbf;
    return in(1, lo, hi) && in(2, 0x80, 0xbf) ? 3 : 0;
  }
  if (b0 >= 0xf0 && b0 <= 0xf4) {
    const unsigned char lo = b0 == 0xf0 ? 0x90 : 0x80;
    const unsigned char hi = b0 == 0xf4 ? 0x8f : 0xbf;
    return in(1, lo, hi) && in(2, 0x80, 0xbf) && in(3, 0x80, 0xbf) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string JsonString(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  while (!text.empty()) {
    const char c = text.front();
    const size_t n = Utf8SequenceLength(text);
    if (n == 0) {
      out += "\\ufffd";
      text.remove_prefix(1);
      continue;
    }
    if (n > 1) {
      out.append(text.data(), n);
      text.remove_prefix(n);
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
    text.remove_prefix(1);
  }
  out += '"';
  return out;
}

std::string JsonNumber(double value, int decimals) {
  if (!std::isfinite(value)) return "null";
  return absl::StrFormat("%.*f", decimals, value);
}

}  // namespace chorus
