#include "worker/runtime/join_relay.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// How long one wait for the agent's answer lasts before the relay looks
// whether it is stopping.
constexpr absl::Duration kAnswerPoll = absl::Milliseconds(100);

v1::AgentJoinAnswer JoinDirectly(const v1::JoinRequest& join, const std::string& why) {
  v1::AgentJoinAnswer answer;
  answer.set_job_id(join.job_id());
  answer.set_asked_generation(join.generation());
  answer.set_join_directly(true);
  answer.set_message(why);
  return answer;
}

}  // namespace

JoinRelay::JoinRelay(ProgressReceiver& program, std::shared_ptr<ProgressSender> agent)
    : program_(program), agent_(std::move(agent)), thread_([this] { Run(); }) {}

JoinRelay::~JoinRelay() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void JoinRelay::Relay(v1::JoinRequest join) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(join));
}

bool JoinRelay::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void JoinRelay::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    const v1::JoinRequest join = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    const std::optional<v1::AgentJoinAnswer> answer = Carry(join);
    if (answer.has_value()) {
      if (absl::Status sent = program_.SendJoinAnswer(*answer); !sent.ok()) {
        LOG(WARNING) << join.job_id()
                     << ": passing the program its join's answer: " << sent.message();
      }
    }
    mu_.Lock();
  }
}

std::optional<v1::AgentJoinAnswer> JoinRelay::Carry(const v1::JoinRequest& join) {
  if (absl::Status sent = agent_->SendJoin(join); !sent.ok()) {
    return JoinDirectly(join,
                        absl::StrCat("the node agent did not take the join: ", sent.message()));
  }
  while (!Stopping()) {
    absl::StatusOr<v1::AgentJoinAnswer> answer =
        agent_->ReceiveJoinAnswer(absl::Now() + kAnswerPoll);
    if (absl::IsDeadlineExceeded(answer.status())) continue;
    if (!answer.ok()) {
      return JoinDirectly(join,
                          absl::StrCat("the node agent's channel: ", answer.status().message()));
    }
    // An answer to an earlier join the program gave up waiting for.
    if (answer->job_id() != join.job_id() || answer->asked_generation() != join.generation()) {
      continue;
    }
    return *std::move(answer);
  }
  return std::nullopt;
}

}  // namespace chorus
