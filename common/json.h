// Writing JSON by hand where a line's layout is part of the interface (the
// last line of `chorus up --json`): strings as JSON string literals, numbers
// as JSON numbers.
//
// JSON text must be valid UTF-8 (RFC 8259 §8.1), so bytes that are not part
// of a well-formed UTF-8 sequence (a job's failure reason may carry a rank's
// stderr) become U+FFFD; everything else passes through unchanged except the
// characters JSON requires escaped.
//
// Thread-safety: plain functions of their arguments.
//
// Example:
//   std::cout << "{\"reason\": " << JsonString(job.reason()) << "}\n";
//   // {"reason": "rank 1: can't open \"x.pt\"\n"}
#ifndef CHORUS_COMMON_JSON_H_
#define CHORUS_COMMON_JSON_H_

#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

// `text` as a JSON string literal, quotes included: `"` and `\` escaped,
// control characters as \n, \r, \t, \b, \f or \u00XX, ill-formed UTF-8
// bytes as \ufffd.
std::string JsonString(absl::string_view text);

// `value` with `decimals` digits after the point; null for NaN and the
// infinities, which JSON cannot express.
std::string JsonNumber(double value, int decimals);

}  // namespace chorus

#endif  // CHORUS_COMMON_JSON_H_
