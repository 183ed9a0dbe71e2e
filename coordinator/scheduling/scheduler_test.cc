#include "coordinator/scheduling/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/job_spec.h"
#include "common/join_answers.h"
#include "coordinator/scheduling/agent_departure.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "coordinator/state/slow_state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// What an agent's stream carries after its hello, passed on as AgentService
// does (Scheduler::OnAgentMessage).
void RankExited(Scheduler& scheduler, const std::string& agent, const v1::RankExited& exited) {
  v1::AgentMessage message;
  *message.mutable_rank_exited() = exited;
  scheduler.OnAgentMessage(agent, message, absl::InfiniteFuture());
}
void AgentHeartbeats(Scheduler& scheduler, const std::string& agent,
                     const v1::RankHeartbeats& batch) {
  v1::AgentMessage message;
  *message.mutable_heartbeats() = batch;
  scheduler.OnAgentMessage(agent, message, absl::InfiniteFuture());
}
void AgentJoins(Scheduler& scheduler, const std::string& agent, const v1::RankJoins& batch,
                absl::Time deadline) {
  v1::AgentMessage message;
  *message.mutable_joins() = batch;
  scheduler.OnAgentMessage(agent, message, deadline);
}
// A ping.
void AgentAlive(Scheduler& scheduler, const std::string& agent) {
  v1::AgentMessage message;
  message.set_ping_time_us(1);
  scheduler.OnAgentMessage(agent, message, absl::InfiniteFuture());
}

// A node agent as the scheduler sees it: records what it is told.
struct FakeAgent {
  std::string id;
  std::vector<v1::CoordinatorMessage> received;
  Scheduler::Sender Sender() {
    return [this](const v1::CoordinatorMessage& m) { received.push_back(m); };
  }
  std::vector<v1::LaunchRanks> Launches() const {
    std::vector<v1::LaunchRanks> out;
    for (const auto& m : received) {
      if (m.has_launch()) out.push_back(m.launch());
    }
    return out;
  }
  int Stops() const {
    int n = 0;
    for (const auto& m : received) n += m.has_stop();
    return n;
  }
  // The answers to joins sent through the agent, one per message.
  std::vector<v1::RankJoinAnswers> Answers() const {
    std::vector<v1::RankJoinAnswers> out;
    for (const auto& m : received) {
      if (m.has_joined()) out.push_back(m.joined());
    }
    return out;
  }
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/sched_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    state_ = *StateStore::Open(dir);
    jobs_ = *JobManager::Create(*state_, &clock_);
    scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, options_);
  }
  // What the scheduler is built with; a test that changes it calls
  // scheduler_->Configure(options_).
  SchedulerOptions options_{"127.0.0.1:1"};

  std::string Submit(int min_ranks, int max_ranks) {
    auto spec = ParseJobSpec(absl::StrCat("model { mlp {} } data { synthetic {} } resources { "
                                          "min_ranks: ",
                                          min_ranks, " max_ranks: ", max_ranks, " }"),
                             SpecFormat::kTextProto, "test");
    auto job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    return job->job_id();
  }

  std::string Add(FakeAgent& agent, int slots, const std::string& host) {
    v1::AgentHello hello;
    hello.set_host(host);
    hello.set_slots(slots);
    auto id = scheduler_->AddAgent(hello, agent.Sender());
    EXPECT_TRUE(id.ok());
    agent.id = *id;
    return *id;
  }

  v1::Job::State State(const std::string& job_id) { return jobs_->Get(job_id)->state(); }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<Scheduler> scheduler_;
};

struct JoinResult {
  bool called = false;
  absl::StatusOr<v1::JoinResponse> result = absl::UnknownError("not called");
  Scheduler::JoinDone Done() {
    return [this](absl::StatusOr<v1::JoinResponse> r) {
      called = true;
      result = std::move(r);
    };
  }
};

v1::JoinRequest JoinOf(const std::string& job, const std::string& agent, int slot,
                       int64_t gen = 1) {
  v1::JoinRequest r;
  r.set_job_id(job);
  r.set_agent_id(agent);
  r.set_slot(slot);
  r.set_generation(gen);
  r.set_pid(100 + slot);
  return r;
}

TEST_F(SchedulerTest, PlacesFifoWithinMinAndMaxAndNumbersRanksStably) {
  FakeAgent a, b;
  const std::string big = Submit(3, 4);
  const std::string first = Submit(1, 1);
  Add(a, 2, "node-a");
  EXPECT_EQ(State(big), v1::Job::PENDING);
  EXPECT_EQ(State(first), v1::Job::RUNNING)
      << "one 2-slot agent could not hold the big job even idle: it holds up nobody";
  v1::RankExited done;
  done.set_job_id(first);
  done.set_slot(0);
  RankExited(*scheduler_, a.id, done);
  EXPECT_EQ(State(first), v1::Job::SUCCEEDED);
  Add(b, 2, "node-b");
  EXPECT_EQ(State(big), v1::Job::RUNNING);
  EXPECT_EQ(jobs_->Get(big)->world_size(), 4);
  ASSERT_EQ(a.Launches().size(), 2u);
  EXPECT_EQ(a.Launches()[1].ranks_size(), 2);
  EXPECT_EQ(a.Launches()[1].ranks(1).local_rank(), 1);
  EXPECT_EQ(a.Launches()[1].ranks(1).local_world_size(), 2);
  EXPECT_EQ(a.Launches()[1].coordinator(), "127.0.0.1:1");
  const std::string small = Submit(1, 1);
  EXPECT_EQ(State(small), v1::Job::PENDING);
  EXPECT_EQ(scheduler_->reads().free_slots(), 0);

  // All four join; ranks follow agent then slot order.
  std::vector<JoinResult> joins(4);
  scheduler_->Join(JoinOf(big, a.id, 0), clock_.Now() + absl::Seconds(60), joins[0].Done());
  scheduler_->Join(JoinOf(big, b.id, 1), clock_.Now() + absl::Seconds(60), joins[3].Done());
  scheduler_->Join(JoinOf(big, a.id, 1), clock_.Now() + absl::Seconds(60), joins[1].Done());
  EXPECT_FALSE(joins[0].called) << "Join waits for the whole generation";
  scheduler_->Join(JoinOf(big, b.id, 0), clock_.Now() + absl::Seconds(60), joins[2].Done());
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(joins[r].called);
    ASSERT_TRUE(joins[r].result.ok()) << joins[r].result.status();
    EXPECT_EQ(joins[r].result->rank(), r);
    EXPECT_EQ(joins[r].result->world_size(), 4);
    EXPECT_EQ(joins[r].result->store_namespace(), big + "/gen-1");
    EXPECT_EQ(joins[r].result->spec().resources().max_ranks(), 4);
  }
  v1::JobStatus status;
  scheduler_->reads().FillStatus(big, status);
  ASSERT_EQ(status.ranks_size(), 4);
  EXPECT_EQ(status.ranks(2).host(), "node-b");
  EXPECT_EQ(status.ranks(2).state(), v1::RankStatus::TRAINING);

  // All exit 0: success, slots return, the small job starts.
  for (const auto& [agent, slot] :
       std::vector<std::pair<FakeAgent*, int>>{{&a, 0}, {&a, 1}, {&b, 0}, {&b, 1}}) {
    v1::RankExited e;
    e.set_job_id(big);
    e.set_slot(slot);
    RankExited(*scheduler_, agent->id, e);
  }
  EXPECT_EQ(State(big), v1::Job::SUCCEEDED);
  EXPECT_EQ(State(small), v1::Job::RUNNING);
}

TEST_F(SchedulerTest, StaleGenerationUnknownSlotAndDeadline) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = Submit(2, 2);
  JoinResult stale, unknown, first;
  scheduler_->Join(JoinOf(job, a.id, 0, /*gen=*/7), clock_.Now() + absl::Seconds(5), stale.Done());
  EXPECT_EQ(stale.result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.result.status().message(), HasSubstr("the current generation is 1"));
  scheduler_->Join(JoinOf(job, a.id, 9), clock_.Now() + absl::Seconds(5), unknown.Done());
  EXPECT_EQ(unknown.result.status().code(), absl::StatusCode::kNotFound);
  scheduler_->Join(JoinOf(job, a.id, 0), clock_.Now() + absl::Seconds(5), first.Done());
  scheduler_->Tick();
  EXPECT_FALSE(first.called);
  clock_.Advance(absl::Seconds(6));
  scheduler_->Tick();
  ASSERT_TRUE(first.called);
  EXPECT_EQ(first.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(first.result.status().message(), HasSubstr("ranks that have not joined: 1"));
  JoinResult none;
  scheduler_->Join(JoinOf("job-000099", a.id, 0), clock_.Now(), none.Done());
  EXPECT_EQ(none.result.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, AFinalReportWithoutMetricsKeepsTheLatest) {
  FakeAgent a;
  Add(a, 1, "node-a");
  const std::string job = Submit(1, 1);
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  v1::ReportRequest report;
  report.set_job_id(job);
  report.set_generation(1);
  report.mutable_metrics()->set_step(50);
  report.mutable_metrics()->set_eval_accuracy(0.9);
  ASSERT_TRUE(scheduler_->Report(report).ok());
  v1::ReportRequest final_report;
  final_report.set_job_id(job);
  final_report.set_generation(1);
  final_report.set_final(true);
  final_report.set_success(true);
  ASSERT_TRUE(scheduler_->Report(final_report).ok());
  EXPECT_EQ(jobs_->Get(job)->latest_metrics().step(), 50);
  EXPECT_DOUBLE_EQ(jobs_->Get(job)->latest_metrics().eval_accuracy(), 0.9);
  final_report.mutable_metrics()->set_step(60);
  ASSERT_TRUE(scheduler_->Report(final_report).ok());
  EXPECT_EQ(jobs_->Get(job)->latest_metrics().step(), 60) << "final metrics still replace";
  EXPECT_EQ(jobs_->Get(job)->latest_metrics().eval_accuracy(), 0);
}

// Note [Reports are written outside the scheduler's lock]: while a report
// is being recorded (here: held inside the event's subscriber, which runs
// as the event is recorded), other calls into the scheduler go on.
TEST_F(SchedulerTest, ARecordedReportDoesNotHoldTheScheduler) {
  FakeAgent a;
  Add(a, 1, "node-a");
  const std::string job = Submit(1, 1);
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  std::atomic<bool> others_went_on{false};
  bool went_on_while_recording = false;
  std::thread other;
  const int64_t handle = jobs_->Subscribe(job, [&] {
    if (other.joinable()) return;
    other = std::thread([&] {
      (void)scheduler_->reads().ListAgents();
      others_went_on = true;
    });
    for (int i = 0; i < 200 && !others_went_on; ++i) absl::SleepFor(absl::Milliseconds(10));
    went_on_while_recording = others_went_on;
  });
  v1::ReportRequest report;
  report.set_job_id(job);
  report.set_generation(1);
  report.mutable_metrics()->set_step(7);
  ASSERT_TRUE(scheduler_->Report(report).ok());
  jobs_->Unsubscribe(handle);
  ASSERT_TRUE(other.joinable());
  other.join();
  EXPECT_TRUE(went_on_while_recording) << "the scheduler was locked while the report was recorded";
  EXPECT_EQ(jobs_->Get(job)->latest_metrics().step(), 7);
  // The end of the job comes after the report's event.
  report.set_final(true);
  report.mutable_metrics()->set_step(9);
  ASSERT_TRUE(scheduler_->Report(report).ok());
  v1::RankExited exited;
  exited.set_job_id(job);
  exited.set_slot(0);
  exited.set_exit_code(0);
  RankExited(*scheduler_, a.id, exited);
  ASSERT_EQ(State(job), v1::Job::SUCCEEDED);
  auto events = jobs_->Events(job, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_GE(events->size(), 2u);
  EXPECT_EQ(events->back().state(), v1::Job::SUCCEEDED);
  EXPECT_EQ((*events)[events->size() - 2].metrics().step(), 9);
}

// Note [Durable writes outside the lock] in job_manager.h: on a state
// store whose writes of one job take seconds (a slow disk, a slow etcd),
// while a report of that job is being written, heartbeats, joins, status
// and submissions of every job are served.
class SchedulerOnASlowStoreTest : public SchedulerTest {
 protected:
  void SetUp() override {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/slow_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto slow = std::make_unique<SlowStateStore>(*StateStore::Open(dir), absl::Seconds(3));
    slow_ = slow.get();
    state_ = std::move(slow);
    jobs_ = *JobManager::Create(*state_, &clock_);
    scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, options_);
  }
  // Whether the slow write was still going on when `call` returned.
  template <typename Call>
  bool Meanwhile(Call call) {
    call();
    return slow_->slow_writes_done() == 0;
  }
  SlowStateStore* slow_ = nullptr;
};

TEST_F(SchedulerOnASlowStoreTest, AReportBeingWrittenHoldsUpNoHeartbeatJoinOrStatus) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 2, "node-b");
  const std::string slow = Submit(1, 1);
  const std::string other = Submit(2, 2);
  ASSERT_EQ(State(slow), v1::Job::RUNNING);
  ASSERT_EQ(State(other), v1::Job::RUNNING);
  slow_->SlowDown(slow);
  v1::ReportRequest report;
  report.set_job_id(slow);
  report.set_generation(1);
  report.mutable_metrics()->set_step(7);
  absl::Status reported;
  std::thread reporter([&] { reported = scheduler_->Report(report); });
  slow_->slow_write_began().WaitForNotification();

  v1::RankHeartbeat hb;
  hb.set_job_id(slow);
  hb.set_generation(1);
  hb.set_step(8);
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(scheduler_->Heartbeat(hb)); }))
      << "the reporting job's own heartbeat";
  hb.set_job_id(other);
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(scheduler_->Heartbeat(hb)); }));
  std::vector<JoinResult> joins(2);
  EXPECT_TRUE(Meanwhile([&] {
    for (int slot = 0; slot < 2; ++slot) {
      scheduler_->Join(JoinOf(other, b.id, slot), clock_.Now() + absl::Seconds(60),
                       joins[slot].Done());
    }
  }));
  for (const JoinResult& join : joins) {
    ASSERT_TRUE(join.called);
    EXPECT_TRUE(join.result.ok()) << join.result.status();
  }
  for (const std::string& job : {slow, other}) {
    v1::JobStatus status;
    EXPECT_TRUE(Meanwhile([&] {
      status = *jobs_->Status(job);  // as `chorus status` is answered
      scheduler_->reads().FillStatus(job, status);
    })) << job;
    EXPECT_EQ(status.job().state(), v1::Job::RUNNING);
    EXPECT_EQ(status.ranks_size(), job == slow ? 1 : 2);
  }
  std::string queued;
  EXPECT_TRUE(Meanwhile([&] { queued = Submit(1, 1); }));
  EXPECT_EQ(State(queued), v1::Job::PENDING) << "no free slot";
  EXPECT_TRUE(Meanwhile([&] { scheduler_->Tick(); }));

  reporter.join();
  EXPECT_TRUE(reported.ok()) << reported;
  EXPECT_EQ(slow_->slow_writes_done(), 1);
  auto events = jobs_->Events(slow, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->back().metrics().step(), 7) << "the report's event, written";
}

// An agent whose messages may be read while another thread sends them.
struct LockedAgent {
  std::string id;
  absl::Mutex mu;
  std::vector<v1::CoordinatorMessage> received ABSL_GUARDED_BY(mu);
  Scheduler::Sender Sender() {
    return [this](const v1::CoordinatorMessage& m) {
      absl::MutexLock lock(&mu);
      received.push_back(m);
    };
  }
  int Launches() {
    absl::MutexLock lock(&mu);
    return static_cast<int>(std::count_if(received.begin(), received.end(),
                                          [](const auto& m) { return m.has_launch(); }));
  }
};

// Note [The scheduler's writes after its lock]: a job's end, decided by the
// scheduler, is written without its lock; every other job is served meanwhile.
TEST_F(SchedulerOnASlowStoreTest, AJobsEndBeingWrittenHoldsUpNoOtherJob) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 2, "node-b");
  const std::string slow = Submit(1, 1);
  const std::string other = Submit(2, 2);
  ASSERT_EQ(State(other), v1::Job::RUNNING);
  slow_->SlowDown(slow);
  v1::RankExited failed;
  failed.set_job_id(slow);
  failed.set_slot(0);
  failed.set_exit_code(3);
  std::thread exiting([&] { RankExited(*scheduler_, a.id, failed); });
  slow_->slow_write_began().WaitForNotification();

  v1::RankHeartbeat hb;
  hb.set_job_id(other);
  hb.set_generation(1);
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(scheduler_->Heartbeat(hb)); }));
  std::vector<JoinResult> joins(2);
  EXPECT_TRUE(Meanwhile([&] {
    for (int slot = 0; slot < 2; ++slot) {
      scheduler_->Join(JoinOf(other, b.id, slot), clock_.Now() + absl::Seconds(60),
                       joins[slot].Done());
    }
  }));
  for (const JoinResult& join : joins) {
    ASSERT_TRUE(join.called);
    EXPECT_TRUE(join.result.ok()) << join.result.status();
  }
  EXPECT_TRUE(Meanwhile([&] { EXPECT_EQ(scheduler_->reads().ListAgents().size(), 2u); }));
  EXPECT_TRUE(Meanwhile([&] { scheduler_->Tick(); }));
  EXPECT_EQ(State(slow), v1::Job::RUNNING) << "not shown ended before it is durable";

  exiting.join();  // returns once the end is durable
  EXPECT_EQ(State(slow), v1::Job::FAILED);
  EXPECT_THAT(jobs_->Get(slow)->reason(), HasSubstr("exit"));
}

// A job's start is written without the lock too, and its agent is told to
// launch only once the start is durable (a restart would otherwise not know
// the ranks it runs). A cancellation answers once it is durable.
TEST_F(SchedulerOnASlowStoreTest, AStartBeingWrittenLaunchesAfterItAndHoldsUpNoOtherJob) {
  FakeAgent b;
  Add(b, 1, "node-b");
  const std::string other = Submit(1, 1);
  ASSERT_EQ(State(other), v1::Job::RUNNING);
  const std::string slow = Submit(1, 1);
  ASSERT_EQ(State(slow), v1::Job::PENDING) << "no free slot yet";
  slow_->SlowDown(slow);
  LockedAgent a;
  std::thread adding([&] {
    v1::AgentHello hello;
    hello.set_host("node-a");
    hello.set_slots(1);
    a.id = *scheduler_->AddAgent(hello, a.Sender());
  });
  slow_->slow_write_began().WaitForNotification();

  v1::RankHeartbeat hb;
  hb.set_job_id(other);
  hb.set_generation(1);
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(scheduler_->Heartbeat(hb)); }));
  JoinResult join;
  EXPECT_TRUE(Meanwhile([&] {
    scheduler_->Join(JoinOf(other, b.id, 0), clock_.Now() + absl::Seconds(60), join.Done());
  }));
  EXPECT_TRUE(join.called && join.result.ok()) << join.result.status();
  EXPECT_TRUE(Meanwhile([&] { scheduler_->Schedule(); }));
  EXPECT_EQ(a.Launches(), 0) << "launched before its start was durable";

  adding.join();
  EXPECT_EQ(State(slow), v1::Job::RUNNING);
  EXPECT_EQ(a.Launches(), 1);
  EXPECT_EQ(jobs_->Get(slow)->placements_size(), 1);
  EXPECT_EQ(slow_->slow_writes_done(), 2) << "its start, then its placements";

  // Its cancellation is slow as well: answered once written.
  const auto cancelled = scheduler_->Cancel(slow, "no longer needed");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(State(slow), v1::Job::CANCELLED);
  EXPECT_EQ(slow_->slow_writes_done(), 3);
}

TEST_F(SchedulerTest, AHeartbeatOfAnEndedJobIsToldToAbort) {
  FakeAgent a;
  Add(a, 1, "node-a");
  const std::string job = Submit(1, 1);
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  v1::Directive running;
  EXPECT_TRUE(scheduler_->Heartbeat(hb, &running));
  EXPECT_EQ(running.kind(), v1::Directive::KIND_UNSPECIFIED);
  ASSERT_TRUE(scheduler_->Cancel(job, "user asked").ok());
  v1::Directive ended;
  EXPECT_FALSE(scheduler_->Heartbeat(hb, &ended));
  EXPECT_EQ(ended.kind(), v1::Directive::ABORT);
  EXPECT_THAT(ended.reason(), HasSubstr(job + " is CANCELLED: "));
  EXPECT_THAT(ended.reason(), HasSubstr("user asked"));
  v1::Directive unknown;
  hb.set_job_id("job-000099");
  EXPECT_FALSE(scheduler_->Heartbeat(hb, &unknown));
  EXPECT_EQ(unknown.kind(), v1::Directive::KIND_UNSPECIFIED) << "no such job: nothing to say";
}

