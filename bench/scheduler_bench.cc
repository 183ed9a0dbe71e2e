// scheduler_bench: how long the coordinator takes to decide what to start
// with 10,000 queued jobs and 1,000 agents (docs/scheduling.md).
//
// Two figures on one generated cluster (1,000 agents of 8 CPU slots, 3% of
// the slots free, scattered; 10,000 queued jobs of 1-16 ranks from 100
// users at three priorities, with quotas and fair-share usage):
//   * PlanQueue (coordinator/scheduling/queue_plan.h), the pure decision, against the strict-FIFO
//     PlaceJobs (coordinator/scheduling/placement.h) it replaced, on the same input: the JSON line;
//   * a whole Scheduler::Schedule() pass (listing the queue from the job
//     manager, planning, starting what fits) over the same cluster shape,
//     against the goal of p99 <= 50 ms: printed before it.
// Prints, last, {"bench": "scheduler_decision", ...} (ratio < 1: faster).
//
// Usage: scheduler_bench [--rounds N] [--queued N] [--agents N]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/queue_plan.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/state_store.h"
#include "glog/logging.h"

namespace chorus {
namespace {

struct Options {
  int rounds = 50;
  int queued = 10000;
  int agents = 1000;
  int slots_per_agent = 8;
};

double Percentile(std::vector<double> ms, double p) {
  std::sort(ms.begin(), ms.end());
  return ms[std::min(ms.size() - 1, static_cast<size_t>(p * ms.size()))];
}

template <typename F>
std::vector<double> Time(int rounds, F f) {
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  return ms;
}

// The generated cluster: agents with a few free slots, and the queue.
struct Cluster {
  std::vector<AgentSlots> agents;
  std::vector<QueueEntry> queued;
  QueueUsage usage;
  SchedulingPolicy policy;
};

Cluster Generate(const Options& o, std::mt19937& rng) {
  Cluster c;
  std::uniform_real_distribution<double> unit(0, 1);
  for (int a = 0; a < o.agents; ++a) {
    AgentSlots& agent = c.agents.emplace_back();
    agent.agent_id = absl::StrCat("agent-", a + 1);
    agent.total_slots = o.slots_per_agent;
    for (int s = 0; s < o.slots_per_agent; ++s) {
      if (unit(rng) < 0.03) agent.free_slots.push_back(s);
    }
  }
  std::uniform_int_distribution<int> ranks(1, 16), owner(0, 99), priority(1, 3);
  for (int j = 0; j < o.queued; ++j) {
    QueueEntry& e = c.queued.emplace_back();
    e.job.job_id = absl::StrFormat("job-%06d", j + 1);
    const int n = ranks(rng);
    e.job.resources.set_min_ranks(n);
    e.job.resources.set_max_ranks(n + ranks(rng) / 4);
    e.job.resources.set_device(v1::ResourceSpec::CPU);
    e.owner = absl::StrCat("user", owner(rng));
    e.priority = static_cast<v1::JobSpec::Priority>(priority(rng));
  }
  for (int u = 0; u < 100; ++u) {
    const std::string name = absl::StrCat("user", u);
    c.usage.fair_share[name] = unit(rng) * 1e6;
    c.usage.slots_in_use[name][v1::ResourceSpec::CPU] = static_cast<int>(unit(rng) * 100);
    if (u % 4 == 0) c.policy.users[name].max_slots[v1::ResourceSpec::CPU] = 64;
  }
  return c;
}

// A Scheduler over a real job manager: `o.agents` agents, filled by jobs,
// then o.queued more queued behind them. Returns the p50/p99 of Schedule().
absl::Status ScheduleRounds(const Options& o, std::vector<double>& ms) {
  const std::string dir = absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                                       "/scheduler_bench_", getpid());
  ASSIGN_OR_RETURN(std::unique_ptr<StateStore> state, StateStore::Open(dir));
  FakeClock clock(absl::FromUnixSeconds(1000));
  ASSIGN_OR_RETURN(std::unique_ptr<JobManager> jobs,
                   JobManager::Create(*state, &clock, o.queued + o.agents * o.slots_per_agent));
  Scheduler scheduler(*jobs, &clock, SchedulerOptions{"127.0.0.1:1"});
  for (int a = 0; a < o.agents; ++a) {
    v1::AgentHello hello;
    hello.set_host(absl::StrCat("node-", a));
    hello.set_slots(o.slots_per_agent);
    RETURN_IF_ERROR(scheduler.AddAgent(hello, [](const v1::CoordinatorMessage&) {}).status());
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> ranks(1, 16), priority(1, 3);
  const int total = o.agents * o.slots_per_agent / 8 + o.queued;
  for (int j = 0; j < total; ++j) {
    ASSIGN_OR_RETURN(v1::JobSpec spec,
                     ParseJobSpec(absl::StrCat("model { mlp {} } data { synthetic {} } "
                                               "resources { min_ranks: ",
                                               j < total - o.queued ? 8 : ranks(rng), " }"),
                                  SpecFormat::kTextProto, "bench"));
    spec.set_priority(static_cast<v1::JobSpec::Priority>(priority(rng)));
    RETURN_IF_ERROR(jobs->Submit(spec, "", absl::StrCat("user", j % 100)).status());
  }
  scheduler.Schedule();  // fills the cluster
  ms = Time(o.rounds, [&] {
    clock.Advance(absl::Seconds(1));
    scheduler.Schedule();
  });
  std::printf(
      "Scheduler::Schedule() with %d queued jobs, %d agents (%d free slots): p50 %.2f ms, "
      "p99 %.2f ms (goal <= 50 ms)\n",
      static_cast<int>(jobs->List({v1::Job::PENDING}, 0)->size()), o.agents,
      scheduler.reads().free_slots(), Percentile(ms, 0.5), Percentile(ms, 0.99));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  FLAGS_minloglevel = google::GLOG_WARNING;  // not a line per agent and job started
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--rounds")
      o.rounds = value;
    else if (flag == "--queued")
      o.queued = value;
    else if (flag == "--agents")
      o.agents = value;
    else {
      std::fprintf(stderr, "usage: scheduler_bench [--rounds N] [--queued N] [--agents N]\n");
      return 2;
    }
  }
  std::vector<double> schedule_ms;
  if (absl::Status s = ScheduleRounds(o, schedule_ms); !s.ok()) {
    std::fprintf(stderr, "scheduler_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::mt19937 rng(1);
  const Cluster c = Generate(o, rng);
  std::vector<QueuedJob> fifo;
  for (const QueueEntry& e : c.queued) fifo.push_back(e.job);
  size_t placed = 0, waiting = 0;
  const std::vector<double> ours = Time(o.rounds, [&] {
    const QueuePlan plan = PlanQueue(c.queued, c.agents, c.usage, c.policy);
    placed = plan.placed.size();
    waiting = plan.waiting.size();
  });
  size_t fifo_placed = 0;
  const std::vector<double> peer =
      Time(o.rounds, [&] { fifo_placed = PlaceJobs(fifo, c.agents).size(); });
  std::printf(
      "PlanQueue: %zu placed, %zu waiting, p50 %.2f ms, p99 %.2f ms; strict-FIFO "
      "PlaceJobs: %zu placed, p99 %.3f ms\n",
      placed, waiting, Percentile(ours, 0.5), Percentile(ours, 0.99), fifo_placed,
      Percentile(peer, 0.99));
  const double x = Percentile(ours, 0.99), y = Percentile(peer, 0.99);
  std::printf(
      "{\"bench\": \"scheduler_decision\", \"metric\": \"p99 placement decision, %d queued jobs, "
      "%d agents\", \"unit\": \"ms\", \"ours\": %.3f, \"peer\": %.3f, \"peer_name\": "
      "\"strict-FIFO PlaceJobs\", \"ratio\": %.2f}\n",
      o.queued, o.agents, x, y, y > 0 ? x / y : 0.0);
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) { return chorus::Main(argc, argv); }
