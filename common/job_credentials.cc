#include "common/job_credentials.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/hmac.h"
#include "common/private_files.h"
#include "common/sha256.h"
#include "glog/logging.h"

namespace chorus {
namespace {

constexpr absl::string_view kPrefix = "chorus-job:";
// Keeps these tags apart from any other use of the same secret.
constexpr absl::string_view kPurpose = "chorus job credential\n";

bool SameBytes(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::string> NewSecret() {
  std::string bytes(JobCredentials::kSecretBytes, '\0');
  size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t n = ::getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot draw a job-credential secret: getrandom: ", std::strerror(errno)));
    }
    filled += static_cast<size_t>(n);
  }
  return HexOf(bytes);
}

}  // namespace

JobCredentials::JobCredentials(std::string secret) : secret_(std::move(secret)) {
  CHECK_GE(secret_.size(), kMinSecretChars) << "job-credential secret too short";
}

absl::StatusOr<JobCredentials> JobCredentials::Create() {
  absl::StatusOr<std::string> secret = NewSecret();
  if (!secret.ok()) return secret.status();
  return JobCredentials(*std::move(secret));
}

absl::StatusOr<std::optional<JobCredentials>> JobCredentials::LoadIfPresent(
    const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 && errno == ENOENT) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("job-credential secret ", path, ": cannot read it"));
  }
  if (absl::Status s = CheckTokenFileIsPrivate(path, "job-credential secret"); !s.ok()) return s;
  std::stringstream text;
  text << in.rdbuf();
  std::string secret(absl::StripAsciiWhitespace(text.str()));
  if (secret.size() < kMinSecretChars) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job-credential secret ", path, " holds ", secret.size(), " characters, fewer than ",
        kMinSecretChars, "; remove the file and a new secret is drawn at the next start (the "
        "credentials of running jobs then stop working)"));
  }
  return JobCredentials(std::move(secret));
}

absl::StatusOr<JobCredentials> JobCredentials::LoadOrCreate(const std::string& path) {
  absl::StatusOr<std::optional<JobCredentials>> kept = LoadIfPresent(path);
  if (!kept.ok()) return kept.status();
  if (kept->has_value()) return **std::move(kept);
  absl::StatusOr<JobCredentials> created = Create();
  if (!created.ok()) return created.status();
  absl::Status written = WritePrivateFile(path, created->secret_ + "\n");
  if (written.ok()) return created;
  // ALREADY_EXISTS: the file appeared between the two looks; read it.
  if (written.code() != absl::StatusCode::kAlreadyExists) {
    return absl::FailedPreconditionError(
        absl::StrCat("job-credential secret: ", written.message()));
  }
  kept = LoadIfPresent(path);
  if (!kept.ok()) return kept.status();
  if (!kept->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job-credential secret ", path, ": cannot read it"));
  }
  return **std::move(kept);
}

bool JobCredentials::SameSecretAs(const JobCredentials& other) const {
  return SameBytes(secret_, other.secret_);
}

std::string JobCredentials::Tag(absl::string_view job_id) const {
  return HmacSha256Hex(secret_, absl::StrCat(kPurpose, job_id));
}

std::string JobCredentials::For(absl::string_view job_id) const {
  return absl::StrCat(kPrefix, job_id, ":", Tag(job_id));
}

std::optional<std::string> JobCredentials::JobOf(absl::string_view credential) const {
  if (!absl::ConsumePrefix(&credential, kPrefix)) return std::nullopt;
  const size_t colon = credential.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return std::nullopt;
  const absl::string_view job_id = credential.substr(0, colon);
  if (!SameBytes(credential.substr(colon + 1), Tag(job_id))) return std::nullopt;
  return std::string(job_id);
}

bool JobCredentials::LooksLikeOne(absl::string_view token) {
  return absl::StartsWith(token, kPrefix);
}

}  // namespace chorus
