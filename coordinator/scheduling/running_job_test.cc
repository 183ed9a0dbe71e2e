#include "coordinator/scheduling/running_job.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/output_limits.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::AgentHello Hello(const std::string& host, int64_t pid, int slots) {
  v1::AgentHello hello;
  hello.set_host(host);
  hello.set_pid(pid);
  hello.set_slots(slots);
  return hello;
}

v1::RankExited Exit(int slot, int code, int64_t pid = 4242) {
  v1::RankExited e;
  e.set_job_id("job-000001");
  e.set_slot(slot);
  e.set_pid(pid);
  e.set_exit_code(code);
  return e;
}

// Three ranks: two on agent-1 (node-a) and one on agent-2 (node-b).
class RunningJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(*agents_.Add(Hello("node-a", 11, 2), nullptr), "agent-1");
    ASSERT_EQ(*agents_.Add(Hello("node-b", 12, 1), nullptr), "agent-2");
    job_.set_job_id("job-000001");
    job_.mutable_spec()->mutable_resources()->set_max_ranks(3);
    const std::vector<RankSlot> slots = {
        {"agent-1", 0, 0, 2}, {"agent-1", 1, 1, 2}, {"agent-2", 0, 0, 1}};
    for (const RankSlot& slot : slots) run_.AddRank(RankState::At(slot));
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  AgentRegistry agents_;
  v1::Job job_;
  RunningJob run_{job_, 3, /*generation=*/1};
};

// Which ranks a change of generation loses, and how: each rank's own state
// and its agent's, one row per case.
TEST_F(RunningJobTest, EachRanksFateAtAChangeOfGeneration) {
  using Fate = RunningJob::Fate;
  struct Row {
    const char* what;
    std::function<void(RunningJob&, AgentRegistry&)> make;
    std::vector<Fate> fates;
  };
  const std::vector<Row> rows = {
      {"every rank running",
       [](RunningJob&, AgentRegistry&) {},
       {Fate::kStays, Fate::kStays, Fate::kStays}},
      {"rank 1 exited",
       [](RunningJob& run, AgentRegistry&) { RankOf(run, 1).state = v1::RankStatus::EXITED; },
       {Fate::kStays, Fate::kExited, Fate::kStays}},
      {"agent-2 gone",
       [](RunningJob&, AgentRegistry& agents) { agents.Remove("agent-2"); },
       {Fate::kStays, Fate::kStays, Fate::kAgentGone}},
      {"agent-1 draining",
       [](RunningJob&, AgentRegistry& agents) { agents.SetDraining("agent-1"); },
       {Fate::kLeavesAtBoundary, Fate::kLeavesAtBoundary, Fate::kStays}},
      {"rank 2 yields its slot",
       [](RunningJob& run, AgentRegistry&) { run.mutable_leaving().Yield("agent-2", 0); },
       {Fate::kStays, Fate::kStays, Fate::kLeavesAtBoundary}},
      {"rank 0 awaits its agent",
       [](RunningJob& run, AgentRegistry&) { RankOf(run, 0).agent_id.clear(); },
       {Fate::kUnbound, Fate::kStays, Fate::kStays}},
      {"an exit counts before a draining agent",
       [](RunningJob& run, AgentRegistry& agents) {
         agents.SetDraining("agent-1");
         RankOf(run, 0).state = v1::RankStatus::EXITED;
       },
       {Fate::kExited, Fate::kLeavesAtBoundary, Fate::kStays}},
  };
  for (const Row& row : rows) {
    RunningJob run = run_;
    AgentRegistry agents;
    ASSERT_EQ(*agents.Add(Hello("node-a", 11, 2), nullptr), "agent-1");
    ASSERT_EQ(*agents.Add(Hello("node-b", 12, 1), nullptr), "agent-2");
    row.make(run, agents);
    EXPECT_EQ(run.Fates(agents), row.fates) << row.what;
  }
}

// Growth, shrinking and re-queueing start only from a steady job.
TEST_F(RunningJobTest, SteadyOnceFormedWithNoRankMissingAndNoChangeUnderWay) {
  EXPECT_FALSE(run_.Steady()) << "its generation has not formed";
  Rendezvous::Answers answers;
  for (int rank = 0; rank < 3; ++rank) {
    run_.mutable_rendezvous().Join(
        rank, absl::InfiniteFuture(), [](absl::StatusOr<v1::JoinResponse>) {},
        [](int) { return v1::JoinResponse(); }, answers);
  }
  ASSERT_TRUE(run_.Formed());
  EXPECT_TRUE(run_.Steady());

  RunningJob exited = run_;
  RankOf(exited, 2).state = v1::RankStatus::EXITED;
  EXPECT_FALSE(exited.Steady()) << "a rank exited";
  RunningJob planned = run_;
  ASSERT_TRUE(
      planned.mutable_phase().Plan(ElasticPhase::Planned{"a drain", ReformKind::kDrain, 2}));
  EXPECT_FALSE(planned.Steady()) << "a change is planned";
  RunningJob awaiting = run_;
  RankOf(awaiting, 0).agent_id.clear();
  EXPECT_FALSE(awaiting.Steady()) << "a rank is awaited";
}

TEST_F(RunningJobTest, FindsRanksByAgentSlotAndGeneration) {
  EXPECT_EQ(run_.RankOn("agent-1", 1), 1);
  EXPECT_EQ(run_.RankOn("agent-2", 0), 2);
  EXPECT_EQ(run_.RankOn("agent-2", 1), -1);
  EXPECT_TRUE(run_.HasRank(1, 2));
  EXPECT_FALSE(run_.HasRank(2, 0)) << "another generation";
  EXPECT_FALSE(run_.HasRank(1, 3));
}

