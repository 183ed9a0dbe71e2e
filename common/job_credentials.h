// Per-job credentials: what a job's rank processes present to the
// coordinator instead of the agent's token (Note [Job credentials]).
//
// Note [Job credentials]
// A program job runs user code, and every library it imports, with the
// environment its agent gives it. With the agent's worker token there, any
// of that code could register a fake agent, read any job's checkpoints or
// write into any job's key-value namespace. So the coordinator mints one
// credential per job, hands it to the agents with the launch
// (LaunchRanks.credential), and the agent sets it as the ranks' CHORUS_TOKEN
// in place of its own. The coordinator lets it do only what that job's
// ranks need (common/auth.h, Caller::CheckJob): RankService calls, its
// job's StoreService namespaces and checkpoints, and reading the checkpoint
// the job resumes from.
//
// A credential is "chorus-job:JOB:HMAC" with HMAC = HMAC-SHA256(secret,
// JOB) in hex: it names its job and proves the coordinator made it, so
// checking one needs no table and no database row. The secret is drawn once
// and kept in a 0600 file under --state_dir, so the credentials of running
// jobs stay valid across a coordinator restart (their agents and ranks
// reconnect with them). Deleting that file revokes every job credential.
//
// Thread-safe: immutable after construction.
//
// Example:
//   ASSIGN_OR_RETURN(JobCredentials credentials,
//                    JobCredentials::LoadOrCreate(state_dir + "/job_credentials.key"));
//   launch.set_credential(credentials.For("job-000001"));
//   credentials.JobOf(launch.credential());   // "job-000001"
#ifndef CHORUS_COMMON_JOB_CREDENTIALS_H_
#define CHORUS_COMMON_JOB_CREDENTIALS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chorus {

class JobCredentials {
 public:
  // Bytes of randomness in a new secret, and the fewest characters a secret
  // may have.
  static constexpr size_t kSecretBytes = 32;
  static constexpr size_t kMinSecretChars = 32;

  // REQUIRES: secret.size() >= kMinSecretChars.
  explicit JobCredentials(std::string secret);

  // The secret kept in `path` (hex, one line); when there is no such file,
  // draws a new one and writes it there with mode 0600 first.
  // FAILED_PRECONDITION naming the file if it is readable by others (with
  // the chmod that fixes it), too short, or cannot be read or written.
  static absl::StatusOr<JobCredentials> LoadOrCreate(const std::string& path);
  // The secret kept in `path`; nullopt when there is no such file. Errors as
  // LoadOrCreate's.
  static absl::StatusOr<std::optional<JobCredentials>> LoadIfPresent(const std::string& path);
  // A new secret from getrandom; FAILED_PRECONDITION if none can be drawn.
  static absl::StatusOr<JobCredentials> Create();

  // The secret, for a store that shares it between coordinators
  // (EtcdStateStore::LoadJobCredentials).
  const std::string& secret() const { return secret_; }
  // Whether `other` has the same secret (in constant time).
  bool SameSecretAs(const JobCredentials& other) const;

  // The credential of job `job_id`.
  std::string For(absl::string_view job_id) const;
  // The job `credential` was made for by this secret; nullopt for anything
  // else (another secret's, a token, a damaged one). Compares in constant
  // time.
  std::optional<std::string> JobOf(absl::string_view credential) const;

  // Whether `token` has the form of a job credential (of any secret).
  static bool LooksLikeOne(absl::string_view token);

 private:
  std::string Tag(absl::string_view job_id) const;

  std::string secret_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_JOB_CREDENTIALS_H_
