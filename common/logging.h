// Process-wide logging setup for Chorus binaries (glog, to stderr).
//
// Call once from main() before any thread starts.
//
// Example:
//   int main(int argc, char** argv) {
//     chorus::InitLogging(argv[0], /*verbosity=*/0);
//     LOG(INFO) << "started";
//   }
#ifndef CHORUS_COMMON_LOGGING_H_
#define CHORUS_COMMON_LOGGING_H_

namespace chorus {

// Note [Rank log tag]
// A rank's stdout and stderr reach its agent as one stream, and for a
// `program` job that stream carries both the program's output and the log
// of the chorus-rank that supervises it. A failed program's reason quotes its
// last output lines, and once quoted the supervisor's own "starts /bin/sh"
// line as if the program had said it. So chorus-rank's log lines begin with
// kRankLogTag, and the coordinator leaves lines that begin with it out of
// what the reason quotes (coordinator/scheduling/running_job.cc). Lines chorus-rank
// writes for the reason on purpose ("chorus-rank: the program ... was killed
// by signal 9") are plain, untagged writes to stderr.
inline constexpr char kRankLogTag[] = "[chorus-rank] ";

// Logs go to stderr; VLOG(n) is shown for n <= verbosity. Installs glog's
// failure signal handler so a crash prints a stack trace.
void InitLogging(const char* argv0, int verbosity);

// As InitLogging, and each log line begins with kRankLogTag, then glog's
// usual prefix (Note [Rank log tag]). For chorus-rank.
void InitRankLogging(const char* argv0, int verbosity);

}  // namespace chorus

#endif  // CHORUS_COMMON_LOGGING_H_
