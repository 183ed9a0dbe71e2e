// Limits on what a user's job writes, applied wherever that text crosses a
// process (Note [Bounded job output]), and the helpers that apply them.
//
// Thread-safety: constants and pure functions.
//
// Example:
//   std::string line = BoundOutputLine(std::move(raw));  // <= kMaxOutputLineBytes + marker
//   BoundTail(tail);  // the newest lines within kMaxTailLines and kMaxTailBytes
#ifndef CHORUS_COMMON_OUTPUT_LIMITS_H_
#define CHORUS_COMMON_OUTPUT_LIMITS_H_

#include <cstddef>
#include <deque>
#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

// Note [Bounded job output]
// A rank's stdout/stderr goes: pipe -> agent (PosixRankProcess::ReadLine) ->
// AgentService stream (RankLogs batches, RankExited.stderr_tail) ->
// coordinator (LogStore for `chorus logs`, the job's failure reason, saved in
// SQLite). A user's program can print anything: one line of 40 MB once made
// a single message pass gRPC's limit (kMaxCoordinatorMessageBytes), which
// broke the agent's stream and with it every other job on that node. So:
//   - the agent reads a line in chunks and keeps at most kMaxOutputLineBytes
//     of it, discarding the rest as it arrives and saying how much it
//     dropped; bytes that are not UTF-8 become U+FFFD (proto3 strings must be
//     UTF-8, or the receiver cannot parse the message);
//   - a log batch holds at most kMaxLogBatchLines lines and
//     kMaxLogBatchBytes bytes; an exit's tail at most kMaxTailLines lines and
//     kMaxTailBytes bytes;
//   - the coordinator does not trust the agent: it applies the same limits
//     to what it receives, and keeps every job reason (and the event that
//     records it) within kMaxReasonBytes.
// Cut text always says so and how much was cut.

// Longest output line kept, in bytes (the marker comes on top).
inline constexpr size_t kMaxOutputLineBytes = 16 * 1024;
// Lines in one RankLogs message.
inline constexpr size_t kMaxLogBatchLines = 256;
// Bytes of line text in one RankLogs message: far below the gRPC limit.
inline constexpr size_t kMaxLogBatchBytes = 1 << 20;
// Lines of an exit report's stderr tail.
inline constexpr size_t kMaxTailLines = 20;
// Bytes of line text in an exit report's stderr tail.
inline constexpr size_t kMaxTailBytes = 64 * 1024;
// Longest job reason (failure reasons quote the program's output).
inline constexpr size_t kMaxReasonBytes = 4096;

// `line` as valid UTF-8 (invalid bytes replaced by U+FFFD), cut to at most
// `max_bytes` at a character boundary. When anything is cut, or
// `already_dropped` > 0 (bytes of the same line its reader discarded before
// `line` was complete), ends with " [N bytes of this line dropped]".
std::string BoundOutputLine(absl::string_view line, size_t already_dropped = 0,
                            size_t max_bytes = kMaxOutputLineBytes);

// The longest line BoundOutputLine returns with the default limit, marker
// included.
inline constexpr size_t kMaxBoundedLineBytes = kMaxOutputLineBytes + 64;

// For a line that should have been bounded already, by another component
// or process: unchanged when it was (BoundOutputLine's output passes as it
// is), otherwise made UTF-8 and cut to kMaxBoundedLineBytes with the marker.
std::string BoundReceivedLine(absl::string_view line);

// Drops the oldest lines of `tail` until it has at most kMaxTailLines lines
// and kMaxTailBytes bytes of text; the newest line always stays.
void BoundTail(std::deque<std::string>& tail);

// `text`, or its last `max_bytes` (at a character boundary) after
// "[N bytes cut] " when it is longer: for quoting where the end says most
// (a traceback ends with the error).
std::string KeepEnd(absl::string_view text, size_t max_bytes);

// `reason` within kMaxReasonBytes: its start, then " [N bytes cut]".
std::string BoundReason(absl::string_view reason);

}  // namespace chorus

#endif  // CHORUS_COMMON_OUTPUT_LIMITS_H_
