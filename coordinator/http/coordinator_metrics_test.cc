#include "coordinator/http/coordinator_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::RankStatus Row(int rank, const std::string& host, int64_t step) {
  v1::RankStatus row;
  row.set_rank(rank);
  row.set_host(host);
  row.set_state(v1::RankStatus::TRAINING);
  row.set_step(step);
  row.set_phase(v1::BACKWARD);
  row.set_phase_seconds(0.5);
  row.set_heartbeat_age_seconds(0.25);
  row.set_step_time_seconds(0.4);
  row.set_compute_seconds(0.1);
  row.set_comm_wait_seconds(0.3);
  row.set_samples_per_second(160);
  row.set_loss(1.25);
  return row;
}

ClusterSnapshot TwoRankJob() {
  ClusterSnapshot snapshot;
  snapshot.jobs_by_state = {{v1::Job::PENDING, 2},
                            {v1::Job::RUNNING, 1},
                            {v1::Job::SUCCEEDED, 3},
                            {v1::Job::FAILED, 1},
                            {v1::Job::CANCELLED, 0}};
  snapshot.agents = 2;
  snapshot.slots_by_device[v1::ResourceSpec::CPU] = {3, 2};
  v1::JobStatus& job = snapshot.running.emplace_back();
  job.mutable_job()->set_job_id("job-000007");
  v1::Metrics* latest = job.mutable_job()->mutable_latest_metrics();
  latest->set_step(40);
  latest->set_loss(1.5);
  latest->set_samples_per_second(320);
  latest->set_step_time_seconds(0.5);
  (*latest->mutable_values())["total_steps"] = 100;
  (*latest->mutable_values())["checkpoint_bytes"] = 4096;
  (*latest->mutable_values())["checkpoint_stall_seconds"] = 0.75;
  (*latest->mutable_values())["checkpoint_store_seconds"] = 0.125;
  *job.add_ranks() = Row(0, "node-a", 42);
  v1::RankStatus slow = Row(1, "node-b", 41);
  slow.set_compute_seconds(0.39);
  slow.set_comm_wait_seconds(0.01);
  slow.set_caused_wait_seconds(0.29);
  slow.set_phase(v1::DATA);
  *job.add_ranks() = slow;
  v1::Diagnosis* d = job.add_diagnoses();
  d->set_kind(v1::Diagnosis::STRAGGLER);
  d->add_ranks(1);
  return snapshot;
}

