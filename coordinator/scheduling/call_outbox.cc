#include "coordinator/scheduling/call_outbox.h"

namespace chorus {

void CallOutbox::Flush() {
  writes.Run();
  for (auto& [send, message] : messages) send(message);
  std::vector<std::string> unrecorded;
  for (Launch& launch : launches) {
    if (!*launch.recorded) {
      unrecorded.push_back(launch.job_id);
      continue;
    }
    for (auto& [send, message] : launch.messages) send(message);
  }
  for (auto& [done, result] : joins) done(std::move(result));
  messages.clear();
  launches.clear();
  joins.clear();
  agent_joins.Send();  // what the joins above recorded for agents
  if (settling.empty() && unrecorded.empty() && !requeued) return;
  const std::vector<std::string> settled = std::move(settling);
  settling.clear();
  const bool place_requeued = requeued;
  requeued = false;
  if (after_writes) after_writes(settled, unrecorded, place_requeued);
}

}  // namespace chorus
