// StateDirLock: an exclusive lock on a coordinator's state directory, held
// for the object's lifetime, so two coordinators can never share one.
//
// The lock is a flock(2) on DIR/LOCK, which also records the holder's pid so
// that the error a second coordinator gets names it. The kernel drops the
// lock when the file is closed (here: in the destructor) or when the process
// dies, so a crashed coordinator never leaves a stale lock behind.
//
// Thread-safety: Acquire may be called from any thread; the object itself
// has no mutable state.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<StateDirLock> lock, StateDirLock::Acquire(dir));
//   ...  // the directory is ours until `lock` is destroyed
#ifndef CHORUS_COORDINATOR_STATE_STATE_DIR_LOCK_H_
#define CHORUS_COORDINATOR_STATE_STATE_DIR_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace chorus {

class StateDirLock {
 public:
  // Creates `dir` if needed and locks it. INVALID_ARGUMENT for an empty
  // `dir`; FAILED_PRECONDITION naming the directory when it cannot be
  // created or written, or when another holder has it locked (with that
  // holder's pid when it recorded one).
  static absl::StatusOr<std::unique_ptr<StateDirLock>> Acquire(const std::string& dir);

  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  // Releases the lock.
  ~StateDirLock();

  const std::string& dir() const { return dir_; }

 private:
  StateDirLock(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}

  const std::string dir_;
  const int fd_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_STATE_DIR_LOCK_H_