// Note [Aggregated heartbeats]: one message per agent per interval, each
// rank's liveness still its own.
v1::RankHeartbeat HeartbeatOf(const std::string& job, int rank, int64_t step) {
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  hb.set_rank(rank);
  hb.set_step(step);
  hb.set_phase(v1::FORWARD);
  return hb;
}

TEST_F(SchedulerTest, ADeadRankInsideALiveAgentsAggregateIsDead) {
  FakeAgent a;
  Add(a, 3, "node-a");
  auto spec = ParseJobSpec(
      "model { mlp {} } data { synthetic {} } resources { min_ranks: 3 max_ranks: 3 } "
      "hang_detection { dead_after_seconds: 5 }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string job = jobs_->Submit(*spec, "")->job_id();
  scheduler_->Schedule();
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  // Every rank in the first batch; then rank 1 stops and its agent, which
  // forwards only what arrived, leaves it out.
  for (int second = 0; second < 8; ++second) {
    v1::RankHeartbeats batch;
    for (int rank = 0; rank < 3; ++rank) {
      if (rank != 1 || second == 0) *batch.add_heartbeats() = HeartbeatOf(job, rank, second);
    }
    AgentHeartbeats(*scheduler_, a.id, batch);
    clock_.Advance(absl::Seconds(1));
  }
  v1::JobStatus status;
  scheduler_->reads().FillStatus(job, status);
  ASSERT_EQ(status.diagnoses_size(), 1) << status.DebugString();
  EXPECT_EQ(status.diagnoses(0).kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(status.diagnoses(0).ranks(), testing::ElementsAre(1));
  ASSERT_EQ(status.ranks_size(), 3);
  EXPECT_EQ(status.ranks(0).step(), 7) << "the aggregate is recorded rank by rank";
  EXPECT_EQ(status.ranks(1).step(), 0);
  EXPECT_DOUBLE_EQ(status.ranks(1).heartbeat_age_seconds(), 8);
  EXPECT_DOUBLE_EQ(status.ranks(2).heartbeat_age_seconds(), 1);
}

// Note [A silent agent's ranks] in hang_detector.h: a rank whose heartbeats
// come through its agent is not DEAD while the agent is silent too (its
// link stalls); once the agent talks again (a ping), the rank's own silence
// counts in full; and an agent's silence postpones it by at most
// kAgentSilenceForgiven.
TEST_F(SchedulerTest, ARankIsNotDeadForItsAgentsSilenceButIsForItsOwn) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  auto spec = ParseJobSpec(
      "model { mlp {} } data { synthetic {} } resources { min_ranks: 2 max_ranks: 2 } "
      "hang_detection { dead_after_seconds: 5 }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string job = jobs_->Submit(*spec, "")->job_id();
  scheduler_->Schedule();
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  auto beat = [&](FakeAgent& agent, int rank, int step) {
    v1::RankHeartbeats batch;
    *batch.add_heartbeats() = HeartbeatOf(job, rank, step);
    AgentHeartbeats(*scheduler_, agent.id, batch);
  };
  auto diagnoses = [&] {
    v1::JobStatus status;
    scheduler_->reads().FillStatus(job, status);
    return std::vector<v1::Diagnosis>(status.diagnoses().begin(), status.diagnoses().end());
  };
  beat(a, 0, 0);
  beat(b, 1, 0);
  // b's link stalls: nothing from b (nor its rank) for 8 s; a goes on.
  for (int second = 1; second <= 8; ++second) {
    clock_.Advance(absl::Seconds(1));
    beat(a, 0, second);
  }
  EXPECT_TRUE(diagnoses().empty()) << diagnoses()[0].message();
  // b talks again, a ping without its rank's heartbeat: the rank is silent.
  AgentAlive(*scheduler_, b.id);
  std::vector<v1::Diagnosis> now = diagnoses();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(now[0].ranks(), testing::ElementsAre(1));
  EXPECT_THAT(now[0].message(), HasSubstr("rank 1 has sent no heartbeat for 8.0 s"));
  EXPECT_THAT(now[0].message(), testing::Not(HasSubstr("its agent has been silent")));

  // Its heartbeat again; then b silent for good: DEAD once the forgiven
  // 10 s are spent on top of dead_after_seconds, naming the agent's silence.
  beat(b, 1, 9);
  for (int second = 1; second <= 16; ++second) {
    clock_.Advance(absl::Seconds(1));
    beat(a, 0, 8 + second);
    if (second == 15) {
      EXPECT_TRUE(diagnoses().empty()) << diagnoses()[0].message();
    }
  }
  now = diagnoses();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(now[0].message(), HasSubstr("rank 1 has sent no heartbeat for 16.0 s"));
  EXPECT_THAT(now[0].message(), HasSubstr("its agent has been silent for 16.0 s too"));
}

TEST_F(SchedulerTest, AnAgentSpeaksOnlyForItsOwnRanksAndHearsTheirDirectives) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  const std::string job = Submit(2, 2);
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  v1::RankHeartbeats batch;
  *batch.add_heartbeats() = HeartbeatOf(job, 0, 5);
  *batch.add_heartbeats() = HeartbeatOf(job, 1, 5);  // rank 1 runs on b
  AgentHeartbeats(*scheduler_, a.id, batch);
  v1::JobStatus status;
  scheduler_->reads().FillStatus(job, status);
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(0).step(), 5);
  EXPECT_EQ(status.ranks(1).step(), 0) << "agent a may not speak for b's rank";
  EXPECT_EQ(status.ranks(1).heartbeat_age_seconds(), 0) << "no heartbeat recorded";
  const size_t before = a.received.size();
  ASSERT_TRUE(scheduler_->Cancel(job, "user asked").ok());
  AgentHeartbeats(*scheduler_, a.id, batch);
  ASSERT_GT(a.received.size(), before);
  const v1::CoordinatorMessage& answer = a.received.back();
  ASSERT_TRUE(answer.has_directives()) << answer.DebugString();
  ASSERT_EQ(answer.directives().entries_size(), 2) << "an ended job's ranks stop, wherever";
  EXPECT_EQ(answer.directives().entries(0).rank(), 0);
  EXPECT_EQ(answer.directives().entries(0).directive().kind(), v1::Directive::ABORT);
  EXPECT_THAT(answer.directives().entries(0).directive().reason(), HasSubstr("user asked"));
  EXPECT_EQ(answer.directives().entries(0).slot(), -1) << "the job is gone: the agent finds it";
}

TEST_F(SchedulerTest, AProgramJobShowsRankZerosHeartbeatProgress) {
  FakeAgent a;
  Add(a, 2, "node-a");
  auto spec = ParseJobSpec("program { argv: \"/bin/true\" } resources { min_ranks: 2 }",
                           SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string job = jobs_->Submit(*spec, "")->job_id();
  scheduler_->Schedule();
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  v1::ReportRequest sdk;  // what an SDK program reported itself
  sdk.set_job_id(job);
  sdk.set_generation(1);
  sdk.mutable_metrics()->set_eval_accuracy(0.8);
  ASSERT_TRUE(scheduler_->Report(sdk).ok());
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  hb.set_rank(1);
  hb.set_step(99);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  EXPECT_EQ(jobs_->Get(job)->latest_metrics().step(), 0) << "only rank 0 speaks for the job";
  hb.set_rank(0);
  hb.set_step(40);
  hb.set_epoch(2);
  hb.set_loss(0.5);
  hb.set_samples_per_second(300);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  v1::Metrics m = jobs_->Get(job)->latest_metrics();
  EXPECT_EQ(m.step(), 40);
  EXPECT_EQ(m.epoch(), 2);
  EXPECT_DOUBLE_EQ(m.loss(), 0.5);
  EXPECT_DOUBLE_EQ(m.samples_per_second(), 300);
  EXPECT_DOUBLE_EQ(m.eval_accuracy(), 0.8) << "what the program reported stays";
  hb.set_step(30);  // a late, older record does not move the step back
  hb.set_loss(0);   // a record without a loss keeps the last one
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  EXPECT_EQ(jobs_->Get(job)->latest_metrics().step(), 40);
  hb.set_step(45);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  EXPECT_DOUBLE_EQ(jobs_->Get(job)->latest_metrics().loss(), 0.5);
  // The supervisor's final report: the program's newest record, which
  // came after the last heartbeat.
  v1::ReportRequest final_report;
  final_report.set_job_id(job);
  final_report.set_generation(1);
  final_report.set_final(true);
  final_report.set_success(true);
  final_report.mutable_metrics()->set_step(48);
  final_report.mutable_metrics()->set_loss(0.25);
  ASSERT_TRUE(scheduler_->Report(final_report).ok());
  m = jobs_->Get(job)->latest_metrics();
  EXPECT_EQ(m.step(), 48);
  EXPECT_DOUBLE_EQ(m.loss(), 0.25);
  EXPECT_DOUBLE_EQ(m.samples_per_second(), 300) << "a value the record lacks stays";
  EXPECT_DOUBLE_EQ(m.eval_accuracy(), 0.8) << "what the program reported stays";
}

TEST_F(SchedulerTest, FailedRankFailsTheJobAndStopsTheOthers) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  const std::string job = Submit(2, 2);
  v1::RankExited e;
  e.set_job_id(job);
  e.set_slot(0);
  e.set_pid(4242);
  e.set_exit_code(3);
  e.add_stderr_tail("Traceback...");
  e.add_stderr_tail("RuntimeError: out of data");
  RankExited(*scheduler_, b.id, e);
  EXPECT_EQ(State(job), v1::Job::FAILED);
  EXPECT_THAT(jobs_->Get(job)->reason(),
              HasSubstr("rank 1 (node-b, pid 4242) exited with code 3; last stderr: RuntimeError"));
  EXPECT_EQ(a.Stops(), 1);
  EXPECT_EQ(b.Stops(), 0) << "the rank that exited needs no stop";
  EXPECT_EQ(scheduler_->reads().free_slots(), 2);
}

// Without --agent_reconnect_grace_seconds (0) a job that is not elastic fails
// as soon as an agent it runs on is lost.
TEST_F(SchedulerTest, LostAgentFailsItsJobsAndCancelStopsRanks) {
  options_.agent_reconnect_grace = absl::ZeroDuration();
  scheduler_->Configure(options_);
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  const std::string lost = Submit(2, 2);
  JoinResult waiting;
  scheduler_->Join(JoinOf(lost, a.id, 0), clock_.Now() + absl::Seconds(60), waiting.Done());
  scheduler_->RemoveAgent(b.id);
  EXPECT_EQ(State(lost), v1::Job::FAILED);
  EXPECT_THAT(jobs_->Get(lost)->reason(), HasSubstr("lost contact with the agent on node-b"));
  ASSERT_TRUE(waiting.called);
  EXPECT_EQ(waiting.result.status().code(), absl::StatusCode::kAborted);

  const std::string cancelled = Submit(1, 1);
  EXPECT_EQ(State(cancelled), v1::Job::RUNNING);
  auto job = scheduler_->Cancel(cancelled, "enough");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(State(cancelled), v1::Job::CANCELLED);
  EXPECT_EQ(a.Stops(), 2);  // one for the lost job, one for the cancelled one
  EXPECT_EQ(scheduler_->reads().free_slots(), 1);
}

