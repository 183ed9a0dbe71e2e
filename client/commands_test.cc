// The chorus subcommands as a user runs them (the real app, RunChorus), over
// an injected channel to an in-memory coordinator: exit codes, the requests
// they send and what they print.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/layout.h"
#include "client/cli.h"
#include "client/fake_coordinator.h"
#include "common/job_spec.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus::client {
namespace {

using ::google::protobuf::util::JsonStringToMessage;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

constexpr char kGoodSpec[] =
    "name: \"mnist-mlp\"\n"
    "model { mlp {} }\n"
    "data { synthetic {} }\n"
    "resources { min_ranks: 2 max_ranks: 4 }\n";

// One bad value in each of two fields.
constexpr char kBadSpec[] =
    "model: {mlp: {}}\n"
    "data: {synthetic: {}}\n"
    "strategy: {ddp: {bucket_cap_mb: -3}}\n"
    "training: {batch_size_per_rank: -1}\n";

v1::Job MakeJob(const std::string& id, const std::string& name, v1::Job::State state, int min_ranks,
                int max_ranks, const std::string& reason = "") {
  v1::Job job;
  job.set_job_id(id);
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->mutable_resources()->set_min_ranks(min_ranks);
  job.mutable_spec()->mutable_resources()->set_max_ranks(max_ranks);
  job.set_state(state);
  job.set_reason(reason);
  return job;
}

// The lines of `text`, and a line's whitespace-separated words.
std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}
std::vector<std::string> Words(const std::string& line) {
  return absl::StrSplit(line, ' ', absl::SkipEmpty());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coordinator_.Start().ok());
    dir_ = ::testing::TempDir();
    if (dir_.empty() || dir_.back() != '/') dir_ += '/';
    dir_ += ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // `chorus --coordinator ADDRESS ARGS...` with calls over `channel`; the
  // exit code, with what it printed in out_ and err_.
  int RunAt(const std::string& address, std::shared_ptr<grpc::Channel> channel,
            const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"chorus", "--coordinator", address};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<const char*> pointers;
    for (const std::string& a : argv) pointers.push_back(a.c_str());
    out_.str("");
    err_.str("");
    GlobalOptions global;
    global.channel = std::move(channel);
    global.out = &out_;
    global.err = &err_;
    return RunChorus(static_cast<int>(pointers.size()), pointers.data(), global);
  }
  // The same against the fake coordinator.
  int Run(const std::vector<std::string>& args) {
    return RunAt(coordinator_.address(), coordinator_.channel(), args);
  }

  // An address nothing listens on (a Unix socket that does not exist; short,
  // as socket paths are limited to 107 bytes), and a channel to it.
  std::string DeadAddress() const {
    return absl::StrCat("unix:/tmp/chorus-commands-test-", getpid(), ".sock");
  }
  std::shared_ptr<grpc::Channel> DeadChannel() const {
    return grpc::CreateChannel(DeadAddress(), grpc::InsecureChannelCredentials());
  }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream(path) << contents;
    return path;
  }

  FakeCoordinator coordinator_;
  std::string dir_;
  std::ostringstream out_;
  std::ostringstream err_;
};

// ---------------------------------------------------------------- jobs

TEST_F(CommandsTest, JobsPrintsATableOfTheCoordinatorsJobs) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::SUCCEEDED, 2, 2));
  v1::Job owned = MakeJob("job-000002", "resnet", v1::Job::CANCELLED, 2, 4, "user asked");
  owned.set_owner("alice");
  coordinator_.AddJob(owned);

  EXPECT_EQ(Run({"jobs"}), kExitOk);

  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(3)) << out_.str();
  EXPECT_THAT(Words(lines[0]),
              ElementsAre("JOB", "NAME", "OWNER", "STATE", "RANKS", "SUBMITTED", "REASON"));
  EXPECT_THAT(Words(lines[1]), ElementsAre("job-000001", "mnist", "-", "SUCCEEDED", "2", "-"))
      << "a job of a coordinator without a token file has no owner";
  EXPECT_THAT(Words(lines[2]), ElementsAre("job-000002", "resnet", "alice", "CANCELLED", "2-4", "-",
                                           "user", "asked"));
  EXPECT_EQ(err_.str(), "");
  ASSERT_THAT(coordinator_.list_jobs_requests(), SizeIs(1));
  EXPECT_THAT(coordinator_.list_jobs_requests()[0].states(), IsEmpty());
  EXPECT_EQ(coordinator_.list_jobs_requests()[0].limit(), 50) << "a screenful by default";
}

TEST_F(CommandsTest, JobsAsksForTheStateAndLimitGiven) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::SUCCEEDED, 2, 2));
  coordinator_.AddJob(MakeJob("job-000002", "resnet", v1::Job::RUNNING, 2, 4));
  coordinator_.AddJob(MakeJob("job-000003", "bert", v1::Job::RUNNING, 1, 1));

  EXPECT_EQ(Run({"jobs", "--state", "RUNNING", "--limit", "1"}), kExitOk);

  ASSERT_THAT(coordinator_.list_jobs_requests(), SizeIs(1));
  const v1::ListJobsRequest request = coordinator_.list_jobs_requests()[0];
  EXPECT_THAT(request.states(), ElementsAre(v1::Job::RUNNING));
  EXPECT_EQ(request.limit(), 1);
  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(2)) << out_.str();
  EXPECT_THAT(Words(lines[1]), ElementsAre("job-000002", "resnet", "-", "RUNNING", "2-4", "-"));
}

TEST_F(CommandsTest, JobsJsonIsTheListJobsResponse) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::SUCCEEDED, 2, 2));
  coordinator_.AddJob(MakeJob("job-000002", "resnet", v1::Job::RUNNING, 2, 4));

  EXPECT_EQ(Run({"jobs", "--json"}), kExitOk);

  v1::ListJobsResponse printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  ASSERT_THAT(printed.jobs(), SizeIs(2));
  EXPECT_TRUE(MessageDifferencer::Equals(printed.jobs(1),
                                         MakeJob("job-000002", "resnet", v1::Job::RUNNING, 2, 4)))
      << printed.DebugString();
  // Proto field names, as documented for --json.
  EXPECT_THAT(out_.str(), HasSubstr("\"job_id\": \"job-000001\""));
}

