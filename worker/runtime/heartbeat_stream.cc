#include "worker/runtime/heartbeat_stream.h"

#include <memory>

#include "glog/logging.h"
#include "grpcpp/client_context.h"

namespace chorus {

HeartbeatStream::HeartbeatStream(v1::RankService::StubInterface& stub,
                                 std::function<v1::RankHeartbeat()> compose, Options options)
    : stub_(stub),
      compose_(std::move(compose)),
      options_(options),
      clock_(options.clock != nullptr ? *options.clock : real_clock_),
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

void HeartbeatStream::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    ++streams_opened_;
    stream_ended_ = false;
    grpc::ClientContext context;
    mu_.Unlock();
    std::unique_ptr<grpc::ClientReaderWriterInterface<v1::RankHeartbeat, v1::Directive>> stream =
        stub_.Heartbeat(&context);
    // Note [Directives are read at once]: the coordinator writes a directive
    // just before it ends the stream. A Write after the end does not fail
    // at once (gRPC accepted two more heartbeats, 3 s, against the
    // coordinator before one failed), so waiting for a failed Write to read
    // it delays RE_RENDEZVOUS and REFORM_AT_STEP_BOUNDARY by seconds. A
    // reader blocked in Read gets the directive as soon as it arrives and
    // ends the writes. (gRPC allows one Read and one Write at a time.)
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
      mu_.Unlock();
      const bool paused = options_.paused && options_.paused();
      const bool written = paused || stream->Write(compose_());
      mu_.Lock();
      if (!written) break;
      if (!paused) ++sent_;
      clock_.AwaitWithDeadline(mu_, absl::Condition(this, &HeartbeatStream::StopOrStreamEnded),
                               clock_.Now() + options_.interval);
    }
    mu_.Unlock();
    // Half-closes the stream: the coordinator then ends it, which ends the
    // reader's Read.
    stream->WritesDone();
    reader.join();
    const grpc::Status status = stream->Finish();
    mu_.Lock();
    if (!stop_) {
      LOG(WARNING) << "heartbeat stream to the coordinator ended (" << status.error_message()
                   << "); reconnecting";
      clock_.AwaitWithDeadline(mu_, absl::Condition(&stop_),
                               clock_.Now() + options_.reconnect_delay);
    }
  }
}

}  // namespace chorus