TEST_F(SchedulerTest, DevicesMustMatch) {
  FakeAgent gpu;
  v1::AgentHello hello;
  hello.set_host("gpu-node");
  hello.set_slots(8);
  hello.set_device(v1::ResourceSpec::CUDA);
  ASSERT_TRUE(scheduler_->AddAgent(hello, gpu.Sender()).ok());
  const std::string cpu_job = Submit(1, 1);
  EXPECT_EQ(State(cpu_job), v1::Job::PENDING);
  hello.set_slots(0);
  EXPECT_EQ(scheduler_->AddAgent(hello, gpu.Sender()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ACudaJobOfTheBuiltInTrainerWaitsForCudaSlotsAndSaysSo) {
  FakeAgent cpu;
  Add(cpu, 4, "cpu-node");
  auto spec = ParseJobSpec("model { mlp {} } data { synthetic {} } resources { device: CUDA }",
                           SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto job = jobs_->Submit(*spec, "");
  ASSERT_TRUE(job.ok()) << job.status();  // accepted: the trainer runs on GPUs
  scheduler_->Schedule();
  const std::string id = job->job_id();
  EXPECT_EQ(State(id), v1::Job::PENDING) << "4 free CPU slots must not take a CUDA job";
  v1::JobStatus status;
  *status.mutable_job() = *jobs_->Get(id);
  scheduler_->reads().FillStatus(id, status);
  EXPECT_EQ(status.pending_reason(),
            "waiting for a node agent with CUDA slots (none is connected); later jobs start "
            "meanwhile");
  // It does not keep the CPU jobs behind it waiting.
  const std::string cpu_job = Submit(1, 1);
  EXPECT_EQ(State(cpu_job), v1::Job::RUNNING) << "a CPU job behind it takes a free CPU slot";
  EXPECT_EQ(State(id), v1::Job::PENDING);

  FakeAgent gpu;
  v1::AgentHello hello;
  hello.set_host("gpu-node");
  hello.set_slots(2);
  hello.set_device(v1::ResourceSpec::CUDA);
  ASSERT_TRUE(scheduler_->AddAgent(hello, gpu.Sender()).ok());
  scheduler_->Schedule();
  EXPECT_EQ(State(id), v1::Job::RUNNING);
  EXPECT_EQ(scheduler_->reads().free_slots(), 4) << "the other CPU slots stay free";
}

TEST_F(SchedulerTest, AJobThatCannotResumeFailsAndTheNextOneTakesItsSlots) {
  const std::string first = Submit(1, 1);
  auto spec =
      ParseJobSpec("model { mlp {} } data { synthetic {} }", SpecFormat::kTextProto, "test");
  auto resuming = jobs_->Submit(*spec, first);
  ASSERT_TRUE(resuming.ok()) << resuming.status();
  const std::string after = Submit(1, 1);
  FakeAgent a;
  Add(a, 2, "node-a");
  EXPECT_EQ(State(first), v1::Job::RUNNING);
  EXPECT_EQ(State(resuming->job_id()), v1::Job::FAILED);
  EXPECT_EQ(jobs_->Get(resuming->job_id())->reason(),
            "cannot resume from job-000001: this coordinator keeps no checkpoints");
  EXPECT_EQ(State(after), v1::Job::RUNNING) << "the failed job's slot goes to the next one";
  EXPECT_EQ(scheduler_->reads().free_slots(), 0);
}

TEST_F(SchedulerTest, ResumedJobsJoinWithTheirCheckpointAndSkippedOnesAreWarnedAbout) {
  options_.resume_resolver = [](const std::string& resume_from, std::vector<std::string>* skipped) {
    EXPECT_EQ(resume_from, "job-000001:30");
    skipped->push_back("checkpoint job-000001 step 30 is damaged");
    v1::CheckpointManifest manifest;
    manifest.set_job_id("job-000001");
    manifest.set_step(20);
    return absl::StatusOr<v1::CheckpointManifest>(manifest);
  };
  scheduler_->Configure(options_);
  const std::string original = Submit(1, 1);
  auto spec =
      ParseJobSpec("model { mlp {} } data { synthetic {} }", SpecFormat::kTextProto, "test");
  auto resumed = jobs_->Submit(*spec, original + ":30");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  FakeAgent a;
  Add(a, 2, "node-a");
  JoinResult join;
  scheduler_->Join(JoinOf(resumed->job_id(), a.id, 1), clock_.Now() + absl::Seconds(5),
                   join.Done());
  ASSERT_TRUE(join.called);
  ASSERT_TRUE(join.result.ok()) << join.result.status();
  EXPECT_EQ(join.result->resume().step(), 20);
  EXPECT_EQ(join.result->local_rank(), 0);
  EXPECT_EQ(join.result->local_world_size(), 1);
  auto events = jobs_->Events(resumed->job_id(), 0);
  ASSERT_TRUE(events.ok());
  bool warned = false;
  for (const v1::JobEvent& e : *events) {
    warned |=
        e.message() == "warning: checkpoint job-000001 step 30 is damaged; using an older one";
  }
  EXPECT_TRUE(warned);
}

// ---------------------------------------------------------------- elastic

class ElasticSchedulerTest : public SchedulerTest {
 protected:
  // A 4-rank elastic job on a 5-slot agent whose ranks joined generation 1.
  std::string StartElastic(const std::string& elastic, const std::string& more = "") {
    auto spec = ParseJobSpec(absl::StrCat("model { mlp {} } data { synthetic {} } resources { "
                                          "min_ranks: 4 max_ranks: 4 } elastic { ",
                                          elastic, " } ", more),
                             SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    Add(agent_, 5, "node-a");
    std::vector<JoinResult> joins(4);
    for (int slot = 0; slot < 4; ++slot) {
      scheduler_->Join(JoinOf(job->job_id(), agent_.id, slot), clock_.Now() + absl::Seconds(60),
                       joins[slot].Done());
    }
    EXPECT_TRUE(joins[3].result.ok()) << joins[3].result.status();
    return job->job_id();
  }

  void Exit(const std::string& job, int slot, int code) {
    v1::RankExited e;
    e.set_job_id(job);
    e.set_slot(slot);
    e.set_pid(100 + slot);
    e.set_exit_code(code);
    RankExited(*scheduler_, agent_.id, e);
  }

  std::vector<std::string> Reasons(const std::string& job) {
    std::vector<std::string> out;
    absl::StatusOr<std::vector<v1::JobEvent>> events = jobs_->Events(job, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    for (const v1::JobEvent& e : *events) {
      if (e.has_state()) out.push_back(e.reason());
      if (e.has_message()) out.push_back(e.message());
    }
    return out;
  }

  // Rank `rank`'s heartbeat of generation `gen` with `records` in its flight
  // recorder. Returns what Heartbeat returned; the directive goes to
  // `directive` if not null.
  bool BeatWith(const std::string& job, int64_t gen, int rank,
                const std::vector<v1::CollectiveRecord>& records,
                v1::Directive* directive = nullptr) {
    v1::RankHeartbeat hb;
    hb.set_job_id(job);
    hb.set_generation(gen);
    hb.set_rank(rank);
    hb.set_step(40);
    hb.set_phase(records.empty() ? v1::FORWARD : v1::COLLECTIVE);
    for (const v1::CollectiveRecord& r : records) {
      *hb.mutable_flight_recorder()->add_records() = r;
      hb.mutable_flight_recorder()->set_last_enqueued_seq(
          std::max(hb.flight_recorder().last_enqueued_seq(), r.seq()));
    }
    return scheduler_->Heartbeat(hb, directive);
  }

  // Every rank joins generation `gen` on its own slot (pid 100 + slot).
  std::vector<JoinResult> JoinSameSlots(const std::string& job, int64_t gen) {
    std::vector<JoinResult> joins(4);
    for (int slot = 0; slot < 4; ++slot) {
      scheduler_->Join(JoinOf(job, agent_.id, slot, gen), clock_.Now() + absl::Seconds(60),
                       joins[slot].Done());
    }
    return joins;
  }

  FakeAgent agent_;
};

// An all-reduce of `count` floats tagged `tag`, collective #seq, started at
// `started`; completed `took` later when `took` is not zero.
v1::CollectiveRecord AllReduce(int64_t seq, const std::string& tag, int64_t count,
                               absl::Time started, absl::Duration took = absl::ZeroDuration()) {
  v1::CollectiveRecord r;
  r.set_seq(seq);
  r.mutable_fingerprint()->set_op("allreduce/sum");
  r.mutable_fingerprint()->set_tag(tag);
  r.mutable_fingerprint()->set_dtype("float32");
  r.mutable_fingerprint()->set_count(count);
  r.mutable_fingerprint()->set_bytes(4 * count);
  r.set_started_us(absl::ToUnixMicros(started));
  if (took == absl::ZeroDuration()) {
    r.set_state(v1::CollectiveRecord::STARTED);
  } else {
    r.set_state(v1::CollectiveRecord::COMPLETED);
    r.set_completed_us(absl::ToUnixMicros(started + took));
  }
  return r;
}

// Rank `rank` of a MISMATCH_COLLECTIVE fault on rank 1: collective #27 is
// fault/first (4 floats) on every rank but rank 1, which issued fault/second
// (8 floats) there.
std::vector<v1::CollectiveRecord> MismatchAt27(int rank, absl::Time started) {
  return {rank == 1 ? AllReduce(27, "fault/second", 8, started)
                    : AllReduce(27, "fault/first", 4, started)};
}

constexpr char kMismatchMessage[] =
    "ranks 0 and 1 issued different collectives at #27: rank 0 allreduce/sum fault/first "
    "(float32[4], 16 bytes), rank 1 allreduce/sum fault/second (float32[8], 32 bytes) (are two "
    "models or DDP instances called in a different order?)";

TEST_F(ElasticSchedulerTest, AKilledRankIsReplacedAndTheSurvivorsJoinTheNextGeneration) {
  const std::string job = StartElastic("");
  // A survivor whose communicator failed asks for generation 2 before the
  // coordinator has heard of the exit: not formed yet.
  JoinResult early;
  scheduler_->Join(JoinOf(job, agent_.id, 0, 2), clock_.Now() + absl::Seconds(60), early.Done());
  EXPECT_EQ(early.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(early.result.status().message(),
              HasSubstr("generation 2 of job " + job + " has not formed yet"));

  Exit(job, 1, -9);
  v1::Job running = *jobs_->Get(job);
  EXPECT_EQ(running.state(), v1::Job::RUNNING);
  EXPECT_EQ(running.generation(), 2);
  EXPECT_EQ(running.world_size(), 4);
  EXPECT_EQ(running.restarts(), 1);
  // Only the newcomer is launched, on the lost rank's slot, for generation 2.
  ASSERT_EQ(agent_.Launches().size(), 2u);
  const v1::LaunchRanks launch = agent_.Launches()[1];
  EXPECT_EQ(launch.generation(), 2);
  ASSERT_EQ(launch.ranks_size(), 1);
  EXPECT_EQ(launch.ranks(0).slot(), 1);
  EXPECT_EQ(agent_.Stops(), 0) << "survivors are not stopped";

  std::vector<JoinResult> joins(4);
  clock_.Advance(absl::Seconds(2));
  for (int slot : {0, 2, 3, 1}) {
    scheduler_->Join(JoinOf(job, agent_.id, slot, 2), clock_.Now() + absl::Seconds(60),
                     joins[slot].Done());
  }
  for (int slot = 0; slot < 4; ++slot) {
    ASSERT_TRUE(joins[slot].result.ok()) << joins[slot].result.status();
    EXPECT_EQ(joins[slot].result->rank(), slot);
    EXPECT_EQ(joins[slot].result->world_size(), 4);
    EXPECT_EQ(joins[slot].result->generation(), 2);
    EXPECT_EQ(joins[slot].result->store_namespace(), job + "/gen-2");
  }
  EXPECT_THAT(Reasons(job),
              testing::Contains("generation 2 after rank 1 (node-a, pid 101) was killed by signal "
                                "9: 4 -> 4 ranks (rank 1 on node-a slot 1), restart 1 of 3"));
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 formed with 4 ranks, 2 s after the "
                                              "failure (recovery_seconds)"));
  // Generation 1's heartbeats and reports are no longer accepted.
  v1::RankHeartbeat old;
  old.set_job_id(job);
  old.set_generation(1);
  old.set_rank(0);
  v1::Directive directive;
  EXPECT_FALSE(scheduler_->Heartbeat(old, &directive));
  EXPECT_EQ(directive.kind(), v1::Directive::RE_RENDEZVOUS) << "a survivor that missed it";
  EXPECT_EQ(directive.generation(), 2);
  EXPECT_THAT(directive.reason(), testing::StartsWith("generation 2 after rank 1 (node-a"));
  v1::ReportRequest report;
  report.set_job_id(job);
  report.set_generation(2);
  report.set_rank(0);
  report.mutable_metrics()->set_step(120);
  ASSERT_TRUE(scheduler_->Report(report).ok());
  const v1::Metrics latest = jobs_->Get(job)->latest_metrics();
  EXPECT_EQ(latest.step(), 120);
  EXPECT_EQ(latest.values().at("restarts"), 1);
  EXPECT_EQ(latest.values().at("recovery_seconds"), 2);
  for (int slot = 0; slot < 4; ++slot) Exit(job, slot, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
}

// Note [A survivor that does not join]: rank 2 is frozen (SIGSTOP) as
// generation 2 forms after rank 3's loss. Once its process has been silent
// for dead_after_seconds it is evicted, and generation 3 forms without it,
// with a newcomer in its place, long before elastic.wait_seconds (60 s).
TEST_F(ElasticSchedulerTest, ASurvivorSilentWhileAGenerationFormsIsEvictedAndReplaced) {
  const std::string job = StartElastic("");
  for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(BeatWith(job, 1, rank, {}));
  Exit(job, 3, -9);
  ASSERT_EQ(jobs_->Get(job)->generation(), 2);
  std::vector<JoinResult> joins(4);
  for (int slot : {0, 1, 3}) {
    scheduler_->Join(JoinOf(job, agent_.id, slot, 2), clock_.Now() + absl::Seconds(60),
                     joins[slot].Done());
  }
  for (int second = 1; second <= 5; ++second) {
    clock_.Advance(absl::Seconds(1));
    // The survivors that joined still heartbeat in generation 1 until it forms.
    for (int rank : {0, 1}) BeatWith(job, 1, rank, {});
    scheduler_->Tick();
    EXPECT_EQ(agent_.Stops(), 0) << "after " << second << " s: not silent for 5 s yet";
  }
  clock_.Advance(absl::Milliseconds(500));
  scheduler_->Tick();
  std::vector<v1::StopRanks> stops;
  for (const auto& m : agent_.received) {
    if (m.has_stop()) stops.push_back(m.stop());
  }
  ASSERT_EQ(stops.size(), 1u);
  ASSERT_EQ(stops[0].slots_size(), 1);
  EXPECT_EQ(stops[0].slots(0), 2);
  EXPECT_EQ(stops[0].reason(),
            "evicted by the forming generation: rank 2 has not joined generation 2 and its "
            "process has sent no heartbeat for 5.5 s (hang_detection.dead_after_seconds 5): it "
            "is stopped or not responding");
  Exit(job, 2, -9);  // the agent's SIGKILL
  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.state(), v1::Job::RUNNING);
  EXPECT_EQ(reformed.generation(), 3);
  EXPECT_EQ(reformed.world_size(), 4);
  EXPECT_EQ(reformed.restarts(), 2);
  EXPECT_THAT(Reasons(job), testing::Contains(testing::StartsWith(
                                "generation 3 after rank 2 (node-a, pid 102) was evicted by the "
                                "forming generation: rank 2 has not joined generation 2")));
  for (int slot : {0, 1, 3}) {
    EXPECT_EQ(joins[slot].result.status().code(), absl::StatusCode::kAborted) << slot;
  }
  std::vector<JoinResult> again = JoinSameSlots(job, 3);
  for (int slot = 0; slot < 4; ++slot) {
    ASSERT_TRUE(again[slot].result.ok()) << again[slot].result.status();
  }
  for (int slot = 0; slot < 4; ++slot) Exit(job, slot, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
}

// Note [A generation's checkpoint]: a later generation names the job's
// newest committed checkpoint, looked up as it forms, which its ranks start
// over from should none of them hold training state; without one, the
// checkpoint the job was submitted with (here none).
TEST_F(ElasticSchedulerTest, ALaterGenerationNamesTheJobsNewestCommittedCheckpoint) {
  int64_t newest = 0;  // the step of the job's newest committed checkpoint; 0: none
  std::vector<std::string> asked;
  options_.resume_resolver =
      [&](const std::string& resume_from,
          std::vector<std::string>* skipped) -> absl::StatusOr<v1::CheckpointManifest> {
    asked.push_back(resume_from);
    if (newest == 0) return absl::NotFoundError("no usable checkpoint");
    v1::CheckpointManifest manifest;
    manifest.set_job_id(resume_from);
    manifest.set_step(newest);
    return manifest;
  };
  scheduler_->Configure(options_);
  const std::string job = StartElastic("");
  Exit(job, 1, -9);
  for (JoinResult& join : JoinSameSlots(job, 2)) {
    ASSERT_TRUE(join.result.ok()) << join.result.status();
    EXPECT_TRUE(join.result->resume().job_id().empty()) << "no checkpoint committed yet";
  }
  newest = 40;
  Exit(job, 2, -9);
  newest = 50;  // committed after generation 3 formed: its members were told 40
  std::vector<JoinResult> joins = JoinSameSlots(job, 3);
  for (int slot = 0; slot < 4; ++slot) {
    ASSERT_TRUE(joins[slot].result.ok()) << joins[slot].result.status();
    EXPECT_EQ(joins[slot].result->resume().job_id(), job) << "slot " << slot;
    EXPECT_EQ(joins[slot].result->resume().step(), 40) << "slot " << slot;
  }
  EXPECT_EQ(asked, (std::vector<std::string>{job, job}));
  EXPECT_EQ(jobs_->Get(job)->restarts(), 2) << "one restart per lost rank";
}

// Note [Joins through the agent]: the joins of `slots` of generation `gen`
// as one message from the agent.
v1::RankJoins JoinsOf(const std::string& job, const std::vector<int>& slots, int64_t gen = 1) {
  v1::RankJoins batch;
  for (int slot : slots) {
    // What a rank writes: the agent's stream, not the request, says whose.
    *batch.add_joins() = JoinOf(job, "agent-that-lies", slot, gen);
  }
  return batch;
}

TEST_F(ElasticSchedulerTest, SurvivorsJoinTheNextGenerationThroughTheirAgentInOneAnswer) {
  const std::string job = StartElastic("");
  const absl::Time deadline = clock_.Now() + absl::Seconds(60);
  // Before the coordinator heard of the failure: answered at once, as a
  // rank's own Join would be.
  AgentJoins(*scheduler_, agent_.id, JoinsOf(job, {0}, 2), deadline);
  ASSERT_EQ(agent_.Answers().size(), 1u);
  ASSERT_EQ(agent_.Answers()[0].entries_size(), 1);
  const v1::RankJoinAnswers::Entry early = agent_.Answers()[0].entries(0);
  EXPECT_EQ(early.slot(), 0);
  EXPECT_EQ(early.asked_generation(), 2);
  EXPECT_EQ(early.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(early.message(), HasSubstr("generation 2 of job " + job + " has not formed yet"));

  Exit(job, 1, -9);
  clock_.Advance(absl::Seconds(2));
  AgentJoins(*scheduler_, agent_.id, JoinsOf(job, {0, 2}, 2), deadline);
  EXPECT_EQ(agent_.Answers().size(), 1u) << "they wait for the generation";
  JoinResult own;  // a rank without an agent channel joins on its own
  scheduler_->Join(JoinOf(job, agent_.id, 3, 2), deadline, own.Done());
  EXPECT_FALSE(own.called);
  AgentJoins(*scheduler_, agent_.id, JoinsOf(job, {1}, 2), deadline);  // the newcomer

  ASSERT_TRUE(own.result.ok()) << own.result.status();
  EXPECT_EQ(own.result->rank(), 3);
  EXPECT_EQ(own.result->generation(), 2);
  ASSERT_EQ(agent_.Answers().size(), 2u) << "every answer of the completion in one message";
  const v1::RankJoinAnswers answers = agent_.Answers()[1];
  ASSERT_EQ(answers.entries_size(), 3);
  ASSERT_EQ(answers.shared_size(), 1) << "the spec and the rest go once";
  EXPECT_TRUE(answers.shared(0).response().has_spec());
  for (const v1::RankJoinAnswers::Entry& entry : answers.entries()) {
    EXPECT_FALSE(entry.response().has_spec()) << "not per rank";
    absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, entry);
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined->rank(), entry.slot());
    EXPECT_EQ(joined->world_size(), 4);
    EXPECT_EQ(joined->generation(), 2);
    EXPECT_EQ(joined->store_namespace(), job + "/gen-2");
    EXPECT_EQ(joined->restarts(), 1);
    EXPECT_EQ(joined->spec().resources().max_ranks(), 4);
    EXPECT_EQ(joined->local_world_size(), 4);
    EXPECT_EQ(joined->local_rank(), entry.slot());
    // The rank's whole answer is what its own Join would have got.
    v1::JoinResponse same = *own.result;
    same.set_rank(entry.slot());
    same.set_local_rank(entry.slot());
    EXPECT_EQ(joined->SerializeAsString(), same.SerializeAsString());
  }
  // Completion counted once, whichever way the ranks joined.
  const std::vector<std::string> reasons = Reasons(job);
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(),
                       "generation 2 formed with 4 ranks, 2 s after the failure "
                       "(recovery_seconds)"),
            1);
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);
}

// A first rendezvous (generation 1) takes joins both ways at once, and
// chorus_rank_joins_total says which way each came.
TEST_F(SchedulerTest, FirstJoinsThroughTheAgentFormGenerationOneAndAreCountedByWay) {
  CoordinatorMetrics metrics;
  options_.metrics = &metrics;
  scheduler_->Configure(options_);
  FakeAgent agent;
  Add(agent, 3, "node-a");
  const std::string job = Submit(3, 3);
  const absl::Time deadline = clock_.Now() + absl::Seconds(60);
  JoinResult own;  // a rank without an agent channel
  scheduler_->Join(JoinOf(job, agent.id, 2), deadline, own.Done());
  AgentJoins(*scheduler_, agent.id, JoinsOf(job, {0}), deadline);
  EXPECT_FALSE(own.called);
  EXPECT_TRUE(agent.Answers().empty()) << "generation 1 waits for rank 1";
  AgentJoins(*scheduler_, agent.id, JoinsOf(job, {1}), deadline);

  ASSERT_TRUE(own.result.ok()) << own.result.status();
  EXPECT_EQ(own.result->generation(), 1);
  ASSERT_EQ(agent.Answers().size(), 1u) << "both agent ranks' answers in one message";
  const v1::RankJoinAnswers answers = agent.Answers()[0];
  ASSERT_EQ(answers.entries_size(), 2);
  for (const v1::RankJoinAnswers::Entry& entry : answers.entries()) {
    EXPECT_EQ(entry.asked_generation(), 1);
    absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, entry);
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined->generation(), 1);
    EXPECT_EQ(joined->world_size(), 3);
    EXPECT_TRUE(joined->spec().has_model()) << "the spec reaches a first join";
  }
  const std::string text = metrics.Render({});
  EXPECT_THAT(text, HasSubstr("chorus_rank_joins_total{via=\"agent\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_joins_total{via=\"rank\"} 1\n"));
}

TEST_F(SchedulerTest, AnAgentJoinsOnlyForItsOwnSlots) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  const std::string job = Submit(2, 2);
  const absl::Time deadline = clock_.Now() + absl::Seconds(60);
  // b sends a join naming a's slot 0: the stream says it is b's, so it is
  // b's own slot 0 (rank 1) that joins, and a's rank 0 has not.
  v1::RankJoins claim;
  *claim.add_joins() = JoinOf(job, a.id, 0);
  AgentJoins(*scheduler_, b.id, claim, deadline);
  EXPECT_TRUE(b.Answers().empty()) << "waits for rank 0";
  // A slot b does not have is no rank of the job.
  AgentJoins(*scheduler_, b.id, JoinsOf(job, {3}), deadline);
  ASSERT_EQ(b.Answers().size(), 1u);
  EXPECT_EQ(b.Answers()[0].entries(0).code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(b.Answers()[0].entries(0).message(), HasSubstr(b.id + " slot 3"));
  AgentJoins(*scheduler_, a.id, JoinsOf(job, {0}), deadline);
  ASSERT_EQ(a.Answers().size(), 1u);
  ASSERT_EQ(b.Answers().size(), 2u) << "each agent hears its own ranks' answers";
  const v1::RankJoinAnswers to_a = a.Answers()[0];
  const v1::RankJoinAnswers to_b = b.Answers()[1];
  EXPECT_EQ(JoinAnswerFor(to_a, to_a.entries(0))->rank(), 0);
  EXPECT_EQ(JoinAnswerFor(to_b, to_b.entries(0))->rank(), 1);
  EXPECT_EQ(JoinAnswerFor(to_b, to_b.entries(0))->group_rank(), 1);
  EXPECT_EQ(JoinAnswerFor(to_b, to_b.entries(0))->group_world_size(), 2);
  // Joins from an agent that is gone are not answered (its stream ended).
  scheduler_->RemoveAgent(a.id);
  const size_t before = a.received.size();
  AgentJoins(*scheduler_, a.id, JoinsOf(job, {0}), deadline);
  EXPECT_EQ(a.received.size(), before);
}

TEST_F(SchedulerTest, AJoinThroughTheAgentExpiresAndARetrySupersedesIt) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = Submit(2, 2);
  AgentJoins(*scheduler_, a.id, JoinsOf(job, {0}), clock_.Now() + absl::Seconds(5));
  // A retry of the same rank replaces the first: it is answered ABORTED.
  AgentJoins(*scheduler_, a.id, JoinsOf(job, {0}), clock_.Now() + absl::Seconds(5));
  ASSERT_EQ(a.Answers().size(), 1u);
  EXPECT_EQ(a.Answers()[0].entries(0).code(), static_cast<int>(absl::StatusCode::kAborted));
  scheduler_->Tick();
  EXPECT_EQ(a.Answers().size(), 1u);
  clock_.Advance(absl::Seconds(6));
  scheduler_->Tick();
  ASSERT_EQ(a.Answers().size(), 2u) << "the expiry reaches the agent from Tick";
  const v1::RankJoinAnswers::Entry expired = a.Answers()[1].entries(0);
  EXPECT_EQ(expired.slot(), 0);
  EXPECT_EQ(expired.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(expired.message(), HasSubstr("ranks that have not joined: 1"));
  // The expired rank no longer counts as joined: rank 1 alone completes
  // nothing, and rank 0's next join completes the generation.
  AgentJoins(*scheduler_, a.id, JoinsOf(job, {1}), clock_.Now() + absl::Seconds(5));
  EXPECT_EQ(a.Answers().size(), 2u);
  AgentJoins(*scheduler_, a.id, JoinsOf(job, {0}), clock_.Now() + absl::Seconds(5));
  ASSERT_EQ(a.Answers().size(), 3u);
  const v1::RankJoinAnswers formed = a.Answers()[2];
  EXPECT_EQ(formed.entries_size(), 2);
  for (const v1::RankJoinAnswers::Entry& entry : formed.entries()) {
    EXPECT_TRUE(JoinAnswerFor(formed, entry).ok()) << entry.message();
  }
}

TEST_F(ElasticSchedulerTest, FailuresBeyondMaxRestartsFailTheJobWithTheHistory) {
  const std::string job = StartElastic("max_restarts: 1");
  Exit(job, 1, -9);
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  Exit(job, 2, 3);
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.reason(),
            "rank 2 (node-a, pid 102) exited with code 3; elastic.max_restarts 1 used up in "
            "generation 2; history: generation 2 after rank 1 (node-a, pid 101) was killed by "
            "signal 9: 4 -> 4 ranks (rank 1 on node-a slot 1), restart 1 of 1");
  EXPECT_EQ(scheduler_->reads().free_slots(), 5) << "every slot is released";
}

TEST_F(ElasticSchedulerTest, AGenerationThatDoesNotFormInWaitSecondsFailsTheJob) {
  const std::string job = StartElastic("wait_seconds: 5");
  Exit(job, 3, -9);
  std::vector<JoinResult> joins(3);
  for (int slot = 0; slot < 3; ++slot) {
    scheduler_->Join(JoinOf(job, agent_.id, slot, 2), clock_.Now() + absl::Seconds(60),
                     joins[slot].Done());
  }
  clock_.Advance(absl::Seconds(4));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  clock_.Advance(absl::Seconds(2));
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_THAT(failed.reason(),
              testing::StartsWith("generation 2 did not form within elastic.wait_seconds 5 s; "
                                  "ranks that have not joined: 3; history: generation 2 after "
                                  "rank 3"));
  EXPECT_EQ(joins[0].result.status().code(), absl::StatusCode::kAborted);
}

