#include "worker/agent/rank_accounts.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "worker/agent/posix_rank_launcher.h"

namespace chorus {
namespace {

std::optional<PasswdEntry> LookUpPasswd(const std::string& name) {
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return std::nullopt;
  }
  return PasswdEntry{found->pw_uid, found->pw_gid, found->pw_dir != nullptr ? found->pw_dir : ""};
}

// A job id made safe for a file name.
std::string FileNamePart(absl::string_view job_id) {
  std::string out;
  for (char c : job_id) out.push_back(absl::ascii_isalnum(c) || c == '-' || c == '_' ? c : '_');
  return out;
}

constexpr char kRangeFlag[] = "--rank_uid_range";

}  // namespace

absl::StatusOr<UidRange> ParseUidRange(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '-');
  uint32_t first = 0, last = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &first) ||
      !absl::SimpleAtoi(parts[1], &last) || first == 0 || last < first || last >= 0x7fffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRangeFlag,
                     ": expected FIRST-LAST, uids with 0 < FIRST <= LAST (e.g. 61000-61999, "
                     "uids no account of this machine uses), got \"",
                     text, "\""));
  }
  return UidRange{first, last};
}

RankAccounts::RankAccounts(Options options) : options_(std::move(options)) {}

std::pair<std::string, bool> RankAccounts::Describe() const {
  std::string fallback;
  if (options_.uid_range.has_value()) {
    fallback = absl::StrCat("else each job gets a uid of its own from ", kRangeFlag, "=",
                            options_.uid_range->first, "-", options_.uid_range->last);
  } else if (options_.agent_uid != 0) {
    fallback = absl::StrCat("else they run as this agent's uid ", options_.agent_uid,
                            " (single-user mode)");
  } else {
    return {absl::StrCat(
                "ranks run as root, like this agent, unless the coordinator's token file maps "
                "their job's owner to a Unix account (`user TOKEN NAME unix=ACCOUNT`): user code "
                "could read this agent's token and every other job's files. Map each user to an "
                "account, or give this agent ",
                kRangeFlag, "=FIRST-LAST (a uid per job); docs/operating.md#rank-accounts"),
            true};
  }
  return {absl::StrCat("ranks run as the Unix account the coordinator's token file maps their "
                       "job's owner to (unix=), ",
                       fallback),
          false};
}

absl::StatusOr<RankAccounts::ForJob> RankAccounts::Acquire(const std::string& job_id,
                                                           const std::string& unix_account) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    absl::StatusOr<Held> chosen = Choose(job_id, unix_account);
    if (!chosen.ok()) return chosen.status();
    it = jobs_.emplace(job_id, *std::move(chosen)).first;
  }
  ++it->second.ranks;
  return it->second.for_job;
}

absl::StatusOr<RankAccounts::Held> RankAccounts::Choose(const std::string& job_id,
                                                        const std::string& unix_account) {
  Held held;
  if (!unix_account.empty()) {
    std::optional<PasswdEntry> entry =
        options_.lookup ? options_.lookup(unix_account) : LookUpPasswd(unix_account);
    if (!entry.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's owner maps to Unix account \"", unix_account,
          "\" (unix= in the coordinator's token file), which this node does not have; create "
          "it here or fix the token file"));
    }
    if (entry->uid == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job's owner maps to Unix account \"", unix_account,
                       "\", which is root (uid 0); ranks never run as root by mapping: name an "
                       "unprivileged account in the coordinator's token file"));
    }
    if (entry->uid == options_.agent_uid) return held;  // the agent's own: nothing to change
    if (options_.agent_uid != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's owner maps to Unix account \"", unix_account, "\" (uid ", entry->uid,
          "), but this agent runs as uid ", options_.agent_uid,
          ", not root, and cannot start processes as another account; run the agent as root"));
    }
    held.for_job.account = RankCommand::Account{entry->uid, entry->gid};
    held.for_job.env = {{"HOME", entry->home}, {"USER", unix_account}, {"LOGNAME", unix_account}};
  } else if (options_.uid_range.has_value()) {
    std::set<uid_t> taken = cleaning_;  // not free until nothing of the last job is left
    for (const auto& [id, other] : jobs_) {
      if (other.from_range) taken.insert(other.for_job.account->uid);
    }
    std::optional<uid_t> free;
    for (uid_t uid = options_.uid_range->first; uid <= options_.uid_range->last; ++uid) {
      if (taken.count(uid) == 0) {
        free = uid;
        break;
      }
    }
    if (!free.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "every uid of ", kRangeFlag, "=", options_.uid_range->first, "-",
          options_.uid_range->last, " is held by another job on this node; give a wider range"));
    }
    held.from_range = true;
    held.for_job.account = RankCommand::Account{*free, *free};
  } else {
    return held;  // single-user mode (Note [Rank accounts])
  }
  if (!options_.temp_root.empty()) {
    absl::StatusOr<std::string> dir = MakeJobDir(job_id, *held.for_job.account);
    if (!dir.ok()) return dir.status();
    held.dir = *dir;
    held.for_job.env.emplace_back("TMPDIR", held.dir);
    if (held.from_range) {
      held.for_job.env.emplace_back("HOME", held.dir);
      held.for_job.env.emplace_back("USER", "");
      held.for_job.env.emplace_back("LOGNAME", "");
    }
  }
  return held;
}