TEST_F(CommandsTest, JobsShowsWhyAPendingJobWaits) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::PENDING, 2, 2));
  v1::GetQueueResponse queue;
  v1::QueuedJobInfo& info = *queue.add_jobs();
  info.set_job_id("job-000001");
  info.set_reason("alice uses 8 of 8 CPU slots (quota); the job needs 2");
  coordinator_.SetQueue(queue);

  EXPECT_EQ(Run({"jobs"}), kExitOk);

  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(2)) << out_.str();
  EXPECT_THAT(lines[1], HasSubstr("alice uses 8 of 8 CPU slots (quota); the job needs 2"));
}

// ---------------------------------------------------------------- queue

TEST_F(CommandsTest, QueuePrintsTheJobsInPlacementOrderWithTheirReasons) {
  v1::GetQueueResponse queue;
  v1::QueuedJobInfo& high = *queue.add_jobs();
  high.set_job_id("job-000007");
  high.set_name("urgent");
  high.set_owner("alice");
  high.set_priority(v1::JobSpec::HIGH);
  high.set_min_ranks(4);
  high.set_device(v1::ResourceSpec::CPU);
  high.set_holds_reservation(true);
  high.set_reason("waiting for 4 free CPU slots; 1 agent has 2 free; it is first in line");
  v1::QueuedJobInfo& low = *queue.add_jobs();
  low.set_job_id("job-000003");
  low.set_name("sweep");
  low.set_priority(v1::JobSpec::LOW);
  low.set_min_ranks(1);
  low.set_device(v1::ResourceSpec::CUDA);
  low.set_reason("waiting behind job-000007");
  coordinator_.SetQueue(queue);

  EXPECT_EQ(Run({"queue"}), kExitOk);

  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(4)) << out_.str();
  EXPECT_THAT(Words(lines[0]),
              ElementsAre("#", "JOB", "NAME", "OWNER", "PRIORITY", "RANKS", "SUBMITTED", "REASON"));
  EXPECT_THAT(Words(lines[1]),
              testing::IsSupersetOf({"1", "job-000007", "urgent", "alice", "HIGH", "4", "CPU"}));
  EXPECT_THAT(lines[1], HasSubstr("it is first in line"));
  EXPECT_THAT(Words(lines[2]),
              testing::IsSupersetOf({"2", "job-000003", "sweep", "-", "LOW", "1", "CUDA"}));
  EXPECT_EQ(lines[3],
            "No start times are estimated: jobs do not declare how long they run "
            "(docs/scheduling.md).");

  out_.str("");
  EXPECT_EQ(Run({"queue", "--json"}), kExitOk);
  v1::GetQueueResponse printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_TRUE(MessageDifferencer::Equals(printed, queue)) << printed.DebugString();
}

TEST_F(CommandsTest, AnEmptyQueueSaysSo) {
  EXPECT_EQ(Run({"queue"}), kExitOk);
  EXPECT_EQ(out_.str(), "no queued jobs\n");
}

// With a long history `chorus jobs` shows the newest few and says how to see
// more; --limit 0 pages through all of them.
TEST_F(CommandsTest, JobsPagesThroughALongHistory) {
  for (int i = 1; i <= 7; ++i) {
    coordinator_.AddJob(MakeJob(absl::StrFormat("job-%06d", i), "j", v1::Job::SUCCEEDED, 1, 1));
  }
  EXPECT_EQ(Run({"jobs", "--limit", "3"}), kExitOk);
  EXPECT_THAT(Lines(out_.str()), SizeIs(4)) << out_.str();
  EXPECT_EQ(err_.str(), "chorus jobs: the newest 3 shown; --limit N shows more, --limit 0 all\n");

  out_.str("");
  err_.str("");
  EXPECT_EQ(Run({"jobs", "--limit", "0", "--json"}), kExitOk);
  v1::ListJobsResponse printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_THAT(printed.jobs(), SizeIs(7));
  EXPECT_EQ(printed.jobs(6).job_id(), "job-000007");
  EXPECT_TRUE(printed.next_page_token().empty());
  EXPECT_THAT(coordinator_.list_jobs_requests(), SizeIs(1 + 3)) << "three pages of at most 3";
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, JobsWithNoneSaysSo) {
  EXPECT_EQ(Run({"jobs"}), kExitOk);
  EXPECT_EQ(out_.str(), "no jobs\n");
}

TEST_F(CommandsTest, AnUnreachableCoordinatorIsNamedWithAHint) {
  EXPECT_EQ(RunAt(DeadAddress(), DeadChannel(), {"jobs", "--timeout", "2"}), kExitFailure);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), StartsWith("chorus jobs: "));
  EXPECT_THAT(err_.str(),
              HasSubstr(absl::StrCat("(coordinator ", DeadAddress(),
                                     "; is it running? `chorus ping` checks, --coordinator "
                                     "picks another)\n")));
}

// ---------------------------------------------------------------- status

