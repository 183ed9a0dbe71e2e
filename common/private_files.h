// Files only their owner may read: the coordinator's state (its database,
// the job-credential secret) and token files.
//
// Note [Private files]
// What a coordinator keeps under --state_dir holds every job's spec (and a
// program's env values), checkpoints and the secret job credentials derive
// from (common/job_credentials.h). The process umask decides the mode of a
// file made with the default mode: 022 (a login shell) leaves it readable by
// every user of the machine. So the state directory is made 0700 and each
// state file 0600 whatever the umask: the mode is given to open(2) and
// mkdir(2) themselves (the umask can only take bits away from it), and
// existing ones are tightened to that with a warning. The same holds for
// checkpoints (the coordinator's --checkpoint_dir,
// coordinator/checkpoint/checkpoint_store.h; a job's SHARED_DIR directory, Note [A shared
// checkpoint directory] in checkpoint/shared_dir_storage.cc) and for the
// logs `chorus up` keeps in its state directory. Token files are the
// operator's: a group- or world-readable one is refused (not silently
// fixed), as ssh refuses such a private key, except
// that a file another user owns (root:chorus 0640, a Kubernetes Secret
// volume with fsGroup) may be shared through its group on purpose; a
// world-readable token file is refused whoever owns it.
//
// Thread-safe: plain functions over the file system.
//
// Example:
//   RETURN_IF_ERROR(MakePrivateDirectory(state_dir, "--state_dir"));
//   RETURN_IF_ERROR(MakePrivateFile(state_dir + "/chorus.db"));
//   RETURN_IF_ERROR(CheckTokenFileIsPrivate("/etc/chorus/tokens", "--token_file"));
//   const int fd = OpenPrivateFile(checkpoint_dir + "/job-000001/MANIFEST", O_WRONLY | O_TRUNC);
#ifndef CHORUS_COMMON_PRIVATE_FILES_H_
#define CHORUS_COMMON_PRIVATE_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace chorus {

// Creates `dir` (and its parents) if missing and makes `dir` itself mode
// 0700; FAILED_PRECONDITION naming `what` and the directory if it cannot be
// created. An existing directory others could reach is made 0700 with a
// warning in the log; one whose mode cannot be changed (another user owns
// it) is left as it is, with a warning.
absl::Status MakePrivateDirectory(const std::string& dir, absl::string_view what);

// Creates `path` empty with mode 0600 if missing, or makes an existing file
// 0600 (with a warning in the log if others could read it).
// FAILED_PRECONDITION naming the path on failure.
absl::Status MakePrivateFile(const std::string& path);

// open(2)s `path` with `flags` | O_CREAT | O_CLOEXEC | O_NOFOLLOW and mode
// 0600, and makes a file that was already there with a wider mode 0600,
// with a warning in the log: the descriptor, owned by the caller. errno
// is kept for the caller's message on failure (-1).
int OpenPrivateFile(const std::string& path, int flags);

// Makes every directory under `root` (root included) 0700 and every file
// 0600 where others could reach them, with one warning in the log naming
// `what` and how many were changed (a tree an older version wrote with the
// umask's modes). Files it cannot change are left, counted in the warning.
void TightenPrivateTree(const std::string& root, absl::string_view what);

// Writes `contents` to a new file `path` of mode 0600 (through a temporary
// name, fsynced and renamed, so a crash leaves no half-written file).
// ALREADY_EXISTS if `path` exists; FAILED_PRECONDITION on other failures.
absl::Status WritePrivateFile(const std::string& path, absl::string_view contents);

// OK unless the token file `path` can be read by others (Note [Private
// files]): FAILED_PRECONDITION "`what` F is readable by others (mode 0644);
// chmod 600 F". A missing file is OK here (reading it reports that).
absl::Status CheckTokenFileIsPrivate(const std::string& path, absl::string_view what);

}  // namespace chorus

#endif  // CHORUS_COMMON_PRIVATE_FILES_H_