absl::StatusOr<std::string> RankAccounts::MakeJobDir(const std::string& job_id,
                                                     const RankCommand::Account& account) const {
  const std::string dir =
      absl::StrCat(options_.temp_root, "/chorus-", FileNamePart(job_id), "-", account.uid);
  // A directory left by an earlier agent is not trusted: made afresh.
  struct stat existing {};
  if (lstat(dir.c_str(), &existing) == 0) {
    CleanUp(Held{ForJob{account, {}}, dir, false, 0});
  }
  if (mkdir(dir.c_str(), 0700) != 0 || chown(dir.c_str(), account.uid, account.gid) != 0) {
    const int error = errno;
    return absl::InternalError(absl::StrCat("cannot make the job's directory ", dir,
                                            " owned by uid ", account.uid, ": ",
                                            std::strerror(error)));
  }
  return dir;
}

void RankAccounts::Release(const std::string& job_id) {
  Held released;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || --it->second.ranks > 0) return;
    released = std::move(it->second);
    jobs_.erase(it);
    if (released.from_range) cleaning_.insert(released.for_job.account->uid);
  }
  CleanUp(released);
  if (released.from_range) {
    absl::MutexLock lock(&mu_);
    cleaning_.erase(released.for_job.account->uid);
  }
}

// Runs as the account (Note [Rank accounts]): root never walks a directory
// the job could have filled with links.
void RankAccounts::CleanUp(const Held& held) const {
  if (!held.for_job.account.has_value() || (held.dir.empty() && !held.from_range)) return;
  std::shared_ptr<RankLauncher> launcher = options_.launcher;
  if (launcher == nullptr) launcher = std::make_shared<PosixRankLauncher>();
  const std::string script = absl::StrCat(held.from_range ? "kill -KILL -1 2>/dev/null; " : "",
                                          "[ -z \"$0\" ] || rm -rf -- \"$0\" 2>/dev/null; exit 0");
  RankCommand command{{"/bin/sh", "-c", script, held.dir}, {"PATH=/usr/bin:/bin"}};
  command.account = held.for_job.account;
  absl::StatusOr<std::unique_ptr<RankProcess>> cleaner = launcher->Start(command);
  if (cleaner.ok() && !(*cleaner)->Wait(absl::Now() + absl::Seconds(30)).ok()) {
    LOG(WARNING) << "emptying " << held.dir << " as uid " << held.for_job.account->uid
                 << " took over 30 s; stopped";
  } else if (!cleaner.ok()) {
    LOG(WARNING) << "cannot clean up after uid " << held.for_job.account->uid << ": "
                 << cleaner.status().message();
  }
  // The account could empty it but not remove it from the agent's directory.
  if (!held.dir.empty() && rmdir(held.dir.c_str()) != 0 && errno != ENOENT) {
    LOG(WARNING) << "cannot remove " << held.dir << ": " << std::strerror(errno);
  }
}

}  // namespace chorus