TEST_F(CommandsTest, StatusShowsRanksAndProblems) {
  v1::JobStatus status;
  v1::Job& job = *status.mutable_job();
  job = MakeJob("job-000002", "resnet", v1::Job::RUNNING, 2, 2);
  job.set_generation(3);
  job.set_world_size(2);
  v1::RankStatus& r0 = *status.add_ranks();
  r0.set_rank(0);
  r0.set_host("node-a");
  r0.set_pid(4242);
  r0.set_state(v1::RankStatus::TRAINING);
  r0.set_step(120);
  r0.set_phase(v1::COLLECTIVE);
  r0.set_heartbeat_age_seconds(0.4);
  r0.set_last_completed_seq(57);
  v1::RankStatus& r1 = *status.add_ranks();
  r1.set_rank(1);
  r1.set_host("node-b");
  r1.set_pid(4343);
  r1.set_state(v1::RankStatus::TRAINING);
  r1.set_step(98);
  r1.set_phase(v1::FORWARD);
  r1.set_heartbeat_age_seconds(2.5);
  r1.set_last_completed_seq(55);
  v1::Diagnosis& d = *status.add_diagnoses();
  d.set_kind(v1::Diagnosis::STRAGGLER);
  d.add_ranks(1);
  d.set_message("rank 1 (node-b) is 1.8x slower than the median rank");
  coordinator_.SetJobStatus(status);

  EXPECT_EQ(Run({"status", "job-000002"}), kExitOk);

  ASSERT_THAT(coordinator_.status_requests(), SizeIs(1));
  EXPECT_EQ(coordinator_.status_requests()[0].job_id(), "job-000002");
  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(9)) << out_.str();
  EXPECT_EQ(lines[0], "job-000002 (resnet): RUNNING");
  EXPECT_EQ(lines[1], "  submitted -, started -, ended -");
  EXPECT_EQ(lines[2], "  generation 3, world size 2");
  EXPECT_EQ(lines[3], "Ranks:");
  EXPECT_THAT(Words(lines[4]), ElementsAre("RANK", "HOST", "PID", "STATE", "STEP", "PHASE",
                                           "HEARTBEAT", "LAST_SEQ"));
  EXPECT_THAT(Words(lines[5]),
              ElementsAre("0", "node-a", "4242", "TRAINING", "120", "COLLECTIVE", "0.4s", "57"));
  EXPECT_THAT(Words(lines[6]),
              ElementsAre("1", "node-b", "4343", "TRAINING", "98", "FORWARD", "2.5s", "55"));
  EXPECT_EQ(lines[7], "Problems:");
  EXPECT_EQ(lines[8], "  STRAGGLER rank 1 (node-b) is 1.8x slower than the median rank");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, StatusNamesTheJobsPageWhenTheCoordinatorHasOne) {
  v1::JobStatus status;
  *status.mutable_job() = MakeJob("job-000004", "mnist", v1::Job::RUNNING, 2, 2);
  status.set_page_url("http://127.0.0.1:29651/jobs/job-000004");
  coordinator_.SetJobStatus(status);
  EXPECT_EQ(Run({"status", "job-000004"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("\n  page http://127.0.0.1:29651/jobs/job-000004\n"));
}

TEST_F(CommandsTest, TopOnceDrawsTheRankTableAndMarksTheDiagnosedRank) {
  v1::JobStatus status;
  *status.mutable_job() = MakeJob("job-000005", "slow", v1::Job::RUNNING, 2, 2);
  status.mutable_job()->set_world_size(2);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankStatus& r = *status.add_ranks();
    r.set_rank(rank);
    r.set_host(rank == 0 ? "node-a" : "node-b");
    r.set_state(v1::RankStatus::TRAINING);
    r.set_step(40 + rank);
    r.set_phase(rank == 0 ? v1::COLLECTIVE : v1::DATA);
    r.set_phase_seconds(0.5);
    r.set_heartbeat_age_seconds(0.3);
    r.set_compute_seconds(rank == 0 ? 0.01 : 0.11);
    r.set_comm_wait_seconds(rank == 0 ? 0.1 : 0.0);
    r.set_caused_wait_seconds(rank == 0 ? 0.0 : 0.1);
    r.set_samples_per_second(150);
  }
  v1::Diagnosis& d = *status.add_diagnoses();
  d.set_kind(v1::Diagnosis::STRAGGLER);
  d.add_ranks(1);
  d.set_message("rank 1 computes for 0.110 s per step");
  coordinator_.SetJobStatus(status);

  EXPECT_EQ(Run({"top", "job-000005", "--once"}), kExitOk);
  ASSERT_THAT(coordinator_.status_requests(), SizeIs(1)) << "--once asks once";
  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(6)) << out_.str();
  EXPECT_EQ(lines[0], "job-000005 (slow): RUNNING, generation 0, world size 2");
  EXPECT_THAT(Words(lines[1]), ElementsAre("RANK", "HOST", "STATE", "STEP", "PHASE", "IN_PHASE",
                                           "HEARTBEAT", "COMPUTE", "WAIT", "OTHERS", "SAMPLES/S"));
  EXPECT_THAT(Words(lines[2]), ElementsAre("0", "node-a", "TRAINING", "40", "COLLECTIVE", "0.5s",
                                           "0.3s", "0.010s", "0.100s", "0.000s", "150.0"));
  EXPECT_THAT(Words(lines[3]),
              ElementsAre("1", "node-b", "TRAINING", "41", "DATA", "0.5s", "0.3s", "0.110s",
                          "0.000s", "0.100s", "150.0", "<-", "STRAGGLER"));
  EXPECT_EQ(lines[4], "STRAGGLER rank 1 computes for 0.110 s per step");
  EXPECT_THAT(out_.str(), Not(HasSubstr("\x1b["))) << "no screen control outside a terminal";
}

TEST_F(CommandsTest, TopStopsAfterItsIterationsAndAtTheJobsEnd) {
  v1::JobStatus status;
  *status.mutable_job() = MakeJob("job-000006", "x", v1::Job::RUNNING, 1, 1);
  coordinator_.SetJobStatus(status);
  EXPECT_EQ(Run({"top", "job-000006", "--iterations", "3", "--interval", "0.2"}), kExitOk);
  EXPECT_THAT(coordinator_.status_requests(), SizeIs(3));

  status.mutable_job()->set_state(v1::Job::SUCCEEDED);
  coordinator_.SetJobStatus(status);
  EXPECT_EQ(Run({"top", "job-000006", "--interval", "0.2"}), kExitOk);
  EXPECT_THAT(coordinator_.status_requests(), SizeIs(4)) << "an ended job is drawn once";
}

TEST_F(CommandsTest, StatusOfAFailedJobShowsItsReasonAndNoProblems) {
  // Only the header and the problems: what an ended job prints for its
  // ranks is not pinned here.
  v1::Job job = MakeJob("job-000004", "bert", v1::Job::FAILED, 1, 1, "rank 0 exited with 3");
  coordinator_.AddJob(job);

  EXPECT_EQ(Run({"status", "job-000004"}), kExitOk);

  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(testing::Ge(3))) << out_.str();
  EXPECT_EQ(lines[0], "job-000004 (bert): FAILED - rank 0 exited with 3");
  EXPECT_EQ(lines.back(), "Problems: none");
}

