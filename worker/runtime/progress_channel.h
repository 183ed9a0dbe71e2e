// The progress channel: how a user's program, started by chorus-rank for a
// `program` job (docs/programs.md), tells its supervising chorus-rank where
// training is, so that the supervisor's heartbeats carry the program's step,
// phase and flight recorder and the hang detector sees it like a built-in
// rank. One SOCK_SEQPACKET socket pair: the supervisor keeps one end, the
// program inherits the other and finds its number in CHORUS_PROGRESS_FD.
// Each message is the byte 'P' followed by one serialized v1::RankHeartbeat
// holding what the program knows (step, epoch, phase, phase_seconds,
// timings, loss, samples_per_second, flight_recorder); the tag keeps an
// empty record from reading like the peer's close (a sender in another
// language must write it too). The supervisor fills in job_id, generation,
// rank and time_us itself. Messages keep their boundaries, so no framing is
// needed, and a sender never blocks: a record the supervisor has no room
// for is dropped (the next one carries newer state).
//
// The other way, the supervisor passes on the coordinator's directives that
// concern an elastic program (RE_RENDEZVOUS, REFORM_AT_STEP_BOUNDARY;
// docs/elastic.md): the byte 'D' followed by one serialized v1::Directive.
// A program that does not read them loses nothing; the supervisor's sends
// never block either.
//
// The node agent uses the same channel for its ranks' heartbeats (Note
// [Heartbeats through the agent] in worker/agent/agent.cc): the agent keeps
// one end of a pair per rank, the rank process (chorus-rank) inherits the
// other and finds its number in CHORUS_AGENT_HEARTBEATS_FD; the rank sends
// its whole heartbeat as the record, and the agent passes the
// coordinator's directives for it back the same way. A rank whose agent
// takes its ranks' joins (the agent sets CHORUS_AGENT_JOINS=1) sends its
// JoinRequest there too, the byte 'J' and the serialized request, and gets
// the answer back as the byte 'A' and a serialized v1::AgentJoinAnswer
// (Note [Joins gathered by the agent] in worker/agent/agent.cc). Each kind keeps
// its own tag so that an older peer, which knows only 'P' and 'D', skips
// what it does not know as a record that does not parse.
//
// Thread-safety: a ProgressSender may be used from any thread (each Send is
// one atomic datagram; ReceiveDirective and ReceiveJoinAnswer may wait at the
// same time on different threads, each getting its own kind); a
// ProgressReceiver by one thread at a time.
//
// Example:
//   // supervisor
//   absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
//   // ... start the program with CHORUS_PROGRESS_FD=<pair->program_fd>, then
//   close(pair->program_fd);
//   ProgressReceiver receiver(pair->supervisor_fd);
//   absl::StatusOr<v1::RankHeartbeat> newest = receiver.Receive(absl::Now() + absl::Seconds(1));
//   // program
//   absl::StatusOr<std::unique_ptr<ProgressSender>> sender = ProgressSender::FromEnvironment();
//   v1::RankHeartbeat progress;
//   progress.set_step(12);
//   if (sender.ok()) (*sender)->Send(progress).IgnoreError();
#ifndef CHORUS_WORKER_RUNTIME_PROGRESS_CHANNEL_H_
#define CHORUS_WORKER_RUNTIME_PROGRESS_CHANNEL_H_

#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/env_names.h"

namespace chorus {

// The largest record a sender accepts (a heartbeat with a full flight
// recorder summary is a few KB).
inline constexpr size_t kMaxProgressRecordBytes = 64 * 1024;

struct ProgressChannelPair {
  // Close-on-exec: stays with the supervisor.
  int supervisor_fd = -1;
  // Inheritable: survives the exec of the program.
  int program_fd = -1;
};

// A new socket pair; the caller owns both descriptors.
absl::StatusOr<ProgressChannelPair> CreateProgressChannel();

// The program's end.
class ProgressSender {
 public:
  // From CHORUS_PROGRESS_FD: NOT_FOUND when it is unset (the program runs
  // outside Chorus, or under a supervisor without a channel);
  // INVALID_ARGUMENT, naming the variable, when it is not the number of an
  // open socket.
  static absl::StatusOr<std::unique_ptr<ProgressSender>> FromEnvironment();
  // The same from the environment variable `variable` (e.g.
  // kEnvAgentHeartbeatsFd): NOT_FOUND when it is unset,
  // INVALID_ARGUMENT naming it when it does not name an open channel. The
  // descriptor is made close-on-exec, so the caller's children do not
  // inherit it.
  static absl::StatusOr<std::unique_ptr<ProgressSender>> FromVariable(const char* variable);

