#include "coordinator/service/leader_loop.h"

#include <utility>

#include "common/status_macros.h"
#include "glog/logging.h"

namespace chorus {

LeaderLoop::LeaderLoop(Leadership& leadership, Options options)
    : leadership_(leadership), options_(std::move(options)) {}

bool LeaderLoop::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool LeaderLoop::leading() const {
  absl::MutexLock lock(&mu_);
  return leading_;
}

int64_t LeaderLoop::leader_changes() const {
  absl::MutexLock lock(&mu_);
  return leader_changes_;
}

void LeaderLoop::SetLeading(bool leading) {
  absl::MutexLock lock(&mu_);
  if (leading_ != leading) ++leader_changes_;
  leading_ = leading;
}

void LeaderLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // Campaign and WaitUntilLost return; leadership, if held, is given up.
  leadership_.Stop();
}

absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> LeaderLoop::StartOn(const Starter& starter) {
  ASSIGN_OR_RETURN(std::unique_ptr<Serving> serving, starter(ports_));
  if (!listening_) {
    listening_ = true;
    ports_ = Ports{serving->port(), serving->http_port()};
    if (options_.on_listening) options_.on_listening(ports_);
  }
  return serving;
}

absl::Status LeaderLoop::FollowUntilElected() {
  std::unique_ptr<Serving> follower;
  if (options_.start_follower) {
    ASSIGN_OR_RETURN(follower, StartOn(options_.start_follower));
  }
  const absl::Status won = leadership_.Campaign();
  // Stopped before the full server binds the same ports.
  if (follower != nullptr) follower->Shutdown(absl::ZeroDuration());
  return won;
}

absl::Status LeaderLoop::Run() {
  while (!stopping()) {
    if (absl::Status won = FollowUntilElected(); !won.ok()) {
      if (stopping()) break;
      return won;
    }
    // Leading before it serves: the first call the full server answers, and
    // its first scrape (chorus_leader), find it leading. Set after, a test
    // under load saw a call answered while leading() was still false.
    SetLeading(true);
    absl::StatusOr<std::unique_ptr<Serving>> leader = StartOn(options_.start_leader);
    if (!leader.ok()) {
      SetLeading(false);
      // Another coordinator may manage where this one cannot.
      leadership_.Resign();
      return leader.status();
    }
    leadership_.WaitUntilLost();
    const bool stop = stopping();
    if (!stop) LOG(WARNING) << "leadership lost: stopping the coordinator's services at once";
    // Lost: no call may go on writing. Stopped: calls in flight may finish.
    (*leader)->Shutdown(stop ? options_.stop_grace : absl::ZeroDuration());
    leader->reset();
    SetLeading(false);
  }
  return absl::OkStatus();
}

}  // namespace chorus
