#include "common/output_limits.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed UTF-8 character at text[i] (no overlong
// forms, surrogates or code points past U+10FFFF), or 0 if there is none.
size_t CharLength(absl::string_view text, size_t i) {
  const unsigned char c = text[i];
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char cc = text[i + k];
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// The largest prefix length <= max of valid UTF-8 `text` that ends at a
// character boundary.
size_t CutPoint(absl::string_view text, size_t max) {
  if (text.size() <= max) return text.size();
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

}  // namespace

std::string BoundOutputLine(absl::string_view line, size_t already_dropped, size_t max_bytes) {
  std::string valid;
  valid.reserve(std::min(line.size(), max_bytes) + 16);
  size_t dropped = already_dropped;
  size_t i = 0;
  // Only what fits is converted: the rest is counted, not copied.
  while (i < line.size() && valid.size() <= max_bytes) {
    const size_t n = CharLength(line, i);
    if (n == 0) {
      valid += kReplacement;
      ++i;
    } else {
      valid.append(line.data() + i, n);
      i += n;
    }
  }
  dropped += line.size() - i;
  const size_t keep = CutPoint(valid, max_bytes);
  dropped += valid.size() - keep;
  valid.resize(keep);
  if (dropped > 0) absl::StrAppend(&valid, " [", dropped, " bytes of this line dropped]");
  return valid;
}

std::string BoundReceivedLine(absl::string_view line) {
  return BoundOutputLine(line, 0, kMaxBoundedLineBytes);
}

void BoundTail(std::deque<std::string>& tail) {
  size_t bytes = 0;
  for (const std::string& line : tail) bytes += line.size();
  while (tail.size() > 1 && (tail.size() > kMaxTailLines || bytes > kMaxTailBytes)) {
    bytes -= tail.front().size();
    tail.pop_front();
  }
}

std::string KeepEnd(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t start = text.size() - max_bytes;
  while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
  return absl::StrCat("[", start, " bytes cut] ", text.substr(start));
}

std::string BoundReason(absl::string_view reason) {
  if (reason.size() <= kMaxReasonBytes) return std::string(reason);
  const size_t keep = CutPoint(reason, kMaxReasonBytes);
  return absl::StrCat(reason.substr(0, keep), " [", reason.size() - keep, " bytes cut]");
}

namespace {

// `text` escaped (EscapeErrorText) into `out`, and where each escaped
// character ends in it.
void EscapeInto(absl::string_view text, std::string& out, std::vector<size_t>& ends) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = text[i];
    const size_t n = CharLength(text, i);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (n == 0 || c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out.append(text.data() + i, n);
    }
    i += n == 0 ? 1 : n;
    ends.push_back(out.size());
  }
}

}  // namespace

std::string EscapeErrorText(absl::string_view text, size_t max_bytes) {
  std::string escaped;
  std::vector<size_t> ends;
  escaped.reserve(text.size());
  EscapeInto(text, escaped, ends);
  if (escaped.size() <= max_bytes) return escaped;
  // Two thirds of the room for the start, the rest for the end.
  const size_t head_room = max_bytes / 3 * 2;
  const size_t tail_room = max_bytes - head_room;
  // The last character boundary within head_room, and the first from
  // which the rest fits in tail_room.
  const auto after_head = std::upper_bound(ends.begin(), ends.end(), head_room);
  const size_t head = after_head == ends.begin() ? 0 : *(after_head - 1);
  const size_t tail = *std::lower_bound(ends.begin(), ends.end(), escaped.size() - tail_room);
  return absl::StrCat(absl::string_view(escaped).substr(0, head), " [", tail - head,
                      " bytes cut] ", absl::string_view(escaped).substr(tail));
}

std::string RankErrorRecord(absl::string_view message) {
  return absl::StrCat(kRankErrorPrefix, EscapeErrorText(message));
}

const std::string* LastErrorRecord(const std::deque<std::string>& lines) {
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (absl::StartsWith(*it, kRankErrorPrefix)) return &*it;
  }
  return nullptr;
}

}  // namespace chorus