TEST_F(CommandsTest, StatusOfAPendingJobHasNoRanksYet) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::PENDING, 2, 2));

  EXPECT_EQ(Run({"status", "job-000001"}), kExitOk);

  EXPECT_THAT(out_.str(), StartsWith("job-000001 (mnist): PENDING\n"));
  EXPECT_THAT(out_.str(), HasSubstr("\nRanks: none yet\nProblems: none\n"));
}

TEST_F(CommandsTest, StatusJsonIsTheJobStatus) {
  v1::JobStatus status;
  *status.mutable_job() = MakeJob("job-000002", "resnet", v1::Job::RUNNING, 2, 2);
  status.add_ranks()->set_host("node-a");
  status.add_diagnoses()->set_kind(v1::Diagnosis::DEAD);
  coordinator_.SetJobStatus(status);

  EXPECT_EQ(Run({"status", "job-000002", "--json"}), kExitOk);

  v1::JobStatus printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_TRUE(MessageDifferencer::Equals(printed, status)) << printed.DebugString();
}

TEST_F(CommandsTest, StatusOfAnUnknownJobNamesItAndExits1) {
  EXPECT_EQ(Run({"status", "job-424242"}), kExitFailure);

  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(),
            "chorus status: no job \"job-424242\"; `chorus jobs` lists the jobs this coordinator "
            "knows\n");
  ASSERT_THAT(coordinator_.status_requests(), SizeIs(1));
  EXPECT_EQ(coordinator_.status_requests()[0].job_id(), "job-424242");
}

// ---------------------------------------------------------------- drain, agents

v1::AgentInfo MakeAgent(const std::string& id, const std::string& host, int busy) {
  v1::AgentInfo agent;
  agent.set_agent_id(id);
  agent.set_host(host);
  agent.set_slots(2);
  agent.set_busy_slots(busy);
  agent.set_state(v1::AgentInfo::ACTIVE);
  if (busy > 0) agent.add_jobs("job-000001");
  return agent;
}

TEST_F(CommandsTest, DrainPrintsTheAgentsStateAndAgentsListsThem) {
  coordinator_.AddAgent(MakeAgent("agent-1", "node-a", 0));
  coordinator_.AddAgent(MakeAgent("agent-2", "node-b", 2));

  EXPECT_EQ(Run({"drain", "node-b"}), kExitOk);
  ASSERT_THAT(coordinator_.drains(), SizeIs(1));
  EXPECT_EQ(coordinator_.drains()[0].agent(), "node-b");
  EXPECT_EQ(out_.str(), "agent-2 (node-b): DRAINING, 2 of 2 slot(s) busy, jobs job-000001\n");
  out_.str("");
  EXPECT_EQ(Run({"drain", "agent-1"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "agent-1 (node-a): DRAINED, 0 of 2 slot(s) busy - no rank runs there; the agent can "
            "be stopped\n");
  out_.str("");
  EXPECT_EQ(Run({"agents"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "agent-1 (node-a): DRAINED, 0 of 2 slot(s) busy - no rank runs there; the agent can "
            "be stopped\nagent-2 (node-b): DRAINING, 2 of 2 slot(s) busy, jobs job-000001\n");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, DrainWaitThatTimesOutExits1AndAnUnknownAgentIsNamed) {
  coordinator_.AddAgent(MakeAgent("agent-2", "node-b", 1));
  EXPECT_EQ(Run({"drain", "node-b", "--wait", "0.6"}), kExitFailure);
  EXPECT_THAT(coordinator_.drains(), SizeIs(testing::Ge(2u))) << "it asked again while waiting";
  EXPECT_EQ(out_.str(), "agent-2 (node-b): DRAINING, 1 of 2 slot(s) busy, jobs job-000001\n");
  EXPECT_EQ(err_.str(), "chorus drain: agent-2 is not drained after 0.6 s\n");
  out_.str("");
  err_.str("");
  EXPECT_EQ(Run({"drain", "node-z"}), kExitFailure);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), testing::StartsWith("chorus drain: no agent \"node-z\""));
}

TEST_F(CommandsTest, DrainHelpSaysWhatHappensToTheJobs) {
  EXPECT_EQ(Run({"drain", "--help"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("re-forms without them at its next step boundary"));
  EXPECT_THAT(out_.str(), HasSubstr("other jobs keep their ranks there until they end"));
  EXPECT_THAT(out_.str(), HasSubstr("--wait"));
}

// ---------------------------------------------------------------- cancel

TEST_F(CommandsTest, CancelNamesTheJobAndTheReason) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::RUNNING, 2, 2));

  EXPECT_EQ(Run({"cancel", "job-000001", "--reason", "changed my mind"}), kExitOk);

  ASSERT_THAT(coordinator_.cancels(), SizeIs(1));
  EXPECT_EQ(coordinator_.cancels()[0].job_id(), "job-000001");
  EXPECT_EQ(coordinator_.cancels()[0].reason(), "changed my mind");
  EXPECT_EQ(out_.str(), "job-000001: CANCELLED (changed my mind)\n");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, CancelJsonIsTheCancelledJob) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::PENDING, 2, 2));

  EXPECT_EQ(Run({"cancel", "--json", "job-000001"}), kExitOk);

  v1::Job printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_EQ(printed.job_id(), "job-000001");
  EXPECT_EQ(printed.state(), v1::Job::CANCELLED);
}

TEST_F(CommandsTest, CancelOfAnUnknownJobSaysSoAndExits1) {
  EXPECT_EQ(Run({"cancel", "job-000009"}), kExitFailure);

  ASSERT_THAT(coordinator_.cancels(), SizeIs(1));
  EXPECT_EQ(coordinator_.cancels()[0].job_id(), "job-000009");
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(),
            "chorus cancel: no job \"job-000009\"; `chorus jobs` lists the jobs this coordinator "
            "knows\n");
}

TEST_F(CommandsTest, CancelOfAnEndedJobIsRefused) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::SUCCEEDED, 2, 2));

  EXPECT_EQ(Run({"cancel", "job-000001"}), kExitFailure);

  EXPECT_EQ(err_.str(), "chorus cancel: job job-000001 already ended: SUCCEEDED\n");
}