TEST_F(RunningJobTest, ReleasingFreesSlotsAndListsRanksStillRunning) {
  for (const RankState& r : run_.ranks()) agents_.SetBusy(r.agent_id, r.slot, true);
  ASSERT_EQ(agents_.free_slots(), 0);
  RankOf(run_, 1).state = v1::RankStatus::EXITED;
  RankOf(run_, 2).state = v1::RankStatus::EXITED;
  EXPECT_TRUE(run_.RunsOn("agent-1"));
  EXPECT_FALSE(run_.RunsOn("agent-2")) << "its only rank exited";
  const auto to_stop = run_.ReleaseSlots(agents_);
  ASSERT_EQ(to_stop.size(), 1u);
  EXPECT_EQ(to_stop.at("agent-1"), std::vector<int>{0});
  EXPECT_EQ(agents_.free_slots(), 3);
}

// `chorus checkpoint`: one message per agent for the ranks running there,
// and the highest step a rank has reported.
TEST_F(RunningJobTest, CheckpointMessagesGoToTheAgentsOfRanksStillRunning) {
  RankOf(run_, 0).last_heartbeat.set_step(40);
  RankOf(run_, 2).last_heartbeat.set_step(42);
  EXPECT_EQ(run_.ReportedStep(), 42);
  RankOf(run_, 1).state = v1::RankStatus::EXITED;
  auto messages = run_.CheckpointMessages("job-000001", agents_);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages.at("agent-1").checkpoint().job_id(), "job-000001");
  EXPECT_EQ(messages.at("agent-1").checkpoint().slots_size(), 1);  // slot 1's rank exited
  EXPECT_EQ(messages.at("agent-2").checkpoint().slots(0), 0);
  agents_.Remove("agent-2");
  messages = run_.CheckpointMessages("job-000001", agents_);
  EXPECT_EQ(messages.count("agent-2"), 0u);  // its agent is gone
}

// A generation's newcomers (LAUNCHING) are launched; survivors join by
// themselves.
TEST_F(RunningJobTest, NewcomerLaunchesAreForTheRanksLaunching) {
  for (RankState& r : RanksOf(run_)) r.state = v1::RankStatus::TRAINING;
  EXPECT_TRUE(run_.NewcomerLaunchMessages("job-000001", "10.0.0.1:29650").empty());
  RankOf(run_, 2).state = v1::RankStatus::LAUNCHING;
  const auto launches = run_.NewcomerLaunchMessages("job-000001", "10.0.0.1:29650");
  ASSERT_EQ(launches.size(), 1u);
  const v1::LaunchRanks& launch = launches.at("agent-2").launch();
  ASSERT_EQ(launch.ranks_size(), 1);
  EXPECT_EQ(launch.ranks(0).slot(), 0);
  EXPECT_EQ(launch.generation(), 1);
}

// A rank silent past dead_after_seconds is diagnosed once: an event when it
// appears, the diagnosis kept as the job's current one.
TEST_F(RunningJobTest, DiagnosesBecomeEventsWhenTheyAppear) {
  Rendezvous::Answers answers;
  for (int r = 0; r < 3; ++r) {
    run_.mutable_rendezvous().MarkJoined(r);
    RankOf(run_, r).state = v1::RankStatus::TRAINING;
    RankOf(run_, r).heartbeat_at = clock_.Now();
    RankOf(run_, r).last_heartbeat.set_step(10);
  }
  EXPECT_TRUE(run_.UpdateDiagnoses(agents_, clock_.Now()).empty());
  EXPECT_TRUE(run_.diagnoses_now().empty());
  const absl::Time later = clock_.Now() + absl::Seconds(60);
  for (int r : {0, 2}) RankOf(run_, r).heartbeat_at = later;
  std::vector<v1::JobEvent> events = run_.UpdateDiagnoses(agents_, later);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].diagnosis().kind(), v1::Diagnosis::DEAD);
  ASSERT_EQ(run_.diagnoses_now().size(), 1u);
  EXPECT_EQ(run_.diagnoses_now()[0].ranks(0), 1);
  EXPECT_TRUE(run_.UpdateDiagnoses(agents_, later).empty());  // once
}

TEST_F(RunningJobTest, AStartTakesItsSlotsAsGenerationOne) {
  v1::CheckpointManifest resume;
  resume.set_job_id("job-000000");
  resume.set_step(40);
  const RunningJob run = RunningJob::Started(job_, {{"agent-1", 1, 0, 2}, {"agent-2", 0, 0, 1}},
                                             resume, agents_, clock_.Now());
  EXPECT_EQ(run.generation(), 1);
  ASSERT_EQ(run.ranks().size(), 2u);
  EXPECT_EQ(run.ranks()[1].agent_id, "agent-2");
  EXPECT_EQ(run.ranks()[0].state, v1::RankStatus::LAUNCHING);
  EXPECT_EQ(run.resume().step(), 40);
  EXPECT_EQ(run.generation_started_at(), clock_.Now());
  EXPECT_EQ(run.last_growth_at(), clock_.Now());
  EXPECT_EQ(agents_.free_slots(), 1);  // agent-1's slot 0
}

// A new generation: a rendezvous and upload grant of its own, no exit
// counted, survivors mapped to their new ranks, the phase Forming; that a
// rank of the last one had finished training is kept.
TEST_F(RunningJobTest, ANewGenerationStartsItsBookkeepingAfresh) {
  run_.FinishedTraining(1);
  std::vector<RankState> next = {run_.ranks()[0], run_.ranks()[2]};
  run_.BeginGeneration(job_, next, 2, ReformKind::kRankLost, clock_.Now(), {0, -1, 1});
  EXPECT_EQ(run_.generation(), 2);
  EXPECT_EQ(run_.ranks().size(), 2u);
  EXPECT_FALSE(run_.Formed());
  EXPECT_EQ(run_.exited_ok(), 0);
  EXPECT_EQ(run_.rank_of_survivor(), (std::vector<int>{0, -1, 1}));
  EXPECT_EQ(run_.generation_started_at(), clock_.Now());
  EXPECT_TRUE(CheckUploader(run_.upload_grant(), 2, 0).ok());
  EXPECT_FALSE(CheckUploader(run_.upload_grant(), 1, 0).ok());
  EXPECT_NE(run_.phase().forming(), nullptr);
  EXPECT_TRUE(run_.finished_before_reform());

  run_.MarkFinished(1);  // taken back after a restart, its exit of 0 recorded
  EXPECT_EQ(run_.ranks()[1].state, v1::RankStatus::EXITED);
  EXPECT_EQ(run_.exited_ok(), 1);
}