TEST_F(ElasticSchedulerTest, RestartEvictsADeadRankAndItsExitStartsTheNextGeneration) {
  const std::string job =
      StartElastic("", "hang_detection { action: RESTART dead_after_seconds: 2 }");
  auto beat = [&](int rank) {
    v1::RankHeartbeat hb;
    hb.set_job_id(job);
    hb.set_generation(1);
    hb.set_rank(rank);
    hb.set_step(40);
    hb.set_phase(v1::COLLECTIVE);
    EXPECT_TRUE(scheduler_->Heartbeat(hb));
  };
  for (int rank = 0; rank < 4; ++rank) beat(rank);
  for (int i = 0; i < 3; ++i) {  // rank 1 is frozen; the others go on
    clock_.Advance(absl::Seconds(1));
    for (int rank : {0, 2, 3}) beat(rank);
    scheduler_->Tick();
  }
  std::vector<v1::StopRanks> stops;
  for (const auto& m : agent_.received) {
    if (m.has_stop()) stops.push_back(m.stop());
  }
  ASSERT_EQ(stops.size(), 1u) << "evicted once, not at every tick";
  EXPECT_EQ(stops[0].job_id(), job);
  ASSERT_EQ(stops[0].slots_size(), 1);
  EXPECT_EQ(stops[0].slots(0), 1);
  EXPECT_EQ(stops[0].grace_seconds(), 1);
  EXPECT_THAT(stops[0].reason(), testing::StartsWith("evicted by hang_detection.action RESTART: "
                                                     "DEAD rank 1"));
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "RESTART does not fail an elastic job for DEAD";

  Exit(job, 1, -9);
  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.state(), v1::Job::RUNNING);
  EXPECT_EQ(reformed.generation(), 2);
  bool cause = false;
  for (const std::string& r : Reasons(job)) {
    cause |= r.rfind(
                 "generation 2 after rank 1 (node-a, pid 101) was evicted by "
                 "hang_detection.action RESTART: DEAD rank 1",
                 0) == 0;
  }
  EXPECT_TRUE(cause);
}

// Note [Hang restart]: a MISMATCH has no rank to evict; every rank keeps its
// process and slot and re-forms its transport in generation 2.
TEST_F(ElasticSchedulerTest, RestartReformsEveryRankAfterAMismatch) {
  const std::string job = StartElastic("", "hang_detection { action: RESTART }");
  const absl::Time started = clock_.Now();
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(BeatWith(job, 1, rank, MismatchAt27(rank, started)));
  }
  clock_.Advance(absl::Milliseconds(500));
  scheduler_->Tick();

  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.state(), v1::Job::RUNNING);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.world_size(), 4);
  EXPECT_EQ(reformed.restarts(), 1) << "a hang restart counts against elastic.max_restarts";
  EXPECT_EQ(agent_.Stops(), 0) << "no rank is stopped";
  EXPECT_EQ(agent_.Launches().size(), 1u) << "no rank is launched: the same processes re-form";
  const std::string change = absl::StrCat(
      "generation 2 after hang_detection.action RESTART for MISMATCH ranks 0,1 at #27 "
      "(every rank re-forms its transport): ",
      kMismatchMessage, ": 4 -> 4 ranks, restart 1 of 3");
  EXPECT_THAT(Reasons(job), testing::Contains(change));

  // The next tick finds no problem in generation 2 (no heartbeat of it yet),
  // so nothing more happens.
  clock_.Advance(absl::Milliseconds(100));
  scheduler_->Tick();
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);

  // A rank still blocked in the mismatched collective hears of generation 2
  // on its next heartbeat and aborts its communicator.
  v1::Directive directive;
  EXPECT_FALSE(BeatWith(job, 1, 2, MismatchAt27(2, started), &directive));
  EXPECT_EQ(directive.kind(), v1::Directive::RE_RENDEZVOUS);
  EXPECT_EQ(directive.generation(), 2);
  EXPECT_EQ(directive.reason(), change);

  clock_.Advance(absl::Milliseconds(900));
  std::vector<JoinResult> joins = JoinSameSlots(job, 2);
  for (int slot = 0; slot < 4; ++slot) {
    ASSERT_TRUE(joins[slot].result.ok()) << joins[slot].result.status();
    EXPECT_EQ(joins[slot].result->rank(), slot) << "every rank keeps its number";
    EXPECT_EQ(joins[slot].result->world_size(), 4);
    EXPECT_EQ(joins[slot].result->generation(), 2);
    EXPECT_EQ(joins[slot].result->store_namespace(), job + "/gen-2");
  }
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 formed with 4 ranks, 1 s after the "
                                              "failure (recovery_seconds)"));
  // Healthy heartbeats of generation 2: no diagnosis, no further generation.
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(
        BeatWith(job, 2, rank,
                 {AllReduce(3, "ddp:model/bucket0", 100, clock_.Now(), absl::Milliseconds(5))}));
  }
  clock_.Advance(absl::Seconds(1));
  scheduler_->Tick();
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1);
  for (int slot = 0; slot < 4; ++slot) Exit(job, slot, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
}

TEST_F(ElasticSchedulerTest, RestartReformsEveryRankWhenAllAreStuckInOneCollective) {
  const std::string job = StartElastic("", "hang_detection { action: RESTART }");
  // Collective #10 usually takes 10 ms: "far longer than usual" is then the
  // default stall_after_seconds, 3 s.
  const absl::Time started = clock_.Now();
  const std::vector<v1::CollectiveRecord> inside = {
      AllReduce(9, "ddp:model/bucket0", 100, started - absl::Seconds(1), absl::Milliseconds(10)),
      AllReduce(10, "ddp:model/bucket0", 100, started)};
  for (int i = 0; i < 3; ++i) {  // 0, 1.5 and 3 s inside: not yet stuck
    for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(BeatWith(job, 1, rank, inside));
    scheduler_->Tick();
    EXPECT_EQ(jobs_->Get(job)->generation(), 1) << "after " << i * 1.5 << " s";
    clock_.Advance(absl::Milliseconds(1500));
  }
  for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(BeatWith(job, 1, rank, inside));
  scheduler_->Tick();  // 4.5 s

  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.state(), v1::Job::RUNNING);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.world_size(), 4);
  EXPECT_EQ(reformed.restarts(), 1);
  EXPECT_EQ(agent_.Stops(), 0);
  EXPECT_EQ(agent_.Launches().size(), 1u);
  EXPECT_THAT(Reasons(job),
              testing::Contains(
                  "generation 2 after hang_detection.action RESTART for STUCK_IN_COLLECTIVE ranks "
                  "0,1,2,3 at #10 (every rank re-forms its transport): every rank has been inside "
                  "collective #10 allreduce/sum ddp:model/bucket0 (float32[100], 400 bytes) for "
                  "4.5 s (threshold "
                  "3.0 s); all of them issued it, so the transport or a peer's network is "
                  "suspect: 4 -> 4 ranks, restart 1 of 3"));
  v1::Directive directive;
  EXPECT_FALSE(BeatWith(job, 1, 0, inside, &directive));
  EXPECT_EQ(directive.kind(), v1::Directive::RE_RENDEZVOUS);
  EXPECT_EQ(directive.generation(), 2);
  std::vector<JoinResult> joins = JoinSameSlots(job, 2);
  for (int slot = 0; slot < 4; ++slot) {
    ASSERT_TRUE(joins[slot].result.ok()) << joins[slot].result.status();
    EXPECT_EQ(joins[slot].result->rank(), slot);
  }
}

// Note [Diagnoses during shutdown]: the ranks' last heartbeats say they are
// inside the final evaluation's all-reduce, then they fall silent while
// they shut down (their heartbeat streams end before the final report).
// Neither STUCK_IN_COLLECTIVE nor DEAD may restart a job whose ranks said
// they finished; their exits with code 0 end it SUCCEEDED.
class FinishingTest : public ElasticSchedulerTest {
 protected:
  void SetUp() override {
    ElasticSchedulerTest::SetUp();
    job_ = StartElastic("", "hang_detection { action: RESTART }");
    started_ = clock_.Now();
    inside_ = {AllReduce(9, "eval/metrics", 2, started_ - absl::Seconds(1), absl::Milliseconds(5)),
               AllReduce(10, "eval/metrics", 2, started_)};
    for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(BeatWith(job_, 1, rank, inside_));
    clock_.Advance(absl::Seconds(1));
    for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(BeatWith(job_, 1, rank, inside_));
  }

  absl::Status FinalReport(int64_t gen, int rank) {
    v1::ReportRequest report;
    report.set_job_id(job_);
    report.set_generation(gen);
    report.set_rank(rank);
    report.set_final(true);
    report.set_success(true);
    report.mutable_metrics()->set_step(1500);
    return scheduler_->Report(report);
  }

  // Ticks once a second for `seconds` with no heartbeat.
  void Silence(int seconds) {
    for (int s = 0; s < seconds; ++s) {
      clock_.Advance(absl::Seconds(1));
      scheduler_->Tick();
    }
  }

  std::string job_;
  absl::Time started_;
  std::vector<v1::CollectiveRecord> inside_;
};

TEST_F(FinishingTest, RanksSilentAfterTheirFinalReportsAreNeitherStuckNorDead) {
  for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(FinalReport(1, rank).ok());
  Silence(10);  // past stall_after_seconds (3) and dead_after_seconds (5)
  EXPECT_EQ(jobs_->Get(job_)->generation(), 1);
  EXPECT_EQ(agent_.Stops(), 0);
  v1::JobStatus status;
  scheduler_->reads().FillStatus(job_, status);
  EXPECT_EQ(status.diagnoses_size(), 0) << status.diagnoses(0).message();
  for (int slot = 0; slot < 4; ++slot) Exit(job_, slot, 0);
  const v1::Job ended = *jobs_->Get(job_);
  EXPECT_EQ(ended.state(), v1::Job::SUCCEEDED) << ended.reason();
  EXPECT_EQ(ended.restarts(), 0);
  EXPECT_EQ(ended.latest_metrics().step(), 1500);
}

TEST_F(FinishingTest, AFinishedHeartbeatEndsTheWatchBeforeTheFinalReport) {
  for (int rank = 0; rank < 4; ++rank) {
    v1::RankHeartbeat hb;
    hb.set_job_id(job_);
    hb.set_generation(1);
    hb.set_rank(rank);
    hb.set_step(1500);
    hb.set_phase(v1::FINISHED);
    ASSERT_TRUE(scheduler_->Heartbeat(hb, nullptr));
  }
  Silence(10);
  EXPECT_EQ(jobs_->Get(job_)->generation(), 1);
  EXPECT_EQ(agent_.Stops(), 0);
  for (int slot = 0; slot < 4; ++slot) Exit(job_, slot, 0);
  EXPECT_EQ(State(job_), v1::Job::SUCCEEDED);
}

TEST_F(FinishingTest, StaleHeartbeatsInsideACollectiveAreNotStuck) {
  // No final report yet (the coordinator is slow to take it): the
  // heartbeats that said "inside #10" do not grow older inside it.
  Silence(3);
  EXPECT_EQ(jobs_->Get(job_)->generation(), 1);
  v1::JobStatus status;
  scheduler_->reads().FillStatus(job_, status);
  EXPECT_EQ(status.diagnoses_size(), 0) << status.diagnoses(0).message();
  for (int slot = 0; slot < 4; ++slot) Exit(job_, slot, 0);
  EXPECT_EQ(State(job_), v1::Job::SUCCEEDED);
}

TEST_F(FinishingTest, ARestartOrderedAsTheRanksFinishedStillEndsSucceeded) {
  // The final all-reduce is slow (a loaded machine) but the ranks still
  // heartbeat: past 3 s it is STUCK_IN_COLLECTIVE and generation 2 forms.
  for (int s = 0; s < 4; ++s) {
    clock_.Advance(absl::Seconds(1));
    for (int rank = 0; rank < 4; ++rank) BeatWith(job_, 1, rank, inside_);
    scheduler_->Tick();
  }
  ASSERT_EQ(jobs_->Get(job_)->generation(), 2);
  // The all-reduce completes; the ranks finish and report before they hear
  // of generation 2, then exit 0.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(FinalReport(1, rank).ok()) << "rank " << rank;
  }
  Silence(2);
  for (int slot = 0; slot < 4; ++slot) Exit(job_, slot, 0);
  const v1::Job ended = *jobs_->Get(job_);
  EXPECT_EQ(ended.state(), v1::Job::SUCCEEDED) << ended.reason();
  EXPECT_EQ(ended.latest_metrics().step(), 1500);
}

// Note [Hang restart]: a rank stopped inside the collective looks
// STUCK_IN_COLLECTIVE before it is DEAD. Re-forming with it would wait for a
// rank that never joins; the restart waits, and once DEAD the rank is
// evicted (eviction wins when both diagnoses hold).
TEST_F(ElasticSchedulerTest, RestartWaitsForASilentRankToBeDeadAndEvictsIt) {
  const std::string job = StartElastic("", "hang_detection { action: RESTART }");
  const absl::Time started = clock_.Now();
  const std::vector<v1::CollectiveRecord> inside = {
      AllReduce(10, "ddp:model/bucket0", 100, started)};
  for (int rank = 0; rank < 4; ++rank) ASSERT_TRUE(BeatWith(job, 1, rank, inside));
  for (int second = 1; second <= 6; ++second) {  // rank 3 is frozen; the others go on
    clock_.Advance(absl::Seconds(1));
    for (int rank : {0, 1, 2}) ASSERT_TRUE(BeatWith(job, 1, rank, inside));
    scheduler_->Tick();
    if (second == 4) {
      v1::JobStatus status;
      scheduler_->reads().FillStatus(job, status);
      ASSERT_GE(status.diagnoses_size(), 1);
      EXPECT_EQ(status.diagnoses(0).kind(), v1::Diagnosis::STUCK_IN_COLLECTIVE);
      EXPECT_EQ(jobs_->Get(job)->generation(), 1) << "rank 3 is silent: the restart waits";
      EXPECT_EQ(agent_.Stops(), 0);
    }
  }
  std::vector<v1::StopRanks> stops;
  for (const auto& m : agent_.received) {
    if (m.has_stop()) stops.push_back(m.stop());
  }
  ASSERT_EQ(stops.size(), 1u);
  ASSERT_EQ(stops[0].slots_size(), 1);
  EXPECT_EQ(stops[0].slots(0), 3);
  EXPECT_THAT(stops[0].reason(), testing::StartsWith("evicted by hang_detection.action RESTART: "
                                                     "DEAD rank 3"));
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  Exit(job, 3, -9);
  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.restarts(), 1) << "one restart, not two";
  EXPECT_THAT(Reasons(job), testing::Contains(testing::StartsWith(
                                "generation 2 after rank 3 (node-a, pid 103) was evicted by "
                                "hang_detection.action RESTART: DEAD rank 3")));
  EXPECT_EQ(agent_.Launches().size(), 2u) << "a newcomer replaces rank 3";
}

TEST_F(ElasticSchedulerTest, AMismatchEveryGenerationFailsTheJobPastMaxRestarts) {
  const std::string job = StartElastic("max_restarts: 1", "hang_detection { action: RESTART }");
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(BeatWith(job, 1, rank, MismatchAt27(rank, clock_.Now())));
  }
  scheduler_->Tick();
  ASSERT_EQ(jobs_->Get(job)->generation(), 2);
  clock_.Advance(absl::Seconds(1));
  std::vector<JoinResult> joins = JoinSameSlots(job, 2);
  ASSERT_TRUE(joins[3].result.ok()) << joins[3].result.status();
  // The program's own mismatch comes back in generation 2.
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(BeatWith(job, 2, rank, MismatchAt27(rank, clock_.Now())));
  }
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  const std::string cause = absl::StrCat(
      "hang_detection.action RESTART for MISMATCH ranks 0,1 at #27 (every rank "
      "re-forms its transport): ",
      kMismatchMessage);
  EXPECT_EQ(failed.reason(),
            absl::StrCat(cause,
                         "; elastic.max_restarts 1 used up in generation 2; history: "
                         "generation 2 after ",
                         cause, ": 4 -> 4 ranks, restart 1 of 1"));
  EXPECT_EQ(failed.restarts(), 1);
  EXPECT_EQ(scheduler_->reads().free_slots(), 5) << "every slot is released";
  EXPECT_EQ(agent_.Stops(), 1) << "the ranks are stopped with the job";
}

TEST_F(SchedulerTest, RestartWithoutElasticFailsTheJobAndSaysItNeedsAnElasticBlock) {
  FakeAgent a;
  Add(a, 2, "node-a");
  auto spec = ParseJobSpec(
      "model { mlp {} } data { synthetic {} } resources { min_ranks: 2 max_ranks: 2 } "
      "hang_detection { action: RESTART }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto job = jobs_->Submit(*spec, "");
  ASSERT_TRUE(job.ok()) << job.status();
  scheduler_->Schedule();
  std::vector<JoinResult> joins(2);
  for (int slot = 0; slot < 2; ++slot) {
    scheduler_->Join(JoinOf(job->job_id(), a.id, slot), clock_.Now() + absl::Seconds(60),
                     joins[slot].Done());
  }
  ASSERT_TRUE(joins[1].result.ok()) << joins[1].result.status();
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankHeartbeat hb;
    hb.set_job_id(job->job_id());
    hb.set_generation(1);
    hb.set_rank(rank);
    for (const v1::CollectiveRecord& r : MismatchAt27(rank, clock_.Now())) {
      *hb.mutable_flight_recorder()->add_records() = r;
    }
    ASSERT_TRUE(scheduler_->Heartbeat(hb));
  }
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job->job_id());
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.generation(), 1);
  EXPECT_EQ(failed.reason(),
            absl::StrCat("hang detection: MISMATCH ", kMismatchMessage,
                         " (hang_detection.action RESTART needs an elastic block in the job spec "
                         "to re-form the job; without one it fails the job as ABORT does)"));
  EXPECT_EQ(a.Stops(), 1);
}

// ---------------------------------------------------------------- drain, wait, grow

class ElasticChangesTest : public ElasticSchedulerTest {
 protected:
  // An elastic job of min..max ranks placed on the agents already added;
  // every placed rank joins generation 1 (pid 100 + slot).
  std::string Place(int min_ranks, int max_ranks, const std::string& elastic,
                    const std::vector<FakeAgent*>& on) {
    auto spec = ParseJobSpec(
        absl::StrCat("model { mlp {} } data { synthetic {} } resources { min_ranks: ", min_ranks,
                     " max_ranks: ", max_ranks, " } elastic { ", elastic, " }"),
        SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    JoinAll(job->job_id(), on, 1);
    return job->job_id();
  }
  // Agent `a`'s stream ends for good: its elastic jobs wait
  // kElasticAgentGrace for it, then re-form without its ranks (Note [An
  // elastic job's lost agent] in scheduler.cc).
  void LoseAgent(const FakeAgent& a) {
    scheduler_->RemoveAgent(a.id);
    clock_.Advance(kElasticAgentGrace);
    scheduler_->Tick();
  }
  // Every rank the agents were told to launch for `gen` joins it.
  std::vector<JoinResult> JoinAll(const std::string& job, const std::vector<FakeAgent*>& on,
                                  int64_t gen) {
    std::vector<std::pair<std::string, int>> slots;
    for (FakeAgent* a : on) {
      for (const v1::LaunchRanks& l : a->Launches()) {
        if (l.generation() != gen) continue;
        for (const v1::RankLaunch& r : l.ranks()) slots.emplace_back(a->id, r.slot());
      }
    }
    std::vector<JoinResult> joins(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      scheduler_->Join(JoinOf(job, slots[i].first, slots[i].second, gen),
                       clock_.Now() + absl::Seconds(60), joins[i].Done());
    }
    return joins;
  }
  v1::Directive Beat(const std::string& job, int64_t gen, int rank) {
    v1::RankHeartbeat hb;
    hb.set_job_id(job);
    hb.set_generation(gen);
    hb.set_rank(rank);
    v1::Directive directive;
    EXPECT_TRUE(scheduler_->Heartbeat(hb, &directive));
    return directive;
  }
  void ExitOn(const FakeAgent& a, const std::string& job, int slot, int code) {
    v1::RankExited e;
    e.set_job_id(job);
    e.set_slot(slot);
    e.set_pid(100 + slot);
    e.set_exit_code(code);
    RankExited(*scheduler_, a.id, e);
  }
  v1::AgentInfo Info(const std::string& agent) {
    for (const v1::AgentInfo& info : scheduler_->reads().ListAgents()) {
      if (info.agent_id() == agent) return info;
    }
    return v1::AgentInfo();
  }
};

TEST_F(ElasticChangesTest, ADrainedAgentsRanksLeaveAtTheStepBoundaryAndTheJobGoesOn) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  Add(b, 2, "node-b");
  const std::string job = Place(2, 4, "", {&a, &b});
  ASSERT_EQ(jobs_->Get(job)->world_size(), 4);