TEST_F(CommandsTest, CancelWithoutAJobIsAUsageErrorWithoutACall) {
  EXPECT_EQ(Run({"cancel"}), kExitBadInput);

  EXPECT_THAT(err_.str(), HasSubstr("job is required"));
  EXPECT_EQ(coordinator_.calls(), 0);
}

// ---------------------------------------------------------------- submit

TEST_F(CommandsTest, SubmitSendsTheSpecFileAndPrintsTheJobId) {
  const std::string path = WriteFile("job.textproto", kGoodSpec);
  absl::StatusOr<v1::JobSpec> expected = LoadJobSpec(path);
  ASSERT_TRUE(expected.ok()) << expected.status();

  EXPECT_EQ(Run({"submit", path}), kExitOk);

  ASSERT_THAT(coordinator_.submits(), SizeIs(1));
  const v1::SubmitJobRequest request = coordinator_.submits()[0];
  EXPECT_TRUE(MessageDifferencer::Equals(request.spec(), *expected)) << request.DebugString();
  EXPECT_EQ(request.spec().name(), "mnist-mlp");
  EXPECT_EQ(request.spec().resources().min_ranks(), 2);
  EXPECT_EQ(request.spec().resources().max_ranks(), 4);
  EXPECT_EQ(request.resume_from(), "");
  EXPECT_EQ(out_.str(), "job-000001\n");
  EXPECT_EQ(err_.str(),
            "chorus submit: queued job-000001 (mnist-mlp); `chorus status job-000001` follows "
            "it\n");
}

TEST_F(CommandsTest, SubmitPassesResumeFromAndPrintsJson) {
  const std::string path = WriteFile("job.textproto", kGoodSpec);

  EXPECT_EQ(Run({"submit", "--json", "--resume_from", "job-000007:300", path}), kExitOk);

  ASSERT_THAT(coordinator_.submits(), SizeIs(1));
  EXPECT_EQ(coordinator_.submits()[0].resume_from(), "job-000007:300");
  v1::SubmitJobResponse printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_EQ(printed.job_id(), "job-000001");
}

TEST_F(CommandsTest, SubmitOfABadSpecNamesTheFileAndFieldsWithoutACall) {
  const std::string path = WriteFile("bad.yaml", kBadSpec);

  EXPECT_EQ(Run({"submit", path}), kExitBadInput);

  EXPECT_EQ(coordinator_.calls(), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), StartsWith("chorus submit: "));
  EXPECT_THAT(err_.str(), HasSubstr(path));
  EXPECT_THAT(err_.str(), HasSubstr("strategy.ddp.bucket_cap_mb: must be > 0, got -3"));
  EXPECT_THAT(err_.str(), HasSubstr("training.batch_size_per_rank: must be > 0, got -1"));
}

TEST_F(CommandsTest, SubmitOfAMissingFileNamesItWithoutACall) {
  const std::string path = absl::StrCat(dir_, "/missing.textproto");

  EXPECT_EQ(Run({"submit", path}), kExitBadInput);

  EXPECT_EQ(coordinator_.calls(), 0);
  EXPECT_THAT(err_.str(), StartsWith("chorus submit: "));
  EXPECT_THAT(err_.str(), HasSubstr(path));
  EXPECT_THAT(err_.str(), HasSubstr("cannot open"));
}

// ---------------------------------------------------------------- checkpoints

TEST_F(CommandsTest, CheckpointsListsTheManifests) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::RUNNING, 2, 2));
  v1::CheckpointManifest first;
  first.set_job_id("job-000001");
  first.set_step(100);
  first.set_world_size(2);
  v1::CheckpointFile* model = first.add_files();
  model->set_name("model.pt");
  model->set_size(1 << 20);
  v1::CheckpointFile* state = first.add_files();
  state->set_name("train_state.pt");
  state->set_size(1 << 19);
  v1::CheckpointManifest second = first;
  second.set_step(200);
  second.set_world_size(4);
  second.set_directory("/shared/job-000001/200");
  coordinator_.SetCheckpoints("job-000001", {first, second});

  EXPECT_EQ(Run({"checkpoints", "job-000001"}), kExitOk);

  ASSERT_THAT(coordinator_.list_checkpoints_requests(), SizeIs(1));
  EXPECT_EQ(coordinator_.list_checkpoints_requests()[0].job_id(), "job-000001");
  std::vector<std::string> lines = Lines(out_.str());
  ASSERT_THAT(lines, SizeIs(3)) << out_.str();
  EXPECT_THAT(Words(lines[0]), ElementsAre("STEP", "COMMITTED", "RANKS", "SIZE", "FILES"));
  EXPECT_THAT(Words(lines[1]),
              ElementsAre("100", "-", "2", "1.5", "MB", "model.pt,train_state.pt"));
  EXPECT_THAT(Words(lines[2]), ElementsAre("200", "-", "4", "1.5", "MB", "model.pt,train_state.pt",
                                           "in", "/shared/job-000001/200"));
}

TEST_F(CommandsTest, CheckpointsOfAJobWithoutAnySaysSo) {
  coordinator_.AddJob(MakeJob("job-000001", "mnist", v1::Job::PENDING, 2, 2));

  EXPECT_EQ(Run({"checkpoints", "job-000001"}), kExitOk);

  EXPECT_EQ(out_.str(), "job-000001 has no checkpoints\n");
}

TEST_F(CommandsTest, CheckpointsOfAnUnknownJobExits1) {
  EXPECT_EQ(Run({"checkpoints", "job-000042"}), kExitFailure);

  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), StartsWith("chorus checkpoints: no job \"job-000042\""));
}

// A file of `size` bytes that differ from offset to offset.
std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  return bytes;
}

TEST_F(CommandsTest, ExportDownloadsTheCheckpointFileToTheOutputPath) {
  const std::string bytes = Pattern(300 << 10);  // several chunks
  coordinator_.SetCheckpointFile("job-000001", 200, ModelFileName(0), bytes);
  const std::string output = absl::StrCat(dir_, "/model.pt");

  EXPECT_EQ(Run({"export", "job-000001", "--step", "200", "-o", output}), kExitOk);

  ASSERT_THAT(coordinator_.downloads(), SizeIs(1));
  const v1::DownloadCheckpointRequest request = coordinator_.downloads()[0];
  EXPECT_EQ(request.job_id(), "job-000001");
  EXPECT_EQ(request.step(), 200);
  EXPECT_EQ(request.file_name(), ModelFileName(0));
  EXPECT_EQ(ReadFile(output), bytes);
  EXPECT_FALSE(std::filesystem::exists(output + ".tmp"));
  EXPECT_EQ(err_.str(), absl::StrCat("chorus export: wrote ", output, " (", bytes.size(),
                                     " bytes; torch.load reads it)\n"));
}