// A change counts a failure as a restart, a growth restarts the scale-up
// interval, a survivors-only generation owes its replacements; a restart
// takes the history back as saved.
TEST_F(RunningJobTest, AChangeIsCountedAndRestored) {
  const absl::Time now = clock_.Now();
  run_.CountChange(/*failure=*/true, /*grew=*/false, /*owes=*/true, now);
  run_.AddHistory("generation 2 after rank 1 exited");
  EXPECT_EQ(run_.restarts(), 1);
  EXPECT_EQ(run_.last_growth_at(), absl::InfinitePast());
  EXPECT_TRUE(run_.replacements_owed());
  run_.CountChange(false, /*grew=*/true, false, now);
  EXPECT_EQ(run_.restarts(), 1);
  EXPECT_EQ(run_.last_growth_at(), now);
  EXPECT_FALSE(run_.replacements_owed());
  EXPECT_EQ(run_.history(), std::vector<std::string>{"generation 2 after rank 1 exited"});

  RunningJob back(job_, 3, /*generation=*/2);
  back.Restore({"a", "b"}, 1.5, absl::InfinitePast(), /*reforms_in_process=*/true);
  EXPECT_EQ(back.history(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(back.recovery_seconds(), 1.5);
  EXPECT_EQ(back.last_growth_at(), absl::InfinitePast());  // none saved
  EXPECT_TRUE(back.reforms_in_process());
}

TEST_F(RunningJobTest, LaunchMessagesAndPlacementsDescribeEveryRank) {
  const auto launches = run_.LaunchMessages("job-000001", "10.0.0.1:29650");
  ASSERT_EQ(launches.size(), 2u);
  const v1::LaunchRanks& a = launches.at("agent-1").launch();
  EXPECT_EQ(a.job_id(), "job-000001");
  EXPECT_EQ(a.generation(), 1);
  EXPECT_EQ(a.coordinator(), "10.0.0.1:29650");
  ASSERT_EQ(a.ranks_size(), 2);
  EXPECT_EQ(a.ranks(1).slot(), 1);
  EXPECT_EQ(a.ranks(1).local_rank(), 1);
  EXPECT_EQ(a.ranks(1).local_world_size(), 2);
  EXPECT_EQ(launches.at("agent-2").launch().ranks_size(), 1);

  const std::vector<v1::RankPlacement> placements = run_.Placements(agents_);
  ASSERT_EQ(placements.size(), 3u);
  EXPECT_EQ(placements[2].host(), "node-b");
  EXPECT_EQ(placements[2].agent_pid(), 12);
  EXPECT_EQ(placements[1].slot(), 1);
}

TEST_F(RunningJobTest, AFailedProgramRankIsQuotedByItsLastThreeLines) {
  v1::Job job = job_;
  job.mutable_spec()->mutable_program()->add_argv("/usr/bin/python3");
  RunningJob run(job, 3, /*generation=*/1);
  RanksOf(run) = run_.ranks();
  v1::RankExited failed = Exit(0, 3);
  for (const char* line : {"epoch 1", "Traceback (most recent call last):",
                           "  File \"train.py\", line 9", "ValueError: bad batch"}) {
    failed.add_stderr_tail(line);
  }
  std::optional<JobEnd> end = run.RecordExit("agent-2", agents_.Find("agent-2")->hello, failed);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->reason,
            "rank 2 (node-b, pid 4242) exited with code 3; last output: Traceback (most recent "
            "call last): |   File \"train.py\", line 9 | ValueError: bad batch");
}

// Note [Rank log tag]: the supervisor's log shares the program's output.
TEST_F(RunningJobTest, AFailedProgramIsQuotedWithoutItsSupervisorsLogLines) {
  v1::Job job = job_;
  job.mutable_spec()->mutable_program()->add_argv("/bin/sh");
  RunningJob run(job, 3, /*generation=*/1);
  RanksOf(run) = run_.ranks();
  const std::string starts =
      absl::StrCat(kRankLogTag,
                   "I20240612 10:15:02.123456  4242 program_supervisor.cc:311] job-000001: rank 2 "
                   "of 3 starts /bin/sh (MASTER_ADDR 127.0.0.1, MASTER_PORT 29500)");
  v1::RankExited failed = Exit(0, 3);
  failed.add_stderr_tail(starts);
  failed.add_stderr_tail("error: disk full");
  std::optional<JobEnd> end = run.RecordExit("agent-2", agents_.Find("agent-2")->hello, failed);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->reason,
            "rank 2 (node-b, pid 4242) exited with code 3; last output: error: disk full");

  // A program that printed nothing is not quoted at all.
  RanksOf(run) = run_.ranks();
  v1::RankExited silent = Exit(0, 3);
  silent.add_stderr_tail(starts);
  end = run.RecordExit("agent-2", agents_.Find("agent-2")->hello, silent);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->reason, "rank 2 (node-b, pid 4242) exited with code 3");
}

