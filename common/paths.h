// Where this program lives, for finding the binaries built beside it
// (chorus up starts chorus-coordinator and chorus-worker; the agent starts
// chorus-rank); and making a directory's entries durable.
#ifndef CHORUS_COMMON_PATHS_H_
#define CHORUS_COMMON_PATHS_H_

#include <string>

#include "absl/status/status.h"

namespace chorus {

// The directory holding the running executable (symlinks resolved), or "."
// if /proc/self/exe cannot be read.
std::string ExecutableDir();

// fsync(2) of the directory `path`, so that entries created, renamed or
// removed in it survive a crash. INTERNAL naming the path on failure.
absl::Status FsyncDirectory(const std::string& path);

}  // namespace chorus

#endif  // CHORUS_COMMON_PATHS_H_
