// ProgramSupervisor: what chorus-rank becomes for a `program` job
// (JobSpec.program, docs/programs.md). After the rank has joined its
// generation it starts the user's program as its child and stays beside it
// as the rank's link to the coordinator:
//
//   - rank 0 picks MASTER_PORT (a free TCP port on its CHORUS_RANK_HOST) and
//     publishes "host:port" in the generation's store; the others wait for it;
//   - the child gets torchrun's variables, the CHORUS_* ones (ProgramEnvironment),
//     a file holding the JoinResponse (CHORUS_JOIN_FILE) and its end of the
//     progress channel (CHORUS_PROGRESS_FD, progress_channel.h);
//   - heartbeats carry the newest progress record the program sent; while the
//     child is stopped (SIGSTOP: state 'T' in /proc/PID/stat) none are sent,
//     so the coordinator diagnoses the rank DEAD;
//   - an elastic program joins later generations itself (the SDK's
//     Session::JoinNextGeneration): its records then carry a newer
//     generation and rank, and the heartbeats and final report follow them;
//     the directives that concern it (RE_RENDEZVOUS, REFORM_AT_STEP_BOUNDARY)
//     are passed on over the progress channel, and a program that left the
//     job at a drain (record.left_job) gets no final report;
//   - SIGTERM and SIGUSR1 that reach the supervisor are passed on (SIGUSR1
//     only to a program that handles it: by default it would kill it); an
//     ABORT directive stops the child (SIGTERM, then SIGKILL after a grace);
//   - when the child ends, the final Report says how (success iff exit 0).
//
// The child shares the supervisor's process group (the agent's group
// signals reach both) and inherits its stdout/stderr (its lines reach
// `chorus logs` and the failure reason like a built-in rank's).
//
// Thread-safety: Run() once, from one thread. The helper functions are pure
// or touch only their arguments.
//
// Example:
//   ProgramSupervisor::Options options;
//   options.rank = {joined, job_id, coordinator, rank_host};
//   options.store = &store;          // the generation's namespace
//   options.ranks = ranks_stub.get();
//   options.terminate_requests = &g_terminate_requests;  // bumped by a SIGTERM handler
//   ProgramSupervisor supervisor(std::move(options));
//   absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
//   return outcome.ok() ? outcome->ExitCode() : 1;
#ifndef CHORUS_WORKER_RUNTIME_PROGRAM_SUPERVISOR_H_
#define CHORUS_WORKER_RUNTIME_PROGRAM_SUPERVISOR_H_

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/host_port.h"
#include "worker/comm/store.h"
#include "worker/runtime/master_address.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {

class ProgressReceiver;


// The rank as it joined: what its program's environment is made of.
struct ProgramRank {
  v1::JoinResponse joined;
  std::string job_id;
  std::string coordinator;  // HOST:PORT, as CHORUS_COORDINATOR
  std::string rank_host;    // CHORUS_RANK_HOST: this rank's address
  // The supervising chorus-rank's pid, the one the coordinator knows the
  // rank by (CHORUS_RANK_PID; 0: not set).
  pid_t supervisor_pid = 0;
};

// Note [torchrun's variables]
// A program gets every variable torchrun's agent gives its workers, with
// the values it would give, so that a script written for torchrun runs
// unchanged, restarts included (Note [Restart-all] in
// coordinator/scheduling/running_job.h):
//  - RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
//  - GROUP_RANK / GROUP_WORLD_SIZE: torchrun runs one worker group (agent)
//    per node; here the rank's agent among the generation's agents, and
//    their number (JoinResponse.group_rank, group_world_size);
//  - ROLE_NAME "default" (torchrun's --role default), ROLE_RANK and
//    ROLE_WORLD_SIZE: every rank has the one role, so they equal RANK and
//    WORLD_SIZE;
//  - TORCHELASTIC_RESTART_COUNT: failures the job has survived so far (0 in
//    the first generation; a drain or a growth does not count, as torchrun's
//    membership changes do not); TORCHELASTIC_MAX_RESTARTS: the spec's
//    elastic.max_restarts (0 without an elastic block);
//    TORCHELASTIC_RUN_ID: the job id (torchrun's rendezvous run id);
//  - TORCHELASTIC_USE_AGENT_STORE "False": no agent hosts a store at
//    MASTER_PORT (torchrun's static rendezvous does), so the program's rank
//    0 starts its own there, as init_process_group("env://") does by
//    default;
//  - NCCL_ASYNC_ERROR_HANDLING "1" unless the agent's environment or
//    program.env sets it (torchrun's default).
// torchrun's TORCHELASTIC_ERROR_FILE (where a @record-decorated script
// writes its exception) is not set: a failure's reason quotes the
// program's last output lines instead.

// What ROLE_NAME holds: torchrun's default role.
inline constexpr char kProgramRoleName[] = "default";

// The program's environment: `base` ("NAME=value" entries, e.g. the
// supervisor's own), then the spec's program.env, then what Chorus sets
// (each replacing an entry of the same name): RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, torchrun's other variables
// (Note [torchrun's variables]), CHORUS_COORDINATOR,
// CHORUS_JOB_ID, CHORUS_GENERATION, CHORUS_RANK, CHORUS_WORLD_SIZE,
// CHORUS_STORE_NAMESPACE, CHORUS_RANK_HOST, CHORUS_JOIN_FILE,
// CHORUS_RANK_PID (when rank.supervisor_pid is set) and CHORUS_PROGRESS_FD
// (omitted when `progress_fd` < 0). CHORUS_TOKEN, the TLS variables and the
// agent's CHORUS_AGENT_ID and CHORUS_SLOT (an elastic program's Join names
// them) pass through from `base`.
std::vector<std::string> ProgramEnvironment(const std::vector<std::string>& base,
                                            const ProgramRank& rank, const HostPort& master,
                                            const std::string& join_file, int progress_fd);