  absl::StatusOr<v1::AgentInfo> drained = scheduler_->DrainAgent("node-b");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->agent_id(), b.id);
  EXPECT_EQ(drained->state(), v1::AgentInfo::DRAINING);
  EXPECT_EQ(drained->busy_slots(), 2);
  EXPECT_THAT(drained->jobs(), testing::ElementsAre(job));
  EXPECT_EQ(scheduler_->reads().free_slots(), 0) << "a draining agent offers no slot";
  EXPECT_EQ(jobs_->Get(job)->generation(), 1) << "nothing changes before the step boundary";
  EXPECT_EQ(b.Stops(), 0) << "the drained ranks are not killed";

  // Every rank of generation 1 is told, on its heartbeat, to re-form into 2.
  for (int rank = 0; rank < 4; ++rank) {
    const v1::Directive d = Beat(job, 1, rank);
    EXPECT_EQ(d.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
    EXPECT_EQ(d.generation(), 2);
    EXPECT_EQ(d.reason(), "agent " + b.id + " (node-b) was drained: rank(s) 2,3 leave");
    EXPECT_EQ(d.world_size(), 2) << "the planned world picks the ranks' step boundary";
  }
  // At the boundary every rank joins generation 2; the first one starts it.
  std::vector<JoinResult> joins(4);
  scheduler_->Join(JoinOf(job, a.id, 0, 2), clock_.Now() + absl::Seconds(60), joins[0].Done());
  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.world_size(), 2);
  EXPECT_EQ(reformed.restarts(), 0) << "a drain is not a restart";
  for (int slot = 0; slot < 2; ++slot) {
    scheduler_->Join(JoinOf(job, b.id, slot, 2), clock_.Now() + absl::Seconds(60),
                     joins[2 + slot].Done());
    ASSERT_TRUE(joins[2 + slot].result.ok()) << joins[2 + slot].result.status();
    EXPECT_TRUE(joins[2 + slot].result->leave()) << "node-b slot " << slot << " leaves";
  }
  clock_.Advance(absl::Milliseconds(300));
  scheduler_->Join(JoinOf(job, a.id, 1, 2), clock_.Now() + absl::Seconds(60), joins[1].Done());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(joins[rank].result.ok()) << joins[rank].result.status();
    EXPECT_EQ(joins[rank].result->rank(), rank);
    EXPECT_EQ(joins[rank].result->world_size(), 2);
    EXPECT_FALSE(joins[rank].result->leave());
  }
  EXPECT_EQ(a.Launches().size(), 1u) << "no newcomer: the only free slots are draining";
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 will form at the next step boundary "
                                              "after agent " +
                                              b.id + " (node-b) was drained: rank(s) 2,3 leave"));
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 after agent " + b.id +
                                              " (node-b) was drained: rank(s) 2,3 leave: 4 -> 2 "
                                              "ranks, at a step boundary (not a restart)"));
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 formed with 2 ranks, 0.3 s after the "
                                              "step boundary"));
  EXPECT_EQ(Beat(job, 2, 0).kind(), v1::Directive::KIND_UNSPECIFIED);

  // The leaving processes exit 0: the agent is drained; the job goes on.
  EXPECT_EQ(Info(b.id).state(), v1::AgentInfo::DRAINING);
  ExitOn(b, job, 0, 0);
  ExitOn(b, job, 1, 0);
  EXPECT_EQ(Info(b.id).state(), v1::AgentInfo::DRAINED);
  EXPECT_EQ(Info(b.id).busy_slots(), 0);
  EXPECT_THAT(Info(b.id).jobs(), testing::IsEmpty());
  EXPECT_EQ(Info(a.id).state(), v1::AgentInfo::ACTIVE);
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  ExitOn(a, job, 0, 0);
  ExitOn(a, job, 1, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
  // Draining again only reports.
  EXPECT_EQ(scheduler_->DrainAgent(b.id)->state(), v1::AgentInfo::DRAINED);
}

TEST_F(ElasticChangesTest, ADrainLeavesANonElasticJobRunningAndNamesUnknownAgents) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = Submit(2, 2);
  std::vector<JoinResult> joins(2);
  for (int slot = 0; slot < 2; ++slot) {
    scheduler_->Join(JoinOf(job, a.id, slot), clock_.Now() + absl::Seconds(60), joins[slot].Done());
  }
  EXPECT_EQ(scheduler_->DrainAgent(a.id)->state(), v1::AgentInfo::DRAINING);
  EXPECT_EQ(Beat(job, 1, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  EXPECT_THAT(Reasons(job),
              testing::Contains("agent " + a.id +
                                " (node-a) is draining; the job is not elastic: rank(s) 0,1 keep "
                                "running there until the job ends"));
  ExitOn(a, job, 0, 0);
  ExitOn(a, job, 1, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
  EXPECT_EQ(Info(a.id).state(), v1::AgentInfo::DRAINED);

  absl::StatusOr<v1::AgentInfo> unknown = scheduler_->DrainAgent("node-z");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(),
            "no agent \"node-z\"; connected agents: " + a.id + " (node-a)");
}

TEST_F(ElasticChangesTest, ALostAgentShrinksTheJobAfterItsGraceWhileAtLeastMinRanksRemain) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  Add(b, 2, "node-b");
  const std::string job = Place(2, 4, "", {&a, &b});
  LoseAgent(b);
  const v1::Job shrunk = *jobs_->Get(job);
  EXPECT_EQ(shrunk.state(), v1::Job::RUNNING);
  EXPECT_EQ(shrunk.generation(), 2);
  EXPECT_EQ(shrunk.world_size(), 2);
  EXPECT_EQ(shrunk.restarts(), 1);
  EXPECT_THAT(Reasons(job),
              testing::Contains(
                  "generation 2 after lost contact with the agent on "
                  "node-b (" +
                  b.id +
                  "), which ran rank(s) 2,3, and it was not back within 5s: 4 -> 2 ranks, restart "
                  "1 of 3"));
}

TEST_F(ElasticChangesTest, BelowMinRanksTheJobWaitsForSlotsAndFormsWhenAnAgentComes) {
  FakeAgent a, b, c;
  Add(a, 2, "node-a");
  Add(b, 2, "node-b");
  const std::string job = Place(3, 4, "wait_seconds: 10", {&a, &b});
  LoseAgent(b);
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "waits instead of failing at once";
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  EXPECT_THAT(
      Reasons(job),
      testing::Contains("generation 2 after lost contact with the agent on node-b (" + b.id +
                        "), which ran rank(s) 2,3, and it was not back within 5s waits up to "
                        "elastic.wait_seconds 10 s "
                        "for free slots: 2 surviving rank(s) and 0 free CPU slot(s) are "
                        "fewer than resources.min_ranks 3"));
  clock_.Advance(absl::Seconds(9));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  Add(c, 2, "node-c");
  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.world_size(), 4);
  EXPECT_EQ(reformed.restarts(), 1);
  ASSERT_EQ(c.Launches().size(), 1u);
  EXPECT_EQ(c.Launches()[0].generation(), 2);
  EXPECT_EQ(c.Launches()[0].ranks_size(), 2);
  clock_.Advance(absl::Seconds(5));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "formed in time: the wait is over";
}

TEST_F(ElasticChangesTest, BelowMinRanksPastWaitSecondsTheJobFailsNamingWhatWasLost) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  Add(b, 2, "node-b");
  const std::string job = Place(3, 4, "wait_seconds: 10", {&a, &b});
  LoseAgent(b);
  clock_.Advance(absl::Seconds(10));
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.reason(), "lost contact with the agent on node-b (" + b.id +
                                 "), which ran rank(s) 2,3, and it was not back within 5s; "
                                 "generation 2 cannot form: waited "
                                 "elastic.wait_seconds 10 s and 2 surviving rank(s) and 0 free "
                                 "CPU slot(s) are fewer than resources.min_ranks 3");
  EXPECT_EQ(scheduler_->reads().free_slots(), 2);
}

TEST_F(ElasticChangesTest, FreeSlotsGrowTheJobAtAStepBoundaryAfterTheScaleUpInterval) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  const std::string job = Place(2, 4, "scale_up_interval_seconds: 30", {&a});
  ASSERT_EQ(jobs_->Get(job)->world_size(), 2);
  clock_.Advance(absl::Seconds(10));
  Add(b, 2, "node-b");
  EXPECT_EQ(Beat(job, 1, 0).kind(), v1::Directive::KIND_UNSPECIFIED)
      << "30 s have not passed since the job started";
  clock_.Advance(absl::Seconds(20));
  scheduler_->Tick();
  const v1::Directive d = Beat(job, 1, 1);
  EXPECT_EQ(d.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(d.generation(), 2);
  EXPECT_EQ(d.reason(), "2 free slot(s) let the job grow from 2 towards resources.max_ranks 4");
  EXPECT_EQ(d.world_size(), 4);
  EXPECT_TRUE(b.Launches().empty()) << "newcomers start with the new generation";

  std::vector<JoinResult> joins(2);
  scheduler_->Join(JoinOf(job, a.id, 1, 2), clock_.Now() + absl::Seconds(60), joins[1].Done());
  const v1::Job grown = *jobs_->Get(job);
  EXPECT_EQ(grown.generation(), 2);
  EXPECT_EQ(grown.world_size(), 4);
  EXPECT_EQ(grown.restarts(), 0);
  ASSERT_EQ(b.Launches().size(), 1u);
  EXPECT_EQ(b.Launches()[0].generation(), 2);
  EXPECT_EQ(b.Launches()[0].ranks_size(), 2);
  EXPECT_THAT(Reasons(job),
              testing::Contains("generation 2 after 2 free slot(s) let the job grow from 2 towards "
                                "resources.max_ranks 4: 2 -> 4 ranks (rank 2 on node-b slot 0, "
                                "rank 3 on node-b slot 1), at a step boundary (not a restart)"));
  scheduler_->Join(JoinOf(job, a.id, 0, 2), clock_.Now() + absl::Seconds(60), joins[0].Done());
  std::vector<JoinResult> newcomers = JoinAll(job, {&b}, 2);
  ASSERT_TRUE(joins[0].result.ok()) << joins[0].result.status();
  EXPECT_EQ(joins[0].result->world_size(), 4);
  ASSERT_TRUE(newcomers[1].result.ok()) << newcomers[1].result.status();
  EXPECT_EQ(newcomers[1].result->rank(), 3);
  // At max_ranks: no further growth.
  clock_.Advance(absl::Seconds(60));
  scheduler_->Tick();
  EXPECT_EQ(Beat(job, 2, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
}

// ---------------------------------------------------------------- coordinator restarts

// Note [Elastic restart] in job_recovery.h: an elastic job killed with the
// coordinator in each of its states ends as it would have without it.
class ElasticRestartTest : public ElasticChangesTest {
 protected:
  // The coordinator restarts: the scheduler and the job manager are built
  // again over the same state database (the agents' streams ended with the
  // old process) and take back the running jobs, with 30 s for their ranks.
  void Restart() {
    scheduler_.reset();
    jobs_ = *JobManager::Create(*state_, &clock_);
    options_ = SchedulerOptions{"127.0.0.1:1"};  // a new process: set up afresh
    scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, options_);
    scheduler_->Recover(jobs_->List({v1::Job::RUNNING}, 0).value(), absl::Seconds(30));
  }
  // `a`'s agent process connects again and reports the ranks it runs: (job,
  // the generation each was launched in, slot), pid 100 + slot.
  void Reconnect(FakeAgent& a, int slots, const std::string& host,
                 const std::vector<std::tuple<std::string, int64_t, int>>& running) {
    v1::AgentHello hello;
    hello.set_host(host);
    hello.set_slots(slots);
    for (const auto& [job, generation, slot] : running) {
      v1::RunningRank* r = hello.add_running();
      r->set_job_id(job);
      r->set_generation(generation);
      r->set_slot(slot);
      r->set_pid(100 + slot);
    }
    a.received.clear();
    auto id = scheduler_->AddAgent(hello, a.Sender());
    ASSERT_TRUE(id.ok()) << id.status();
    a.id = *id;
  }
  // A Join as chorus-rank sends it: with the agent id of its environment.
  v1::JoinRequest JoinFrom(const std::string& job, const std::string& agent, int slot, int64_t gen,
                           int64_t pid, const std::string& host) {
    v1::JoinRequest r = JoinOf(job, agent, slot, gen);
    r.set_pid(pid);
    r.set_host(host);
    return r;
  }
};

// Issue #10: waiting below min_ranks, the coordinator restarts, then an agent
// with a free slot comes: the job forms generation 2 and goes on; the rank
// lost before the restart is not waited for.
TEST_F(ElasticRestartTest, AJobWaitingForSlotsFormsAfterARestartWhenASlotComes) {
  FakeAgent a, b, c;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  const std::string job = Place(2, 2, "wait_seconds: 300", {&a, &b});
  const std::string a_before = a.id;
  LoseAgent(b);
  ASSERT_THAT(Reasons(job), testing::Contains(HasSubstr("waits up to elastic.wait_seconds 300 s")));
  clock_.Advance(absl::Seconds(10));

  Restart();
  Add(c, 1, "node-c");  // takes the id node-a's agent had: ranks still name it
  ASSERT_EQ(c.id, a_before);
  EXPECT_EQ(jobs_->Get(job)->generation(), 1) << "the survivor is not back yet";
  Reconnect(a, 1, "node-a", {{job, 1, 0}});
  const v1::Job reformed = *jobs_->Get(job);
  EXPECT_EQ(reformed.state(), v1::Job::RUNNING);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.world_size(), 2);
  EXPECT_EQ(reformed.restarts(), 1);
  ASSERT_EQ(c.Launches().size(), 1u);
  EXPECT_EQ(c.Launches()[0].generation(), 2);
  EXPECT_EQ(a.Stops(), 0) << "the survivor keeps its process";

  std::vector<JoinResult> joins(2);
  scheduler_->Join(JoinFrom(job, a_before, 0, 2, 100, "node-a"), clock_.Now() + absl::Seconds(60),
                   joins[0].Done());
  scheduler_->Join(JoinFrom(job, c.id, 0, 2, 300, "node-c"), clock_.Now() + absl::Seconds(60),
                   joins[1].Done());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(joins[rank].result.ok()) << joins[rank].result.status();
    EXPECT_EQ(joins[rank].result->rank(), rank);
    EXPECT_EQ(joins[rank].result->world_size(), 2);
  }
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 formed with 2 ranks, 10 s after the "
                                              "failure (recovery_seconds)"));
  clock_.Advance(absl::Seconds(60));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  ExitOn(a, job, 0, 0);
  ExitOn(c, job, 0, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
}

// Without a slot the job fails when the wait that began before the restart
// ends, with the waiting reason, not when the restart's grace ends.
TEST_F(ElasticRestartTest, AJobWaitingForSlotsFailsAtTheOriginalDeadlineAfterARestart) {
  FakeAgent a, b;
  Add(a, 1, "node-a");
  Add(b, 1, "node-b");
  const std::string job = Place(2, 2, "wait_seconds: 300", {&a, &b});
  const std::string b_before = b.id;
  LoseAgent(b);
  clock_.Advance(absl::Seconds(10));
  Restart();
  Reconnect(a, 1, "node-a", {{job, 1, 0}});
  clock_.Advance(absl::Seconds(289));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "1 s of elastic.wait_seconds is left";
  clock_.Advance(absl::Seconds(1));
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(
      failed.reason(),
      "lost contact with the agent on node-b (" + b_before +
          "), which ran rank(s) 1, and it was not back within 5s; generation 2 cannot form: waited "
          "elastic.wait_seconds 300 s and 1 surviving rank(s) and 0 free "
          "CPU slot(s) are fewer than resources.min_ranks 2");
  EXPECT_EQ(a.Stops(), 1) << "the survivor is stopped";
}

// Steady after a re-formation: the survivor reports the generation it was
// launched in (1), the newcomer its own (2); both are the job's ranks.
// Note [Exits told again]: a job that is not elastic; rank 0 finished
// before the takeover (read by the old leader, not in the store), rank 1's
// exit was written to the old leader and never read. The agent's hello
// tells both again, and the job ends as its ranks did instead of failing
// for ranks that "did not come back".
class ToldExitsTest : public ElasticRestartTest {
 protected:
  std::string StartOnTwoSlots(FakeAgent& a) {
    Add(a, 2, "node-a");
    auto spec = ParseJobSpec(
        "model { mlp {} } data { synthetic {} } resources { min_ranks: 2 max_ranks: 2 }",
        SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    EXPECT_EQ(a.Launches().size(), 1u);
    JoinAll(job->job_id(), {&a}, 1);
    return job->job_id();
  }
  // node-a's agent connects to the new leader, running nothing, and tells
  // again the exits (slot, code) of generation `gen`.
  void ReconnectTelling(FakeAgent& a, const std::string& job, int64_t gen,
                        const std::vector<std::pair<int, int>>& exits) {
    v1::AgentHello hello;
    hello.set_host("node-a");
    hello.set_slots(2);
    for (const auto& [slot, code] : exits) {
      v1::RankExited* e = hello.add_exited();
      e->set_job_id(job);
      e->set_slot(slot);
      e->set_pid(100 + slot);
      e->set_exit_code(code);
      e->set_generation(gen);
      e->add_stderr_tail("the last line of slot " + std::to_string(slot));
    }
    a.received.clear();
    auto id = scheduler_->AddAgent(hello, a.Sender());
    ASSERT_TRUE(id.ok()) << id.status();
    a.id = *id;
  }
};

TEST_F(ToldExitsTest, ExitsTheOldLeaderNeverReadAreToldAgainAndTheJobSucceeds) {
  FakeAgent a;
  const std::string job = StartOnTwoSlots(a);
  ExitOn(a, job, 0, 0);
  ASSERT_EQ(State(job), v1::Job::RUNNING);
  Restart();
  ReconnectTelling(a, job, 1, {{0, 0}, {1, 0}});
  const v1::Job ended = *jobs_->Get(job);
  EXPECT_EQ(ended.state(), v1::Job::SUCCEEDED) << ended.reason();
  EXPECT_EQ(ended.reason(), "every rank exited with code 0");
}

TEST_F(ToldExitsTest, AFailureToldAgainFailsTheJobWithTheRanksOwnReason) {
  FakeAgent a;
  const std::string job = StartOnTwoSlots(a);
  Restart();
  ReconnectTelling(a, job, 1, {{1, 3}});
  const v1::Job ended = *jobs_->Get(job);
  EXPECT_EQ(ended.state(), v1::Job::FAILED);
  EXPECT_EQ(ended.reason(),
            "rank 1 (node-a, pid 101) exited with code 3; last stderr: the last line of slot 1");
}

TEST_F(ToldExitsTest, AnExitOfAnotherGenerationOrJobChangesNothing) {
  FakeAgent a;
  const std::string job = StartOnTwoSlots(a);
  Restart();
  ReconnectTelling(a, job, 2, {{0, 1}, {1, 1}});
  ReconnectTelling(a, "job-000099", 1, {{0, 1}});
  clock_.Advance(absl::Seconds(10));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "generation 2 is not the job's";
  clock_.Advance(absl::Seconds(21));
  scheduler_->Tick();
  EXPECT_THAT(jobs_->Get(job)->reason(), HasSubstr("did not come back"));
}

// Note [Agent reconnect grace] in running_job.h: a job that is not elastic
// on node-a (rank 0) and node-b (rank 1), agent processes 11 and 22, whose
// hang policy is ABORT (a DEAD rank would fail it). node-b's stream ends.
class AgentReconnectTest : public ElasticRestartTest {
 protected:
  void AddNode(FakeAgent& agent, const std::string& host, int64_t pid) {
    v1::AgentHello hello;
    hello.set_host(host);
    hello.set_slots(1);
    hello.set_pid(pid);
    agent.received.clear();
    auto id = scheduler_->AddAgent(hello, agent.Sender());
    ASSERT_TRUE(id.ok()) << id.status();
    agent.id = *id;
  }
  // Both ranks joined generation 1 and sent a heartbeat.
  std::string StartOnTwoNodes(FakeAgent& a, FakeAgent& b) {
    AddNode(a, "node-a", 11);
    AddNode(b, "node-b", 22);
    auto spec = ParseJobSpec(
        "model { mlp {} } data { synthetic {} } resources { min_ranks: 2 max_ranks: 2 } "
        "hang_detection { action: ABORT }",
        SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    JoinAll(job->job_id(), {&a, &b}, 1);
    Beat(job->job_id(), 1, 0);
    Beat(job->job_id(), 1, 1);
    return job->job_id();
  }
  // An elastic job of `min_ranks`..2 ranks, one on each of two nodes; both
  // joined generation 1 and sent a heartbeat.
  std::string StartElasticOnTwoNodes(FakeAgent& a, FakeAgent& b, int min_ranks) {
    AddNode(a, "node-a", 11);
    AddNode(b, "node-b", 22);
    const std::string job = Place(min_ranks, 2, "max_restarts: 2", {&a, &b});
    Beat(job, 1, 0);
    Beat(job, 1, 1);
    return job;
  }
  // The agent process of `host` (`pid`) connects again, still running slot
  // 0's rank of `job` if `running`, and telling its `exit_code` if any.
  void NodeBack(FakeAgent& agent, const std::string& host, int64_t pid, const std::string& job,
                bool running, std::optional<int> exit_code = std::nullopt) {
    v1::AgentHello hello;
    hello.set_host(host);
    hello.set_slots(1);
    hello.set_pid(pid);
    hello.set_agent_id(agent.id);  // the id it was last welcomed with, as the agent tells it
    if (running) {
      v1::RunningRank* r = hello.add_running();
      r->set_job_id(job);
      r->set_generation(1);
      r->set_slot(0);
      r->set_pid(100);
    }
    if (exit_code.has_value()) {
      v1::RankExited* e = hello.add_exited();
      e->set_job_id(job);
      e->set_slot(0);
      e->set_pid(100);
      e->set_exit_code(*exit_code);
      e->set_generation(1);
      e->add_stderr_tail("ValueError: bad batch");
    }
    agent.received.clear();
    auto id = scheduler_->AddAgent(hello, agent.Sender());
    ASSERT_TRUE(id.ok()) << id.status();
    agent.id = *id;
  }
  void NodeBBack(FakeAgent& b, const std::string& job, bool running,
                 std::optional<int> exit_code = std::nullopt) {
    NodeBack(b, "node-b", 22, job, running, exit_code);
  }
  // `time` passes; rank 0 keeps beating (the hang policy would fail a
  // silent rank 0), then the scheduler ticks.
  void PassAndTick(const std::string& job, absl::Duration time) {
    clock_.Advance(time);
    Beat(job, 1, 0);
    scheduler_->Tick();
  }
  v1::RankStatus Row(const std::string& job, int rank) {
    v1::JobStatus status;
    scheduler_->reads().FillStatus(job, status);
    return rank < status.ranks_size() ? status.ranks(rank) : v1::RankStatus();
  }
};

TEST_F(AgentReconnectTest, AnAgentBackWithinTheGraceKeepsItsJobRunningWithItsRanks) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  const std::string b_before = b.id;
  scheduler_->RemoveAgent(b.id);
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  EXPECT_THAT(Reasons(job), testing::Contains("lost contact with the agent on node-b (" + b_before +
                                              "), which ran rank(s) 1; waiting up to 10s for it "
                                              "to reconnect"));
  EXPECT_EQ(Row(job, 1).state(), v1::RankStatus::LOST);
  EXPECT_EQ(Row(job, 1).host(), "node-b");
  EXPECT_EQ(scheduler_->reads().free_slots(), 0) << "node-b's slot is gone with it";

