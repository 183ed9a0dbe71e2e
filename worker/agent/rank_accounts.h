// RankAccounts: which Unix account a job's ranks run as on this node, and
// the private directory each job's ranks get there.
//
// Note [Rank accounts]
// Ranks run user code, so they must not run as the agent (root, on a shared
// node): they could read its token, its memory and every other job's files.
// Which account a job's ranks get, in this order:
//   1. the account the coordinator names in the launch (LaunchRanks.
//      unix_account, from `unix=NAME` on the owner's line of the
//      coordinator's token file), looked up in the node's passwd; it must
//      exist and must not be root;
//   2. else, with --rank_uid_range=FIRST-LAST, a uid of that range of its
//      own for the job (gid = uid, no passwd entry needed, as systemd's
//      DynamicUser), held while the job has ranks on the node;
//   3. else the agent's own uid, as before: single-user mode, which is what
//      `chorus up --local` runs (an agent running as root says at its start
//      that its ranks run as root, and how to change that).
// Each job run under an account of its own gets a directory of its own,
// TEMP_ROOT/chorus-JOB-UID, 0700 and owned by that account; it is the
// ranks' TMPDIR (where they write their join files) and, for a uid of the
// range, their HOME. When the job's last rank on the node is gone the
// account is released: the directory is emptied by a process running as
// the account (never by root following the job's symbolic links) and
// removed, and for a uid of the range whatever else still runs as that uid
// is killed first, so the next job to get the uid finds nothing of this one.
//
// Thread-safety: Acquire and Release may be called from any thread.
//
// Example:
//   RankAccounts accounts(options);
//   ASSIGN_OR_RETURN(RankAccounts::ForJob job, accounts.Acquire("job-1", "alice"));
//   command.account = job.account;          // nullopt: the agent's own
//   for (auto& [key, value] : job.env) ...  // TMPDIR, HOME, USER, LOGNAME
//   ...                                     // once the rank has exited:
//   accounts.Release("job-1");
#ifndef CHORUS_WORKER_AGENT_RANK_ACCOUNTS_H_
#define CHORUS_WORKER_AGENT_RANK_ACCOUNTS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/agent/rank_launcher.h"

namespace chorus {

// --rank_uid_range: uids FIRST to LAST, both included.
struct UidRange {
  uid_t first = 0;
  uid_t last = 0;
};

// "FIRST-LAST" with 0 < FIRST <= LAST < 2^31 - 1; INVALID_ARGUMENT naming
// the flag otherwise.
absl::StatusOr<UidRange> ParseUidRange(absl::string_view text);

// An account of the node's passwd.
struct PasswdEntry {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
};

class RankAccounts {
 public:
  struct Options {
    std::optional<UidRange> uid_range;
    // The agent's effective uid (only root may start ranks as another).
    uid_t agent_uid = 0;
    // Where job directories are made; empty: none are (tests).
    std::string temp_root;
    // Looks up a passwd entry by name; default getpwnam_r.
    std::function<std::optional<PasswdEntry>(const std::string& name)> lookup;
    // Empties a released job's directory as its account (and kills what
    // else runs as a released uid of the range); default PosixRankLauncher.
    std::shared_ptr<RankLauncher> launcher;
  };

  // What the ranks of one job get.
  struct ForJob {
    std::optional<RankCommand::Account> account;  // nullopt: the agent's own
    // Variables the ranks' environment gets (or loses: an empty value
    // means unset), in order.
    std::vector<std::pair<std::string, std::string>> env;
  };

  explicit RankAccounts(Options options);
  RankAccounts(const RankAccounts&) = delete;
  RankAccounts& operator=(const RankAccounts&) = delete;

  // One line for the agent's start: how its ranks' accounts are chosen; a
  // WARNING-worthy line (second: true) when ranks would run as root.
  std::pair<std::string, bool> Describe() const;

  // The account for one more rank of `job_id`, whose launch named
  // `unix_account` (empty: none); every success is paired with one
  // Release(job_id). FAILED_PRECONDITION saying what to fix when the named
  // account is unknown, is root, or cannot be taken by this agent, or when
  // every uid of the range is held by other jobs; INTERNAL if the job's
  // directory cannot be made.
  absl::StatusOr<ForJob> Acquire(const std::string& job_id, const std::string& unix_account)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One rank of `job_id` is gone; after the last, the job's account and
  // directory are released (Note [Rank accounts]).
  void Release(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Held {
    ForJob for_job;
    std::string dir;  // empty: none
    bool from_range = false;
    int ranks = 0;
  };
  absl::StatusOr<Held> Choose(const std::string& job_id, const std::string& unix_account)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> MakeJobDir(const std::string& job_id,
                                         const RankCommand::Account& account) const;
  void CleanUp(const Held& held) const;

  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, Held> jobs_ ABSL_GUARDED_BY(mu_);
  // Uids of the range released and being cleaned up: not given out yet.
  std::set<uid_t> cleaning_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_WORKER_AGENT_RANK_ACCOUNTS_H_
