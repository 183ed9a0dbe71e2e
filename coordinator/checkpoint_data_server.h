// CheckpointDataServer: the coordinator's checkpoint data port, a TCP
// listener beside gRPC that takes the bytes of checkpoint uploads opened
// with CheckpointService.OpenUpload (protocol: checkpoint/wire.h),
// completed through CheckpointUploads like every other upload.
// Each connection presents an upload's token; if the upload may start, it is
// told so (an OK answer), streams its files into the upload
// (CheckpointStore::Upload: per-chunk and per-file CRC-32C checks, fsync)
// and gets the commit's status back. At most `max_uploads` run at once; one
// more is answered RESOURCE_EXHAUSTED before it sends data (its token stays
// valid; ranks then upload over gRPC). A connection that sends anything
// wrong gets the error and is closed; what it sent is deleted.
//
// Thread-safety: one thread accepts, one thread serves each connection (at
// most kMaxConnections at once); Shutdown() may be called from any thread.
//
// Example:
//   ASSIGN_OR_RETURN(auto data, CheckpointDataServer::Start("127.0.0.1", 0, uploads));
//   uploads.set_data_port(data->port());
#ifndef CHORUS_COORDINATOR_CHECKPOINT_DATA_SERVER_H_
#define CHORUS_COORDINATOR_CHECKPOINT_DATA_SERVER_H_

#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

class CheckpointUploads;

class CheckpointDataServer {
 public:
  // Connections served at once (most wait to be told RESOURCE_EXHAUSTED);
  // beyond it a new connection is closed at once.
  static constexpr int kMaxConnections = 256;
  static constexpr int kDefaultMaxUploads = 32;
  // How long a new connection may take to send its hello.
  static constexpr absl::Duration kHelloTimeout = absl::Seconds(10);

  // Listens on host:port (port 0: any free port). `io_timeout` bounds each
  // send and receive on a connection (a rank that stops sending frees its
  // connection after it). UNAVAILABLE if the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<CheckpointDataServer>> Start(
      const std::string& host, int port, CheckpointUploads& uploads,
      absl::Duration io_timeout = absl::Minutes(1), int max_uploads = kDefaultMaxUploads);
  ~CheckpointDataServer();  // Shutdown()
  CheckpointDataServer(const CheckpointDataServer&) = delete;
  CheckpointDataServer& operator=(const CheckpointDataServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, cuts the open connections (their uploads are dropped)
  // and waits for their threads.
  void Shutdown();

 private:
  CheckpointDataServer(int listen_fd, int port, CheckpointUploads& uploads,
                       absl::Duration io_timeout, int max_uploads)
      : listen_fd_(listen_fd),
        port_(port),
        checkpoint_uploads_(uploads),
        io_timeout_(io_timeout),
        max_uploads_(max_uploads) {}
  struct Connection {
    int fd = -1;  // -1 once closed
    bool done = false;
    std::thread thread;
  };

  void AcceptLoop();
  // One connection, start to end; closes it.
  void Serve(int fd, Connection* connection);
  // Answers `status` and closes `fd`. After an error it first reads (and
  // drops) what the peer still sends, for a moment, so that the answer is
  // not lost to a reset.
  void AnswerAndClose(int fd, Connection* connection, const absl::Status& status);

  const int listen_fd_;
  const int port_;
  CheckpointUploads& checkpoint_uploads_;
  const absl::Duration io_timeout_;
  const int max_uploads_;
  std::thread acceptor_;
  absl::Mutex join_mu_;  // held while Shutdown joins threads
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  int uploads_ ABSL_GUARDED_BY(mu_) = 0;  // connections past their hello, sending
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_DATA_SERVER_H_