// How the program ended.
struct ProgramOutcome {
  pid_t pid = 0;          // the program's; 0 if it never started
  bool signaled = false;  // killed by `signal`; otherwise exited with `exit_code`
  int exit_code = 0;
  int signal = 0;

  static ProgramOutcome FromWaitStatus(pid_t pid, int wait_status);
  bool ok() const { return !signaled && exit_code == 0; }
  // OK, or UNKNOWN naming the program (argv[0]), its pid and the exit code
  // or signal: "the program /usr/bin/python3 (pid 412) exited with code 3".
  absl::Status ToStatus(const std::string& program) const;
  // What the supervisor exits with: the child's code, 128 + signal.
  int ExitCode() const { return signaled ? 128 + signal : exit_code; }
};

// The final ReportRequest for `outcome` (final, success iff ok()). Its
// metrics are the progress of the program's newest record (`newest`: step,
// epoch, loss, throughput; none when it reported no step), which the
// coordinator lays over the metrics the program reported along the way: the
// last steps of a program that ends between two heartbeats still count.
v1::ReportRequest FinalReport(const ProgramRank& rank, const ProgramOutcome& outcome,
                              const std::string& program,
                              const v1::RankHeartbeat& newest = v1::RankHeartbeat());

// Whether `pid` is stopped (state 'T' or 't' in /proc/PID/stat); false when
// it cannot be read (gone).
bool IsProcessStopped(pid_t pid);

// Whether `pid` has a handler for `signal` (the SigCgt mask in
// /proc/PID/status); false when it cannot be read.
bool CatchesSignal(pid_t pid, int signal);

class ProgramSupervisor {
 public:
  struct Options {
    ProgramRank rank;
    // The generation's store (MASTER_PORT). Not owned; must outlive Run().
    Store* store = nullptr;
    // Heartbeats and the final report. Not owned; must outlive Run().
    v1::RankService::StubInterface* ranks = nullptr;
    // This rank's end of its agent's heartbeat channel
    // (AgentChannelFromEnvironment()); null: heartbeats go straight to the
    // coordinator through `ranks`.
    std::shared_ptr<ProgressSender> agent_heartbeats;
    // The supervisor's environment as "NAME=value"; empty: `environ`.
    std::vector<std::string> base_environment;
    // Where the join file goes; empty: $TMPDIR or /tmp.
    std::string join_file_dir;
    // How long ranks other than 0 wait for MASTER_PORT.
    absl::Duration master_wait = absl::Minutes(5);
    absl::Duration heartbeat_interval = absl::Seconds(1);
    // After an ABORT directive: SIGTERM, then SIGKILL after this.
    absl::Duration kill_grace = absl::Seconds(5);
    // How long the final report is retried (the coordinator may restart).
    absl::Duration report_deadline = absl::Minutes(1);
    // Counters a signal handler bumps (may be null): each increase is passed
    // on to the child as SIGTERM / SIGUSR1.
    std::atomic<int64_t>* terminate_requests = nullptr;
    std::atomic<int64_t>* checkpoint_requests = nullptr;
  };

  explicit ProgramSupervisor(Options options);
  ProgramSupervisor(const ProgramSupervisor&) = delete;
  ProgramSupervisor& operator=(const ProgramSupervisor&) = delete;

  // Starts the program, supervises it until it ends, sends the final report
  // and returns how it ended. An error when it could not be started (the
  // master address was not agreed, the binary could not be executed, ...):
  // then a failed final report was sent already.
  absl::StatusOr<ProgramOutcome> Run();

  // The child's pid once Run() has started it; 0 before.
  pid_t child_pid() const { return child_.load(); }

 private:
  class Progress;
  // A started program: its pid, our end of its progress channel, and its
  // join file (removed when this goes).
  struct Launched {
    struct RemovedFile {
      std::string path;
      RemovedFile() = default;
      RemovedFile(RemovedFile&& other) noexcept : path(std::move(other.path)) {
        other.path.clear();
      }
      ~RemovedFile() {
        if (!path.empty()) ::unlink(path.c_str());
      }
    };
    pid_t pid = 0;
    std::unique_ptr<ProgressReceiver> receiver;
    RemovedFile join_file;
  };
  // The stop and checkpoint requests passed on so far, and whether the
  // program is being stopped.
  struct Requests {
    int64_t terminates = 0;
    int64_t checkpoints = 0;
    bool terminating = false;
  };

  // Agrees the master address, writes the join file, opens the progress
  // channel and starts `binary`.
  absl::StatusOr<Launched> Launch(const std::string& binary);
  // Heartbeats the program's progress and passes requests and the
  // coordinator's directives on until it exits; its wait status.
  int Supervise(Launched& launched, Progress& progress, Requests& seen);
  // Sends the program the stop (SIGTERM) and checkpoint (SIGUSR1, if it
  // handles it) requests that came since `seen`.
  void PassOnRequests(pid_t pid, Requests& seen);
  // The program could not be started (`why`): a failed final report, and
  // `why` back.
  absl::Status Refuse(const absl::Status& why, const std::string& shown);
  // Retried while the coordinator is unreachable, for up to `deadline`.
  absl::Status SendFinalReport(const v1::ReportRequest& request, absl::Duration deadline);

  const Options options_;
  std::atomic<pid_t> child_{0};
};

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_PROGRAM_SUPERVISOR_H_
