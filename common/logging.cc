#include "common/logging.h"

#include "glog/logging.h"

namespace chorus {

void InitLogging(const char* argv0, int verbosity) {
  FLAGS_logtostderr = true;
  FLAGS_v = verbosity;
  google::InitGoogleLogging(argv0);
  google::InstallFailureSignalHandler();
}

}  // namespace chorus
