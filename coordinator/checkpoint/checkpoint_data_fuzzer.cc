// Fuzz target: a session on the coordinator's checkpoint data port
// (checkpoint/wire.h), against a real CheckpointDataServer on 127.0.0.1:0
// storing into a real CheckpointStore in a scratch directory.
//
// Input: one flags byte, then the bytes the "rank" sends.
//   flags bit 0 set: the harness sends the hello itself (magic and the
//     token of an upload it opened for this input), then the bytes;
//   clear: the bytes are the whole connection (the hello included: the
//     fuzzer plays a stray or hostile client without a token).
// The harness then closes its sending side and reads the answers.
//
// Every input opens a fresh upload (a new step of job-000001, generation 1,
// rank 0; keep_last 2 keeps the store small). Properties checked:
//   - the coordinator always answers (an acceptance then a result, or one
//     refusal), with a message when it refuses;
//   - without the token nothing is accepted;
//   - an OK result means the step is committed: listed, its files present
//     with their recorded sizes and checksums (FindLoadable);
//   - a failed upload leaves no staging directory behind.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "checkpoint/wire.h"
#include "coordinator/checkpoint/checkpoint_data_server.h"
#include "coordinator/checkpoint/checkpoint_grant.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/checkpoint/checkpoint_uploads.h"
#include "coordinator/state/state_store.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"
#include "glog/logging.h"

namespace chorus {
namespace {

constexpr char kJob[] = "job-000001";

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_data_fuzzer: %s\n", what.c_str());
  std::abort();
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

// The coordinator side, built once per process.
struct Coordinator {
  std::string root;
  std::unique_ptr<StateStore> state;
  std::unique_ptr<CheckpointStore> store;
  UploadGrant grant;
  std::unique_ptr<CheckpointUploads> uploads;
  std::unique_ptr<CheckpointDataServer> server;
  int64_t next_step = 1;
};

Coordinator& TheCoordinator() {
  static Coordinator* const c = [] {
    auto* c = new Coordinator;
    // Fatal messages only: the store logs every commit and refusal.
    FLAGS_minloglevel = google::GLOG_FATAL;
    const std::string dir = ScratchDir() + "/data_port";
    c->root = dir + "/checkpoints";
    c->state = OrDie(StateStore::Open(dir), "state store");
    c->store = std::make_unique<CheckpointStore>(c->root, *c->state);
    if (absl::Status s = c->store->Recover(); !s.ok()) Fail(s.ToString());
    c->grant.manifest.set_job_id(kJob);
    c->grant.manifest.set_world_size(1);
    c->grant.manifest.set_strategy("ddp");
    c->grant.manifest.set_generation(1);
    c->grant.keep_last = 2;
    c->uploads = std::make_unique<CheckpointUploads>(
        *c->store, [c](const std::string& job_id, int64_t generation, int rank) {
          if (job_id != kJob) return absl::StatusOr<UploadGrant>(absl::NotFoundError(job_id));
          return CheckUploader(c->grant, generation, rank);
        });
    CheckpointDataServer::Options options;
    options.io_timeout = absl::Seconds(5);
    c->server =
        OrDie(CheckpointDataServer::Start("127.0.0.1", 0, *c->uploads, options), "data server");
    c->uploads->set_data_port(c->server->port());
    // The server lives as long as the process; its connection threads are
    // joined at exit (ThreadSanitizer reports threads left unjoined).
    std::atexit([] { TheCoordinator().server->Shutdown(); });
    return c;
  }();
  return *c;
}

// libFuzzer's timeout alarm (SIGALRM every second) interrupts system calls:
// the harness rides them out as a rank must.
int ConnectTo(int port) {
  const int fd = OrDie(ConnectTcp("127.0.0.1", port, absl::Seconds(20)), "the data port");
  // Generous: the server bounds its own reads by 5 s.
  SetReceiveTimeout(fd, absl::Seconds(20));
  SetSendTimeout(fd, absl::Seconds(20));
  return fd;
}

void CheckNoStaging(const std::string& job_dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(job_dir, ec)) {
    if (e.path().filename().string().rfind(".staging-", 0) == 0) {
      Fail("a failed upload left " + e.path().string());
    }
  }
}

void Session(FuzzInput& in) {
  Coordinator& c = TheCoordinator();
  const bool with_token = (in.Byte() & 1) != 0;
  const std::string bytes = in.Rest();
  const int64_t step = c.next_step++;

  v1::OpenUploadRequest open;
  open.set_job_id(kJob);
  open.set_generation(1);
  open.set_rank(0);
  open.set_step(step);
  const v1::OpenUploadResponse opened = OrDie(c.uploads->Open(open), "OpenUpload");

  const int fd = ConnectTo(c.server->port());
  // The peer may stop reading at the first error: what is left unsent then
  // is of no interest.
  if (with_token) {
    (void)SendAll(fd, {absl::string_view(kHelloMagic, kHelloMagicBytes), opened.token(), bytes},
                  "the session");
  } else {
    (void)SendAll(fd, {bytes}, "the session");
  }
  ::shutdown(fd, SHUT_WR);
  absl::Status answer;
  if (absl::Status s = ReceiveReply(fd, &answer); !s.ok()) Fail("no answer: " + s.ToString());
  const bool accepted = answer.ok();
  if (accepted) {
    if (!with_token) Fail("a connection without the token was accepted");
    if (absl::Status s = ReceiveReply(fd, &answer); !s.ok()) {
      Fail("no result after the acceptance: " + s.ToString());
    }
  }
  if (!answer.ok() && answer.message().empty()) Fail("a refusal without a reason");
  // The server closes the connection once the upload is dropped or
  // committed: after EOF, the store is as the answer says.
  char sink[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(fd);
  // An upload nobody connected for is dropped now rather than at its expiry.
  (void)c.uploads->TakeOpened(opened.token());

  if (answer.ok()) {
    std::vector<std::string> skipped;
    const v1::CheckpointManifest m =
        OrDie(c.store->FindLoadable(kJob, step, &skipped), "the committed step cannot be loaded");
    if (m.step() != step || m.files_size() == 0) Fail("the committed manifest is wrong");
  } else {
    std::vector<std::string> skipped;
    if (c.store->FindLoadable(kJob, step, &skipped).ok()) {
      Fail("a failed upload was committed: " + answer.ToString());
    }
  }
  CheckNoStaging(c.root + "/" + kJob);
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::FuzzInput in(data, size);
  chorus::Session(in);
  return 0;
}
