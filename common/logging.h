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

// Logs go to stderr; VLOG(n) is shown for n <= verbosity. Installs glog's
// failure signal handler so a crash prints a stack trace.
void InitLogging(const char* argv0, int verbosity);

}  // namespace chorus

#endif  // CHORUS_COMMON_LOGGING_H_