TEST_F(CommandsTest, ExportAsksForTheRanksModelAndTheNewestStepByDefault) {
  coordinator_.SetCheckpointFile("job-000001", 100, ModelFileName(1), "old");
  coordinator_.SetCheckpointFile("job-000001", 300, ModelFileName(1), "newest");
  const std::string output = absl::StrCat(dir_, "/rank1.pt");

  EXPECT_EQ(Run({"export", "job-000001", "--rank", "1", "-o", output}), kExitOk);

  ASSERT_THAT(coordinator_.downloads(), SizeIs(1));
  EXPECT_EQ(coordinator_.downloads()[0].step(), 0);
  EXPECT_EQ(coordinator_.downloads()[0].file_name(), ModelFileName(1));
  EXPECT_EQ(ReadFile(output), "newest");
}

TEST_F(CommandsTest, ExportOfADamagedDownloadWritesNothing) {
  coordinator_.SetCheckpointFile("job-000001", 200, ModelFileName(0), Pattern(1000));
  coordinator_.set_damage_downloads(true);
  const std::string output = absl::StrCat(dir_, "/model.pt");

  EXPECT_EQ(Run({"export", "job-000001", "-o", output}), kExitFailure);

  EXPECT_EQ(err_.str(), "chorus export: checkpoint job-000001 model.pt: a chunk arrived damaged\n");
  EXPECT_FALSE(std::filesystem::exists(output));
  EXPECT_FALSE(std::filesystem::exists(output + ".tmp"));
}

TEST_F(CommandsTest, ExportOfAMissingCheckpointSaysSo) {
  const std::string output = absl::StrCat(dir_, "/model.pt");

  EXPECT_EQ(Run({"export", "job-000001", "--step", "5", "-o", output}), kExitFailure);

  EXPECT_EQ(err_.str(),
            "chorus export: job job-000001 has no checkpoint file model.pt at step 5\n");
  EXPECT_FALSE(std::filesystem::exists(output));
}

// ------------------------------------------------- several coordinators

// A port nothing listens on now (bound, read and closed).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

// During a failover no coordinator of the list may answer for a moment: a
// call waits (within --timeout) for one that does instead of failing at once.
TEST_F(CommandsTest, WithSeveralCoordinatorsACallWaitsForALeaderWithinTheTimeout) {
  const int first = FreePort();
  const int second = FreePort();
  ASSERT_NE(first, 0);
  ASSERT_NE(second, 0);
  const std::string list = absl::StrCat("127.0.0.1:", first, ",127.0.0.1:", second);
  FakeCoordinator late;
  late.AddJob(MakeJob("job-000001", "mnist", v1::Job::RUNNING, 2, 2));
  std::thread elect([&] {
    absl::SleepFor(absl::Milliseconds(700));
    ASSERT_TRUE(late.Start(second).ok());
  });
  EXPECT_EQ(RunAt(list, nullptr, {"jobs", "--timeout", "10"}), kExitOk) << err_.str();
  elect.join();
  EXPECT_THAT(out_.str(), HasSubstr("job-000001"));

  // None answers at all: the call fails after --timeout, naming the list.
  const std::string dead = absl::StrCat("127.0.0.1:", first, ",127.0.0.1:", FreePort());
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunAt(dead, nullptr, {"jobs", "--timeout", "1"}), kExitFailure);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat("coordinators ", dead, ": none leads")));
}

// Note [Why none leads]: while no coordinator can be elected (etcd without
// quorum) a call through the list fails quoting a follower's reason.
TEST_F(CommandsTest, WhenNoneCanLeadTheErrorQuotesAFollowersReason) {
  FakeCoordinator follower;
  ASSERT_TRUE(follower.Start().ok());
  follower.set_health(grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  follower.set_no_leader("no coordinator can lead: etcd at 127.0.0.1:1: range: unreachable or "
                         "no quorum (Deadline Exceeded)");
  const std::string gone = absl::StrCat("127.0.0.1:", FreePort());
  const std::string list = absl::StrCat(gone, ",", follower.address());

  EXPECT_EQ(RunAt(list, nullptr, {"jobs", "--timeout", "1"}), kExitFailure);
  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat("coordinators ", list, ": none leads")));
  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat(
                              follower.address(), " says: no coordinator can lead: etcd at "
                              "127.0.0.1:1: range: unreachable or no quorum")));

  // Coordinators that give no reason (none answers here): none is quoted.
  err_.str("");
  const std::string dead = absl::StrCat(gone, ",127.0.0.1:", FreePort());
  EXPECT_EQ(RunAt(dead, nullptr, {"jobs", "--timeout", "1"}), kExitFailure);
  EXPECT_THAT(err_.str(), HasSubstr("none leads"));
  EXPECT_THAT(err_.str(), Not(HasSubstr("says:")));
}

TEST_F(CommandsTest, ACoordinatorListWithABadEntryIsRefusedNamingIt) {
  EXPECT_NE(RunAt("127.0.0.1:1,127.0.0.1:http", nullptr, {"jobs"}), kExitOk);
  EXPECT_THAT(err_.str(), HasSubstr("entry 2 of \"127.0.0.1:1,127.0.0.1:http\""));
}