// Note [Bounded job output]: the agent is not trusted to bound its report.
TEST_F(RunningJobTest, AReasonQuotesABoundedEndOfTheOutput) {
  v1::Job job = job_;
  job.mutable_spec()->mutable_program()->add_argv("/usr/bin/python3");
  RunningJob run(job, 3, /*generation=*/1);
  RanksOf(run) = run_.ranks();
  v1::RankExited failed = Exit(0, 1);
  for (int i = 0; i < 30; ++i) failed.add_stderr_tail(std::string(100000, 'a' + i % 26));
  failed.add_stderr_tail("ValueError: bad batch");
  std::optional<JobEnd> end = run.RecordExit("agent-2", agents_.Find("agent-2")->hello, failed);
  ASSERT_TRUE(end.has_value());
  EXPECT_LT(end->reason.size(), 2200u);
  EXPECT_TRUE(absl::EndsWith(end->reason, "bytes of this line dropped] | ValueError: bad batch"))
      << end->reason.substr(end->reason.size() - 200);

  // A built-in rank's last line the same.
  v1::RankExited long_line = Exit(0, 1);
  long_line.add_stderr_tail(std::string(5 << 20, 'x'));
  end = run_.RecordExit("agent-2", agents_.Find("agent-2")->hello, long_line);
  ASSERT_TRUE(end.has_value());
  EXPECT_LT(end->reason.size(), 2200u);
  EXPECT_TRUE(absl::EndsWith(end->reason, "bytes of this line dropped]")) << end->reason;
}

// Note [Rank cgroups]: every launch carries the job's limits, and a rank
// the OOM killer took in its cgroup fails its job saying so, with the
// limit and the field that sets it.
TEST_F(RunningJobTest, LaunchesCarryLimitsAndAnOutOfMemoryKillIsExplained) {
  v1::Job job = job_;
  job.mutable_spec()->mutable_program()->add_argv("/usr/bin/python3");
  job.mutable_spec()->mutable_resources()->set_memory_bytes(int64_t{4} << 30);
  job.mutable_spec()->mutable_resources()->set_max_processes(100);
  RunningJob run(job, 3, /*generation=*/1);
  RanksOf(run) = run_.ranks();
  const auto launches = run.LaunchMessages("job-000001", "10.0.0.1:29650");
  EXPECT_EQ(launches.at("agent-1").launch().memory_limit_bytes(), int64_t{4} << 30);
  EXPECT_EQ(launches.at("agent-2").launch().max_processes(), 100);

  v1::RankExited killed = Exit(0, 137);
  killed.set_out_of_memory_limit_bytes(int64_t{4} << 30);
  killed.add_stderr_tail("allocated 3900 MiB");
  std::optional<JobEnd> end = run.RecordExit("agent-2", agents_.Find("agent-2")->hello, killed);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->state, v1::Job::FAILED);
  EXPECT_EQ(end->reason,
            "rank 2 (node-b, pid 4242) was killed: out of memory: the job's limit is 4 GiB per "
            "rank (resources.memory_bytes); last output: allocated 3900 MiB");
}

TEST_F(RunningJobTest, ANonZeroExitFailsTheJobNamingRankHostPidAndStderr) {
  v1::RankExited killed = Exit(0, -9);
  killed.add_stderr_tail("loading data");
  killed.add_stderr_tail("out of memory");
  std::optional<JobEnd> end = run_.RecordExit("agent-2", agents_.Find("agent-2")->hello, killed);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->state, v1::Job::FAILED);
  EXPECT_EQ(end->reason,
            "rank 2 (node-b, pid 4242) was killed by signal 9; last stderr: out of memory");
  EXPECT_EQ(run_.ranks()[2].state, v1::RankStatus::EXITED);
  EXPECT_EQ(run_.ranks()[2].exit_code, -9);
}

// Note [Rank error record]: a data error's message quotes a damaged .npy
// header, which ends in a newline; lines logged after the record (a thread
// stopping) do not hide it.
TEST_F(RunningJobTest, TheReasonIsTheRanksLastErrorRecordNotItsLastLine) {
  v1::RankExited failed = Exit(1, 1);
  failed.add_stderr_tail(RankErrorRecord("an earlier record"));
  failed.add_stderr_tail(RankErrorRecord(
      "data.shards: /d/a.tar at byte offset 1536 (sample 2, member \"2.x.npy\"): .npy header "
      "\"{'descr': '<f4', }\n\" lacks descr, fortran_order or shape"));
  failed.add_stderr_tail("[chorus-rank] W0101 12:00:00 gloo: connection closed by peer");
  std::optional<JobEnd> end = run_.RecordExit("agent-1", agents_.Find("agent-1")->hello, failed);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->reason,
            "rank 1 (node-a, pid 4242) exited with code 1; last stderr: chorus-rank: data.shards: "
            "/d/a.tar at byte offset 1536 (sample 2, member \"2.x.npy\"): .npy header "
            "\"{'descr': '<f4', }\\n\" lacks descr, fortran_order or shape");
}

TEST_F(RunningJobTest, EveryRankExitingZeroSucceedsOnce) {
  const v1::AgentHello& a = agents_.Find("agent-1")->hello;
  const v1::AgentHello& b = agents_.Find("agent-2")->hello;
  EXPECT_FALSE(run_.RecordExit("agent-1", a, Exit(0, 0)).has_value());
  EXPECT_FALSE(run_.RecordExit("agent-1", a, Exit(0, 0)).has_value())
      << "a repeated report counts once";
  EXPECT_FALSE(run_.RecordExit("agent-1", a, Exit(5, 0)).has_value()) << "no rank on slot 5";
  EXPECT_FALSE(run_.RecordExit("agent-1", a, Exit(1, 0)).has_value());
  std::optional<JobEnd> end = run_.RecordExit("agent-2", b, Exit(0, 0));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->state, v1::Job::SUCCEEDED);
  EXPECT_EQ(end->reason, "every rank exited with code 0");
}

TEST_F(RunningJobTest, AnExitReportedBeforeTheRankIsBoundAgainBindsIt) {
  RankOf(run_, 2).agent_id.clear();  // taken back after a restart, not bound yet
  RankOf(run_, 2).recover_host = "node-b";
  RankOf(run_, 2).recover_agent_pid = 12;
  ASSERT_EQ(*agents_.Add(Hello("node-b", 12, 1), nullptr), "agent-3");  // the agent reconnected
  std::optional<JobEnd> end =
      run_.RecordExit("agent-3", agents_.Find("agent-3")->hello, Exit(0, 1));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->reason, "rank 2 (node-b, pid 4242) exited with code 1");
  EXPECT_EQ(run_.ranks()[2].agent_id, "agent-3");
}