  PassAndTick(job, absl::Seconds(9));  // rank 1 silent for 9 s: not DEAD while away
  EXPECT_EQ(State(job), v1::Job::RUNNING) << jobs_->Get(job)->reason();
  NodeBBack(b, job, /*running=*/true);
  EXPECT_NE(b.id, b_before);
  EXPECT_EQ(scheduler_->reads().free_slots(), 0) << "its slot is busy again";
  EXPECT_EQ(Row(job, 1).state(), v1::RankStatus::TRAINING);
  PassAndTick(job, absl::Seconds(2));  // rank 1's heartbeats come back shortly
  EXPECT_EQ(State(job), v1::Job::RUNNING) << jobs_->Get(job)->reason();
  EXPECT_THAT(Reasons(job),
              testing::Contains("every rank is back: the agent on node-b reconnected"));
  EXPECT_EQ(a.Stops() + b.Stops(), 0);
  EXPECT_EQ(a.Launches().size(), 1u);
  EXPECT_TRUE(b.Launches().empty()) << "its rank keeps its process";

  Beat(job, 1, 1);
  PassAndTick(job, absl::Seconds(4));  // the deadline has passed
  EXPECT_EQ(State(job), v1::Job::RUNNING) << jobs_->Get(job)->reason();
  ExitOn(a, job, 0, 0);
  ExitOn(b, job, 0, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED) << jobs_->Get(job)->reason();
}

TEST_F(AgentReconnectTest, AnAgentNotBackFailsTheJobAtTheDeadlineNamingIt) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  const std::string b_before = b.id;
  scheduler_->RemoveAgent(b.id);
  PassAndTick(job, absl::Seconds(9));
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "1 s of the grace is left";
  EXPECT_EQ(a.Stops(), 0);
  PassAndTick(job, absl::Seconds(1));
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.reason(), "lost contact with the agent on node-b (" + b_before +
                                 "), which ran ranks of this job; 1 of 2 rank(s) did not come "
                                 "back within 10s");
  EXPECT_EQ(a.Stops(), 1);
  EXPECT_EQ(scheduler_->reads().free_slots(), 1);
  // The agent coming back later is told to stop the rank it kept.
  NodeBBack(b, job, /*running=*/true);
  EXPECT_EQ(b.Stops(), 1);
}

// A survivor failing while the job waits for a lost agent (its host died
// and took its peers with it) names that agent in the job's reason too.
TEST_F(AgentReconnectTest, ASurvivorFailingDuringTheWaitNamesTheLostAgent) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  const std::string b_before = b.id;
  scheduler_->RemoveAgent(b.id);
  PassAndTick(job, absl::Seconds(2));
  v1::RankExited e;
  e.set_job_id(job);
  e.set_slot(0);
  e.set_pid(4242);
  e.set_exit_code(1);
  e.add_stderr_tail("RuntimeError: Connection reset by peer");
  RankExited(*scheduler_, a.id, e);
  EXPECT_EQ(State(job), v1::Job::FAILED);
  EXPECT_EQ(jobs_->Get(job)->reason(),
            "rank 0 (node-a, pid 4242) exited with code 1 while the job waited for the ranks of "
            "the agent(s) on node-b (" +
                b_before +
                "), with which contact was lost; last stderr: RuntimeError: Connection reset by "
                "peer");
}

TEST_F(AgentReconnectTest, ARankThatFailedWhileItsAgentWasAwayFailsTheJobWithItsExit) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  scheduler_->RemoveAgent(b.id);
  PassAndTick(job, absl::Seconds(3));
  NodeBBack(b, job, /*running=*/false, /*exit_code=*/3);
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.reason(),
            "rank 1 (node-b, pid 100) exited with code 3; last stderr: ValueError: bad batch");
  EXPECT_EQ(a.Stops(), 1);
  EXPECT_EQ(b.Stops(), 0) << "its rank has exited";
  EXPECT_EQ(scheduler_->reads().free_slots(), 2);
}

// The agent process connects again while the coordinator still takes its
// old stream for open (a half-open connection): the old registration is the
// lost agent, and the new one takes its ranks back at once instead of being
// told to stop them as no job's.
TEST_F(AgentReconnectTest, AnAgentConnectingAgainBeforeItsOldStreamEndedKeepsItsRanks) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  const std::string b_before = b.id;
  NodeBBack(b, job, /*running=*/true);
  EXPECT_EQ(b.Stops(), 0);
  EXPECT_EQ(Row(job, 1).state(), v1::RankStatus::TRAINING);
  EXPECT_EQ(scheduler_->reads().ListAgents().size(), 2u) << "the old registration is gone";
  EXPECT_EQ(scheduler_->reads().free_slots(), 0);
  scheduler_->RemoveAgent(b_before);  // its stream ends at last: nothing more
  Beat(job, 1, 1);
  PassAndTick(job, absl::Seconds(1));
  EXPECT_EQ(State(job), v1::Job::RUNNING) << jobs_->Get(job)->reason();
  EXPECT_THAT(Reasons(job),
              testing::Contains("every rank is back: the agent on node-b reconnected"));
  ExitOn(a, job, 0, 0);
  ExitOn(b, job, 0, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED) << jobs_->Get(job)->reason();
}

// Note [An agent back before its stream ended]: an elastic job neither
// re-forms nor counts a restart when the agent that connected again still
// runs its ranks; it re-forms without a rank the new hello does not list.
TEST_F(AgentReconnectTest, AnElasticJobKeepsItsGenerationWhenItsAgentIsBackBeforeItsStreamEnded) {
  FakeAgent a, b;
  const std::string job = StartElasticOnTwoNodes(a, b, 2);
  const std::string b_before = b.id;
  NodeBBack(b, job, /*running=*/true);
  EXPECT_EQ(a.Stops() + b.Stops(), 0);
  EXPECT_EQ(Row(job, 1).state(), v1::RankStatus::TRAINING);
  EXPECT_EQ(Beat(job, 1, 1).kind(), v1::Directive::KIND_UNSPECIFIED) << "no new generation";
  scheduler_->RemoveAgent(b_before);  // its old stream ends at last
  PassAndTick(job, absl::Seconds(1));
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  EXPECT_EQ(jobs_->Get(job)->restarts(), 0);
  EXPECT_EQ(Beat(job, 1, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
  ExitOn(a, job, 0, 0);
  ExitOn(b, job, 0, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED) << jobs_->Get(job)->reason();
}

// Note [An elastic job's lost agent] in agent_departure.h: an elastic job whose
// agent's stream ended waits kElasticAgentGrace for it; back in time with
// its rank, the job keeps its generation and counts no restart.
TEST_F(AgentReconnectTest,
       AnElasticJobWaitsBrieflyForItsLostAgentAndKeepsItsGenerationWhenItIsBack) {
  FakeAgent a, b;
  const std::string job = StartElasticOnTwoNodes(a, b, 2);
  const std::string b_before = b.id;
  scheduler_->RemoveAgent(b.id);
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  EXPECT_THAT(Reasons(job), testing::Contains("lost contact with the agent on node-b (" + b_before +
                                              "), which ran rank(s) 1; waiting up to 5s for it "
                                              "to reconnect"));
  PassAndTick(job, absl::Seconds(3));
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  NodeBBack(b, job, /*running=*/true);
  PassAndTick(job, absl::Seconds(3));
  EXPECT_EQ(a.Stops() + b.Stops(), 0);
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  EXPECT_EQ(jobs_->Get(job)->restarts(), 0);
  EXPECT_EQ(Row(job, 1).state(), v1::RankStatus::TRAINING);
  EXPECT_THAT(Reasons(job),
              testing::Contains("every rank is back: the agent on node-b reconnected"));
  ExitOn(a, job, 0, 0);
  ExitOn(b, job, 0, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED) << jobs_->Get(job)->reason();
}

TEST_F(AgentReconnectTest, AnElasticJobReFormsWithoutARankItsReturningAgentNoLongerRuns) {
  FakeAgent a, b;
  const std::string job = StartElasticOnTwoNodes(a, b, 1);
  NodeBBack(b, job, /*running=*/false);
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1);
  EXPECT_THAT(
      Reasons(job),
      testing::Contains(HasSubstr("the agent on node-b connected again without rank(s) 1")));
}

// Only the agent itself takes its old registration over: another agent
// process with the same host name and pid (containers sharing the host's
// network, each with its own pid namespace) is a second agent.
TEST_F(AgentReconnectTest, AnotherAgentWithTheSameHostAndPidIsASecondAgent) {
  FakeAgent a, b, twin;
  const std::string job = StartOnTwoNodes(a, b);
  v1::AgentHello hello;
  hello.set_host("node-b");
  hello.set_slots(1);
  hello.set_pid(22);
  auto id = scheduler_->AddAgent(hello, twin.Sender());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(*id, b.id);
  EXPECT_EQ(scheduler_->reads().ListAgents().size(), 3u) << "b's registration stays";
  EXPECT_EQ(b.Stops(), 0);
  EXPECT_EQ(twin.Stops(), 0);
  EXPECT_EQ(Row(job, 1).state(), v1::RankStatus::TRAINING);
  EXPECT_EQ(scheduler_->reads().free_slots(), 1) << "the twin's slot";
  EXPECT_EQ(State(job), v1::Job::RUNNING);
}

// A job already waiting keeps the later deadline: a restart's 30 s are not
// cut to an agent's 10 s.
TEST_F(AgentReconnectTest, AJobWaitingAfterARestartKeepsItsLaterDeadline) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  Restart();
  NodeBBack(b, job, /*running=*/true);  // rank 1 is back; rank 0 is not yet
  const std::string b_now = b.id;
  scheduler_->RemoveAgent(b.id);
  PassAndTick(job, absl::Seconds(29));
  EXPECT_EQ(State(job), v1::Job::RUNNING) << jobs_->Get(job)->reason();
  PassAndTick(job, absl::Seconds(1));
  EXPECT_EQ(jobs_->Get(job)->reason(),
            "lost contact with the agent on node-b (" + b_now +
                "), which ran ranks of this job; 1 of 2 rank(s) did not come back within 10s; "
                "1 of 2 rank(s) did not come back after the coordinator restarted");
}

// The coordinator restarting during the wait takes the job back from its
// recorded placements (the agents' host and process did not change): both
// agents come back to the new one and the job goes on.
TEST_F(AgentReconnectTest, ACoordinatorRestartDuringTheWaitTakesTheJobBack) {
  FakeAgent a, b;
  const std::string job = StartOnTwoNodes(a, b);
  scheduler_->RemoveAgent(b.id);
  PassAndTick(job, absl::Seconds(5));
  Restart();
  NodeBack(a, "node-a", 11, job, /*running=*/true);
  NodeBBack(b, job, /*running=*/true);
  EXPECT_EQ(a.Stops() + b.Stops(), 0);
  PassAndTick(job, absl::Seconds(1));
  EXPECT_EQ(State(job), v1::Job::RUNNING) << jobs_->Get(job)->reason();
  EXPECT_THAT(Reasons(job), testing::Contains("every rank is back after the coordinator restart"));
}

TEST_F(ElasticRestartTest, ASteadyJobKeepsSurvivorsOfEarlierGenerationsAfterARestart) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = Place(1, 2, "", {&a});
  ExitOn(a, job, 1, -9);
  ASSERT_EQ(jobs_->Get(job)->generation(), 2);
  std::vector<JoinResult> joins(2);
  for (int slot = 0; slot < 2; ++slot) {
    scheduler_->Join(JoinOf(job, a.id, slot, 2), clock_.Now() + absl::Seconds(60),
                     joins[slot].Done());
  }
  ASSERT_TRUE(joins[0].result.ok()) << joins[0].result.status();

  Restart();
  Reconnect(a, 2, "node-a", {{job, 1, 0}, {job, 2, 1}});
  EXPECT_EQ(a.Stops(), 0) << "both ranks are the job's";
  clock_.Advance(absl::Seconds(40));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1);
  ExitOn(a, job, 0, 0);
  ExitOn(a, job, 1, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
}

// Forming: generation 2 had not formed, so no rank was answered; its ranks
// join again and are answered together, and the original deadline holds.
TEST_F(ElasticRestartTest, AFormingGenerationKeepsItsRendezvousAndDeadlineAfterARestart) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = Place(2, 2, "wait_seconds: 20", {&a});
  const std::string a_before = a.id;
  ExitOn(a, job, 1, -9);
  ASSERT_EQ(jobs_->Get(job)->generation(), 2);
  clock_.Advance(absl::Seconds(5));

  Restart();
  Reconnect(a, 2, "node-a", {{job, 1, 0}, {job, 2, 1}});
  EXPECT_EQ(a.Stops(), 0);
  JoinResult survivor;
  scheduler_->Join(JoinFrom(job, a_before, 0, 2, 100, "node-a"), clock_.Now() + absl::Seconds(60),
                   survivor.Done());
  EXPECT_FALSE(survivor.called) << "rank 1 has not joined generation 2";
  clock_.Advance(absl::Seconds(14));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  clock_.Advance(absl::Seconds(1));
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_THAT(failed.reason(),
              testing::StartsWith("generation 2 did not form within elastic.wait_seconds 20 s; "
                                  "ranks that have not joined: 1; history: generation 2 after "
                                  "rank 1"));
  EXPECT_EQ(survivor.result.status().code(), absl::StatusCode::kAborted);
}

// Planned: a growth the ranks were told to make at their step boundary is
// still the coordinator's plan after the restart; the first Join of
// generation 2 starts it, and each rank keeps its number.
TEST_F(ElasticRestartTest, APlannedGrowthStartsAtTheStepBoundaryAfterARestart) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  const std::string job = Place(2, 4, "scale_up_interval_seconds: 30", {&a});
  const std::string a_before = a.id;
  clock_.Advance(absl::Seconds(10));
  Add(b, 2, "node-b");
  clock_.Advance(absl::Seconds(20));
  scheduler_->Tick();
  ASSERT_EQ(Beat(job, 1, 0).kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);

  Restart();
  Reconnect(b, 2, "node-b", {});  // takes the id node-a's agent had
  Reconnect(a, 2, "node-a", {{job, 1, 0}, {job, 1, 1}});
  const v1::Directive d = Beat(job, 1, 1);
  EXPECT_EQ(d.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(d.generation(), 2);
  EXPECT_EQ(d.world_size(), 4);
  std::vector<JoinResult> joins(4);
  scheduler_->Join(JoinFrom(job, a_before, 1, 2, 101, "node-a"), clock_.Now() + absl::Seconds(60),
                   joins[1].Done());
  const v1::Job grown = *jobs_->Get(job);
  EXPECT_EQ(grown.generation(), 2);
  EXPECT_EQ(grown.world_size(), 4);
  EXPECT_EQ(grown.restarts(), 0);
  ASSERT_EQ(b.Launches().size(), 1u);
  EXPECT_EQ(b.Launches()[0].ranks_size(), 2);
  scheduler_->Join(JoinFrom(job, a_before, 0, 2, 100, "node-a"), clock_.Now() + absl::Seconds(60),
                   joins[0].Done());
  for (int slot = 0; slot < 2; ++slot) {
    scheduler_->Join(JoinFrom(job, b.id, slot, 2, 300 + slot, "node-b"),
                     clock_.Now() + absl::Seconds(60), joins[2 + slot].Done());
  }
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(joins[rank].result.ok()) << joins[rank].result.status();
    EXPECT_EQ(joins[rank].result->rank(), rank);
    EXPECT_EQ(joins[rank].result->world_size(), 4);
  }
}