TEST_F(CommandsTest, CoordinatorsShowsWhoLeadsWhoFollowsAndWhoIsUnreachable) {
  // coordinator_ leads; `follower` names it; nothing listens at `gone`.
  v1::CoordinatorLeader leader;
  leader.set_id("node-a:42");
  leader.set_address(coordinator_.address());
  leader.set_since_unix_us(absl::ToUnixMicros(absl::FromUnixSeconds(1700000000)));
  coordinator_.set_leader(leader);
  FakeCoordinator follower;
  ASSERT_TRUE(follower.Start().ok());
  follower.set_health(grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  follower.set_follower_of(coordinator_.address());
  const std::string gone = absl::StrCat("127.0.0.1:", FreePort());
  const std::string list = absl::StrCat(coordinator_.address(), ",", follower.address(), ",", gone);

  EXPECT_EQ(RunAt(list, nullptr, {"coordinators", "--timeout", "1"}), kExitOk) << err_.str();
  const std::vector<std::string> lines = Lines(out_.str());
  ASSERT_EQ(lines.size(), 4u) << out_.str();
  EXPECT_THAT(Words(lines[1]), ElementsAre(coordinator_.address(), "leader", coordinator_.address(),
                                           ::testing::_, ::testing::_, "id", "node-a:42"));
  EXPECT_THAT(Words(lines[2]),
              ElementsAre(follower.address(), "follower", coordinator_.address(), "-"));
  EXPECT_THAT(lines[3], StartsWith(gone));
  EXPECT_EQ(Words(lines[3])[1], "unreachable");
  EXPECT_THAT(lines[3], HasSubstr("no answer within 1s"));

  EXPECT_EQ(RunAt(list, nullptr, {"coordinators", "--json", "--timeout", "1"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("\"role\": \"leader\", \"leader\": \"" +
                                    coordinator_.address() + "\", \"id\": \"node-a:42\""));
  EXPECT_THAT(out_.str(), HasSubstr("\"since_unix_us\": 1700000000000000"));
  EXPECT_THAT(out_.str(), HasSubstr("\"role\": \"unreachable\""));

  // No leader: exit 1.
  const std::string leaderless = absl::StrCat(follower.address(), ",", gone);
  EXPECT_EQ(RunAt(leaderless, nullptr, {"coordinators", "--timeout", "1"}), kExitFailure);
}

// ---------------------------------------------------------------- ping

TEST_F(CommandsTest, PingPrintsServing) {
  EXPECT_EQ(Run({"ping"}), kExitOk);

  EXPECT_EQ(coordinator_.health_checks(), 1);
  EXPECT_EQ(out_.str(), absl::StrCat(coordinator_.address(), ": SERVING\n"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, PingJson) {
  EXPECT_EQ(Run({"ping", "--json"}), kExitOk);

  EXPECT_EQ(out_.str(), absl::StrCat("{\"coordinator\": \"", coordinator_.address(),
                                     "\", \"status\": \"SERVING\"}\n"));
}

TEST_F(CommandsTest, PingOfANotServingCoordinatorExits1) {
  coordinator_.set_health(grpc::health::v1::HealthCheckResponse::NOT_SERVING);

  EXPECT_EQ(Run({"ping"}), kExitFailure);

  EXPECT_EQ(out_.str(), absl::StrCat(coordinator_.address(), ": NOT_SERVING\n"));
}

TEST_F(CommandsTest, PingOfNothingGivesUpAtTheTimeoutAndSaysWhatToDo) {
  const auto start = std::chrono::steady_clock::now();

  EXPECT_EQ(RunAt(DeadAddress(), DeadChannel(), {"ping", "--timeout", "0.5"}), kExitFailure);

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // It waits for a connection until the deadline, and no longer.
  EXPECT_GE(seconds, 0.4);
  EXPECT_LT(seconds, 5);
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(), absl::StrCat("chorus ping: no coordinator answered at ", DeadAddress(),
                                     " within 500ms. Start one with `chorus-coordinator`, or "
                                     "pass --coordinator HOST:PORT.\n"));
}

// ---------------------------------------------------------------- whoami

TEST_F(CommandsTest, WhoamiSaysUserAndRoleOrThatThereAreNoTokens) {
  EXPECT_EQ(Run({"whoami"}), kExitOk);
  EXPECT_EQ(out_.str(), "anonymous (admin: this coordinator has no token file)\n");

  v1::WhoAmIResponse alice;
  alice.set_user("alice");
  alice.set_role("user");
  alice.set_tokens_required(true);
  coordinator_.set_whoami(alice);
  out_.str("");
  EXPECT_EQ(Run({"whoami"}), kExitOk);
  EXPECT_EQ(out_.str(), "alice (user)\n");
  out_.str("");
  EXPECT_EQ(Run({"whoami", "--json"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("\"user\": \"alice\""));
  EXPECT_EQ(err_.str(), "");
}

// ---------------------------------------------------------------- validate, version

TEST_F(CommandsTest, ValidatePrintsTheNormalizedSpecWithoutACall) {
  const std::string path = WriteFile("job.textproto", kGoodSpec);

  EXPECT_EQ(Run({"validate", path}), kExitOk);

  EXPECT_EQ(coordinator_.calls(), 0);
  EXPECT_THAT(out_.str(), HasSubstr("name: \"mnist-mlp\""));
  EXPECT_THAT(out_.str(), HasSubstr("bucket_cap_mb: 25"));  // a default filled in
  EXPECT_THAT(err_.str(),
              StartsWith(absl::StrCat("chorus validate: ", path, " is valid (2-4 ranks)\n")));
  // Note [Rank cgroups]: the limits its ranks will run under.
  EXPECT_THAT(err_.str(), HasSubstr(" of memory (the default: twice the estimate plus 1 GiB; set "
                                    "resources.memory_bytes to change it), 4096 processes and "
                                    "threads (resources.max_processes)"));

  const std::string program = WriteFile(
      "program.textproto", "program { argv: '/bin/true' } resources { memory_bytes: 268435456 }");
  err_.str("");
  EXPECT_EQ(Run({"validate", program}), kExitOk);
  EXPECT_THAT(err_.str(), HasSubstr("chorus validate: limits per rank: 256 MiB of memory "
                                    "(resources.memory_bytes), 4096 processes"));
}

// Ranks start elsewhere: relative shard paths (and globs) are made
// absolute against the directory the command runs in, as other data files.
TEST_F(CommandsTest, ValidateMakesRelativeShardPathsAbsolute) {
  const std::string path = WriteFile(
      "shards.textproto",
      "model { mlp {} } data { shards { format: TAR paths: 'data/train-*.tar' num_classes: 10 } "
      "}");
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const char* user_dir = std::getenv("BUILD_WORKING_DIRECTORY");

  EXPECT_EQ(Run({"validate", path}), kExitOk);

  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("paths: \"", user_dir != nullptr ? user_dir : cwd,
                                                 "/data/train-*.tar\"")));
}

// Note [Globs checked here] in validate.cc: a glob that matches nothing on
// this machine is a warning; the spec is still valid.
TEST_F(CommandsTest, ValidateWarnsOfAGlobThatMatchesNothingHere) {
  const std::string dir = absl::StrCat(dir_, "/globs");
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  WriteFile("globs/train-0.tar", "");
  const std::string path = WriteFile(
      "globs.textproto",
      absl::StrCat("model { mlp {} } data { shards { format: TAR paths: ['", dir,
                   "/train-*.tar', '", dir, "/more-*.tar'] eval_paths: '", dir,
                   "/val-?.tar' num_classes: 10 } }"));

  EXPECT_EQ(Run({"validate", "-o", "none", path}), kExitOk);

  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat("chorus validate: ", path, " is valid")));
  EXPECT_THAT(err_.str(), Not(HasSubstr("data.shards.paths[0]")));
  EXPECT_THAT(err_.str(),
              HasSubstr(absl::StrCat("chorus validate: warning: data.shards.paths[1]: \"", dir,
                                     "/more-*.tar\" matches no file on this machine; each rank "
                                     "expands it on its own machine, where it must match (or the "
                                     "job fails naming it)\n")));
  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat("chorus validate: warning: "
                                                 "data.shards.eval_paths[0]: \"",
                                                 dir, "/val-?.tar\" matches no file")));
}

