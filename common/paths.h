// Where this program lives, for finding the binaries built beside it
// (chorus up starts chorus-coordinator and chorus-worker; the agent starts
// chorus-rank); making a directory's entries durable; and letting go of the
// cached pages of a file written once.
#ifndef CHORUS_COMMON_PATHS_H_
#define CHORUS_COMMON_PATHS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace chorus {

// The directory holding the running executable (symlinks resolved), or "."
// if /proc/self/exe cannot be read.
std::string ExecutableDir();

// Where a companion program `name` is, for a program in `dir`: `dir/name`
// when that is executable (an installed tree: every program in one bin/),
// else `dir/../bazel_package/name` (Bazel's output tree, one directory per
// package). Returns the second path when neither is executable, so the
// caller's "missing" message names where a build would put it.
// Example: CompanionBinary(ExecutableDir(), "chorus-worker", "worker")
std::string CompanionBinary(const std::string& dir, const std::string& name,
                            const std::string& bazel_package);

// `path` in the one form Chorus stores and compares paths in: lexically
// normal ("a/./b/../c" -> "a/c", repeated slashes folded) and without a
// trailing slash ("/data/" -> "/data"; "/" stays "/"). Touches no file and
// resolves no link. Empty stays empty.
// Example: NormalPath("/mnt/ckpt//") == "/mnt/ckpt"
std::string NormalPath(absl::string_view path);

// The first `max_bytes` of `path`, read with read(2); nullopt when it cannot
// be opened or a read fails. For /proc files of other processes, which may
// go away between open and read: the read then fails (ESRCH), and an
// istreambuf_iterator over an ifstream turns that into a std::ios_failure
// nothing catches (a supervisor was aborted so, once in a few hundred jobs).
std::optional<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

// fsync(2) of the directory `path`, so that entries created, renamed or
// removed in it survive a crash. INTERNAL naming the path on failure.
absl::Status FsyncDirectory(const std::string& path);

// Drops the clean pages of the open file `fd` from the page cache
// (posix_fadvise DONTNEED; dirty pages stay, so fsync first). For large
// files written once and read again rarely, checkpoints: without it every
// checkpoint adds its size to the page cache and pushes out pages that are
// read again, the training data's among them. Best effort: errors are
// ignored.
void DropCachedPages(int fd);

}  // namespace chorus

#endif  // CHORUS_COMMON_PATHS_H_
