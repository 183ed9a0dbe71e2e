// The names of the CHORUS_* environment variables, one constant each, for
// the code that sets and reads them: the node agent (chorus-worker) and the
// ranks it starts (chorus-rank, chorus-trainer), a `program` job's program
// through the SDK, and the chorus CLI. Each says who sets it and who reads
// it; docs/programs.md has what a program sees.
//
// Tests (*_test.cc) write most names as literals on purpose: they check the
// names a user sees, which a typo here would otherwise change unseen.
//
// Thread-safe: constants only.
//
// Example:
//   const char* job_id = std::getenv(kEnvJobId);
#ifndef CHORUS_COMMON_ENV_NAMES_H_
#define CHORUS_COMMON_ENV_NAMES_H_

namespace chorus {

// What the agent sets for each rank it starts (Agent::RankCommandFor,
// worker/agent/agent.cc); chorus-rank reads them (RankLaunchFromEnvironment,
// worker/runtime/join_generation.cc), and so does chorus-trainer, which
// chorus-rank executes in its place.

// The coordinator's HOST:PORT, or the list a:p,b:p of a cluster with
// several. Set by the agent for its ranks, and by the rank's supervisor
// again for its program (ProgramEnvironment,
// worker/runtime/program_supervisor.cc); read by chorus-rank, chorus-trainer,
// the SDK (ReadSessionEnvironment, sdk/environment.cc), and as the default
// of --coordinator by chorus and chorus-worker.
inline constexpr char kEnvCoordinator[] = "CHORUS_COORDINATOR";
// The job's id. Set by the agent, and by the supervisor for its program;
// read by chorus-rank, chorus-trainer and the SDK.
inline constexpr char kEnvJobId[] = "CHORUS_JOB_ID";
// The generation the rank was launched for. Set by the agent, and by the
// supervisor (the generation it joined) for its program; read by
// chorus-rank, chorus-trainer and the SDK.
inline constexpr char kEnvGeneration[] = "CHORUS_GENERATION";
// The agent's id, for a rank's Join. Set by the agent; read by chorus-rank,
// chorus-trainer and the SDK (a program inherits it through its supervisor).
inline constexpr char kEnvAgentId[] = "CHORUS_AGENT_ID";
// The rank's slot on its agent (the GPU of a CUDA job). Set by the agent;
// read by chorus-rank, chorus-trainer and the SDK.
inline constexpr char kEnvSlot[] = "CHORUS_SLOT";
// The CPUs the rank is bound to, as `taskset -c` writes them (unset when
// unbound). Set by the agent; no Chorus code reads it: it is for the rank's
// own programs that size thread pools (docs/cli.md).
inline constexpr char kEnvCpus[] = "CHORUS_CPUS";
// The number of the rank's end of its agent's heartbeat channel
// (Note [Heartbeats through the agent] in worker/agent/agent.cc). Set by the
// agent; read by AgentChannelFromEnvironment (worker/runtime/heartbeat_stream.cc)
// in chorus-rank and chorus-trainer. The supervisor keeps it from its
// program; chorus-rank unsets it when it cannot keep the descriptor across
// the exec of chorus-trainer.
inline constexpr char kEnvAgentHeartbeatsFd[] = "CHORUS_AGENT_HEARTBEATS_FD";
// "1" when joins may go over that channel (Note [Joins gathered by the
// agent] in worker/agent/agent.cc). Set by the agent for its ranks and by
// the supervisor for its program when its own channel takes joins; read by
// AgentJoinChannel (worker/runtime/join_generation.cc) in chorus-rank,
// chorus-trainer, the supervisor and the SDK.
inline constexpr char kEnvAgentJoins[] = "CHORUS_AGENT_JOINS";

// What a rank's supervisor sets for the program it starts (ProgramEnvironment,
// worker/runtime/program_supervisor.cc), what chorus-rank hands
// chorus-trainer, and the settings a rank reads.

// The generation's rank and world size, as RANK and WORLD_SIZE. Set by the
// supervisor; no Chorus code reads them (the SDK reads RANK and WORLD_SIZE).
inline constexpr char kEnvRank[] = "CHORUS_RANK";
inline constexpr char kEnvWorldSize[] = "CHORUS_WORLD_SIZE";
// The generation's prefix in the coordinator's key-value store. Set by the
// supervisor; read by the SDK.
inline constexpr char kEnvStoreNamespace[] = "CHORUS_STORE_NAMESPACE";
// The address a rank's traffic uses. chorus-worker sets it in its own
// environment from --rank_host, so its ranks inherit it, and the supervisor
// sets it for its program; read by chorus-rank, chorus-trainer (where its
// Gloo transport binds) and the SDK, each defaulting to 127.0.0.1.
inline constexpr char kEnvRankHost[] = "CHORUS_RANK_HOST";
// A file holding the serialized JoinResponse. Set by the supervisor; read by
// the SDK.
inline constexpr char kEnvJoinFile[] = "CHORUS_JOIN_FILE";
// The program's end of its progress channel (worker/runtime/progress_channel.h).
// Set by the supervisor; read by the SDK and ProgressSender::FromEnvironment.
inline constexpr char kEnvProgressFd[] = "CHORUS_PROGRESS_FD";
// The supervising chorus-rank's pid, which the coordinator knows the rank by.
// Set by the supervisor; read by the SDK for a staged or elastic Join.
inline constexpr char kEnvRankPid[] = "CHORUS_RANK_PID";
// A file holding the JoinResponse chorus-rank got (Note [Two binaries for a
// rank] in worker/rank_main.cc). Set by chorus-rank before it executes
// chorus-trainer; read, and unset, by chorus-trainer.
inline constexpr char kEnvRankJoined[] = "CHORUS_RANK_JOINED";
// "1": the Gloo communicator's all-reduces on one host always go through
// shared memory, without timing TCP against it; "0": never
// (worker/comm/gloo_communicator.h). Set in the environment ranks inherit by
// end-to-end tests (the same summation order in every run) and bench/ddp_bench;
// read by the Gloo communicator in chorus-trainer or a program.
inline constexpr char kEnvGlooShm[] = "CHORUS_GLOO_SHM";
// Where decoded Fashion-MNIST is cached ("off": nowhere). Set in the agent's
// environment, which its ranks inherit (deploy/systemd); read by
// DecodedCacheDir (worker/train/data.h) in chorus-trainer.
inline constexpr char kEnvDataCache[] = "CHORUS_DATA_CACHE";

// What the chorus CLI and chorus-worker read for their flags and
// credentials.

// The token itself, when no token file is given. Read by LoadClientSecurity
// (common/auth.h) in chorus, chorus-worker, chorus-rank, chorus-trainer and
// the SDK; the CLI falls back to `chorus up`'s token file only when it and
// kEnvTokenFile are unset. chorus-worker wipes and unsets its own, and the
// agent sets each rank's to its job's credential (Note [Job credentials] in
// common/job_credentials.h).
inline constexpr char kEnvToken[] = "CHORUS_TOKEN";
// A file holding the token, when --token_file is not given. Read by
// LoadClientSecurity; chorus-worker unsets it, and the agent unsets it for
// its ranks.
inline constexpr char kEnvTokenFile[] = "CHORUS_TOKEN_FILE";
// PEM files, when --tls_ca, --tls_cert, --tls_key are not given. Read by
// LoadClientSecurity; chorus-worker sets them to the absolute paths of its
// own flags, so that its ranks inherit them.
inline constexpr char kEnvTlsCa[] = "CHORUS_TLS_CA";
inline constexpr char kEnvTlsCert[] = "CHORUS_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "CHORUS_TLS_KEY";
// Defaults of chorus-worker's --slots, --bind_cpus and --rank_cgroups
// (worker/main.cc); set by the operator (deploy/).
inline constexpr char kEnvSlots[] = "CHORUS_SLOTS";
inline constexpr char kEnvBindCpus[] = "CHORUS_BIND_CPUS";
inline constexpr char kEnvRankCgroups[] = "CHORUS_RANK_CGROUPS";

// Test-only hooks, set by the end-to-end tests and benchmarks.

// A directory: chorus-trainer writes the samples each rank trains on there
// (worker/train/sample_trace.h), for tests that check that none is lost.
inline constexpr char kEnvSampleTrace[] = "CHORUS_SAMPLE_TRACE";
// A file: chorus-trainer waits for it before its first collective
// (TrainOptions::setup_gate), so that a test can lose a rank before any
// step.
inline constexpr char kEnvTestSetupGate[] = "CHORUS_TEST_SETUP_GATE";
// checkpoint:STAGE: the coordinator exits at that stage of a checkpoint
// commit (coordinator/service/server.cc).
inline constexpr char kEnvTestFailpoint[] = "CHORUS_TEST_FAILPOINT";
// The python3 the tests and bench/ddp_cuda_bench run (tests/lib.sh sets it).
inline constexpr char kEnvTestPython[] = "CHORUS_TEST_PYTHON";

}  // namespace chorus

#endif  // CHORUS_COMMON_ENV_NAMES_H_
