#include "coordinator/agent_join_outbox.h"

#include <utility>
#include <vector>

#include "common/join_answers.h"

namespace chorus {

Rendezvous::Done AgentJoinOutbox::DoneFor(const std::string& agent_id, AgentSender send,
                                          const v1::JoinRequest& request) {
  return [this, agent_id, send = std::move(send), job_id = request.job_id(), slot = request.slot(),
          asked = request.generation()](absl::StatusOr<v1::JoinResponse> answer) {
    absl::MutexLock lock(&mu_);
    Pending& pending = pending_[agent_id];
    if (!pending.send) pending.send = send;
    AddJoinAnswer(job_id, slot, asked, std::move(answer), *pending.message.mutable_joined());
  };
}

void AgentJoinOutbox::Send() {
  std::map<std::string, Pending> ready;
  {
    absl::MutexLock lock(&mu_);
    if (pending_.empty()) return;
    ready.swap(pending_);
  }
  for (auto& [agent_id, pending] : ready) pending.send(pending.message);
}

}  // namespace chorus
