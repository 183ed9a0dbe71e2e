#include "worker/runtime/join_generation.h"

#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "glog/logging.h"

namespace chorus {

absl::StatusOr<v1::JoinResponse> JoinGeneration(v1::RankService::StubInterface& ranks,
                                                const v1::JoinRequest& request, absl::Time deadline,
                                                bool until_formed) {
  return GenerationJoiner(ranks, nullptr).Join(request, deadline, until_formed);
}

GenerationJoiner::GenerationJoiner(v1::RankService::StubInterface& ranks,
                                   std::shared_ptr<ProgressSender> agent)
    : ranks_(ranks), agent_(std::move(agent)) {}

absl::StatusOr<v1::JoinResponse> GenerationJoiner::Join(const v1::JoinRequest& request,
                                                        absl::Time deadline, bool until_formed) {
  // Note [Backoff] in common/backoff.cc: every rank of a job asks again at
  // once after a failover; 50-200 ms apart, at random, not all every 100 ms.
  BackoffOptions delays;
  delays.initial = absl::Milliseconds(50);
  delays.max = absl::Milliseconds(200);
  Backoff backoff(delays);
  // The last answer asked again after ("still forming"): what a last attempt
  // cut short by the deadline (a busy machine, a slow coordinator) reports
  // instead of its bare DEADLINE_EXCEEDED.
  std::optional<absl::Status> retried;
  for (;;) {
    std::optional<absl::StatusOr<v1::JoinResponse>> answer = JoinThroughAgent(request, deadline);
    if (!answer.has_value()) {
      v1::JoinResponse joined;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      context.set_wait_for_ready(true);
      const absl::Status s = FromGrpcStatus(ranks_.Join(&context, request, &joined));
      answer = s.ok() ? absl::StatusOr<v1::JoinResponse>(std::move(joined)) : s;
    }
    if (answer->ok()) return *std::move(answer);
    absl::Status s = answer->status();
    if (absl::IsDeadlineExceeded(s) && retried.has_value()) s = *retried;
    // Note [A join is asked for again]: UNAVAILABLE is retried whatever
    // `until_formed` says.
    const bool again = absl::IsUnavailable(s) || (until_formed && absl::IsAborted(s));
    const absl::Duration delay = backoff.Next();
    if (!again || absl::Now() + delay >= deadline) {
      return absl::Status(s.code(), absl::StrCat("joining generation ", request.generation(),
                                                 " of ", request.job_id(), ": ", s.message()));
    }
    retried = s;
    absl::SleepFor(delay);
  }
}

std::optional<absl::StatusOr<v1::JoinResponse>> GenerationJoiner::JoinThroughAgent(
    const v1::JoinRequest& request, absl::Time deadline) {
  if (agent_ == nullptr) return std::nullopt;
  if (absl::Status sent = agent_->SendJoin(request); !sent.ok()) {
    LOG(WARNING) << "joining generation " << request.generation() << " of " << request.job_id()
                 << " directly: the agent did not take the join (" << sent.message() << ")";
    if (absl::IsUnavailable(sent)) agent_ = nullptr;  // its end is closed
    return std::nullopt;
  }
  while (true) {
    absl::StatusOr<v1::AgentJoinAnswer> answer = agent_->ReceiveJoinAnswer(deadline);
    if (absl::IsDeadlineExceeded(answer.status())) {
      return absl::DeadlineExceededError(
          "the node agent passed on no answer from the coordinator by the deadline");
    }
    if (!answer.ok()) {
      LOG(WARNING) << "joining generation " << request.generation() << " of " << request.job_id()
                   << " directly: " << answer.status().message();
      if (absl::IsOutOfRange(answer.status())) agent_ = nullptr;
      return std::nullopt;
    }
    // An answer to an earlier attempt that gave up waiting.
    if (answer->job_id() != request.job_id() ||
        answer->asked_generation() != request.generation()) {
      continue;
    }
    if (answer->join_directly()) {
      LOG(WARNING) << "joining generation " << request.generation() << " of " << request.job_id()
                   << " directly: " << answer->message();
      return std::nullopt;
    }
    ++answered_by_agent_;
    if (answer->code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(answer->code()), answer->message());
    }
    return std::move(*answer->mutable_response());
  }
}

std::shared_ptr<ProgressSender> AgentJoinChannel(std::shared_ptr<ProgressSender> channel) {
  const char* takes = std::getenv(kEnvAgentJoins);
  if (takes == nullptr || std::string(takes) != "1") return nullptr;
  return channel;
}

absl::StatusOr<RankLaunch> RankLaunchFromEnvironment() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  RankLaunch launch;
  launch.coordinator = env(kEnvCoordinator);
  int64_t generation = 0;
  int slot = -1;
  if (launch.coordinator.empty() || env(kEnvJobId).empty() ||
      !absl::SimpleAtoi(env(kEnvGeneration), &generation) ||
      !absl::SimpleAtoi(env(kEnvSlot), &slot)) {
    return absl::FailedPreconditionError(
        "CHORUS_COORDINATOR, CHORUS_JOB_ID, CHORUS_GENERATION and CHORUS_SLOT must be set; "
        "chorus-rank is started by chorus-worker, not by hand");
  }
  v1::JoinRequest& join = launch.join;
  join.set_job_id(env(kEnvJobId));
  join.set_generation(generation);
  join.set_agent_id(env(kEnvAgentId));
  join.set_slot(slot);
  join.set_pid(::getpid());
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  join.set_host(host);
  return launch;
}

absl::StatusOr<std::string> WriteJoinFile(const std::string& dir, const v1::JoinResponse& joined) {
  std::string path = absl::StrCat(dir, "/chorus-join-XXXXXX");
  const int fd = ::mkstemp(path.data());
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the join file in ", dir, ": ", std::strerror(errno)));
  }
  const std::string bytes = joined.SerializeAsString();
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write the join file ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

absl::StatusOr<v1::JoinResponse> ReadJoinFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the join file ", path, ": ", std::strerror(errno)));
  }
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read the join file ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  v1::JoinResponse joined;
  if (!joined.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("the join file ", path, " does not hold a JoinResponse"));
  }
  return joined;
}

}  // namespace chorus