TEST_F(CommandsTest, ValidateJsonIsTheNormalizedSpec) {
  const std::string path = WriteFile("job.textproto", kGoodSpec);
  absl::StatusOr<v1::JobSpec> expected = LoadJobSpec(path);
  ASSERT_TRUE(expected.ok()) << expected.status();

  EXPECT_EQ(Run({"validate", "--output", "json", path}), kExitOk);

  v1::JobSpec printed;
  ASSERT_TRUE(JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_TRUE(MessageDifferencer::Equals(printed, *expected)) << printed.DebugString();
}

TEST_F(CommandsTest, ValidateOfABadSpecNamesEveryFieldAndExits2) {
  const std::string path = WriteFile("bad.yaml", kBadSpec);

  EXPECT_EQ(Run({"validate", path}), kExitBadInput);

  EXPECT_EQ(coordinator_.calls(), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), StartsWith("chorus validate: "));
  EXPECT_THAT(err_.str(), HasSubstr(path));
  EXPECT_THAT(err_.str(), HasSubstr("strategy.ddp.bucket_cap_mb: must be > 0, got -3"));
  EXPECT_THAT(err_.str(), HasSubstr("training.batch_size_per_rank: must be > 0, got -1"));
}

TEST_F(CommandsTest, ValidateAgentsSaysWhichAgentsWouldServeACudaJob) {
  const std::string path = WriteFile(
      "gpu.textproto",
      "model { mlp {} }\ndata { synthetic {} }\n"
      "resources { min_ranks: 2 max_ranks: 2 device: CUDA }\n");
  // Without a GPU agent: it says the job would wait, and how to get one.
  v1::AgentInfo cpu = MakeAgent("agent-1", "node-a", 0);
  cpu.set_device(v1::ResourceSpec::CPU);
  coordinator_.AddAgent(cpu);
  EXPECT_EQ(Run({"validate", "--agents", "-o", "none", path}), kExitOk);
  EXPECT_THAT(err_.str(), HasSubstr("chorus validate: no connected agent offers CUDA slots; "
                                    "submitted, the job would wait PENDING until one does (start "
                                    "chorus-worker --device cuda on such a node)\n"));
  EXPECT_THAT(err_.str(), Not(HasSubstr("agent-1")));

  // GPU agents: the ones that would serve it, and whether 2 ranks fit now.
  err_.str("");
  v1::AgentInfo gpu = MakeAgent("agent-2", "gpu-a", 1);
  gpu.set_device(v1::ResourceSpec::CUDA);
  coordinator_.AddAgent(gpu);
  v1::AgentInfo draining = MakeAgent("agent-3", "gpu-b", 0);
  draining.set_device(v1::ResourceSpec::CUDA);
  draining.set_state(v1::AgentInfo::DRAINING);
  coordinator_.AddAgent(draining);
  EXPECT_EQ(Run({"validate", "--agents", "-o", "none", path}), kExitOk);
  EXPECT_THAT(err_.str(),
              HasSubstr("chorus validate: agent-2 (gpu-a) would serve it: 1 of 2 CUDA slot(s) free\n"));
  EXPECT_THAT(err_.str(), HasSubstr("chorus validate: agent-3 (gpu-b) has 2 CUDA slot(s) but is "
                                    "DRAINING: it takes no new ranks\n"));
  EXPECT_THAT(err_.str(), HasSubstr("chorus validate: 1 free CUDA slot(s) now, fewer than its "
                                    "min_ranks 2; submitted, it would wait PENDING for slots\n"));

  // Enough free slots.
  err_.str("");
  v1::AgentInfo big = MakeAgent("agent-4", "gpu-c", 0);
  big.set_device(v1::ResourceSpec::CUDA);
  coordinator_.AddAgent(big);
  EXPECT_EQ(Run({"validate", "--agents", "-o", "none", path}), kExitOk);
  EXPECT_THAT(err_.str(),
              HasSubstr("chorus validate: its 2 rank(s) fit in the 3 free CUDA slot(s) now\n"));
}

TEST_F(CommandsTest, VersionNamesTheVersionAndApi) {
  EXPECT_EQ(Run({"version"}), kExitOk);

  EXPECT_THAT(out_.str(), StartsWith(absl::StrCat("chorus ", kVersion, " (api ", kApiVersion)));
}

TEST_F(CommandsTest, NoSubcommandIsAUsageError) {
  EXPECT_EQ(Run({}), kExitBadInput);

  EXPECT_THAT(err_.str(), HasSubstr("subcommand"));
  EXPECT_EQ(coordinator_.calls(), 0);
}

}  // namespace
}  // namespace chorus::client