TEST_F(RunningJobTest, StatusRowsCarryHostsAndTheLastHeartbeat) {
  v1::RankHeartbeat hb;
  hb.set_step(40);
  hb.set_phase_seconds(1.5);
  hb.mutable_flight_recorder()->set_last_completed_seq(99);
  hb.mutable_timings()->set_step_seconds(0.25);
  RankOf(run_, 0).last_heartbeat = hb;
  RankOf(run_, 0).heartbeat_at = clock_.Now();
  clock_.Advance(absl::Seconds(3));
  agents_.Remove("agent-2");
  v1::JobStatus status;
  run_.AddStatusRows(agents_, clock_.Now(), status);
  ASSERT_EQ(status.ranks_size(), 3);
  EXPECT_EQ(status.ranks(0).host(), "node-a");
  EXPECT_EQ(status.ranks(0).step(), 40);
  EXPECT_EQ(status.ranks(0).heartbeat_age_seconds(), 3.0);
  EXPECT_EQ(status.ranks(0).last_completed_seq(), 99);
  EXPECT_EQ(status.ranks(0).step_time_seconds(), 0.25);
  EXPECT_EQ(status.ranks(1).step(), 0) << "no heartbeat yet";
  EXPECT_EQ(status.ranks(2).host(), "agent-2") << "the agent is gone: its id stands in";
  const std::vector<RankView> views = run_.HangViews(agents_);
  ASSERT_EQ(views.size(), 1u) << "only ranks that sent a heartbeat or exited";
  EXPECT_EQ(&views[0].hb(), &run_.ranks()[0].last_heartbeat)
      << "the detector reads the recorded heartbeat, not a copy of every rank's";
  EXPECT_EQ(views[0].hb().step(), 40);
}

// Note [A silent agent's ranks]: each rank relayed by an agent is seen with
// its own agent's last message, the agents looked up once per run of ranks.
TEST_F(RunningJobTest, HangViewsCarryEachRanksOwnAgentsLastMessage) {
  // Ranks 0 and 2 on agent-1, rank 1 on agent-2: runs of one.
  RankOf(run_, 1).agent_id = "agent-2";
  RankOf(run_, 2).agent_id = "agent-1";
  agents_.Heard("agent-1", clock_.Now() - absl::Seconds(4));
  agents_.Heard("agent-2", clock_.Now() - absl::Seconds(1));
  for (RankState& r : RanksOf(run_)) {
    r.heartbeat_at = clock_.Now() - absl::Seconds(5);
    r.heartbeats_via_agent = true;
  }
  const std::vector<RankView> views = run_.HangViews(agents_);
  ASSERT_EQ(views.size(), 3u);
  EXPECT_EQ(views[0].relay_heard_at, clock_.Now() - absl::Seconds(4));
  EXPECT_EQ(views[1].relay_heard_at, clock_.Now() - absl::Seconds(1));
  EXPECT_EQ(views[2].relay_heard_at, clock_.Now() - absl::Seconds(4));
  // A rank whose agent is gone is judged by its own heartbeats alone.
  agents_.Remove("agent-2");
  EXPECT_EQ(run_.HangViews(agents_)[1].relay_heard_at, absl::InfiniteFuture());
}

// Note [A starved node]: every rank's view carries its own agent's last
// word on its node's CPU pressure, whether its heartbeats come through the
// agent or not.
TEST_F(RunningJobTest, HangViewsCarryEachRanksNodeCpuPressure) {
  RankOf(run_, 1).agent_id = "agent-2";
  RankOf(run_, 2).agent_id = "agent-1";
  agents_.Heard("agent-1", clock_.Now(), 0.8);
  agents_.Heard("agent-2", clock_.Now(), 0.1);
  for (RankState& r : RanksOf(run_)) r.heartbeat_at = clock_.Now();
  RankOf(run_, 2).heartbeats_via_agent = true;
  std::vector<RankView> views = run_.HangViews(agents_);
  ASSERT_EQ(views.size(), 3u);
  EXPECT_FLOAT_EQ(views[0].node_cpu_pressure, 0.8);
  EXPECT_FLOAT_EQ(views[1].node_cpu_pressure, 0.1);
  EXPECT_FLOAT_EQ(views[2].node_cpu_pressure, 0.8);
  // The next message says the node is quiet again.
  agents_.Heard("agent-1", clock_.Now(), 0.0);
  views = run_.HangViews(agents_);
  EXPECT_EQ(views[0].node_cpu_pressure, 0.0);
  EXPECT_EQ(views[1].relay_heard_at, absl::InfiniteFuture());  // its own heartbeats
  agents_.Remove("agent-2");
  EXPECT_EQ(run_.HangViews(agents_)[1].node_cpu_pressure, 0.0);
}