  // Takes ownership of `fd`.
  explicit ProgressSender(int fd);
  ~ProgressSender();
  ProgressSender(const ProgressSender&) = delete;
  ProgressSender& operator=(const ProgressSender&) = delete;

  // Makes the descriptor survive this process's next exec (FromVariable
  // made it close-on-exec), for a process that hands its channel on to the
  // program it becomes (Note [The first join through the agent] in
  // worker/rank_main.cc). Records read but not yet taken stay behind.
  absl::Status KeepAcrossExec();

  // Sends one record without blocking. RESOURCE_EXHAUSTED: the supervisor
  // is behind and the record was dropped; UNAVAILABLE: the supervisor's end
  // is closed; INVALID_ARGUMENT: over kMaxProgressRecordBytes.
  absl::Status Send(const v1::RankHeartbeat& progress);

  // Waits until `deadline` for the next directive the supervisor passed on.
  // DEADLINE_EXCEEDED: none came; OUT_OF_RANGE: the supervisor's end is
  // closed; DATA_LOSS: a message that does not parse (skipped). One thread
  // at a time (Send may run beside it).
  absl::StatusOr<v1::Directive> ReceiveDirective(absl::Time deadline);

  // Sends a join to the node agent without blocking; errors as Send.
  absl::Status SendJoin(const v1::JoinRequest& join);
  // Waits until `deadline` for the next join answer the agent passed on.
  // DEADLINE_EXCEEDED: none came; OUT_OF_RANGE: the agent's end is closed.
  // One thread at a time (ReceiveDirective and Send may run beside it).
  absl::StatusOr<v1::AgentJoinAnswer> ReceiveJoinAnswer(absl::Time deadline);

 private:
  // Note [One reader, two kinds]: waits until `ready` holds (under mu_) or
  // `deadline`, reading the channel itself while no other caller does.
  // Whether `ready` holds; OK unless reading failed.
  absl::StatusOr<bool> AwaitIncoming(bool (ProgressSender::*ready)() const, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reads one message (waiting until `deadline` for it) into the queue of
  // its kind. DEADLINE_EXCEEDED when none came.
  absl::Status ReadOne(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  bool HasDirective() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !directives_.empty() || skipped_;
  }
  bool HasJoinAnswer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !answers_.empty(); }

  const int fd_;
  absl::Mutex mu_;
  // A caller is reading the channel (the others wait for what it reads).
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // A message that does not parse was skipped (told to ReceiveDirective).
  bool skipped_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::Directive> directives_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::AgentJoinAnswer> answers_ ABSL_GUARDED_BY(mu_);
};

// The supervisor's end.
class ProgressReceiver {
 public:
  // Takes ownership of `fd`.
  explicit ProgressReceiver(int fd);
  ~ProgressReceiver();
  ProgressReceiver(const ProgressReceiver&) = delete;
  ProgressReceiver& operator=(const ProgressReceiver&) = delete;

  // Waits until `deadline` for at least one record, then drains whatever
  // is queued and returns the newest. DEADLINE_EXCEEDED: none came by
  // `deadline`; OUT_OF_RANGE: every copy of the program's end is closed and
  // nothing is left; DATA_LOSS: a record that does not parse (skipped, the
  // next call goes on).
  // Joins that came with the records (agent's end only) are kept for
  // TakeJoins; one ends the wait like a record.
  absl::StatusOr<v1::RankHeartbeat> Receive(absl::Time deadline);

  // The joins Receive read since the last call, oldest first.
  std::vector<v1::JoinRequest> TakeJoins();
  // Passes a join answer to the rank without blocking; errors as
  // SendDirective.
  absl::Status SendJoinAnswer(const v1::AgentJoinAnswer& answer);

  // Passes `directive` on to the program without blocking (any thread).
  // RESOURCE_EXHAUSTED: the program is not reading them and the queue is
  // full; UNAVAILABLE: the program's end is closed.
  absl::Status SendDirective(const v1::Directive& directive);

 private:
  const int fd_;
  bool closed_ = false;
  std::vector<v1::JoinRequest> joins_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_PROGRESS_CHANNEL_H_
