#include "worker/runtime/heartbeat_stream.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/backoff.h"
#include "common/env_names.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"

namespace chorus {
namespace {

// How long the reader of the agent's channel waits for a directive before it
// looks whether the stream is stopping.
constexpr absl::Duration kDirectivePoll = absl::Milliseconds(100);

}  // namespace

HeartbeatStream::HeartbeatStream(v1::RankService::StubInterface& stub,
                                 std::function<v1::RankHeartbeat()> compose, Options options)
    : stub_(stub),
      compose_(std::move(compose)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : real_clock_),
      thread_([this] { Run(); }) {}

HeartbeatStream::~HeartbeatStream() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t HeartbeatStream::sent() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

int64_t HeartbeatStream::streams_opened() const {
  absl::MutexLock lock(&mu_);
  return streams_opened_;
}

bool HeartbeatStream::StopOrStreamEnded() const { return stop_ || stream_ended_; }

bool HeartbeatStream::StopOrAgentGone() const { return stop_ || agent_gone_; }

bool HeartbeatStream::WakeThroughAgent() const { return StopOrAgentGone() || send_now_; }

bool HeartbeatStream::WakeOnStream() const { return StopOrStreamEnded() || send_now_; }

void HeartbeatStream::SendNow() {
  absl::MutexLock lock(&mu_);
  send_now_ = true;
}

// Note [The last heartbeat]
// What the rank says as its stream ends is what the coordinator holds of it
// until its final report and exit. A rank whose training finished says so
// (phase FINISHED) in this last heartbeat, so that the seconds it then spends
// shutting down, silent, are not read as a hang (Note [Diagnoses during
// shutdown] in coordinator/hang/hang_detector.h); sent unless the stream is paused.
void HeartbeatStream::SendLast(const std::function<bool()>& send) {
  mu_.Unlock();
  const bool paused = options_.paused && options_.paused();
  const bool sent = !paused && send();
  mu_.Lock();
  if (sent) ++sent_;
}

void HeartbeatStream::RunThroughAgent() {
  ProgressSender& agent = *options_.agent;
  mu_.Unlock();
  // Directives come back on the channel at any time (Note [Directives are
  // read at once]); the reader waits for them a little at a time, so that it
  // sees the stream stop.
  std::thread reader([&] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (StopOrAgentGone()) return;
      }
      absl::StatusOr<v1::Directive> directive = agent.ReceiveDirective(absl::Now() + kDirectivePoll);
      if (directive.ok()) {
        if (options_.on_directive) options_.on_directive(*directive);
      } else if (absl::IsOutOfRange(directive.status())) {
        absl::MutexLock lock(&mu_);
        agent_gone_ = true;
        return;
      } else if (!absl::IsDeadlineExceeded(directive.status())) {
        LOG(WARNING) << "heartbeats through the agent: " << directive.status().message();
      }
    }
  });
  mu_.Lock();
  while (!StopOrAgentGone()) {
    send_now_ = false;
    mu_.Unlock();
    const bool paused = options_.paused && options_.paused();
    const absl::Status sent = paused ? absl::OkStatus() : agent.Send(compose_());
    mu_.Lock();
    if (absl::IsUnavailable(sent)) {
      agent_gone_ = true;
      break;
    }
    if (!sent.ok()) {
      // The agent is behind: this one is dropped, the next carries newer
      // state (and a rank the agent never hears from ages into DEAD).
      LOG_EVERY_N(WARNING, 60) << "heartbeats through the agent: " << sent.message();
    } else if (!paused) {
      ++sent_;
    }
    clock_.AwaitWithDeadline(mu_, absl::Condition(this, &HeartbeatStream::WakeThroughAgent),
                             clock_.Now() + options_.interval);
  }
  if (stop_ && !agent_gone_) SendLast([&] { return agent.Send(compose_()).ok(); });
  mu_.Unlock();
  reader.join();
  mu_.Lock();
  if (!stop_) {
    LOG(WARNING) << "the agent's heartbeat channel closed; sending heartbeats to the coordinator "
                 << "directly";
  }
}

void HeartbeatStream::Run() {
  absl::MutexLock lock(&mu_);
  if (options_.agent != nullptr) RunThroughAgent();
  BackoffOptions delays;
  delays.initial = options_.reconnect_delay / 2;
  delays.max = options_.reconnect_delay;
  Backoff backoff(delays);
  while (!stop_) {
    ++streams_opened_;
    stream_ended_ = false;
    const absl::Time opened = clock_.Now();
    grpc::ClientContext context;
    mu_.Unlock();
    std::unique_ptr<grpc::ClientReaderWriterInterface<v1::RankHeartbeat, v1::Directive>> stream =
        stub_.Heartbeat(&context);
    // Note [Directives are read at once]
    // The coordinator writes a directive just before it ends the stream. A
    // Write after the end does not fail at once (gRPC accepted two more
    // heartbeats, 3 s, against the coordinator before one failed), so waiting
    // for a failed Write to read it delays RE_RENDEZVOUS and
    // REFORM_AT_STEP_BOUNDARY by seconds. A reader blocked in Read gets the
    // directive as soon as it arrives and ends the writes. (gRPC allows one
    // Read and one Write at a time.)
    std::thread reader([&] {
      v1::Directive directive;
      while (stream->Read(&directive)) {
        if (options_.on_directive) options_.on_directive(directive);
      }
      absl::MutexLock ended(&mu_);
      stream_ended_ = true;
    });
    mu_.Lock();
    while (!StopOrStreamEnded()) {
      send_now_ = false;
      mu_.Unlock();
      const bool paused = options_.paused && options_.paused();
      const bool written = paused || stream->Write(compose_());
      mu_.Lock();
      if (!written) break;
      if (!paused) ++sent_;
      clock_.AwaitWithDeadline(mu_, absl::Condition(this, &HeartbeatStream::WakeOnStream),
                               clock_.Now() + options_.interval);
    }
    if (stop_ && !stream_ended_) SendLast([&] { return stream->Write(compose_()); });
    mu_.Unlock();
    // Half-closes the stream: the coordinator then ends it, which ends the
    // reader's Read.
    stream->WritesDone();
    reader.join();
    const grpc::Status status = stream->Finish();
    mu_.Lock();
    // A stream that worked for a while (not one a follower or a dying
    // coordinator refused at once) starts the delays over.
    if (clock_.Now() - opened >= options_.reconnect_delay) backoff.Reset();
    if (!stop_) {
      LOG(WARNING) << "heartbeat stream to the coordinator ended (" << status.error_message()
                   << "); reconnecting";
      clock_.AwaitWithDeadline(mu_, absl::Condition(&stop_), clock_.Now() + backoff.Next());
    }
  }
}

std::shared_ptr<ProgressSender> AgentChannelFromEnvironment() {
  absl::StatusOr<std::unique_ptr<ProgressSender>> channel =
      ProgressSender::FromVariable(kEnvAgentHeartbeatsFd);
  if (channel.ok()) return std::shared_ptr<ProgressSender>(*std::move(channel));
  if (!absl::IsNotFound(channel.status())) {
    LOG(WARNING) << channel.status().message()
                 << "; sending heartbeats to the coordinator directly";
  }
  return nullptr;
}

}  // namespace chorus