// Note [Restart-all] in running_job.h: a program job with an elastic block
// whose program does not re-form in its own process (a torchrun script).
class RestartAllTest : public ElasticRestartTest {
 protected:
  // A program job of min..max ranks with `elastic` placed on the agents
  // already added; every placed rank joins generation 1 (pid 100 + slot).
  std::string PlaceProgram(int min_ranks, int max_ranks, const std::string& elastic,
                           const std::vector<FakeAgent*>& on) {
    auto spec = ParseJobSpec(
        absl::StrCat("program { argv: '/usr/bin/python3' } resources { min_ranks: ", min_ranks,
                     " max_ranks: ", max_ranks, " } elastic { ", elastic, " }"),
        SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    for (const JoinResult& join : JoinAll(job->job_id(), on, 1)) {
      EXPECT_TRUE(join.result.ok()) << join.result.status();
    }
    return job->job_id();
  }
  // The slots `a` was told to stop for `job`, in the order told.
  static std::vector<int> Stopped(const FakeAgent& a, const std::string& job) {
    std::vector<int> slots;
    for (const v1::CoordinatorMessage& m : a.received) {
      if (m.has_stop() && m.stop().job_id() == job) {
        slots.insert(slots.end(), m.stop().slots().begin(), m.stop().slots().end());
      }
    }
    return slots;
  }
  // The slots `a` was told to launch for `job`'s generation `gen`.
  static std::vector<int> Launched(const FakeAgent& a, const std::string& job, int64_t gen) {
    std::vector<int> slots;
    for (const v1::LaunchRanks& l : a.Launches()) {
      if (l.job_id() != job || l.generation() != gen) continue;
      for (const v1::RankLaunch& r : l.ranks()) slots.push_back(r.slot());
    }
    return slots;
  }
};

TEST_F(RestartAllTest, ALostRankStopsEveryRankAndTheNextGenerationLaunchesThemAll) {
  FakeAgent a;
  Add(a, 5, "node-a");
  const std::string job = PlaceProgram(4, 4, "max_restarts: 3", {&a});
  ASSERT_EQ(Launched(a, job, 1), (std::vector<int>{0, 1, 2, 3}));

  ExitOn(a, job, 1, -9);
  // The survivors are stopped; nothing starts before they have exited.
  EXPECT_EQ(Stopped(a, job), (std::vector<int>{0, 2, 3}));
  v1::Job stopping = *jobs_->Get(job);
  EXPECT_EQ(stopping.state(), v1::Job::RUNNING);
  EXPECT_EQ(stopping.generation(), 1);
  EXPECT_EQ(stopping.restarts(), 0);
  EXPECT_THAT(Reasons(job),
              testing::Contains("restart-all for generation 2 after rank 1 (node-a, pid 101) was "
                                "killed by signal 9: stopping the 3 running rank(s) (the program "
                                "does not re-form in its own process); every rank starts again "
                                "once they have exited"));
  // Their exits are expected, whatever their code: a survivor that crashed
  // at its next collective before the stop reached it included.
  ExitOn(a, job, 0, 1);
  ExitOn(a, job, 2, -15);
  EXPECT_TRUE(Launched(a, job, 2).empty()) << "rank 3 still runs";
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  clock_.Advance(absl::Milliseconds(400));
  ExitOn(a, job, 3, -15);

  const v1::Job restarted = *jobs_->Get(job);
  EXPECT_EQ(restarted.state(), v1::Job::RUNNING);
  EXPECT_EQ(restarted.generation(), 2);
  EXPECT_EQ(restarted.world_size(), 4);
  EXPECT_EQ(restarted.restarts(), 1) << "one failure, one restart";
  EXPECT_EQ(Launched(a, job, 2), (std::vector<int>{0, 1, 2, 3})) << "every rank is new";
  EXPECT_EQ(Stopped(a, job).size(), 3u) << "no one else is stopped";
  EXPECT_THAT(Reasons(job),
              testing::Contains("generation 2 after rank 1 (node-a, pid 101) was killed by signal "
                                "9: 4 -> 4 ranks (restart-all: every rank started again), "
                                "restart 1 of 3"));

  clock_.Advance(absl::Milliseconds(600));
  std::vector<JoinResult> joins = JoinAll(job, {&a}, 2);
  ASSERT_EQ(joins.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(joins[rank].result.ok()) << joins[rank].result.status();
    EXPECT_EQ(joins[rank].result->generation(), 2);
    EXPECT_EQ(joins[rank].result->rank(), rank);
    EXPECT_EQ(joins[rank].result->restarts(), 1) << "TORCHELASTIC_RESTART_COUNT";
    EXPECT_EQ(joins[rank].result->group_rank(), 0);
    EXPECT_EQ(joins[rank].result->group_world_size(), 1);
  }
  EXPECT_THAT(Reasons(job), testing::Contains("generation 2 formed with 4 ranks, 1 s after the "
                                              "failure (recovery_seconds)"));
  for (int slot = 0; slot < 4; ++slot) ExitOn(a, job, slot, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
  EXPECT_EQ(scheduler_->reads().free_slots(), 5);
}

// Note [Diagnoses during shutdown]: a program that exits 0 when a
// restart-all stops it (SIGTERM handled) sends a final report that says
// success; that is not the end of training, and the job restarts.
TEST_F(RestartAllTest, ASuccessReportedWhileBeingStoppedIsNotTheEndOfTraining) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  const std::string job = PlaceProgram(2, 2, "", {&a});
  Add(b, 2, "node-b");
  ASSERT_TRUE(scheduler_->DrainAgent(a.id).ok());
  ASSERT_EQ(Stopped(a, job), (std::vector<int>{0, 1}));
  for (int rank : {0, 1}) {
    v1::ReportRequest report;
    report.set_job_id(job);
    report.set_generation(1);
    report.set_rank(rank);
    report.set_final(true);
    report.set_success(true);
    ASSERT_TRUE(scheduler_->Report(report).ok());
  }
  ExitOn(a, job, 0, 0);
  ExitOn(a, job, 1, 0);
  const v1::Job moved = *jobs_->Get(job);
  EXPECT_EQ(moved.state(), v1::Job::RUNNING) << moved.reason();
  EXPECT_EQ(moved.generation(), 2);
  EXPECT_EQ(Launched(b, job, 2), (std::vector<int>{0, 1}));
}

TEST_F(RestartAllTest, EachFailureCountsOneRestartUntilMaxRestartsAreUsedUp) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = PlaceProgram(2, 2, "max_restarts: 1", {&a});
  ExitOn(a, job, 1, -9);
  ExitOn(a, job, 0, 1);  // the survivor crashes before the stop reaches it
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1);
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);
  ASSERT_EQ(Launched(a, job, 2), (std::vector<int>{0, 1}));
  for (const JoinResult& join : JoinAll(job, {&a}, 2)) {
    ASSERT_TRUE(join.result.ok()) << join.result.status();
  }
  ExitOn(a, job, 0, -9);
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.reason(),
            "rank 0 (node-a, pid 100) was killed by signal 9; elastic.max_restarts 1 used up in "
            "generation 2; history: generation 2 after rank 1 (node-a, pid 101) was killed by "
            "signal 9: 2 -> 2 ranks (restart-all: every rank started again), restart 1 of 1");
  EXPECT_EQ(Stopped(a, job), (std::vector<int>{0, 1}))
      << "the first restart's stop, then the end's";
  EXPECT_EQ(scheduler_->reads().free_slots(), 2);
}

TEST_F(RestartAllTest, AProgramThatSaysItReformsInProcessKeepsItsSurvivors) {
  FakeAgent a;
  Add(a, 3, "node-a");
  const std::string job = PlaceProgram(2, 2, "", {&a});
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  hb.set_rank(0);
  hb.set_reforms_in_process(true);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  ExitOn(a, job, 1, -9);
  EXPECT_TRUE(Stopped(a, job).empty()) << "the survivor keeps its process";
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1);
  EXPECT_EQ(Launched(a, job, 2), (std::vector<int>{1})) << "only the newcomer";
}

// Note [Staged growth] in staged_growth.h: min_ranks 1 lets the
// survivor form the failure's generation alone; its replacement is started
// at once, before its generation forms, and the survivor is told to re-form
// only once the replacement's program waits to join.
TEST_F(RestartAllTest, AFailureFormsWithTheSurvivorsAndTheirReplacementJoinsOnceItIsUp) {
  FakeAgent a;
  Add(a, 3, "node-a");
  const std::string job = PlaceProgram(1, 2, "", {&a});
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  hb.set_rank(0);
  hb.set_reforms_in_process(true);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  ExitOn(a, job, 1, -9);
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);
  EXPECT_EQ(jobs_->Get(job)->world_size(), 1) << "the survivor alone";
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1);
  EXPECT_TRUE(Launched(a, job, 2).empty()) << "no newcomer for generation 2";
  JoinResult survivor;
  scheduler_->Join(JoinOf(job, a.id, 0, 2), clock_.Now() + absl::Seconds(60), survivor.Done());
  ASSERT_TRUE(survivor.result.ok()) << survivor.result.status() << ": formed by the survivor";
  EXPECT_EQ(survivor.result->world_size(), 1);

  // The default scale-up interval (60 s) has not passed, but the
  // replacement is owed: at the next Tick it is started for generation 3,
  // which has not formed; the survivor is not told anything yet.
  scheduler_->Tick();
  const std::vector<int> started = Launched(a, job, 3);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(jobs_->Get(job)->generation(), 2);
  EXPECT_EQ(Beat(job, 2, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
  // Its chorus-rank is answered at once with the planned membership.
  v1::JoinRequest first = JoinOf(job, a.id, started[0], 3);
  first.set_starts_program_first(true);
  JoinResult supervisor;
  scheduler_->Join(first, clock_.Now() + absl::Seconds(60), supervisor.Done());
  ASSERT_TRUE(supervisor.result.ok()) << supervisor.result.status();
  EXPECT_TRUE(supervisor.result->staged());
  EXPECT_EQ(supervisor.result->generation(), 3);
  EXPECT_EQ(supervisor.result->rank(), 1);
  EXPECT_EQ(supervisor.result->world_size(), 2);
  EXPECT_EQ(supervisor.result->store_namespace(), job + "/gen-3");
  EXPECT_EQ(Beat(job, 2, 0).kind(), v1::Directive::KIND_UNSPECIFIED) << "the program is not up yet";
  // Its program asks to join: now the survivor re-forms at its boundary.
  JoinResult waiting;
  scheduler_->Join(JoinOf(job, a.id, started[0], 3), clock_.Now() + absl::Seconds(60),
                   waiting.Done());
  EXPECT_EQ(waiting.result.status().code(), absl::StatusCode::kUnavailable);
  const v1::Directive grow = Beat(job, 2, 0);
  EXPECT_EQ(grow.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(grow.generation(), 3);
  EXPECT_EQ(grow.world_size(), 2);
  EXPECT_EQ(grow.reason(), "1 newcomer(s) replace the rank(s) lost in generation 1");

  std::vector<JoinResult> joins(2);
  scheduler_->Join(JoinOf(job, a.id, 0, 3), clock_.Now() + absl::Seconds(60), joins[0].Done());
  EXPECT_EQ(jobs_->Get(job)->generation(), 3);
  EXPECT_EQ(Launched(a, job, 3).size(), 1u) << "the newcomer is not launched again";
  scheduler_->Join(JoinOf(job, a.id, started[0], 3), clock_.Now() + absl::Seconds(60),
                   joins[1].Done());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(joins[rank].result.ok()) << joins[rank].result.status();
    EXPECT_EQ(joins[rank].result->rank(), rank);
    EXPECT_EQ(joins[rank].result->world_size(), 2);
    EXPECT_FALSE(joins[rank].result->staged());
  }
  EXPECT_EQ(jobs_->Get(job)->restarts(), 1) << "the growth is no restart";
  // Grown back: the next growth waits for the scale-up interval again.
  scheduler_->Tick();
  EXPECT_EQ(Beat(job, 3, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
  for (int slot : {0, started[0]}) ExitOn(a, job, slot, 0);
  EXPECT_EQ(State(job), v1::Job::SUCCEEDED);
}

// A staged newcomer whose program is not up within elastic.wait_seconds is
// stopped and the growth tried again; the survivors were never stalled.
TEST_F(RestartAllTest, AStagedNewcomerNotUpWithinWaitSecondsIsStoppedAndStartedAgain) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = PlaceProgram(1, 2, "wait_seconds: 30", {&a});
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  hb.set_rank(0);
  hb.set_reforms_in_process(true);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  ExitOn(a, job, 1, -9);
  JoinResult survivor;
  scheduler_->Join(JoinOf(job, a.id, 0, 2), clock_.Now() + absl::Seconds(60), survivor.Done());
  scheduler_->Tick();
  ASSERT_EQ(Launched(a, job, 3).size(), 1u);
  const int slot = Launched(a, job, 3)[0];
  clock_.Advance(absl::Seconds(31));
  scheduler_->Tick();
  EXPECT_EQ(Stopped(a, job), (std::vector<int>{slot}));
  EXPECT_EQ(Beat(job, 2, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
  EXPECT_EQ(Launched(a, job, 3).size(), 1u) << "its slot is busy until it has exited";
  ExitOn(a, job, slot, 143);
  EXPECT_EQ(State(job), v1::Job::RUNNING) << "a stopped newcomer is no failure";
  scheduler_->Tick();
  EXPECT_EQ(Launched(a, job, 3).size(), 2u) << "started again";
}

// The survivors alone would be below min_ranks: the failure's generation
// takes its newcomer at once, as the built-in trainer's always does.
TEST_F(RestartAllTest, BelowMinRanksAFailuresGenerationTakesItsNewcomerAtOnce) {
  FakeAgent a;
  Add(a, 3, "node-a");
  const std::string job = PlaceProgram(2, 2, "", {&a});
  v1::RankHeartbeat hb;
  hb.set_job_id(job);
  hb.set_generation(1);
  hb.set_rank(0);
  hb.set_reforms_in_process(true);
  ASSERT_TRUE(scheduler_->Heartbeat(hb));
  ExitOn(a, job, 1, -9);
  EXPECT_EQ(jobs_->Get(job)->world_size(), 2);
  EXPECT_EQ(Launched(a, job, 2).size(), 1u);
}

TEST_F(RestartAllTest, ADrainRestartsEveryRankAtOnceAndIsNotARestart) {
  FakeAgent a, b;
  Add(a, 2, "node-a");
  const std::string job = PlaceProgram(2, 2, "", {&a});
  Add(b, 2, "node-b");
  ASSERT_TRUE(scheduler_->DrainAgent(a.id).ok());
  // No step boundary to wait for: a torchrun script would never reach one.
  EXPECT_EQ(Stopped(a, job), (std::vector<int>{0, 1}));
  EXPECT_EQ(Beat(job, 1, 0).kind(), v1::Directive::KIND_UNSPECIFIED);
  ExitOn(a, job, 0, -15);
  ExitOn(a, job, 1, -15);
  const v1::Job moved = *jobs_->Get(job);
  EXPECT_EQ(moved.generation(), 2);
  EXPECT_EQ(moved.restarts(), 0) << "a drain is not a restart";
  EXPECT_EQ(Launched(b, job, 2), (std::vector<int>{0, 1}));
  EXPECT_TRUE(Launched(a, job, 2).empty());
  EXPECT_EQ(Info(a.id).state(), v1::AgentInfo::DRAINED);
  EXPECT_THAT(Reasons(job), testing::Contains(testing::HasSubstr(
                                "2 -> 2 ranks (restart-all: every rank started again), at a step "
                                "boundary (not a restart)")));
  for (const JoinResult& join : JoinAll(job, {&b}, 2)) {
    ASSERT_TRUE(join.result.ok()) << join.result.status();
    EXPECT_EQ(join.result->restarts(), 0);
  }
}

TEST_F(RestartAllTest, RanksThatDoNotExitWithinWaitSecondsOfTheStopFailTheJob) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string job = PlaceProgram(2, 2, "wait_seconds: 20", {&a});
  ExitOn(a, job, 1, -9);
  clock_.Advance(absl::Seconds(19));
  scheduler_->Tick();
  EXPECT_EQ(State(job), v1::Job::RUNNING);
  clock_.Advance(absl::Seconds(2));
  scheduler_->Tick();
  const v1::Job failed = *jobs_->Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.reason(),
            "rank 1 (node-a, pid 101) was killed by signal 9; restart-all: rank(s) 0 of generation "
            "1 did not exit within elastic.wait_seconds 20 s of being stopped");
}

TEST_F(RestartAllTest, ARestartAllInProgressGoesOnAfterACoordinatorRestart) {
  FakeAgent a;
  Add(a, 3, "node-a");
  const std::string job = PlaceProgram(3, 3, "", {&a});
  ExitOn(a, job, 2, -9);
  ExitOn(a, job, 0, -15);
  ASSERT_EQ(Stopped(a, job), (std::vector<int>{0, 1}));
  Restart();
  // Rank 1 still runs: its agent had not acted on the stop. It is told again.
  Reconnect(a, 3, "node-a", {{job, 1, 1}});
  EXPECT_EQ(Stopped(a, job), (std::vector<int>{1}));
  EXPECT_EQ(jobs_->Get(job)->generation(), 1);
  ExitOn(a, job, 1, -15);
  const v1::Job restarted = *jobs_->Get(job);
  EXPECT_EQ(restarted.generation(), 2);
  EXPECT_EQ(restarted.restarts(), 1);
  EXPECT_EQ(Launched(a, job, 2), (std::vector<int>{0, 1, 2}));
}

TEST_F(SchedulerTest, WithoutElasticAKilledRankStillFailsTheJob) {
  FakeAgent a;
  const std::string job = Submit(2, 2);
  Add(a, 3, "node-a");
  v1::RankExited e;
  e.set_job_id(job);
  e.set_slot(0);
  e.set_pid(7);
  e.set_exit_code(-9);
  RankExited(*scheduler_, a.id, e);
  EXPECT_EQ(State(job), v1::Job::FAILED);
  EXPECT_EQ(jobs_->Get(job)->reason(), "rank 0 (node-a, pid 7) was killed by signal 9");
}

// ---------------------------------------------------------------- priorities, quotas, fair share

class QueueSchedulerTest : public ElasticChangesTest {
 protected:
  void UsePolicy(const std::string& text) {
    absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy(text, "policy");
    ASSERT_TRUE(policy.ok()) << policy.status();
    options_.scheduling_policy = *std::move(policy);
    scheduler_->Configure(options_);
  }
  std::string SubmitAs(const std::string& owner, int min_ranks, int max_ranks,
                       const std::string& priority = "NORMAL") {
    auto spec = ParseJobSpec(
        absl::StrCat("model { mlp {} } data { synthetic {} } priority: ", priority,
                     " resources { min_ranks: ", min_ranks, " max_ranks: ", max_ranks, " }"),
        SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "", owner);
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    return job->job_id();
  }
  std::string Why(const std::string& job) {
    v1::JobStatus status;
    *status.mutable_job() = *jobs_->Get(job);
    scheduler_->reads().FillStatus(job, status);
    return status.pending_reason();
  }
  std::vector<std::string> QueueOrder() {
    std::vector<std::string> ids;
    const v1::GetQueueResponse queue = scheduler_->reads().Queue();
    for (const v1::QueuedJobInfo& info : queue.jobs()) ids.push_back(info.job_id());
    return ids;
  }
};

TEST_F(QueueSchedulerTest, OverQuotaAJobWaitsWithTheReasonAndBlocksNobody) {
  UsePolicy("default cpu_slots=2");
  FakeAgent a;
  Add(a, 4, "node-a");
  const std::string alice_1 = SubmitAs("alice", 2, 2);
  const std::string alice_2 = SubmitAs("alice", 1, 1);
  const std::string bob_1 = SubmitAs("bob", 2, 2);
  EXPECT_EQ(State(alice_1), v1::Job::RUNNING);
  EXPECT_EQ(State(alice_2), v1::Job::PENDING);
  EXPECT_EQ(State(bob_1), v1::Job::RUNNING) << "a job over quota blocks nobody";
  EXPECT_EQ(Why(alice_2), "alice uses 2 of 2 CPU slots (quota); the job needs 1");
  const v1::GetQueueResponse queue = scheduler_->reads().Queue();
  ASSERT_EQ(queue.jobs_size(), 1);
  EXPECT_EQ(queue.jobs(0).owner(), "alice");
  EXPECT_EQ(queue.jobs(0).reason(), "alice uses 2 of 2 CPU slots (quota); the job needs 1");
  EXPECT_FALSE(queue.jobs(0).holds_reservation());
  ASSERT_TRUE(scheduler_->Cancel(alice_1, "done").ok());
  EXPECT_EQ(State(alice_2), v1::Job::RUNNING);
}

// A coordinator that takes over (a restart, or a new leader on etcd) lists
// the queue it took back in placement order before any agent comes back: a
// new leader once listed it in submit order until its first placement pass.
TEST_F(QueueSchedulerTest, AQueueTakenBackIsListedInPlacementOrderBeforeAnyAgentReturns) {
  const std::string low = SubmitAs("", 1, 1, "LOW");
  const std::string normal = SubmitAs("", 1, 1);
  const std::string high = SubmitAs("", 1, 1, "HIGH");
  ASSERT_THAT(QueueOrder(), testing::ElementsAre(high, normal, low));
  scheduler_.reset();
  jobs_ = *JobManager::Create(*state_, &clock_);
  options_ = SchedulerOptions{"127.0.0.1:1"};  // a new process: set up afresh
  scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, options_);
  scheduler_->Recover(jobs_->List({v1::Job::RUNNING}, 0).value(), absl::Seconds(30));
  EXPECT_THAT(QueueOrder(), testing::ElementsAre(high, normal, low));
}

TEST_F(QueueSchedulerTest, AHighJobGoesFirstAndHoldsTheReservation) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string running = SubmitAs("", 2, 2);
  const std::string normal = SubmitAs("", 1, 1);
  const std::string high = SubmitAs("", 2, 2, "HIGH");
  EXPECT_THAT(QueueOrder(), testing::ElementsAre(high, normal));
  const v1::GetQueueResponse queue = scheduler_->reads().Queue();
  ASSERT_EQ(queue.jobs_size(), 2);
  EXPECT_TRUE(queue.jobs(0).holds_reservation());
  EXPECT_EQ(queue.jobs(0).priority(), v1::JobSpec::HIGH);
  EXPECT_EQ(Why(normal), absl::StrCat("waiting for 1 CPU slot behind ", high,
                                      ", which comes first and holds the reservation of free "
                                      "CPU slots"));
  ASSERT_TRUE(scheduler_->Cancel(running, "done").ok());
  EXPECT_EQ(State(high), v1::Job::RUNNING) << "the older NORMAL job does not go first";
  EXPECT_EQ(State(normal), v1::Job::PENDING);
}