TEST_F(RunningJobTest, StatusRowsSplitStepTimeAndNameWhoTheOthersWaitedFor) {
  // Rank 1 computes slowly: ranks 0 and 2 wait 0.3 s a step for it.
  const double waits[] = {0.31, 0.01, 0.31};
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankHeartbeat hb;
    hb.set_step(7);
    hb.set_loss(0.5 + rank);
    hb.set_samples_per_second(100.0 * (rank + 1));
    hb.mutable_timings()->set_step_seconds(0.4);
    hb.mutable_timings()->set_compute_seconds(0.4 - waits[rank]);
    hb.mutable_timings()->set_comm_wait_seconds(waits[rank]);
    RankOf(run_, rank).last_heartbeat = hb;
    RankOf(run_, rank).heartbeat_at = clock_.Now();
  }
  v1::JobStatus status;
  run_.AddStatusRows(agents_, clock_.Now(), status);
  ASSERT_EQ(status.ranks_size(), 3);
  EXPECT_NEAR(status.ranks(1).caused_wait_seconds(), 0.6, 1e-9);
  EXPECT_EQ(status.ranks(0).caused_wait_seconds(), 0.0);
  EXPECT_EQ(status.ranks(2).caused_wait_seconds(), 0.0);
  EXPECT_NEAR(status.ranks(1).compute_seconds(), 0.39, 1e-9);
  EXPECT_EQ(status.ranks(0).comm_wait_seconds(), 0.31);
  EXPECT_EQ(status.ranks(2).samples_per_second(), 300.0);
  EXPECT_EQ(status.ranks(2).loss(), 2.5);

  // An exited rank is no longer blamed nor counted.
  RankOf(run_, 1).state = v1::RankStatus::EXITED;
  v1::JobStatus after;
  run_.AddStatusRows(agents_, clock_.Now(), after);
  EXPECT_EQ(after.ranks(1).caused_wait_seconds(), 0.0);
  EXPECT_EQ(after.ranks(0).caused_wait_seconds(), 0.0);
}

// A large job's status is a page of rows and a summary of every rank
// (docs/observability.md, "Large jobs").
TEST_F(RunningJobTest, StatusRowsAreAPageWithTheCulpritsAndTheSummaryCountsEveryRank) {
  for (int rank = 0; rank < 3; ++rank) {
    RankOf(run_, rank).state = v1::RankStatus::TRAINING;
    RankOf(run_, rank).heartbeat_at = clock_.Now() - absl::Seconds(rank);
    RankOf(run_, rank).last_heartbeat.set_step(10 + rank);
    RankOf(run_, rank).last_heartbeat.mutable_timings()->set_comm_wait_seconds(0.3 - 0.1 * rank);
  }
  RankOf(run_, 0).state = v1::RankStatus::EXITED;
  StatusRows rows;
  rows.offset = 1;
  rows.limit = 1;
  rows.also = {0, 1, 0, 7};  // a culprit outside the page, one in it, twice, one unknown
  v1::JobStatus status;
  run_.AddStatusRows(agents_, clock_.Now(), status, rows);
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(0).rank(), 1);
  EXPECT_EQ(status.ranks(1).rank(), 0);
  EXPECT_EQ(status.rank_offset(), 1);
  const v1::RankSummary& summary = status.rank_summary();
  EXPECT_EQ(summary.ranks(), 3);
  EXPECT_EQ(summary.by_state().at("TRAINING"), 2);
  EXPECT_EQ(summary.by_state().at("EXITED"), 1);
  EXPECT_EQ(summary.min_step(), 10);
  EXPECT_EQ(summary.max_step(), 12);
  EXPECT_EQ(summary.oldest_heartbeat_rank(), 2) << "an exited rank's heartbeat ages as it may";
  EXPECT_DOUBLE_EQ(summary.oldest_heartbeat_age_seconds(), 2);
  EXPECT_EQ(summary.most_waited_for_rank(), 2) << "it waited least: rank 1 waited for it";
  EXPECT_NEAR(summary.most_waited_for_seconds(), 0.1, 1e-9);
  v1::JobStatus all;
  run_.AddStatusRows(agents_, clock_.Now(), all);
  EXPECT_EQ(all.ranks_size(), 3) << "no range: every row";
  rows.offset = 5;
  v1::JobStatus past;
  run_.AddStatusRows(agents_, clock_.Now(), past, rows);
  EXPECT_EQ(past.ranks_size(), 2) << "past the end: only the culprits 0 and 1";
  EXPECT_EQ(past.rank_offset(), 3);
}

TEST_F(RunningJobTest, JoinResponseNamesRankGenerationNamespaceAndResume) {
  v1::CheckpointManifest resume;
  resume.set_job_id("job-000000");
  resume.set_step(300);
  run_.ResumeFrom(resume);
  const v1::JoinResponse response = run_.JoinResponseFor(job_, 1, run_.GroupsOfRanks());
  EXPECT_EQ(response.rank(), 1);
  EXPECT_EQ(response.world_size(), 3);
  EXPECT_EQ(response.generation(), 1);
  EXPECT_EQ(response.store_namespace(), "job-000001/gen-1");
  EXPECT_EQ(response.local_rank(), 1);
  EXPECT_EQ(response.local_world_size(), 2);
  EXPECT_EQ(response.spec().resources().max_ranks(), 3);
  EXPECT_EQ(response.resume().step(), 300);
}

// Note [torchrun's variables] in worker/runtime/program_supervisor.h.
TEST_F(RunningJobTest, JoinResponseCarriesTheRestartsAndTheRanksGroup) {
  job_.set_restarts(2);  // two failures survived
  RunningJob run(job_, 3, /*generation=*/1);
  RanksOf(run) = run_.ranks();
  // Agents numbered in the order their first rank comes: rank 0's first.
  std::swap(RankOf(run, 0), RankOf(run, 2));  // agent-2, agent-1, agent-1
  const std::vector<std::pair<int, int>> want = {{0, 2}, {1, 2}, {1, 2}};
  for (int rank = 0; rank < 3; ++rank) {
    const v1::JoinResponse response = run.JoinResponseFor(job_, rank, run.GroupsOfRanks());
    EXPECT_EQ(response.restarts(), 2) << "TORCHELASTIC_RESTART_COUNT";
    EXPECT_EQ(response.group_rank(), want[rank].first) << "rank " << rank;
    EXPECT_EQ(response.group_world_size(), want[rank].second) << "rank " << rank;
  }
}