TEST(CoordinatorMetricsTest, StateGaugesCarryTheSnapshotsValues) {
  CoordinatorMetrics metrics;
  const std::string text = metrics.Render(TwoRankJob());
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_jobs gauge"));
  EXPECT_THAT(text, HasSubstr("chorus_jobs{state=\"PENDING\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_jobs{state=\"RUNNING\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_jobs_finished_total counter"));
  EXPECT_THAT(text, HasSubstr("chorus_jobs_finished_total{state=\"SUCCEEDED\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("chorus_jobs_finished_total{state=\"FAILED\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_agents_connected 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_slots{device=\"CPU\",state=\"free\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("chorus_slots{device=\"CPU\",state=\"used\"} 2\n"));

  EXPECT_THAT(text, HasSubstr("chorus_job_step{job=\"job-000007\"} 42\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_progress_ratio{job=\"job-000007\"} 0.42\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_eta_seconds{job=\"job-000007\"} 29\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_samples_per_second{job=\"job-000007\"} 320\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_loss{job=\"job-000007\"} 1.5\n"));
  EXPECT_THAT(text, HasSubstr("chorus_checkpoint_bytes{job=\"job-000007\"} 4096\n"));
  EXPECT_THAT(text, HasSubstr("chorus_checkpoint_stall_seconds{job=\"job-000007\"} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("chorus_checkpoint_store_seconds{job=\"job-000007\"} 0.125\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_diagnoses{job=\"job-000007\",kind=\"STRAGGLER\"} 1\n"));

  EXPECT_THAT(text,
              HasSubstr("chorus_rank_step{host=\"node-a\",job=\"job-000007\",rank=\"0\"} 42\n"));
  EXPECT_THAT(text,
              HasSubstr("chorus_rank_step{host=\"node-b\",job=\"job-000007\",rank=\"1\"} 41\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_compute_seconds{host=\"node-b\",job=\"job-000007\","
                              "rank=\"1\"} 0.39\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_comm_wait_seconds{host=\"node-a\",job=\"job-000007\","
                              "rank=\"0\"} 0.3\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_caused_wait_seconds{host=\"node-b\",job=\"job-000007\","
                              "rank=\"1\"} 0.29\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_caused_wait_seconds{host=\"node-a\",job=\"job-000007\","
                              "rank=\"0\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_phase{host=\"node-b\",job=\"job-000007\",phase=\"DATA\","
                              "rank=\"1\"} 1\n"));
  EXPECT_THAT(text,
              HasSubstr("chorus_rank_heartbeat_age_seconds{host=\"node-a\",job=\"job-000007\","
                        "rank=\"0\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_samples_per_second{host=\"node-a\",job=\"job-000007\","
                              "rank=\"0\"} 160\n"));
  EXPECT_THAT(text,
              HasSubstr("chorus_rank_loss{host=\"node-a\",job=\"job-000007\",rank=\"0\"} 1.25\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_diagnosed{host=\"node-b\",job=\"job-000007\","
                              "kind=\"STRAGGLER\",rank=\"1\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("chorus_rank_diagnosed{host=\"node-a\"")));
}

// Issue 42: a job that streams data.shards reports its data figures (rank
// 0's, DataWindow in worker/train/trainer.cc); a job that does not, none.
TEST(CoordinatorMetricsTest, DataFiguresOfAShardedJobAreGauges) {
  ClusterSnapshot snapshot = TwoRankJob();
  v1::JobStatus& in_memory = snapshot.running.emplace_back();
  in_memory.mutable_job()->set_job_id("job-000008");
  in_memory.mutable_job()->mutable_latest_metrics()->set_step(3);
  auto& values = *snapshot.running[0].mutable_job()->mutable_latest_metrics()->mutable_values();
  values["data_wait_seconds"] = 0.0625;
  values["data_read_bytes_per_second"] = 2.5e6;
  CoordinatorMetrics metrics;
  const std::string text = metrics.Render(snapshot);
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_data_wait_seconds gauge"));
  EXPECT_THAT(text, HasSubstr("chorus_data_wait_seconds{job=\"job-000007\"} 0.0625\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_data_read_bytes_per_second gauge"));
  EXPECT_THAT(text, HasSubstr("chorus_data_read_bytes_per_second{job=\"job-000007\"} 2500000\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_step{job=\"job-000008\"} 3\n"));
  EXPECT_THAT(text, Not(HasSubstr("chorus_data_wait_seconds{job=\"job-000008\"}")));
  EXPECT_THAT(text, Not(HasSubstr("chorus_data_read_bytes_per_second{job=\"job-000008\"}")));

  // Without them (data in memory, or none reported yet) no series at all.
  const std::string none = metrics.Render(TwoRankJob());
  EXPECT_THAT(none, Not(HasSubstr("chorus_data_wait_seconds")));
  EXPECT_THAT(none, Not(HasSubstr("chorus_data_read_bytes_per_second")));
}

TEST(CoordinatorMetricsTest, SeriesOfAnEndedJobAndALeftPhaseAreRemoved) {
  CoordinatorMetrics metrics;
  ClusterSnapshot snapshot = TwoRankJob();
  ASSERT_THAT(metrics.Render(snapshot), HasSubstr("phase=\"DATA\""));
  snapshot.running[0].mutable_ranks(1)->set_phase(v1::COLLECTIVE);
  std::string text = metrics.Render(snapshot);
  EXPECT_THAT(text, Not(HasSubstr("phase=\"DATA\""))) << "one phase series per rank at a time";
  EXPECT_THAT(text, HasSubstr("phase=\"COLLECTIVE\""));

  // The job ends: no series names it any more; counters stay.
  snapshot.running.clear();
  snapshot.jobs_by_state[v1::Job::RUNNING] = 0;
  snapshot.jobs_by_state[v1::Job::SUCCEEDED] = 4;
  text = metrics.Render(snapshot);
  EXPECT_THAT(text, Not(HasSubstr("job-000007")));
  EXPECT_THAT(text, Not(HasSubstr("chorus_rank_step{")));
  EXPECT_THAT(text, HasSubstr("chorus_jobs{state=\"RUNNING\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("chorus_jobs_finished_total{state=\"SUCCEEDED\"} 4\n"));
}

// Note [Per-rank series at scale].
TEST(CoordinatorMetricsTest, AJobAboveTheRankSeriesLimitGetsSummarySeries) {
  ClusterSnapshot snapshot = TwoRankJob();
  v1::JobStatus& job = snapshot.running[0];
  job.mutable_ranks()->DeleteSubrange(0, 1);  // the scheduler keeps only culprits' rows
  v1::RankSummary& summary = *job.mutable_rank_summary();
  summary.set_ranks(2);
  (*summary.mutable_by_state())["TRAINING"] = 2;
  summary.set_min_step(41);
  summary.set_oldest_heartbeat_rank(1);
  summary.set_oldest_heartbeat_age_seconds(0.25);
  summary.set_most_waited_for_rank(1);
  summary.set_most_waited_for_seconds(0.29);
  CoordinatorMetrics small(/*max_rank_series=*/1);
  const std::string text = small.Render(snapshot);
  EXPECT_THAT(text, HasSubstr("chorus_job_ranks{job=\"job-000007\",state=\"TRAINING\"} 2"));
  EXPECT_THAT(text, HasSubstr("chorus_job_rank_series{job=\"job-000007\"} 0"));
  EXPECT_THAT(text, HasSubstr("chorus_job_rank_step_min{job=\"job-000007\"} 41"));
  EXPECT_THAT(text,
              HasSubstr("chorus_job_rank_heartbeat_age_max_seconds{job=\"job-000007\"} 0.25"));
  EXPECT_THAT(text, HasSubstr("chorus_job_rank_caused_wait_max_seconds{job=\"job-000007\"} 0.29"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_step{host=\"node-b\",job=\"job-000007\",rank=\"1\"}"))
      << "a row the snapshot kept (a culprit's) is written";
  EXPECT_THAT(text, Not(HasSubstr("rank=\"0\"")));
  CoordinatorMetrics large;
  EXPECT_EQ(large.max_rank_series(), 1024);
  EXPECT_THAT(large.Render(snapshot), HasSubstr("chorus_job_rank_series{job=\"job-000007\"} 1"));
}

TEST(CoordinatorMetricsTest, RankJoinsAreCountedByWayAndBothWaysStartAtZero) {
  CoordinatorMetrics metrics;
  std::string text = metrics.Render({});
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_rank_joins_total counter"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_joins_total{via=\"agent\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_joins_total{via=\"rank\"} 0\n"));
  metrics.RankJoined("agent");
  metrics.RankJoined("agent");
  metrics.RankJoined("rank");
  text = metrics.Render({});
  EXPECT_THAT(text, HasSubstr("chorus_rank_joins_total{via=\"agent\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rank_joins_total{via=\"rank\"} 1\n"));
}

TEST(CoordinatorMetricsTest, EventsAreCountedByLabel) {
  CoordinatorMetrics metrics;
  metrics.GenerationStarted("start");
  metrics.GenerationStarted("start");
  metrics.GenerationStarted("recovered");
  metrics.RendezvousCompleted(absl::Milliseconds(300));
  metrics.RendezvousCompleted(absl::Seconds(3));
  metrics.DiagnosisSeen(v1::Diagnosis::NEVER_JOINED);
  metrics.DiagnosisSeen(v1::Diagnosis::NEVER_JOINED);
  metrics.DiagnosisSeen(v1::Diagnosis::MISMATCH);
  metrics.RpcFinished("/chorus.v1.JobService/SubmitJob", "OK", absl::Milliseconds(2));
  metrics.RpcFinished("/chorus.v1.JobService/SubmitJob", "INVALID_ARGUMENT", absl::Milliseconds(1));
  metrics.RpcFinished("/chorus.v1.JobService/SubmitJob", "OK", absl::Milliseconds(4));
  const std::string text = metrics.Render({});
  EXPECT_THAT(text, HasSubstr("chorus_generations_total{cause=\"start\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_generations_total{cause=\"recovered\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_rendezvous_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("chorus_rendezvous_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rendezvous_seconds_sum 3.3\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rendezvous_seconds_bucket{le=\"0.5\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rendezvous_seconds_bucket{le=\"5\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_diagnoses_total{kind=\"NEVER_JOINED\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_diagnoses_total{kind=\"MISMATCH\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rpcs_total{code=\"OK\",method=\"/chorus.v1.JobService/"
                              "SubmitJob\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rpcs_total{code=\"INVALID_ARGUMENT\",method=\"/chorus.v1."
                              "JobService/SubmitJob\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rpc_seconds_count{method=\"/chorus.v1.JobService/"
                              "SubmitJob\"} 3\n"));
}

ClusterSnapshot::User UserWith(int64_t cpu_slots, int64_t running, int64_t queued,
                               double fair_share) {
  ClusterSnapshot::User user;
  if (cpu_slots > 0) user.slots_in_use[v1::ResourceSpec::CPU] = cpu_slots;
  user.running_jobs = running;
  user.queued_jobs = queued;
  user.fair_share_slot_seconds = fair_share;
  return user;
}

TEST(CoordinatorMetricsTest, UsersAndTheQueueByReasonHaveSeries) {
  CoordinatorMetrics metrics;
  ClusterSnapshot snapshot;
  snapshot.users["alice"] = UserWith(6, 2, 1, 7200.5);
  snapshot.users["alice"].slots_in_use[v1::ResourceSpec::CUDA] = 1;
  snapshot.users[""] = UserWith(0, 0, 3, 0);
  snapshot.queued_by_wait = {{"quota", 1}, {"free_slots", 1}, {"reservation", 2}, {"no_agent", 0}};
  const std::string text = metrics.Render(snapshot);
  EXPECT_THAT(text, HasSubstr("chorus_user_slots{device=\"CPU\",user=\"alice\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_slots{device=\"CUDA\",user=\"alice\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_jobs{state=\"running\",user=\"alice\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_jobs{state=\"queued\",user=\"alice\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_fair_share_slot_seconds{user=\"alice\"} 7200.5\n"));
  // The anonymous user is named; holding no slots, it has no slot series.
  EXPECT_THAT(text, HasSubstr("chorus_user_jobs{state=\"queued\",user=\"anonymous\"} 3\n"));
  EXPECT_THAT(text, Not(HasSubstr("chorus_user_slots{device=\"CPU\",user=\"anonymous\"}")));
  EXPECT_THAT(text, HasSubstr("chorus_queued_jobs{reason=\"reservation\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_queued_jobs{reason=\"no_agent\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_series{state=\"all\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_series{state=\"own\"} 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("user=\"(others)\"")));

  // A user with nothing left is gone from the next scrape.
  snapshot.users.erase("alice");
  EXPECT_THAT(metrics.Render(snapshot), Not(HasSubstr("user=\"alice\"")));
}

TEST(CoordinatorMetricsTest, UsersBeyondTheCapAreSummedIntoOthers) {
  CoordinatorMetrics metrics(CoordinatorMetrics::kDefaultMaxRankSeries, /*max_user_series=*/2);
  ClusterSnapshot snapshot;
  snapshot.users["big"] = UserWith(8, 1, 0, 100);
  snapshot.users["mid"] = UserWith(0, 0, 2, 50);  // no slots, more usage than the two below
  snapshot.users["small-1"] = UserWith(1, 1, 1, 10);
  snapshot.users["small-2"] = UserWith(2, 1, 0, 20);
  const std::string text = metrics.Render(snapshot);
  // The most slots keep their series: big (8), small-2 (2).
  EXPECT_THAT(text, HasSubstr("chorus_user_slots{device=\"CPU\",user=\"big\"} 8\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_slots{device=\"CPU\",user=\"small-2\"} 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("user=\"mid\"")));
  EXPECT_THAT(text, Not(HasSubstr("user=\"small-1\"")));
  // mid and small-1 summed.
  EXPECT_THAT(text, HasSubstr("chorus_user_slots{device=\"CPU\",user=\"(others)\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_jobs{state=\"queued\",user=\"(others)\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_jobs{state=\"running\",user=\"(others)\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_fair_share_slot_seconds{user=\"(others)\"} 60\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_series{state=\"all\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_series{state=\"own\"} 2\n"));
}

// Note [Failure reasons as labels]: the newest failed jobs carry their
// reason, escaped as the exposition format wants it; the older ones have
// no series.
TEST(CoordinatorMetricsTest, TheNewestFailedJobsCarryTheirReasonAsALabel) {
  CoordinatorMetrics metrics(CoordinatorMetrics::kDefaultMaxRankSeries,
                             CoordinatorMetrics::kDefaultMaxUserSeries, /*max_failed_series=*/2);
  ClusterSnapshot snapshot;
  for (int i = 3; i >= 1; --i) {  // newest end first, as NewestFailed gives them
    v1::Job& job = snapshot.failed.emplace_back();
    job.set_job_id(absl::StrCat("job-00000", i));
    job.set_owner(i == 2 ? "alice" : "");
    job.set_end_time_us(int64_t{1700000000} * 1000000 + i * 500000);
    job.set_state(v1::Job::FAILED);
  }
  snapshot.failed[0].set_reason(
      "rank 0 (vm, pid 7) exited with code 1; last stderr: chorus-rank: data.shards: /d/a.tar at "
      "byte offset 6656 (sample 3, member \"00003.npy\"): .npy header \"{'descr'\\n\" lacks "
      "shape");
  snapshot.failed[1].set_reason("killed by the OOM killer");
  const std::string text = metrics.Render(snapshot);
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_job_failed_timestamp_seconds gauge\n"));
  // Quotes and backslashes escaped (the reason holds "\n" as two
  // characters: a backslash and an n).
  EXPECT_THAT(text,
              HasSubstr("chorus_job_failed_timestamp_seconds{job=\"job-000003\",reason=\"rank 0 "
                        "(vm, pid 7) exited with code 1; last stderr: chorus-rank: data.shards: "
                        "/d/a.tar at byte offset 6656 (sample 3, member \\\"00003.npy\\\"): .npy "
                        "header \\\"{'descr'\\\\n\\\" lacks shape\",user=\"anonymous\"} "
                        "1700000001.5\n"));
  EXPECT_THAT(text, HasSubstr("chorus_job_failed_timestamp_seconds{job=\"job-000002\",reason=\""
                              "killed by the OOM killer\",user=\"alice\"} 1700000001\n"));
  EXPECT_THAT(text, Not(HasSubstr("job-000001")));

  CoordinatorMetrics none(CoordinatorMetrics::kDefaultMaxRankSeries,
                          CoordinatorMetrics::kDefaultMaxUserSeries, /*max_failed_series=*/0);
  EXPECT_THAT(none.Render(snapshot), Not(HasSubstr("chorus_job_failed_timestamp_seconds")));
}

}  // namespace
}  // namespace chorus
