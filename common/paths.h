// Where this program lives, for finding the binaries built beside it
// (chorus up starts chorus-coordinator and chorus-worker; the agent starts
// chorus-rank).
#ifndef CHORUS_COMMON_PATHS_H_
#define CHORUS_COMMON_PATHS_H_

#include <string>

namespace chorus {

// The directory holding the running executable (symlinks resolved), or "."
// if /proc/self/exe cannot be read.
std::string ExecutableDir();

}  // namespace chorus

#endif  // CHORUS_COMMON_PATHS_H_