TEST_F(QueueSchedulerTest, WithinAPriorityTheUserWithLessRecentUsageGoesFirst) {
  FakeAgent a;
  Add(a, 1, "node-a");
  const std::string alice_1 = SubmitAs("alice", 1, 1);
  const std::string alice_2 = SubmitAs("alice", 1, 1);  // holds the reservation
  const std::string alice_3 = SubmitAs("alice", 1, 1);
  clock_.Advance(absl::Seconds(1));
  const std::string bob_1 = SubmitAs("bob", 1, 1);
  clock_.Advance(absl::Seconds(600));
  scheduler_->Tick();  // alice's 600 slot-seconds are counted
  // Note [Reservation] in queue_plan.h: the holder keeps its place.
  EXPECT_THAT(QueueOrder(), testing::ElementsAre(alice_2, bob_1, alice_3));
  ASSERT_TRUE(scheduler_->Cancel(alice_1, "done").ok());
  EXPECT_EQ(State(alice_2), v1::Job::RUNNING);
  ASSERT_TRUE(scheduler_->Cancel(alice_2, "done").ok());
  EXPECT_EQ(State(bob_1), v1::Job::RUNNING) << "submitted later, but bob has used less";
  EXPECT_EQ(State(alice_3), v1::Job::PENDING);
}

// Issue 57: a job told it holds the reservation lost the slots that freed
// to the later, smaller jobs of a user with less usage.
TEST_F(QueueSchedulerTest, TheReservationHolderGetsTheFreedSlotsWhoeverSubmitsAfterIt) {
  FakeAgent a;
  Add(a, 4, "node-a");
  std::vector<std::string> running;
  for (int i = 0; i < 4; ++i) running.push_back(SubmitAs("alice", 1, 1));
  const std::string large = SubmitAs("alice", 4, 4);
  clock_.Advance(absl::Seconds(600));
  scheduler_->Tick();  // alice's 2400 slot-seconds are counted
  const std::string bob_1 = SubmitAs("bob", 1, 1);
  const std::string bob_2 = SubmitAs("bob", 1, 1);
  EXPECT_THAT(QueueOrder(), testing::ElementsAre(large, bob_1, bob_2));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(scheduler_->Cancel(running[i], "done").ok());
    EXPECT_EQ(State(bob_1), v1::Job::PENDING) << "slot " << i << " went to bob";
    EXPECT_EQ(State(bob_2), v1::Job::PENDING);
    EXPECT_THAT(Why(large), testing::HasSubstr(absl::StrCat(
                                "holds the ", i + 1,
                                " free that it can use (reservation): only a HIGH job can come "
                                "before it")));
  }
  ASSERT_TRUE(scheduler_->Cancel(running[3], "done").ok());
  EXPECT_EQ(State(large), v1::Job::RUNNING);
}

TEST_F(QueueSchedulerTest, TheReservationKeepsElasticJobsFromGrowingOntoItsSlots) {
  FakeAgent a;
  Add(a, 4, "node-a");
  const std::string other = SubmitAs("", 2, 2);
  const std::string elastic = Place(1, 4, "scale_up_interval_seconds: 1", {&a});
  ASSERT_EQ(jobs_->Get(elastic)->world_size(), 2);
  const std::string big = SubmitAs("", 3, 3);
  ASSERT_TRUE(scheduler_->Cancel(other, "done").ok());
  EXPECT_EQ(State(big), v1::Job::PENDING);
  EXPECT_EQ(Why(big),
            "waiting for 3 free CPU slots; 1 agent has 2 free; it is first in line for CPU slots "
            "and holds the 2 free that it can use (reservation): only a HIGH job can come "
            "before it");
  clock_.Advance(absl::Seconds(60));
  scheduler_->Tick();
  EXPECT_EQ(Beat(elastic, 1, 0).kind(), v1::Directive::KIND_UNSPECIFIED)
      << "the free slots are reserved for " << big;
  EXPECT_EQ(scheduler_->reads().free_slots(), 2);
}

TEST_F(QueueSchedulerTest, AnElasticJobGrowsNoFurtherThanItsOwnersQuota) {
  UsePolicy("user alice cpu_slots=3");
  FakeAgent a;
  Add(a, 2, "node-a");
  auto spec = ParseJobSpec(
      "model { mlp {} } data { synthetic {} } resources { min_ranks: 1 max_ranks: 4 } elastic { "
      "scale_up_interval_seconds: 1 }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok());
  const std::string job = jobs_->Submit(*spec, "", "alice")->job_id();
  scheduler_->Schedule();
  JoinAll(job, {&a}, 1);
  FakeAgent b;
  Add(b, 2, "node-b");
  clock_.Advance(absl::Seconds(60));
  scheduler_->Tick();
  const v1::Directive d = Beat(job, 1, 0);
  EXPECT_EQ(d.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(d.world_size(), 3) << "alice may hold 3 CPU slots";
}

TEST_F(QueueSchedulerTest, SubmissionChecksThePriorityCeilingAndQueuedJobs) {
  UsePolicy("default queued_jobs=1 max_priority=NORMAL");
  auto spec = ParseJobSpec("model { mlp {} } data { synthetic {} } priority: HIGH",
                           SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(scheduler_->reads().CheckSubmission(*spec, "alice").code(),
            absl::StatusCode::kPermissionDenied);
  spec->set_priority(v1::JobSpec::NORMAL);
  EXPECT_TRUE(scheduler_->reads().CheckSubmission(*spec, "alice").ok());
  SubmitAs("alice", 1, 1);  // no agent: it stays queued
  EXPECT_EQ(scheduler_->reads().CheckSubmission(*spec, "alice").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(scheduler_->reads().CheckSubmission(*spec, "bob").ok()) << "the limit is per user";
}

// Note [Preemption by shrinking]: a HIGH job takes the slots it needs from a
// NORMAL elastic job at its step boundary; the elastic job grows back once
// the HIGH job has ended.
TEST_F(QueueSchedulerTest, AHighJobShrinksALowerElasticJobAtItsStepBoundaryThenItGrowsBack) {
  FakeAgent a;
  Add(a, 4, "node-a");
  const std::string elastic = Place(2, 4, "scale_up_interval_seconds: 1", {&a});
  ASSERT_EQ(jobs_->Get(elastic)->world_size(), 4);
  const std::string high = SubmitAs("bob", 2, 2, "HIGH");
  EXPECT_EQ(State(high), v1::Job::PENDING);
  const v1::Directive d = Beat(elastic, 1, 0);
  EXPECT_EQ(d.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(d.world_size(), 2);
  EXPECT_EQ(d.reason(), absl::StrCat(high,
                                     " (priority HIGH, bob) preempted rank(s) 2,3 of this "
                                     "NORMAL job: they leave, nothing is lost"));
  EXPECT_THAT(Reasons(high),
              testing::Contains(absl::StrCat("preempting rank(s) 2,3 of ", elastic,
                                             " (priority NORMAL) at its next step boundary to "
                                             "make room for this job")));
  scheduler_->Schedule();  // no second preemption while the first is under way
  EXPECT_EQ(Beat(elastic, 1, 3).world_size(), 2);

  // The step boundary: every rank joins generation 2; ranks 2 and 3 leave.
  std::vector<JoinResult> joins(4);
  for (int slot = 0; slot < 4; ++slot) {
    scheduler_->Join(JoinOf(elastic, a.id, slot, 2), clock_.Now() + absl::Seconds(60),
                     joins[slot].Done());
  }
  ASSERT_TRUE(joins[3].result.ok()) << joins[3].result.status();
  EXPECT_TRUE(joins[3].result->leave());
  ASSERT_TRUE(joins[0].result.ok()) << joins[0].result.status();
  EXPECT_EQ(joins[0].result->world_size(), 2);
  EXPECT_EQ(State(high), v1::Job::PENDING) << "the leaving ranks still hold their slots";
  ExitOn(a, elastic, 2, 0);
  ExitOn(a, elastic, 3, 0);
  EXPECT_EQ(State(high), v1::Job::RUNNING);
  const v1::Job shrunk = *jobs_->Get(elastic);
  EXPECT_EQ(shrunk.world_size(), 2);
  EXPECT_EQ(shrunk.restarts(), 0) << "a preemption is no failure";

  // The HIGH job ends: the elastic job grows back onto its slots.
  ASSERT_TRUE(scheduler_->Cancel(high, "done").ok());
  clock_.Advance(absl::Seconds(5));
  scheduler_->Tick();
  const v1::Directive grow = Beat(elastic, 2, 0);
  EXPECT_EQ(grow.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(grow.world_size(), 4);
}

TEST_F(QueueSchedulerTest, NoPreemptionWhenTheLowerJobsCannotFreeEnough) {
  FakeAgent a;
  Add(a, 4, "node-a");
  const std::string elastic = Place(3, 4, "", {&a});
  const std::string high = SubmitAs("", 2, 2, "HIGH");
  EXPECT_EQ(Beat(elastic, 1, 0).kind(), v1::Directive::KIND_UNSPECIFIED)
      << "one rank above min_ranks cannot make room for 2";
  EXPECT_EQ(State(high), v1::Job::PENDING);
}

// Note [Re-queue]: the coordinator restarts while a preempted job is
// checkpointing: the job is taken back as RUNNING, the plan preempts it
// again and asks for a new checkpoint; after it, the job waits PENDING.
class RequeueRestartTest : public ElasticRestartTest {
 protected:
  void UseCommitted() {
    options_.resume_resolver =
        [this](const std::string& resume_from,
               std::vector<std::string>*) -> absl::StatusOr<v1::CheckpointManifest> {
      auto it = committed_.find(resume_from);
      if (it == committed_.end()) return absl::NotFoundError("no checkpoint");
      v1::CheckpointManifest manifest;
      manifest.set_job_id(resume_from);
      manifest.set_step(it->second);
      return manifest;
    };
    scheduler_->Configure(options_);
  }
  std::map<std::string, int64_t> committed_;
};

TEST_F(RequeueRestartTest, APreemptionUnderWayIsAskedForAgainAfterACoordinatorRestart) {
  UseCommitted();
  FakeAgent a;
  Add(a, 2, "node-a");
  auto low_spec = ParseJobSpec(
      "model { mlp {} } data { synthetic {} } priority: LOW resources { min_ranks: 2 }",
      SpecFormat::kTextProto, "test");
  const std::string low = jobs_->Submit(*low_spec, "", "carol")->job_id();
  scheduler_->Schedule();
  JoinAll(low, {&a}, 1);
  auto high_spec = ParseJobSpec(
      "model { mlp {} } data { synthetic {} } priority: HIGH resources { min_ranks: 2 }",
      SpecFormat::kTextProto, "test");
  const std::string high = jobs_->Submit(*high_spec, "", "bob")->job_id();
  scheduler_->Schedule();
  ASSERT_EQ(State(low), v1::Job::RUNNING);
  const std::string a_before = a.id;

  Restart();
  UseCommitted();
  Reconnect(a, 2, "node-a", {{low, 1, 0}, {low, 1, 1}});
  std::vector<JoinResult> joins(2);
  for (int slot = 0; slot < 2; ++slot) {
    scheduler_->Join(JoinFrom(low, a_before, slot, 1, 100 + slot, "node-a"),
                     clock_.Now() + absl::Seconds(60), joins[slot].Done());
  }
  scheduler_->Schedule();
  v1::RankHeartbeat hb;
  hb.set_job_id(low);
  hb.set_generation(1);
  v1::Directive directive;
  EXPECT_TRUE(scheduler_->Heartbeat(hb, &directive));
  EXPECT_EQ(directive.kind(), v1::Directive::CHECKPOINT_AND_HOLD)
      << "the restarted coordinator asks for the checkpoint again";
  committed_[low] = 1;
  scheduler_->Tick();
  EXPECT_EQ(State(low), v1::Job::PENDING);
  ExitOn(a, low, 0, -15);
  ExitOn(a, low, 1, -15);
  EXPECT_EQ(State(high), v1::Job::RUNNING);

  Restart();  // PENDING with its resume_from: nothing else to take back
  EXPECT_EQ(jobs_->Get(low)->resume_from(), low);
  EXPECT_EQ(jobs_->Get(low)->preemptions(), 1);
}

// Note [Re-queue]: preemption of jobs that are not elastic.
class RequeueSchedulerTest : public QueueSchedulerTest {
 protected:
  void SetUp() override {
    QueueSchedulerTest::SetUp();
    options_.resume_resolver =
        [this](const std::string& resume_from,
               std::vector<std::string>*) -> absl::StatusOr<v1::CheckpointManifest> {
      auto it = committed_.find(resume_from);
      if (it == committed_.end()) return absl::NotFoundError("no checkpoint");
      v1::CheckpointManifest manifest;
      manifest.set_job_id(resume_from);
      manifest.set_step(it->second);
      return manifest;
    };
    scheduler_->Configure(options_);
  }
  // A LOW job of 2 ranks owned by carol (`what` it runs, `resources` added
  // to its resources block), running on `a` and at `step`.
  std::string RunLow(FakeAgent& a, int64_t step,
                     const std::string& what = "model { mlp {} } data { synthetic {} }",
                     const std::string& resources = "") {
    auto spec =
        ParseJobSpec(absl::StrCat(what, " priority: LOW resources { min_ranks: 2 max_ranks: 2 ",
                                  resources, " }"),
                     SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    const std::string job = jobs_->Submit(*spec, "", "carol")->job_id();
    scheduler_->Schedule();
    for (const JoinResult& j : JoinAll(job, {&a}, 1))
      EXPECT_TRUE(j.result.ok()) << j.result.status();
    for (int rank = 0; rank < 2; ++rank) {
      v1::RankHeartbeat hb;
      hb.set_job_id(job);
      hb.set_generation(1);
      hb.set_rank(rank);
      hb.set_step(step);
      EXPECT_TRUE(scheduler_->Heartbeat(hb));
    }
    return job;
  }
  // What rank `rank` of the job's first run is told on its heartbeat.
  v1::Directive::Kind Told(const std::string& job, int rank) { return Beat(job, 1, rank).kind(); }
  std::map<std::string, int64_t> committed_;
};

TEST_F(RequeueSchedulerTest, ACheckpointedJobGoesBackToTheQueueAndResumesFromItsCheckpoint) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string low = RunLow(a, 120);
  committed_[low] = 100;
  const std::string high = SubmitAs("bob", 2, 2, "HIGH");
  const v1::Directive hold = Beat(low, 1, 1);
  EXPECT_EQ(hold.kind(), v1::Directive::CHECKPOINT_AND_HOLD);
  EXPECT_EQ(hold.reason(), absl::StrCat("preempted by ", high, " (HIGH, bob)"));
  EXPECT_EQ(State(low), v1::Job::RUNNING) << "it checkpoints first";
  EXPECT_THAT(Reasons(low), testing::Contains(absl::StrCat(
                                "preempted by ", high,
                                " (HIGH, bob): checkpointing at the next step boundary (step 120 "
                                "or later), then back to the queue")));
  EXPECT_THAT(Reasons(high), testing::Contains(absl::StrCat(
                                 "preempting ", low,
                                 " (priority LOW): it goes back to the queue to make room for "
                                 "this job")));
  scheduler_->Schedule();
  scheduler_->Tick();
  EXPECT_EQ(Told(low, 0), v1::Directive::CHECKPOINT_AND_HOLD) << "until it is stopped";
  EXPECT_EQ(State(low), v1::Job::RUNNING) << "step 100 is older than the request";

  committed_[low] = 121;
  scheduler_->Tick();
  v1::Job queued = *jobs_->Get(low);
  EXPECT_EQ(queued.state(), v1::Job::PENDING);
  const std::string reason =
      absl::StrCat("preempted by ", high, " (HIGH, bob); resumes from step 121");
  EXPECT_EQ(queued.reason(), reason);
  EXPECT_EQ(queued.resume_from(), low);
  EXPECT_EQ(queued.preemptions(), 1);
  EXPECT_EQ(a.Stops(), 1);
  EXPECT_EQ(State(high), v1::Job::PENDING) << "the stopped ranks still hold their slots";
  ExitOn(a, low, 0, -15);
  ExitOn(a, low, 1, -15);
  EXPECT_EQ(State(high), v1::Job::RUNNING);
  EXPECT_EQ(State(low), v1::Job::PENDING) << "the old run's exits fail nothing";
  EXPECT_THAT(Why(low), testing::StartsWith(reason));

  a.received.clear();
  ASSERT_TRUE(scheduler_->Cancel(high, "done").ok());
  ASSERT_EQ(State(low), v1::Job::RUNNING);
  EXPECT_EQ(jobs_->Get(low)->reason(), "");
  std::vector<JoinResult> joins = JoinAll(low, {&a}, 1);
  ASSERT_EQ(joins.size(), 2u);
  ASSERT_TRUE(joins[0].result.ok()) << joins[0].result.status();
  EXPECT_EQ(joins[0].result->generation(), 1) << "a new run, not an elastic re-formation";
  EXPECT_EQ(joins[0].result->resume().step(), 121);
  EXPECT_EQ(joins[0].result->store_namespace(), absl::StrCat(low, "/run-2/gen-1"));
}

TEST_F(RequeueSchedulerTest, ACheckpointThatDoesNotCommitInTimeLosesTheStepsSinceTheLastOne) {
  options_.requeue_checkpoint_timeout = absl::Seconds(30);
  scheduler_->Configure(options_);
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string low = RunLow(a, 120);
  committed_[low] = 100;
  const std::string high = SubmitAs("bob", 2, 2, "HIGH");
  clock_.Advance(absl::Seconds(29));
  scheduler_->Tick();
  EXPECT_EQ(State(low), v1::Job::RUNNING);
  clock_.Advance(absl::Seconds(2));
  scheduler_->Tick();
  EXPECT_EQ(State(low), v1::Job::PENDING);
  EXPECT_THAT(Reasons(low),
              testing::Contains("warning: the checkpoint asked for (step 120 or later) did not "
                                "commit within 30s; the job goes back to the queue anyway and "
                                "resumes from step 100, losing 20 step(s)"));
  EXPECT_EQ(jobs_->Get(low)->reason(),
            absl::StrCat("preempted by ", high, " (HIGH, bob); resumes from step 100"));
}

TEST_F(RequeueSchedulerTest, AProgramJobIsRequeuedOnlyWhenPreemptibleAndThenFromScratch) {
  FakeAgent a;
  Add(a, 2, "node-a");
  const std::string program = RunLow(a, 5, "program { argv: \"/bin/true\" }");
  const std::string high = SubmitAs("bob", 2, 2, "HIGH");
  scheduler_->Tick();
  EXPECT_EQ(State(program), v1::Job::RUNNING) << "nothing says it can be checkpointed";
  EXPECT_EQ(Told(program, 0), v1::Directive::KIND_UNSPECIFIED);
  EXPECT_EQ(a.Stops(), 0);
  ASSERT_TRUE(scheduler_->Cancel(program, "done").ok());
  ExitOn(a, program, 0, -15);
  ExitOn(a, program, 1, -15);
  ASSERT_EQ(State(high), v1::Job::RUNNING);
  ASSERT_TRUE(scheduler_->Cancel(high, "done").ok());

  const std::string preemptible =
      RunLow(a, 5, "program { argv: \"/bin/true\" }", "preemptible: true");
  const std::string high2 = SubmitAs("bob", 2, 2, "HIGH");
  EXPECT_EQ(State(preemptible), v1::Job::PENDING) << "at once, without a checkpoint";
  EXPECT_EQ(jobs_->Get(preemptible)->reason(),
            absl::StrCat("preempted by ", high2,
                         " (HIGH, bob); starts again from scratch (resources.preemptible)"));
  EXPECT_EQ(jobs_->Get(preemptible)->resume_from(), "");
}

}  // namespace
}  // namespace chorus
