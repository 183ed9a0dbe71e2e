// chorus up --local N SPEC: everything on this machine — a coordinator (on a
// temporary state directory unless --state_dir), one node agent with N slots,
// the job, its progress, and a clean teardown. Exits with the job's result.

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/rpc.h"
#include "client/up_json.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"
#include "common/metrics_text.h"
#include "common/paths.h"
#include "common/private_files.h"
#include "common/status_macros.h"

extern char** environ;

namespace chorus::client {
namespace {

// Starts `args` with stdout and stderr appended to `log_path`, made 0600
// first (Note [chorus up's files]); -1 if it cannot be started.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  if (absl::Status s = MakePrivateFile(log_path); !s.ok()) {
    std::cerr << "chorus up: " << s.message() << "\n";
    return -1;
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// Note [chorus up's files]
// The cluster's directory (--state_dir, or a temporary one) holds its
// tokens, the coordinator's state (every job's spec and checkpoints) and
// two logs: coordinator.log and worker.log, where every rank's output goes.
// None of it is for other users of the machine, so the directory is made
// 0700 and the logs 0600 whatever the umask (Note [Private files] in
// common/private_files.h); a directory or log of an earlier run with a
// wider mode is tightened, with a warning.

// SIGTERM, then SIGKILL if it has not exited within `grace`.
void Terminate(pid_t pid, absl::Duration grace) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// Note [chorus up's tokens]
// The coordinator `chorus up` starts has a token file of its own, so that
// other users of the machine cannot reach its jobs through the loopback
// port (a coordinator with a token file requires tokens on loopback too):
// "admin TOKEN USER" for the user running it (their login name) and
// "agent TOKEN" for its node agent, each token also alone in a file for the
// CLI (admin.token) and the agent (agent.token). All are 0600 in the
// cluster's directory and new on every run, so nothing is asked of the
// user. While the cluster runs, the admin token is also in
// $HOME/.chorus/tokens/127.0.0.1_PORT (LocalTokenPath, dir 0700), where
// this user's other chorus commands find it when given no token, so that
// `chorus --coordinator 127.0.0.1:PORT status JOB` from another shell works
// as before; it is removed at teardown. A token given (flag or variable)
// wins; a stale file of a killed run holds a token no coordinator knows.
struct LocalTokens {
  std::string coordinator_file;  // the coordinator's --token_file
  std::string admin_file;        // the CLI's
  std::string agent_file;        // the node agent's
};

// Writes the token files of Note [chorus up's tokens] into `dir`,
// replacing those of an earlier run.
absl::StatusOr<LocalTokens> WriteLocalTokens(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string admin, NewToken());
  ASSIGN_OR_RETURN(const std::string agent, NewToken());
  const char* login = std::getenv("USER");
  if (login == nullptr || *login == '\0') {
    const struct passwd* entry = getpwuid(getuid());
    login = entry != nullptr ? entry->pw_name : "";
  }
  const std::string user = SafeUserName(login, "admin");
  const LocalTokens files{dir + "/tokens", dir + "/admin.token", dir + "/agent.token"};
  const std::pair<std::string, std::string> contents[] = {
      {files.coordinator_file, absl::StrCat("admin ", admin, " ", user, "\nagent ", agent, "\n")},
      {files.admin_file, admin + "\n"},
      {files.agent_file, agent + "\n"}};
  for (const auto& [path, text] : contents) {
    std::remove(path.c_str());
    RETURN_IF_ERROR(WritePrivateFile(path, text));
  }
  return files;
}

struct UpOptions {
  int local = 0;  // slots of the local agent
  std::string spec_path;
  std::string state_dir;  // empty: a temporary one
  std::string resume_from;
  bool json = false;
};

// Why `spec` cannot run on `local` slots of this machine; OK if it can.
absl::Status CheckRunsHere(const v1::JobSpec& spec, const UpOptions& options) {
  if (spec.resources().device() == v1::ResourceSpec::CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.spec_path,
        ": resources.device is CUDA, but chorus up --local starts CPU agents; run a coordinator "
        "and node agents started with `chorus-worker --device cuda` (docs/gpu.md), or set "
        "resources.device: CPU"));
  }
  if (spec.resources().min_ranks() > options.local) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job needs resources.min_ranks = ", spec.resources().min_ranks(),
                     " slots; --local gives ", options.local));
  }
  // The local agent offers this machine's memory; a job it cannot hold
  // would wait for ever (the estimate is the one placement uses).
  const int64_t here = MachineMemoryBytes();
  if (here <= 0) return absl::OkStatus();
  const RankMemoryEstimate memory = EstimateRankMemory(spec);
  const int64_t fit = here / std::max<int64_t>(1, memory.total_bytes());
  if (fit >= spec.resources().min_ranks()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job spec: ",
      fit == 0 ? absl::StrCat(memory.field, ": ",
                              RankMemoryMessage(memory, static_cast<double>(here),
                                                "of memory on this machine"))
               : absl::StrCat("resources.min_ranks: ", spec.resources().min_ranks(), " ranks of ",
                              memory.ToString(), " do not fit in ",
                              FormatBytes(static_cast<double>(here)),
                              " of memory on this machine (", fit, " do)")));
}

