#include "coordinator/scheduling/rank_messages.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);

// Generation 2 of an elastic job: rank 0 on agent-1 slot 0, rank 1 on
// agent-1 slot 1.
v1::Job ElasticJob(bool program = false) {
  v1::Job job;
  job.set_job_id("job-000001");
  job.mutable_spec()->mutable_elastic();
  if (program) job.mutable_spec()->mutable_program()->add_argv("/usr/bin/python3");
  return job;
}

RunningJob RunOf(const v1::Job& job) {
  RunningJob run(job, 2, /*generation=*/2);
  run.AddRank(RankState::At({"agent-1", 0, 0, 2}));
  run.AddRank(RankState::At({"agent-1", 1, 1, 2}));
  run.AddHistory("generation 2: rank 1 replaced");
  return run;
}

void Form(RunningJob& run) {
  Rendezvous::Answers answers;
  for (int rank = 0; rank < 2; ++rank) {
    run.mutable_rendezvous().Join(
        rank, kNow + absl::Seconds(10), [](absl::StatusOr<v1::JoinResponse>) {},
        [](int) { return v1::JoinResponse(); }, answers);
  }
  ASSERT_TRUE(run.Formed());
}

v1::RankHeartbeat Beat(int64_t generation, int rank) {
  v1::RankHeartbeat heartbeat;
  heartbeat.set_job_id("job-000001");
  heartbeat.set_generation(generation);
  heartbeat.set_rank(rank);
  return heartbeat;
}

