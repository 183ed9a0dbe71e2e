// The checkpoint data connection: how a rank streams checkpoint files to the
// coordinator's checkpoint data port, a plain TCP listener beside gRPC. The
// bytes go from the snapshot's memory into the socket and from the socket
// into the file, with no message framing, serialization or HTTP/2 flow
// control in between (over gRPC, a 200 MB checkpoint was copied three more
// times on the way).
//
// Protocol, after CheckpointService.OpenUpload granted the upload and
// returned a port and a single-use token:
//   rank -> coordinator
//     hello   kHelloMagic (8 bytes) + the token (kTokenBytes)
//     chunks  a kChunkHeaderBytes header, then the file name (first chunk of
//             each file only: name_len > 0), then data_len bytes of data;
//             the last chunk of a file has kLast and the file's size and
//             CRC-32C; a chunk may carry no data
//     end     a header with kEndOfUpload and nothing else
//   coordinator -> rank: a reply after the hello: OK (send the files) or why
//     not (unknown token; RESOURCE_EXHAUSTED: too many uploads running, use
//     gRPC); then a reply after the commit, or at the first error (after
//     which it reads no further and closes)
//     reply   absl::StatusCode (4 bytes), message length (4 bytes), message
// Integers are little-endian. The coordinator checks every chunk's CRC-32C
// and each file's size and CRC-32C as for Upload.
//
// Example (rank side):
//   ASSIGN_OR_RETURN(auto upload, CheckpointDataUpload::Connect(host, port, token,
//   absl::Seconds(5),
//                                                               absl::Minutes(5)));
//   RETURN_IF_ERROR(upload->BeginFile("model.pt"));
//   RETURN_IF_ERROR(upload->Write(bytes));
//   RETURN_IF_ERROR(upload->EndFile());
//   RETURN_IF_ERROR(upload->Finish());  // the coordinator's commit status
#ifndef CHORUS_CHECKPOINT_WIRE_H_
#define CHORUS_CHECKPOINT_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace chorus {

inline constexpr char kHelloMagic[] = "CHORUSD1";  // 8 bytes on the wire, no NUL
inline constexpr size_t kHelloMagicBytes = 8;
inline constexpr size_t kTokenBytes = 32;
inline constexpr size_t kChunkHeaderBytes = 32;
// Limits the receiver enforces (a header beyond them is a protocol error).
inline constexpr uint32_t kMaxChunkDataBytes = 4u << 20;
inline constexpr uint16_t kMaxFileNameBytes = 1024;
inline constexpr size_t kMaxReplyMessageBytes = 64 << 10;

struct ChunkHeader {
  static constexpr uint8_t kLast = 1;         // last chunk of its file
  static constexpr uint8_t kEndOfUpload = 2;  // no more files: commit
  uint32_t data_len = 0;
  uint32_t chunk_crc32c = 0;
  uint64_t offset = 0;       // in the file
  uint64_t file_size = 0;    // with kLast
  uint32_t file_crc32c = 0;  // with kLast
  uint16_t name_len = 0;
  uint8_t flags = 0;
};

// Byte layout: data_len@0 crc@4 offset@8 file_size@16 file_crc@24
// name_len@28 flags@30, byte 31 zero.
void EncodeChunkHeader(const ChunkHeader& header, char out[kChunkHeaderBytes]);
// INVALID_ARGUMENT for a header beyond the limits or with unknown flags.
absl::Status DecodeChunkHeader(const char in[kChunkHeaderBytes], ChunkHeader* header);

// The coordinator's answer for `status`.
std::string EncodeReply(const absl::Status& status);

// Sends all of `parts` on a blocking socket (MSG_NOSIGNAL); UNAVAILABLE
// naming `what` when the peer is gone or the send timed out.
absl::Status SendAll(int fd, std::initializer_list<absl::string_view> parts,
                     absl::string_view what);
// Receives exactly `n` bytes; UNAVAILABLE naming `what` on end of stream,
// timeout or error.
absl::Status ReceiveAll(int fd, char* out, size_t n, absl::string_view what);
// Reads a reply into `answer` (the status it carries); UNAVAILABLE if none
// could be read.
absl::Status ReceiveReply(int fd, absl::Status* answer);

// Socket options of a data connection (both ends): bounds on each blocking
// send and receive (SO_SNDTIMEO / SO_RCVTIMEO), and no Nagle delay for the
// small headers and answers.
void SetSendTimeout(int fd, absl::Duration timeout);
void SetReceiveTimeout(int fd, absl::Duration timeout);
void SetNoDelay(int fd);

// A random token (kTokenBytes, from the kernel's generator).
absl::StatusOr<std::string> NewUploadToken();

// A connected TCP socket (blocking, close-on-exec) to host:port, host as in
// a gRPC target (name, IPv4, or IPv6 with or without brackets); UNAVAILABLE
// naming the address if it cannot be reached within `connect_timeout`.
// Signals during the connect are ridden out.
absl::StatusOr<int> ConnectTcp(const std::string& host, int port,
                               absl::Duration connect_timeout);

// Rank side: one upload over the data connection. Small writes are gathered
// into chunks of up to kGatherBytes; large ones are sent straight from the
// caller's memory in chunks of up to kSendBytes.
class CheckpointDataUpload {
 public:
  static constexpr size_t kGatherBytes = 1 << 20;
  static constexpr size_t kSendBytes = kMaxChunkDataBytes;

  // Connects to host:port (host as in a gRPC target: name, IPv4, or IPv6
  // with or without brackets), presents `token` and waits for the
  // coordinator to accept the upload. UNAVAILABLE if the port cannot be
  // reached within `connect_timeout` (or the connection breaks); the
  // coordinator's refusal otherwise (RESOURCE_EXHAUSTED: too many uploads,
  // PERMISSION_DENIED: unknown or expired token). Each later send or
  // receive may take up to `timeout`.
  static absl::StatusOr<std::unique_ptr<CheckpointDataUpload>> Connect(
      const std::string& host, int port, absl::string_view token, absl::Duration connect_timeout,
      absl::Duration timeout);
  ~CheckpointDataUpload();
  CheckpointDataUpload(const CheckpointDataUpload&) = delete;
  CheckpointDataUpload& operator=(const CheckpointDataUpload&) = delete;

  absl::Status BeginFile(const std::string& name);
  // The next bytes of the current file; `bytes` is not referenced after
  // the call returns.
  absl::Status Write(absl::string_view bytes);
  // Sends what is gathered as the file's last chunk, with its size and CRC-32C.
  absl::Status EndFile();
  // No more files: waits for the coordinator's commit and returns its status.
  absl::Status Finish();

  int64_t bytes_sent() const { return bytes_sent_; }
  // Time spent blocked sending (the rest of the upload is the caller's).
  absl::Duration send_time() const { return send_time_; }

 private:
  explicit CheckpointDataUpload(int fd) : fd_(fd) {}
  // Sends `data` as one chunk of the current file (with the file's name if
  // it is the file's first).
  absl::Status SendChunk(absl::string_view data, bool last);
  // After a failed send: the coordinator's reason if it sent one (it
  // answers an error and closes), else `send_error`.
  absl::Status ReasonFor(const absl::Status& send_error);
  // Whether the coordinator has answered (or closed) already.
  bool Answered() const;

  int fd_;
  bool failed_ = false;
  std::string gather_;
  std::string file_name_;
  bool first_chunk_ = true;
  uint64_t offset_ = 0;
  uint32_t file_crc_ = 0;
  int64_t bytes_sent_ = 0;
  absl::Duration send_time_;
};

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_WIRE_H_
