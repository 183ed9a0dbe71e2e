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
// Note [Hostile peers on the data port]
// The port is plaintext TCP anyone on the host (or network) may reach, so every
// way a peer can hold resources is bounded:
//   - a peer that connects and sends nothing is dropped after
//     hello_timeout; and when max_connections are open, the oldest
//     connection still waiting for its hello is dropped to make room, so a
//     flood of idle connections cannot lock real ranks out (a rank sends
//     its hello at once);
//   - a header beyond the wire limits (checkpoint/wire.h: a chunk over
//     4 MB, a name over 1 KB) or promising more than max_upload_bytes in
//     all is refused at once, before any of its data is read;
//   - a peer that stops sending mid-upload is dropped after io_timeout;
//   - every refused or dropped upload's staging files are deleted.
//
// Thread-safety: one thread accepts, one thread serves each connection (at
// most max_connections at once, plus the dropped ones while they close);
// Shutdown() may be called from any thread.
//
// Example:
//   ASSIGN_OR_RETURN(auto data, CheckpointDataServer::Start("127.0.0.1", 0, uploads));
//   uploads.set_data_port(data->port());
#ifndef CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_DATA_SERVER_H_
#define CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_DATA_SERVER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint/checkpoint_uploads.h"

namespace chorus {

class CheckpointDataServer {
 public:
  static constexpr int kMaxConnections = 256;
  static constexpr int kDefaultMaxUploads = 32;
  static constexpr int64_t kDefaultMaxUploadBytes = int64_t{64} << 30;

  struct Options {
    // Bounds each send and receive on a connection once its upload runs (a
    // rank that stops sending frees its connection after it).
    absl::Duration io_timeout = absl::Minutes(1);
    // How long a new connection may take to send its hello.
    absl::Duration hello_timeout = absl::Seconds(10);
    // Uploads receiving at once; one more is answered RESOURCE_EXHAUSTED.
    int max_uploads = kDefaultMaxUploads;
    // Connections served at once (most wait to be told RESOURCE_EXHAUSTED);
    // beyond it the oldest one still waiting for its hello is dropped, or,
    // when there is none, the new one is closed at once.
    int max_connections = kMaxConnections;
    // Largest checkpoint (all files of one upload) taken, in bytes
    // (--checkpoint_max_upload_bytes).
    int64_t max_upload_bytes = kDefaultMaxUploadBytes;
  };

  // Listens on host:port (port 0: any free port). UNAVAILABLE if the port
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<CheckpointDataServer>> Start(const std::string& host,
                                                                     int port,
                                                                     CheckpointUploads& uploads,
                                                                     Options options);
  // With the default Options.
  static absl::StatusOr<std::unique_ptr<CheckpointDataServer>> Start(const std::string& host,
                                                                     int port,
                                                                     CheckpointUploads& uploads);
  ~CheckpointDataServer();  // Shutdown()
  CheckpointDataServer(const CheckpointDataServer&) = delete;
  CheckpointDataServer& operator=(const CheckpointDataServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, cuts the open connections (their uploads are dropped)
  // and waits for their threads.
  void Shutdown();

 private:
  CheckpointDataServer(int listen_fd, int port, CheckpointUploads& uploads, Options options)
      : listen_fd_(listen_fd), port_(port), checkpoint_uploads_(uploads), options_(options) {}
  struct Connection {
    int fd = -1;  // -1 once closed
    bool done = false;
    bool past_hello = false;  // its hello arrived: no longer dropped to make room
    bool evicted = false;     // dropped to make room (its fd is shut down)
    std::thread thread;
  };

  void AcceptLoop();
  // One connection, start to end; closes it.
  void Serve(int fd, Connection* connection);
  // Serve's parts: the hello's upload token; the connection past its hello
  // with an upload slot taken (UNAVAILABLE if it was dropped,
  // RESOURCE_EXHAUSTED if no slot is free); an accepted upload received and
  // completed.
  absl::StatusOr<std::string> ReadHello(int fd);
  absl::Status Admit(Connection* connection) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Receive(int fd, CheckpointUploads::Started opened);
  // Answers `status` and closes `fd`. After an error it first reads (and
  // drops) what the peer still sends, for a moment, so that the answer is
  // not lost to a reset.
  void AnswerAndClose(int fd, Connection* connection, const absl::Status& status);

  // Makes room for one more connection (a lock holder's part of
  // Note [Hostile peers on the data port]); false if there is none.
  bool MakeRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int listen_fd_;
  const int port_;
  CheckpointUploads& checkpoint_uploads_;
  const Options options_;
  std::thread acceptor_;
  absl::Mutex join_mu_;  // held while Shutdown joins threads
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  int uploads_ ABSL_GUARDED_BY(mu_) = 0;           // connections past their hello, sending
  int64_t idle_dropped_ ABSL_GUARDED_BY(mu_) = 0;  // to make room, for the log
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_DATA_SERVER_H_