// A coordinator and one node agent on this machine, torn down (SIGTERM,
// then SIGKILL) when it goes, with its state directory if it was a
// temporary one and keep_files() was not asked for.
class LocalCluster {
 public:
  // Starts the coordinator in `state_dir` (a temporary directory if empty)
  // and waits for its port; FAILED_PRECONDITION naming what to do if a
  // binary is missing or it does not start.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const std::string& state_dir);
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;
  ~LocalCluster() {
    if (!published_token_.empty()) std::remove(published_token_.c_str());
    Terminate(worker_, absl::Seconds(15));
    Terminate(coordinator_, absl::Seconds(10));
    if (temporary_ && !keep_files_) std::filesystem::remove_all(dir_);
  }

  // Starts the node agent with `slots` slots of `threads_per_rank` threads.
  void StartAgent(int slots, int threads_per_rank) {
    worker_ = Spawn({worker_bin_, "--coordinator", address_, "--slots", std::to_string(slots),
                     "--threads_per_rank", std::to_string(threads_per_rank), "--token_file",
                     tokens_.agent_file},
                    dir_ + "/worker.log");
  }
  // Keeps the state directory and logs (a failed job's, for a look).
  void keep_files() { keep_files_ = true; }
  const std::string& address() const { return address_; }
  const std::string& dir() const { return dir_; }
  // The CLI's token file for this cluster (Note [chorus up's tokens]).
  const std::string& admin_token_file() const { return tokens_.admin_file; }
  // The status page's login URL: one visit logs a browser in (Note [Browser
  // login] in coordinator/http/http_server.cc); empty if the HTTP port or the
  // admin token cannot be read.
  std::string LoginUrl() const {
    std::string port, token;
    std::ifstream port_in(dir_ + "/http_port");
    std::getline(port_in, port);
    std::ifstream token_in(tokens_.admin_file);
    std::getline(token_in, token);
    if (port.empty() || token.empty()) return "";
    return absl::StrCat("http://127.0.0.1:", port, "/login?token=", token);
  }
  // Leaves the admin token where this user's other chorus commands look for
  // it (LocalTokenPath), until the cluster goes.
  absl::Status PublishToken() {
    const std::string path = LocalTokenPath(address_);
    if (path.empty()) return absl::FailedPreconditionError("there is no home directory");
    RETURN_IF_ERROR(MakePrivateDirectory(std::filesystem::path(path).parent_path().string(),
                                         "the chorus token directory"));
    std::ifstream in(tokens_.admin_file);
    std::string token;
    std::getline(in, token);
    std::remove(path.c_str());
    RETURN_IF_ERROR(WritePrivateFile(path, token + "\n"));
    published_token_ = path;
    return absl::OkStatus();
  }

 private:
  LocalCluster() = default;

  std::string dir_;
  bool temporary_ = false;
  bool keep_files_ = false;
  std::string worker_bin_;
  std::string address_;
  LocalTokens tokens_;
  std::string published_token_;  // removed with the cluster
  pid_t coordinator_ = -1;
  pid_t worker_ = -1;
};

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const std::string& state_dir) {
  const std::string bin = ExecutableDir();
  const std::string coordinator_bin = CompanionBinary(bin, "chorus-coordinator", "coordinator");
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->worker_bin_ = CompanionBinary(bin, "chorus-worker", "worker");
  for (const std::string& b : {coordinator_bin, cluster->worker_bin_}) {
    if (access(b.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(b, " is missing; build it with `bazel build "
                          "//coordinator:chorus-coordinator //worker:chorus-worker`"));
    }
  }
  cluster->temporary_ = state_dir.empty();
  cluster->dir_ = UserPath(state_dir);
  if (cluster->temporary_) {
    char tmpl[] = "/tmp/chorus-up-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      return absl::FailedPreconditionError("cannot create a temporary state directory");
    }
    cluster->dir_ = tmpl;
  }
  const std::string& dir = cluster->dir_;
  RETURN_IF_ERROR(MakePrivateDirectory(dir, "--state_dir"));  // Note [chorus up's files]
  ASSIGN_OR_RETURN(cluster->tokens_, WriteLocalTokens(dir));
  const std::string port_file = dir + "/port";
  std::remove(port_file.c_str());
  // The HTTP port (metrics, status page) is written before the gRPC port.
  cluster->coordinator_ =
      Spawn({coordinator_bin, "--listen", "127.0.0.1:0", "--state_dir", dir + "/state",
             "--port_file", port_file, "--http_port_file", dir + "/http_port", "--token_file",
             cluster->tokens_.coordinator_file},
            dir + "/coordinator.log");
  std::string port;
  for (int i = 0; i < 300 && port.empty() && !Interrupted(); ++i) {
    std::ifstream in(port_file);
    std::getline(in, port);
    if (port.empty()) absl::SleepFor(absl::Milliseconds(50));
  }
  if (port.empty()) {
    cluster->keep_files();  // keep the log
    return absl::FailedPreconditionError(
        absl::StrCat("the coordinator did not start; see ", dir, "/coordinator.log"));
  }
  cluster->address_ = "127.0.0.1:" + port;
  return cluster;
}