// Note [Restart-all]: a rank told to stop exits as expected, whatever its
// code; the others' exits count as before.
TEST_F(RunningJobTest, TheExitOfARankStoppedForARestartAllIsNeitherFailureNorSuccess) {
  const v1::AgentHello& a = agents_.Find("agent-1")->hello;
  run_.MarkStopping(0);
  run_.MarkStopping(1);
  EXPECT_FALSE(run_.RecordExit("agent-1", a, Exit(0, -15)).has_value());
  EXPECT_FALSE(run_.RecordExit("agent-1", a, Exit(1, 0)).has_value());
  EXPECT_EQ(run_.ranks()[0].state, v1::RankStatus::EXITED);
  EXPECT_EQ(run_.ranks()[0].exit_code, -15);
  EXPECT_EQ(run_.exited_ok(), 0) << "a stopped rank's 0 does not count towards success";
  std::optional<JobEnd> end =
      run_.RecordExit("agent-2", agents_.Find("agent-2")->hello, Exit(0, 3));
  ASSERT_TRUE(end.has_value()) << "a rank not told to stop still fails the job";
  EXPECT_EQ(end->reason, "rank 2 (node-b, pid 4242) exited with code 3");
}

// Note [A bounded history]: losing rank 0 of a 16,384-rank job renumbers
// every survivor; the line names the first few and counts the rest.
// A rank's transitions as a table of events: rank 1's state after each
// sequence, as "state pid heard heartbeat via-agent finished stopping
// evicted" (times in seconds from the start, "-" for never).
TEST_F(RunningJobTest, ARanksEventsChangeOnlyWhatTheyName) {
  const absl::Time t0 = clock_.Now();
  const auto heartbeat = [](int rank, v1::Phase phase) {
    v1::RankHeartbeat hb;
    hb.set_rank(rank);
    hb.set_generation(1);
    hb.set_step(7);
    hb.set_phase(phase);
    return hb;
  };
  const auto describe = [&](const RankState& r) {
    const auto at = [&](absl::Time t) {
      return t == absl::InfinitePast() ? std::string("-")
                                       : absl::StrCat(absl::ToInt64Seconds(t - t0));
    };
    return absl::StrCat(v1::RankStatus::State_Name(r.state), " ", r.pid, " ", at(r.heard_at), " ",
                        at(r.heartbeat_at), "/", r.last_heartbeat.step(), " ",
                        r.heartbeats_via_agent, " ", r.finished, " ", r.stopping, " '", r.evicted,
                        "'");
  };
  struct Row {
    const char* what;
    std::function<void(RunningJob&)> events;
    std::string rank1;
  };
  const std::vector<Row> rows = {
      {"nothing yet", [](RunningJob&) {}, "LAUNCHING 0 - -/0 0 0 0 ''"},
      {"it joins", [](RunningJob& run) { run.OnJoining(1, 4242); }, "JOINING 4242 - -/0 0 0 0 ''"},
      {"the generation forms",
       [](RunningJob& run) {
         run.OnJoining(1, 4242);
         run.OnTraining();
       },
       "TRAINING 4242 - -/0 0 0 0 ''"},
      {"a survivor's heartbeat of the generation before",
       [&](RunningJob& run) { run.HeardFrom(1, t0 + absl::Seconds(3)); },
       "LAUNCHING 0 3 -/0 0 0 0 ''"},
      {"a heartbeat through its agent",
       [&](RunningJob& run) {
         run.OnHeartbeat(heartbeat(1, v1::FORWARD), t0 + absl::Seconds(4), true);
       },
       "LAUNCHING 0 4 4/7 1 0 0 ''"},
      {"a heartbeat in phase FINISHED",
       [&](RunningJob& run) {
         run.OnHeartbeat(heartbeat(1, v1::FINISHED), t0 + absl::Seconds(4), false);
       },
       "LAUNCHING 0 4 4/7 0 1 0 ''"},
      {"FINISHED after it was told to stop (a restart-all): not finished",
       [&](RunningJob& run) {
         EXPECT_EQ(run.MarkStopping(), 3);
         run.OnHeartbeat(heartbeat(1, v1::FINISHED), t0 + absl::Seconds(4), false);
       },
       "LAUNCHING 0 4 4/7 0 0 1 ''"},
      {"evicted once, then its final report of success: not finished",
       [&](RunningJob& run) {
         EXPECT_TRUE(run.MarkEvicted(1, "hang_detection.action RESTART: DEAD"));
         EXPECT_FALSE(run.MarkEvicted(1, "again"));
         run.FinishedTraining(1);
       },
       "LAUNCHING 0 - -/0 0 0 0 'hang_detection.action RESTART: DEAD'"},
      {"an exited rank is not evicted nor told to stop",
       [&](RunningJob& run) {
         run.RecordExit("agent-1", Hello("node-a", 11, 2), Exit(1, 0));
         EXPECT_FALSE(run.MarkEvicted(1, "late"));
         EXPECT_EQ(run.MarkStopping(), 2);
       },
       "EXITED 0 - -/0 0 0 0 ''"},
      {"awaited, then back: its heartbeat age starts again",
       [&](RunningJob& run) {
         run.OnHeartbeat(heartbeat(1, v1::FORWARD), t0 + absl::Seconds(1), false);
         EXPECT_EQ(run.AwaitAgent("agent-1", "node-a", 11), (std::vector<int>{0, 1}));
         EXPECT_EQ(run.AwaitedRank("node-a", 11, 1), 1);
         EXPECT_EQ(run.AwaitedRank("node-a", 11, 2), -1);
         EXPECT_EQ(run.AwaitedRank("node-a", 99, 1), -1) << "another agent process";
         run.Rebind(1, "agent-3", 555);
         run.RestartHeartbeatClock(1, t0 + absl::Seconds(9));
         EXPECT_EQ(run.AwaitedRank("node-a", 11, 1), -1) << "bound again";
         EXPECT_EQ(run.RankOn("agent-3", 1), 1);
       },
       "JOINING 555 1 9/7 0 0 0 ''"},
      {"awaited, then given up: on the agent that is gone",
       [&](RunningJob& run) {
         run.AwaitAgent("agent-1", "node-a", 11);
         EXPECT_TRUE(run.GiveUpRank(1, "agent-1"));
         EXPECT_FALSE(run.GiveUpRank(2, "agent-2")) << "rank 2 is not awaited";
         EXPECT_FALSE(run.GiveUpRank(7, "agent-1")) << "no rank 7";
         EXPECT_EQ(run.ranks()[1].agent_id, "agent-1");
       },
       "LOST 0 - -/0 0 0 0 ''"},
      {"lost before a coordinator restart",
       [&](RunningJob& run) {
         run.MarkLost(1);
         EXPECT_EQ(run.ranks()[1].recover_host, "");
       },
       "EXITED 0 - -/0 0 0 0 ''"},
  };
  for (const Row& row : rows) {
    RunningJob run(job_, 3, /*generation=*/1);
    for (const RankState& r : run_.ranks()) run.AddRank(r);
    row.events(run);
    EXPECT_EQ(describe(run.ranks()[1]), row.rank1) << row.what;
  }
}

