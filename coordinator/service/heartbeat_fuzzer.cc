// Fuzz target: rank heartbeats as the coordinator receives them on
// RankService.Heartbeat streams — serialized chorus.v1.RankHeartbeat — through
// the scheduler (Scheduler::Heartbeat), the hang detector (Tick, FillStatus:
// DiagnoseHangs) and the hang policy.
//
// Input: a header byte, then records.
//   header: world size 1 + (b % 4); hang_detection.action REPORT, ABORT or
//     RESTART ((b / 4) % 3).
//   record: [flags: 1 byte][clock step: 1 byte, x 100 ms][length: u16]
//     [serialized RankHeartbeat]. Unless flags bit 0 is set the heartbeat's
//     job_id is the running job's, unless bit 1 is set its generation is the
//     running one (1): most heartbeats then reach the job's ranks.
//
// Per input a fresh coordinator state (SQLite in the scratch directory, a
// fake clock) runs one job on one agent, every rank joined. Properties:
//   - Heartbeat accepts exactly the heartbeats of a rank of the running
//     generation of a running job;
//   - status lists one row per rank while the job runs, and every diagnosis
//     names only ranks of the job;
//   - a job the policy ended is FAILED with a reason.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/state_store.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"
#include "glog/logging.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "heartbeat_fuzzer: %s\n", what.c_str());
  std::abort();
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

void CheckDiagnoses(const v1::JobStatus& status, int world) {
  for (const v1::Diagnosis& d : status.diagnoses()) {
    for (int r : d.ranks()) {
      if (r < 0 || r >= world) Fail(absl::StrCat("a diagnosis names rank ", r));
    }
    for (int r : d.waiting_ranks()) {
      if (r < 0 || r >= world) Fail(absl::StrCat("a diagnosis names waiting rank ", r));
    }
    if (d.message().empty()) Fail("a diagnosis without a message");
  }
}

void Run(FuzzInput& in) {
  static int64_t inputs = 0;
  // Fatal messages only: the scheduler logs every state change.
  FLAGS_minloglevel = google::GLOG_FATAL;
  const std::string dir = absl::StrCat(ScratchDir(), "/heartbeat-", inputs++);
  const uint8_t header = in.Byte();
  const int world = 1 + header % 4;
  const char* const actions[] = {"REPORT", "ABORT", "RESTART"};
  {
    FakeClock clock(absl::FromUnixSeconds(1000000));
    std::unique_ptr<StateStore> state = OrDie(StateStore::Open(dir), "state store");
    std::unique_ptr<JobManager> jobs = OrDie(JobManager::Create(*state, &clock), "job manager");
    Scheduler scheduler(*jobs, &clock, SchedulerOptions{"127.0.0.1:1"});

    v1::JobSpec spec = OrDie(
        ParseJobSpec(absl::StrCat("model { mlp {} } data { synthetic {} } resources { min_ranks: ",
                                  world, " max_ranks: ", world,
                                  " } hang_detection { action: ", actions[(header / 4) % 3], " }"),
                     SpecFormat::kTextProto, "fuzz"),
        "spec");
    NormalizeJobSpec(spec);
    const std::string job = OrDie(jobs->Submit(spec, ""), "submit").job_id();
    v1::AgentHello hello;
    hello.set_host("node-a");
    hello.set_slots(world);
    const std::string agent =
        OrDie(scheduler.AddAgent(hello, [](const v1::CoordinatorMessage&) {}), "agent");
    int joined = 0;
    for (int slot = 0; slot < world; ++slot) {
      v1::JoinRequest join;
      join.set_job_id(job);
      join.set_agent_id(agent);
      join.set_slot(slot);
      join.set_generation(1);
      join.set_pid(100 + slot);
      scheduler.Join(join, clock.Now() + absl::Seconds(60),
                     [&joined](absl::StatusOr<v1::JoinResponse> r) { joined += r.ok(); });
    }
    if (joined != world) Fail("the ranks could not join");

    while (!in.empty()) {
      const uint8_t flags = in.Byte();
      clock.Advance(absl::Milliseconds(100) * in.Byte());
      v1::RankHeartbeat hb;
      if (!hb.ParseFromString(in.Bytes(in.U16()))) continue;
      if ((flags & 1) == 0) hb.set_job_id(job);
      if ((flags & 2) == 0) hb.set_generation(1);
      const bool running = OrDie(jobs->Get(job), "job").state() == v1::Job::RUNNING;
      const bool expected = running && hb.job_id() == job && hb.generation() == 1 &&
                            hb.rank() >= 0 && hb.rank() < world;
      if (scheduler.Heartbeat(hb) != expected) {
        Fail(absl::StrCat("Heartbeat ", expected ? "refused" : "accepted", " rank ", hb.rank(),
                          " generation ", hb.generation(), " of ", hb.job_id()));
      }
      scheduler.Tick();
      v1::JobStatus status;
      scheduler.reads().FillStatus(job, status);
      const v1::Job now = OrDie(jobs->Get(job), "job");
      if (now.state() == v1::Job::RUNNING) {
        if (status.ranks_size() != world) Fail("status does not list every rank");
        CheckDiagnoses(status, world);
      } else if (now.state() != v1::Job::FAILED || now.reason().empty()) {
        Fail("the job ended other than FAILED with a reason: " + v1::Job::State_Name(now.state()));
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::FuzzInput in(data, size);
  chorus::Run(in);
  return 0;
}
