#include "common/logging.h"

// glog's CMake package defines this for its users; Debian's library is built
// with the custom prefix, its header leaves the declarations to the define.
#ifndef GLOG_CUSTOM_PREFIX_SUPPORT
#define GLOG_CUSTOM_PREFIX_SUPPORT 1
#endif

#include <iomanip>
#include <ostream>

#include "glog/logging.h"

namespace chorus {
namespace {

// glog's own prefix ("I20240612 10:15:02.123456  4242 file.cc:311]", glog
// adds the space after it), behind kRankLogTag.
void TaggedPrefix(std::ostream& out, const google::LogMessageInfo& info, void*) {
  out << kRankLogTag << info.severity[0] << std::setfill('0') << std::setw(4)
      << 1900 + info.time.year() << std::setw(2) << 1 + info.time.month() << std::setw(2)
      << info.time.day() << ' ' << std::setw(2) << info.time.hour() << ':' << std::setw(2)
      << info.time.min() << ':' << std::setw(2) << info.time.sec() << '.' << std::setw(6)
      << info.time.usec() << ' ' << std::setfill(' ') << std::setw(5) << info.thread_id << ' '
      << info.filename << ':' << info.line_number << ']';
}

void Configure(int verbosity) {
  FLAGS_logtostderr = true;
  FLAGS_v = verbosity;
}

}  // namespace

void InitLogging(const char* argv0, int verbosity) {
  Configure(verbosity);
  google::InitGoogleLogging(argv0);
  google::InstallFailureSignalHandler();
}

void InitRankLogging(const char* argv0, int verbosity) {
  Configure(verbosity);
  google::InitGoogleLogging(argv0, &TaggedPrefix, nullptr);
  google::InstallFailureSignalHandler();
}

}  // namespace chorus
