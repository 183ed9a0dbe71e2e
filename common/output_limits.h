// Limits on what a user's job writes, applied wherever that text crosses a
// process (Note [Bounded job output]), and the helpers that apply them.
//
// Thread-safety: constants and pure functions.
//
// Example:
//   std::string line = BoundOutputLine(std::move(raw));  // <= kMaxOutputLineBytes + marker
//   BoundTail(tail);  // the newest lines within kMaxTailLines and kMaxTailBytes
//   std::cerr << RankErrorRecord(status.message()) << std::endl;  // a rank's last word
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

// Note [Rank error record]
// A rank that fails says why in one line on stderr, its error record:
// kRankErrorPrefix, then the error's whole message escaped by
// EscapeErrorText. The coordinator makes the last record of a rank's
// stderr tail its job's reason (coordinator/scheduling/running_job.cc), not the last
// line: lines a rank writes after it (a log line of a thread stopping)
// would hide it, and an error message that quotes a file's bytes (a .npy
// header ends in a newline) would otherwise end up as several lines of
// which only the last was quoted, without the file, offset and sample that
// came before. chorus-rank's log lines carry kRankLogTag instead (Note
// [Rank log tag] in common/logging.h), so they are never records.
inline constexpr char kRankErrorPrefix[] = "chorus-rank: ";
// The most bytes of escaped text a record holds (the marker comes on top).
inline constexpr size_t kMaxErrorRecordBytes = 1024;

// `text` on one line for a human to read: newline, carriage return and tab
// as \n, \r and \t, other control characters and bytes that are not UTF-8
// as \xNN (a backslash itself stays as it is). Longer than `max_bytes`
// when escaped, it keeps its start and its end (where an error says where
// and what) around " [N bytes cut] ", never splitting an escape or a
// character.
std::string EscapeErrorText(absl::string_view text, size_t max_bytes = kMaxErrorRecordBytes);

// The error record of a rank failing with `message`: kRankErrorPrefix +
// EscapeErrorText(message).
std::string RankErrorRecord(absl::string_view message);

// The last error record in `lines` (oldest first), or nullptr if none is.
const std::string* LastErrorRecord(const std::deque<std::string>& lines);

}  // namespace chorus

#endif  // CHORUS_COMMON_OUTPUT_LIMITS_H_
