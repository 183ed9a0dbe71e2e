#include "coordinator/scheduling/scheduling_policy.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace chorus {

const UserLimits& SchedulingPolicy::For(const std::string& owner) const {
  auto it = users.find(owner);
  return it == users.end() ? defaults : it->second;
}

std::string OwnerName(const std::string& owner) { return owner.empty() ? "anonymous" : owner; }

v1::JobSpec::Priority PriorityOf(const v1::JobSpec& spec) {
  return spec.priority() == v1::JobSpec::PRIORITY_UNSPECIFIED ? v1::JobSpec::NORMAL
                                                              : spec.priority();
}

std::string PriorityName(v1::JobSpec::Priority priority) {
  return priority == v1::JobSpec::PRIORITY_UNSPECIFIED ? "NORMAL"
                                                       : v1::JobSpec::Priority_Name(priority);
}

namespace {

// Applies one `name=value` setting to `limits`; the error says what is wrong.
absl::Status ApplySetting(absl::string_view setting, UserLimits& limits) {
  std::vector<std::string> kv = absl::StrSplit(setting, absl::MaxSplits('=', 1));
  if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", setting, "\" is not NAME=VALUE (cpu_slots, cuda_slots, queued_jobs, ",
                     "max_priority)"));
  }
  const std::string& name = kv[0];
  const std::string& value = kv[1];
  if (name == "max_priority") {
    v1::JobSpec::Priority priority;
    if (!v1::JobSpec::Priority_Parse(absl::AsciiStrToUpper(value), &priority) ||
        priority == v1::JobSpec::PRIORITY_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_priority must be LOW, NORMAL or HIGH, got \"", value, "\""));
    }
    limits.max_priority = priority;
    return absl::OkStatus();
  }
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a whole number >= 0, got \"", value, "\""));
  }
  if (name == "cpu_slots") {
    limits.max_slots[v1::ResourceSpec::CPU] = n;
  } else if (name == "cuda_slots") {
    limits.max_slots[v1::ResourceSpec::CUDA] = n;
  } else if (name == "queued_jobs") {
    limits.max_queued_jobs = n;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown setting \"", name, "\" (cpu_slots, cuda_slots, queued_jobs, max_priority)"));
  }
  return absl::OkStatus();
}

// A `user` line's settings over the default line's, wherever that is. `set`
// has max_priority PRIORITY_UNSPECIFIED where its line does not name it.
UserLimits Inherit(const UserLimits& defaults, const UserLimits& set) {
  UserLimits user = defaults;
  for (const auto& [device, n] : set.max_slots) user.max_slots[device] = n;
  if (set.max_queued_jobs) user.max_queued_jobs = set.max_queued_jobs;
  if (set.max_priority != v1::JobSpec::PRIORITY_UNSPECIFIED) user.max_priority = set.max_priority;
  return user;
}

// One statement (its words); user lines go to `user_lines` as written.
absl::Status ParseLine(const std::vector<std::string>& words, SchedulingPolicy& policy,
                       std::map<std::string, UserLimits>& user_lines) {
  const std::string& keyword = words[0];
  if (keyword == "fair_share_half_life") {
    absl::Duration d;
    if (words.size() != 2 || !absl::ParseDuration(words[1], &d) || d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "fair_share_half_life takes one duration > 0, such as 1h or 30m");
    }
    policy.fair_share_half_life = d;
    return absl::OkStatus();
  }
  size_t first = 1;
  UserLimits* limits = nullptr;
  if (keyword == "default") {
    limits = &policy.defaults;
  } else if (keyword == "user") {
    if (words.size() < 2) return absl::InvalidArgumentError("user needs a name: user NAME ...");
    auto [it, added] = user_lines.try_emplace(words[1]);
    if (!added)
      return absl::InvalidArgumentError(absl::StrCat("user ", words[1], " appears twice"));
    it->second.max_priority = v1::JobSpec::PRIORITY_UNSPECIFIED;  // not set on this line
    limits = &it->second;
    first = 2;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown statement \"", keyword, "\" (fair_share_half_life, default, user)"));
  }
  for (size_t i = first; i < words.size(); ++i) RETURN_IF_ERROR(ApplySetting(words[i], *limits));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view text,
                                                       absl::string_view file) {
  SchedulingPolicy policy;
  std::map<std::string, UserLimits> user_lines;
  int line_number = 0;
  bool saw_default = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words[0] == "default") {
      if (saw_default) {
        return absl::InvalidArgumentError(
            absl::StrCat("scheduling policy ", file, ":", line_number, ": a second default line"));
      }
      saw_default = true;
    }
    if (absl::Status s = ParseLine(words, policy, user_lines); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduling policy ", file, ":", line_number, ": ", s.message()));
    }
  }
  for (const auto& [user, set] : user_lines) policy.users[user] = Inherit(policy.defaults, set);
  return policy;
}

absl::StatusOr<SchedulingPolicy> LoadSchedulingPolicy(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--scheduling_policy ", path, ": cannot open the file (does it exist?)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseSchedulingPolicy(text.str(), path);
}

absl::Status CheckSubmission(const SchedulingPolicy& policy, const std::string& owner,
                             const v1::JobSpec& spec, int queued) {
  const UserLimits& limits = policy.For(owner);
  const v1::JobSpec::Priority priority = PriorityOf(spec);
  if (priority > limits.max_priority) {
    return absl::PermissionDeniedError(absl::StrCat(
        "job spec: priority ", PriorityName(priority), " is above what the scheduling policy ",
        "allows ", OwnerName(owner), " (", PriorityName(limits.max_priority),
        "); ask for at most that, or ask the administrator"));
  }
  if (limits.max_queued_jobs && queued >= *limits.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        OwnerName(owner), " already has ", queued, " queued job", queued == 1 ? "" : "s",
        ", the most the scheduling policy allows (queued_jobs=", *limits.max_queued_jobs,
        "); wait for some to start, or cancel some"));
  }
  return absl::OkStatus();
}

}  // namespace chorus