// Each row: the job's state, a heartbeat, and what the answer and the
// rank's record must be.
TEST(RecordHeartbeatTest, EachHeartbeatsAnswerAndRecord) {
  struct Row {
    const char* name;
    std::function<void(RunningJob&)> prepare;
    v1::RankHeartbeat heartbeat;
    bool live;
    v1::Directive::Kind directive;
    int64_t directive_generation;
    const char* reason;  // contained in the directive's reason
    bool finished;       // rank 0's record
    bool progress;
  };
  v1::RankHeartbeat finished = Beat(2, 0);
  finished.set_phase(v1::FINISHED);
  v1::RankHeartbeat stepped = Beat(2, 0);
  stepped.set_step(5);
  const auto none = [](RunningJob&) {};
  const std::vector<Row> rows = {
      {"current generation, steady", none, Beat(2, 0), true, v1::Directive::KIND_UNSPECIFIED, 0, "",
       false, false},
      {"older generation of an elastic job", none, Beat(1, 0), false, v1::Directive::RE_RENDEZVOUS,
       2, "rank 1 replaced", false, false},
      {"a rank the generation does not have", none, Beat(2, 2), false,
       v1::Directive::KIND_UNSPECIFIED, 0, "", false, false},
      {"a newer generation", none, Beat(3, 0), false, v1::Directive::KIND_UNSPECIFIED, 0, "", false,
       false},
      {"FINISHED", none, finished, true, v1::Directive::KIND_UNSPECIFIED, 0, "", true, false},
      {"FINISHED after it was told to stop", [](RunningJob& run) { run.MarkStopping(0); }, finished,
       true, v1::Directive::KIND_UNSPECIFIED, 0, "", false, false},
      {"FINISHED after its eviction", [](RunningJob& run) { run.MarkEvicted(0, "silent"); },
       finished, true, v1::Directive::KIND_UNSPECIFIED, 0, "", false, false},
      {"a planned change, formed",
       [](RunningJob& run) {
         Form(run);
         run.mutable_phase().Plan({"agent-2 is draining", ReformKind::kDrain, 1});
       },
       Beat(2, 1), true, v1::Directive::REFORM_AT_STEP_BOUNDARY, 3, "agent-2 is draining", false,
       false},
      {"a planned change, not formed yet",
       [](RunningJob& run) {
         run.mutable_phase().Plan({"grow", ReformKind::kScaleUp, 4});
       },
       Beat(2, 1), true, v1::Directive::KIND_UNSPECIFIED, 0, "", false, false},
      {"a planned change waiting for slots",
       [](RunningJob& run) {
         Form(run);
         run.mutable_phase().Plan({"grow", ReformKind::kScaleUp, 4});
         run.mutable_phase().BeginWaiting("below min_ranks", ReformKind::kRankLost, kNow,
                                          kNow + absl::Seconds(30));
       },
       Beat(2, 1), true, v1::Directive::KIND_UNSPECIFIED, 0, "", false, false},
      {"waiting for a checkpoint to go back to the queue",
       [](RunningJob& run) {
         run.mutable_requeue().Begin("preempted by job-000007", 10, 0, kNow, absl::Seconds(60));
       },
       Beat(2, 1), true, v1::Directive::CHECKPOINT_AND_HOLD, 0, "preempted by job-000007", false,
       false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    RunningJob run = RunOf(ElasticJob());
    row.prepare(run);
    const HeartbeatAnswer answer = RecordHeartbeat(run, row.heartbeat, kNow, /*via_agent=*/false);
    EXPECT_EQ(answer.live, row.live);
    EXPECT_EQ(answer.directive.kind(), row.directive);
    EXPECT_EQ(answer.directive.generation(), row.directive_generation);
    EXPECT_TRUE(absl::StrContains(answer.directive.reason(), row.reason))
        << answer.directive.reason();
    EXPECT_EQ(run.ranks()[0].finished, row.finished);
    EXPECT_EQ(answer.progress, row.progress);
    // A live heartbeat is its rank's last.
    const int rank = row.heartbeat.rank();
    if (row.live) {
      EXPECT_EQ(run.ranks()[rank].heartbeat_at, kNow);
      EXPECT_EQ(run.ranks()[rank].heard_at, kNow);
    } else if (rank < 2) {
      EXPECT_EQ(run.ranks()[rank].heartbeat_at, absl::InfinitePast());
    }
  }
}

TEST(RecordHeartbeatTest, AJobThatIsNotElasticSendsNoRendezvousDirective) {
  v1::Job job = ElasticJob();
  job.mutable_spec()->clear_elastic();
  RunningJob run = RunOf(job);
  const HeartbeatAnswer answer = RecordHeartbeat(run, Beat(1, 0), kNow, false);
  EXPECT_FALSE(answer.live);
  EXPECT_EQ(answer.directive.kind(), v1::Directive::KIND_UNSPECIFIED);
}

// Note [A survivor that does not join]: a survivor's heartbeat of the
// previous generation counts as heard for the rank it has now.
TEST(RecordHeartbeatTest, ASurvivorNotJoinedYetIsHeardUnderItsNewRank) {
  const v1::Job job = ElasticJob();
  RunningJob run = RunOf(job);
  // Generation 2 forming: old rank 0 is rank 1 now; old rank 1 left.
  run.BeginGeneration(job, run.ranks(), 2, ReformKind::kRankLost, kNow, {1, -1});
  RecordHeartbeat(run, Beat(1, 0), kNow, false);
  EXPECT_EQ(run.ranks()[1].heard_at, kNow);
  EXPECT_EQ(run.ranks()[0].heard_at, absl::InfinitePast());
  RecordHeartbeat(run, Beat(1, 1), kNow + absl::Seconds(1), false);
  EXPECT_EQ(run.ranks()[0].heard_at, absl::InfinitePast());
}

TEST(RecordHeartbeatTest, AProgramsRankZeroCarriesProgressAndSaysItReformsInProcess) {
  RunningJob run = RunOf(ElasticJob(/*program=*/true));
  v1::RankHeartbeat beat = Beat(2, 0);
  beat.set_step(7);
  beat.set_reforms_in_process(true);
  HeartbeatAnswer answer = RecordHeartbeat(run, beat, kNow, /*via_agent=*/true);
  EXPECT_TRUE(answer.progress);
  EXPECT_TRUE(run.reforms_in_process());
  EXPECT_TRUE(run.ranks()[0].heartbeats_via_agent);
  beat.set_rank(1);
  EXPECT_FALSE(RecordHeartbeat(run, beat, kNow, false).progress);
  beat.set_rank(0);
  beat.set_step(0);
  EXPECT_FALSE(RecordHeartbeat(run, beat, kNow, false).progress);
}

v1::JoinRequest JoinOf(int64_t generation, int slot, const std::string& agent = "agent-1") {
  v1::JoinRequest request;
  request.set_job_id("job-000001");
  request.set_generation(generation);
  request.set_agent_id(agent);
  request.set_slot(slot);
  request.set_host("node-a");
  return request;
}

TEST(AnswerJoinTest, EachJoinsAnswer) {
  struct Row {
    const char* name;
    bool elastic;
    std::function<void(RunningJob&)> prepare;
    v1::JoinRequest request;
    JoinAnswer::Kind kind;
    int rank;
    absl::StatusCode code;
    const char* message;  // contained in the refusal
  };
  const auto none = [](RunningJob&) {};
  const std::vector<Row> rows = {
      {"a rank of the current generation", true, none, JoinOf(2, 1), JoinAnswer::Kind::kJoin, 1,
       absl::StatusCode::kOk, ""},
      {"a departing rank leaves", true,
       [](RunningJob& run) { run.mutable_leaving().Depart("agent-1", 1); }, JoinOf(3, 1),
       JoinAnswer::Kind::kLeave, -1, absl::StatusCode::kOk, ""},
      {"a survivor ahead of its generation", true, none, JoinOf(3, 0), JoinAnswer::Kind::kRefuse,
       -1, absl::StatusCode::kUnavailable, "generation 3 of job job-000001 has not formed yet"},
      {"an older generation of an elastic job joins the current one", true, none, JoinOf(1, 0),
       JoinAnswer::Kind::kJoin, 0, absl::StatusCode::kOk, ""},
      {"an older generation of a job that is not elastic", false, none, JoinOf(1, 0),
       JoinAnswer::Kind::kRefuse, -1, absl::StatusCode::kFailedPrecondition, ""},
      {"a slot where the job has no rank", true, none, JoinOf(2, 5), JoinAnswer::Kind::kRefuse, -1,
       absl::StatusCode::kNotFound, "has no rank on agent-1 slot 5"},
      {"a rank taken back after a restart, its agent not back yet", true,
       [](RunningJob& run) { RankOf(run, 1).agent_id.clear(); }, JoinOf(2, 1, "agent-7"),
       JoinAnswer::Kind::kRefuse, -1, absl::StatusCode::kUnavailable,
       "is taking back its ranks after a coordinator restart"},
      {"a rank of an agent that lost contact", true,
       [](RunningJob& run) {
         RankOf(run, 1).agent_id.clear();
         run.AwaitLostAgent({"agent-1", "node-a", {1}, absl::Seconds(5)}, absl::InfinitePast());
       },
       JoinOf(2, 1, "agent-7"), JoinAnswer::Kind::kRefuse, -1, absl::StatusCode::kUnavailable,
       "from agents that lost contact"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    v1::Job job = ElasticJob();
    if (!row.elastic) job.mutable_spec()->clear_elastic();
    RunningJob run = RunOf(job);
    row.prepare(run);
    const JoinAnswer answer = AnswerJoin(run, row.request);
    EXPECT_EQ(answer.kind, row.kind);
    EXPECT_EQ(answer.rank, row.rank);
    EXPECT_EQ(answer.refusal.code(), row.code) << answer.refusal;
    EXPECT_TRUE(absl::StrContains(answer.refusal.message(), row.message)) << answer.refusal;
    EXPECT_EQ(answer.leave.leave(), row.kind == JoinAnswer::Kind::kLeave);
    if (answer.leave.leave()) {
      EXPECT_EQ(answer.leave.generation(), 2);
    }
  }
}

TEST(StartsPlannedChangeTest, OnlyTheNextGenerationsJoinOfAFormedJobWithAPlan) {
  RunningJob run = RunOf(ElasticJob());
  EXPECT_FALSE(StartsPlannedChange(run, JoinOf(3, 0)));  // no plan
  run.mutable_phase().Plan({"grow", ReformKind::kScaleUp, 3});
  EXPECT_FALSE(StartsPlannedChange(run, JoinOf(3, 0)));  // not formed
  Form(run);
  EXPECT_TRUE(StartsPlannedChange(run, JoinOf(3, 0)));
  EXPECT_FALSE(StartsPlannedChange(run, JoinOf(2, 0)));  // the current generation
  RankOf(run, 1).agent_id.clear();                       // being taken back
  EXPECT_FALSE(StartsPlannedChange(run, JoinOf(3, 0)));
}

v1::ReportRequest ReportOf(int64_t generation, int rank, bool final, bool success) {
  v1::ReportRequest report;
  report.set_job_id("job-000001");
  report.set_generation(generation);
  report.set_rank(rank);
  report.set_final(final);
  report.set_success(success);
  report.mutable_metrics()->set_step(40);
  return report;
}

TEST(RecordReportTest, EachReportsMetricsAndWhatItMarks) {
  struct Row {
    const char* name;
    bool elastic;
    std::function<void(RunningJob&)> prepare;
    v1::ReportRequest report;
    absl::StatusCode code;
    bool has_restarts;  // the metrics carry the coordinator's values
    bool finished;      // the rank's record
    bool finished_before_reform;
  };
  const auto none = [](RunningJob&) {};
  const std::vector<Row> rows = {
      {"metrics along the way", true, none, ReportOf(2, 1, false, false), absl::StatusCode::kOk,
       true, false, false},
      {"a final success", true, none, ReportOf(2, 1, true, true), absl::StatusCode::kOk, true, true,
       false},
      {"a final failure", true, none, ReportOf(2, 1, true, false), absl::StatusCode::kOk, true,
       false, false},
      {"a final success after it was told to stop", true,
       [](RunningJob& run) { run.MarkStopping(1); }, ReportOf(2, 1, true, true),
       absl::StatusCode::kOk, true, false, false},
      {"a final success of a generation left since", true, none, ReportOf(1, 1, true, true),
       absl::StatusCode::kOk, false, false, true},
      {"metrics of a generation left since", true, none, ReportOf(1, 1, false, false),
       absl::StatusCode::kFailedPrecondition, false, false, false},
      {"a rank the generation does not have", true, none, ReportOf(2, 5, false, false),
       absl::StatusCode::kFailedPrecondition, false, false, false},
      {"a job that is not elastic", false, none, ReportOf(2, 1, true, true), absl::StatusCode::kOk,
       false, true, false},
      {"a final success of an older generation, not elastic", false, none,
       ReportOf(1, 1, true, true), absl::StatusCode::kFailedPrecondition, false, false, false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    v1::Job job = ElasticJob();
    if (!row.elastic) job.mutable_spec()->clear_elastic();
    job.set_restarts(3);
    RunningJob run = RunOf(job);
    run.NoteRecovery(1.5);
    row.prepare(run);
    const absl::StatusOr<v1::Metrics> metrics = RecordReport(run, row.report);
    EXPECT_EQ(metrics.status().code(), row.code) << metrics.status();
    if (metrics.ok()) {
      EXPECT_EQ(metrics->step(), 40);
      EXPECT_EQ(metrics->values().count("restarts") > 0, row.has_restarts);
      if (row.has_restarts) {
        EXPECT_EQ(metrics->values().at("restarts"), 3);
        EXPECT_EQ(metrics->values().at("recovery_seconds"), 1.5);
      }
    }
    EXPECT_EQ(run.ranks()[1].finished, row.finished);
    EXPECT_EQ(run.finished_before_reform(), row.finished_before_reform);
  }
}

// A program's progress moves the job's metrics forward, never back, and
// keeps a loss or a rate the progress does not carry.
TEST(WithProgressTest, MovesTheMetricsForwardOnly) {
  v1::Metrics latest;
  latest.set_step(10);
  latest.set_loss(0.5);
  latest.set_samples_per_second(100);
  v1::Metrics moved = WithProgress(latest, 12, 1, 0, 250);
  EXPECT_EQ(moved.step(), 12);
  EXPECT_EQ(moved.epoch(), 1);
  EXPECT_EQ(moved.loss(), 0.5);  // not carried: kept
  EXPECT_EQ(moved.samples_per_second(), 250);
  EXPECT_EQ(WithProgress(latest, 9, 1, 0.1, 1).step(), 10);  // behind: as it was
  EXPECT_EQ(WithProgress(latest, 9, 1, 0.1, 1).loss(), 0.5);
}

TEST(StagedJoinResponseTest, IsThePlannedMembershipOfTheStagedGeneration) {
  v1::Job job = ElasticJob(/*program=*/true);
  job.set_restarts(1);
  RunningJob run = RunOf(job);
  const StagedNewcomer newcomer{RankSlot{"agent-2", 0, 0, 1}, 2, false};
  run.mutable_staged().Start(3, 3, "1 free slot(s)", {newcomer}, kNow, absl::Seconds(60));
  const v1::JoinResponse response = StagedJoinResponse(job, run, newcomer);
  EXPECT_TRUE(response.staged());
  EXPECT_EQ(response.rank(), 2);
  EXPECT_EQ(response.world_size(), 3);
  EXPECT_EQ(response.generation(), 3);
  EXPECT_EQ(response.restarts(), 1);
  EXPECT_EQ(response.local_world_size(), 1);
  EXPECT_EQ(response.store_namespace(), RunningJob::StoreNamespace(job, 3));
  EXPECT_EQ(response.spec().program().argv(0), "/usr/bin/python3");
}

TEST(NotRunningTest, AbortsAndRefusalsNameTheJobsState) {
  v1::Job job = ElasticJob();
  job.set_state(v1::Job::FAILED);
  job.set_reason("rank 1 exited with code 3");
  std::optional<v1::Directive> abort = AbortDirective(job);
  ASSERT_TRUE(abort.has_value());
  EXPECT_EQ(abort->kind(), v1::Directive::ABORT);
  EXPECT_EQ(abort->reason(), "job job-000001 is FAILED: rank 1 exited with code 3");
  job.set_state(v1::Job::SUCCEEDED);
  EXPECT_FALSE(AbortDirective(job).has_value());

  job.set_state(v1::Job::PENDING);
  EXPECT_EQ(NotRunning(job).message(), "job job-000001 is PENDING, not running");
  EXPECT_EQ(NotRunning(job).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NotRunning(job, "; only a running job can be checkpointed").message(),
            "job job-000001 is PENDING; only a running job can be checkpointed");
  EXPECT_EQ(NotRunning(absl::NotFoundError("no job \"job-000404\"")).code(),
            absl::StatusCode::kNotFound);
}

TEST(AddDirectiveTest, NamesTheRankItIsFor) {
  v1::RankDirectives directives;
  v1::Directive directive;
  directive.set_kind(v1::Directive::RE_RENDEZVOUS);
  AddDirective(directives, Beat(2, 1), 1, directive);
  ASSERT_EQ(directives.entries_size(), 1);
  const v1::RankDirectives::Entry& entry = directives.entries(0);
  EXPECT_EQ(entry.job_id(), "job-000001");
  EXPECT_EQ(entry.slot(), 1);
  EXPECT_EQ(entry.rank(), 1);
  EXPECT_EQ(entry.generation(), 2);
  EXPECT_EQ(entry.directive().kind(), v1::Directive::RE_RENDEZVOUS);
}

}  // namespace
}  // namespace chorus