// The job's end, on stderr.
void PrintResult(const v1::Job& job, const v1::JobSpec& spec, const GlobalOptions& global) {
  const v1::Metrics& m = job.latest_metrics();
  *global.err << "chorus up: " << job.job_id() << " " << StateName(job.state()) << ": "
              << job.reason();
  if (job.state() == v1::Job::SUCCEEDED && !spec.has_program()) {
    *global.err << "; " << EvaluationText(m) << " after " << m.step() << " steps";
  }
  *global.err << "\n";
}

// `chorus up`: the exit code.
int RunUp(const UpOptions& options, const GlobalOptions& global) {
  absl::StatusOr<v1::JobSpec> spec = LoadUserJobSpec(options.spec_path);
  const absl::Status usable = spec.ok() ? CheckRunsHere(*spec, options) : spec.status();
  if (!usable.ok()) {
    *global.err << "chorus up: " << usable.message() << "\n";
    return kExitBadInput;
  }
  CatchInterrupts();
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options.state_dir);
  if (!cluster.ok()) {
    *global.err << "chorus up: " << cluster.status().message() << "\n";
    return kExitFailure;
  }
  GlobalOptions local_global = global;
  local_global.coordinator = (*cluster)->address();
  local_global.channel = nullptr;  // talk to the coordinator started here
  local_global.token_file = (*cluster)->admin_token_file();
  if (absl::Status s = (*cluster)->PublishToken(); !s.ok()) {
    *global.err << "chorus up: other shells reach this cluster with CHORUS_TOKEN_FILE="
                << (*cluster)->admin_token_file() << " (" << s.message() << ")\n";
  }
  (*cluster)->StartAgent(options.local, spec->resources().threads_per_rank());
  absl::StatusOr<FollowResult> followed;
  {
    // Our connection closes before the cluster stops: a stopping coordinator
    // waits for its clients to close, and an idle channel may not notice
    // for seconds.
    std::unique_ptr<v1::JobService::Stub> stub = JobStub(local_global);
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = *spec;
    submit.set_resume_from(options.resume_from);
    v1::SubmitJobResponse submitted;
    grpc::ClientContext context;
    SetDeadline(context, local_global);
    if (absl::Status s = FromGrpcStatus(stub->SubmitJob(&context, submit, &submitted)); !s.ok()) {
      return ReportError("up", s, local_global);
    }
    *global.err << "chorus up: " << submitted.job_id() << " on " << options.local
                << " local slot(s); logs in " << (*cluster)->dir() << "\n";
    // The URL holds the admin token: it goes to this terminal only, never
    // to a log (Note [Browser login] in coordinator/http/http_server.cc).
    if (const std::string url = (*cluster)->LoginUrl(); !url.empty()) {
      *global.err << "chorus up: status page " << url << "\n";
    }
    followed = FollowJob(*stub, local_global, submitted.job_id(), /*cancel_on_interrupt=*/true);
  }
  if (!followed.ok()) return ReportError("up", followed.status(), local_global);
  PrintResult(followed->job, *spec, global);
  if (followed->job.state() == v1::Job::FAILED) (*cluster)->keep_files();  // for a look
  cluster->reset();
  if (options.json) *global.out << UpJsonLine(followed->job) << std::endl;
  return ExitCodeFor(*followed);
}

}  // namespace

void AddUpCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "up",
      "Run a job entirely on this machine: a coordinator, one node agent with --local slots, the "
      "job and its progress; then tear everything down. Exits 0 if the job succeeded, 1 if not, "
      "130 on Ctrl-C (which cancels the job).");
  auto options = std::make_shared<UpOptions>();
  cmd->add_option("--local", options->local, "Rank slots of the local agent.")
      ->required()
      ->check(CLI::Range(1, 256));
  cmd->add_option("spec", options->spec_path, "Job spec file.")->required();
  cmd->add_option("--state_dir", options->state_dir,
                  "Coordinator state directory (default: a temporary one, removed after).");
  cmd->add_flag("--json", options->json, "End with the final job as one JSON line.");
  cmd->add_option(
      "--resume_from", options->resume_from,
      "JOB or JOB:STEP: start from that job's checkpoint (with --state_dir of the run that "
      "wrote it).");
  cmd->callback([options, &global, &exit_code] { exit_code = RunUp(*options, global); });
}

}  // namespace chorus::client
