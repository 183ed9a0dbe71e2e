#include "coordinator/scheduling/agent_join_outbox.h"

#include <utility>
#include <vector>

#include "common/join_answers.h"

namespace chorus {

Rendezvous::Done AgentJoinOutbox::DoneFor(const std::string& agent_id, int64_t connection,
                                          AgentSender send, const v1::JoinRequest& request) {
  return [this, to = std::make_pair(agent_id, connection), send = std::move(send),
          job_id = request.job_id(), slot = request.slot(),
          asked = request.generation()](absl::StatusOr<v1::JoinResponse> answer) {
    absl::MutexLock lock(&mu_);
    Pending& pending = pending_[to];
    if (!pending.send) pending.send = send;
    AddJoinAnswer(job_id, slot, asked, std::move(answer), *pending.message.mutable_joined());
  };
}

void AgentJoinOutbox::Send() {
  std::map<std::pair<std::string, int64_t>, Pending> ready;
  {
    absl::MutexLock lock(&mu_);
    if (pending_.empty()) return;
    ready.swap(pending_);
  }
  for (auto& [to, pending] : ready) pending.send(pending.message);
}

}  // namespace chorus