// The wait for ranks to come back: after a restart, for lost agents (the
// later deadline kept), and its end.
TEST_F(RunningJobTest, AWaitForRanksKeepsItsLatestDeadlineAndItsCauses) {
  const absl::Time t0 = clock_.Now();
  EXPECT_EQ(run_.recovering_until(), absl::InfinitePast());
  run_.AwaitLostAgent({"agent-1", "node-a", {0, 1}, absl::Seconds(10)}, t0 + absl::Seconds(10));
  run_.AwaitLostAgent({"agent-2", "node-b", {2}, absl::Seconds(3)}, t0 + absl::Seconds(3));
  EXPECT_EQ(run_.recovering_until(), t0 + absl::Seconds(10)) << "the later deadline";
  ASSERT_EQ(run_.wait_cause().lost_agents.size(), 2u);
  EXPECT_EQ(run_.wait_cause().lost_agents[1].host, "node-b");
  EXPECT_FALSE(run_.wait_cause().after_restart);
  run_.StopAwaiting();
  EXPECT_EQ(run_.recovering_until(), absl::InfinitePast());
  EXPECT_TRUE(run_.wait_cause().lost_agents.empty());
  run_.AwaitAfterRestart(t0 + absl::Seconds(30));
  EXPECT_EQ(run_.recovering_until(), t0 + absl::Seconds(30));
  EXPECT_TRUE(run_.wait_cause().after_restart);
}

// A job taken back after a restart: ranks added as joined count towards
// the formed generation.
TEST_F(RunningJobTest, RanksAddedAsJoinedFormTheGeneration) {
  RunningJob formed(job_, 2, /*generation=*/4);
  RunningJob forming(job_, 2, /*generation=*/4);
  for (int rank = 0; rank < 2; ++rank) {
    formed.AddRank(run_.ranks()[rank], /*joined=*/true);
    forming.AddRank(run_.ranks()[rank]);
  }
  EXPECT_TRUE(formed.Formed());
  EXPECT_FALSE(forming.Formed());
  EXPECT_EQ(formed.ranks().size(), 2u);
}

TEST(HistoryTest, ALineNamesTheFirstNewcomersAndCountsTheRest) {
  std::vector<std::string> renumbered;
  for (int rank = 1; rank < 16384; ++rank) {
    renumbered.push_back(absl::StrCat("rank ", rank, " is now rank ", rank - 1));
  }
  const std::string listed = ListNewcomers(renumbered);
  EXPECT_TRUE(absl::StartsWith(listed, "rank 1 is now rank 0, rank 2 is now rank 1, ")) << listed;
  EXPECT_TRUE(absl::EndsWith(listed, ", rank 8 is now rank 7 and 16375 more")) << listed;
  EXPECT_LT(listed.size(), 256u);

  EXPECT_EQ(ListNewcomers({"rank 3 on node-b"}), "rank 3 on node-b");
  EXPECT_EQ(ListNewcomers({}), "");
  std::vector<std::string> eight;
  for (int i = 0; i < kListedNewcomers; ++i) eight.push_back(absl::StrCat("rank ", i));
  EXPECT_EQ(ListNewcomers(eight), "rank 0, rank 1, rank 2, rank 3, rank 4, rank 5, rank 6, rank 7");
}

// The newest kHistoryLines changes are kept, after a line counting the
// others; the count carries on from a history read back from a record.
TEST(HistoryTest, KeepsTheNewestChangesAndCountsTheDroppedOnes) {
  std::vector<std::string> history;
  for (int g = 1; g <= kHistoryLines; ++g) AppendHistory(history, absl::StrCat("generation ", g));
  ASSERT_EQ(history.size(), static_cast<size_t>(kHistoryLines)) << "nothing dropped yet";
  EXPECT_EQ(history.front(), "generation 1");

  AppendHistory(history, absl::StrCat("generation ", kHistoryLines + 1));
  ASSERT_EQ(history.size(), static_cast<size_t>(kHistoryLines) + 1);
  EXPECT_EQ(history[0], "(1 earlier changes not kept)");
  EXPECT_EQ(history[1], "generation 2");
  EXPECT_EQ(history.back(), absl::StrCat("generation ", kHistoryLines + 1));

  for (int g = kHistoryLines + 2; g <= 1000; ++g) {
    AppendHistory(history, absl::StrCat("generation ", g));
  }
  ASSERT_EQ(history.size(), static_cast<size_t>(kHistoryLines) + 1);
  EXPECT_EQ(history[0], absl::StrCat("(", 1000 - kHistoryLines, " earlier changes not kept)"));
  EXPECT_EQ(history[1], absl::StrCat("generation ", 1000 - kHistoryLines + 1));
  EXPECT_EQ(history.back(), "generation 1000");

  // A change that happens to read like the count is still a change.
  std::vector<std::string> odd = {"(x earlier changes not kept)"};
  AppendHistory(odd, "generation 2");
  EXPECT_EQ(odd.size(), 2u);
}

}  // namespace
}  // namespace chorus
