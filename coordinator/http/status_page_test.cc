#include "coordinator/http/status_page.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// What the page embeds in <script id="initial">, as the browser's parser
// hands it to JSON.parse (the element ends at the first "</script").
std::string EmbeddedScript(const std::string& html) {
  const std::string open = "<script id=\"initial\" type=\"application/json\">";
  const size_t begin = html.find(open);
  if (begin == std::string::npos) return "";
  const size_t from = begin + open.size();
  return html.substr(from, html.find("</script", from) - from);
}

// The "job_id" field of the embedded JSON, or why it does not parse. (A
// message without map fields: under --config=tsan, Debian's shared
// libprotobuf crashes on the statically linked generated map code.)
std::string EmbeddedText(const std::string& html) {
  v1::GetJobRequest parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(EmbeddedScript(html), &parsed);
  if (!status.ok()) return "invalid JSON: " + status.ToString();
  return parsed.job_id();
}

class StatusPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/page_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    state_ = *StateStore::Open(dir);
    jobs_ = *JobManager::Create(*state_, &clock_);
    SchedulerOptions options{"127.0.0.1:1"};
    options.metrics = &metrics_;
    scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, std::move(options));
  }

  // A 2-rank job on one agent, both ranks joined.
  std::string StartTwoRankJob(const std::string& name) {
    auto spec = ParseJobSpec(absl::StrCat("name: '", name,
                                          "' model { mlp {} } data { synthetic {} } resources "
                                          "{ min_ranks: 2 max_ranks: 2 }"),
                             SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    const std::string job = jobs_->Submit(*spec, "", "alice")->job_id();
    v1::AgentHello hello;
    hello.set_host("node-a");
    hello.set_slots(2);
    agent_ = *scheduler_->AddAgent(hello, [](const v1::CoordinatorMessage&) {});
    clock_.Advance(absl::Milliseconds(1500));
    for (int slot = 0; slot < 2; ++slot) {
      v1::JoinRequest join;
      join.set_job_id(job);
      join.set_generation(1);
      join.set_agent_id(agent_);
      join.set_slot(slot);
      scheduler_->Join(join, clock_.Now() + absl::Seconds(60), [](auto) {});
    }
    return job;
  }

  void Heartbeat(const std::string& job, int rank, int64_t step, double compute, double wait) {
    v1::RankHeartbeat hb;
    hb.set_job_id(job);
    hb.set_generation(1);
    hb.set_rank(rank);
    hb.set_step(step);
    hb.set_phase(v1::FORWARD);
    hb.mutable_timings()->set_step_seconds(compute + wait);
    hb.mutable_timings()->set_compute_seconds(compute);
    hb.mutable_timings()->set_comm_wait_seconds(wait);
    ASSERT_TRUE(scheduler_->Heartbeat(hb));
  }

  StatusPageSources Sources() { return {jobs_.get(), scheduler_.get(), nullptr}; }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  CoordinatorMetrics metrics_;
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::string agent_;
};

TEST_F(StatusPageTest, JobPageCarriesRanksDiagnosesHistoryAndEvents) {
  const std::string job = StartTwoRankJob("page");
  Heartbeat(job, 0, 20, 0.01, 0.2);
  Heartbeat(job, 1, 20, 0.21, 0.0);
  for (int step : {5, 10}) {
    v1::ReportRequest report;
    report.set_job_id(job);
    report.set_generation(1);
    report.set_rank(0);
    report.mutable_metrics()->set_step(step);
    report.mutable_metrics()->set_loss(2.5 - step / 10.0);
    report.mutable_metrics()->set_samples_per_second(640);
    ASSERT_TRUE(scheduler_->Report(report).ok());
  }
  scheduler_->Tick();  // the STRAGGLER diagnosis becomes an event

  absl::StatusOr<std::string> json = JobPageJson(Sources(), job, clock_.Now());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"job_id\":\"" + job + "\""));
  EXPECT_THAT(*json, HasSubstr("\"state\":\"RUNNING\""));
  EXPECT_THAT(*json, HasSubstr("\"caused_wait_seconds\":0.2"));
  EXPECT_THAT(*json, HasSubstr("\"kind\":\"STRAGGLER\""));
  EXPECT_THAT(*json, HasSubstr("{\"step\":5,"));
  EXPECT_THAT(*json, HasSubstr("\"loss\":1.500000"));
  EXPECT_THAT(*json, HasSubstr("\"samples_per_second\":640.00"));
  EXPECT_THAT(*json, HasSubstr("diagnosis: STRAGGLER rank 1 computes for"));
  EXPECT_THAT(*json, HasSubstr("state RUNNING"));
  EXPECT_THAT(*json, Not(HasSubstr("synthetic"))) << "the spec stays out of the page";

  const std::string list = JobListJson(Sources(), clock_.Now());
  EXPECT_THAT(list, HasSubstr("{\"job_id\":\"" + job +
                              "\",\"name\":\"page\",\"owner\":\"alice\",\"state\":\"RUNNING\""));
  EXPECT_THAT(list, HasSubstr("\"step\":20,"));
  EXPECT_THAT(list, HasSubstr("\"diagnoses\":1,"));

  // The scheduler counted the generation, its rendezvous and the diagnosis.
  const std::string text = metrics_.Render({});
  EXPECT_THAT(text, HasSubstr("chorus_generations_total{cause=\"start\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rendezvous_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_rendezvous_seconds_sum 1.5\n"));
  EXPECT_THAT(text, HasSubstr("chorus_diagnoses_total{kind=\"STRAGGLER\"} 1\n"));
}

TEST_F(StatusPageTest, JobListCarriesTheQueueAndTheUsers) {
  StartTwoRankJob("page");
  // Both slots are held: bob's job waits and holds the CPU reservation, the
  // anonymous one waits behind it.
  auto spec =
      ParseJobSpec("name: 'next' model { mlp {} } data { synthetic {} } resources { min_ranks: 2 }",
                   SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string bobs = jobs_->Submit(*spec, "", "bob")->job_id();
  const std::string anonymous = jobs_->Submit(*spec, "", "")->job_id();
  clock_.Advance(absl::Seconds(10));
  scheduler_->Schedule();

  const std::string list = JobListJson(Sources(), clock_.Now());
  EXPECT_THAT(list,
              HasSubstr("\"queue\":[{\"position\":1,\"job_id\":\"" + bobs +
                        "\",\"name\":\"next\",\"owner\":\"bob\",\"priority\":\"NORMAL\","
                        "\"min_ranks\":2,\"device\":\"CPU\",\"reason\":\"waiting for 2 free"));
  EXPECT_THAT(list, HasSubstr("(reservation): only a HIGH job can come before it\","
                              "\"holds_reservation\":true}"));
  EXPECT_THAT(list, HasSubstr("{\"position\":2,\"job_id\":\"" + anonymous + "\""));
  EXPECT_THAT(list, HasSubstr("behind " + bobs));
  EXPECT_THAT(list, HasSubstr("\"holds_reservation\":false}]"));
  EXPECT_THAT(list, HasSubstr("\"users\":[{\"user\":\"\",\"slots\":{},\"running_jobs\":0,"
                              "\"queued_jobs\":1,"));
  // alice's 2 slots for 10 s count into her fair share.
  EXPECT_THAT(list, HasSubstr("{\"user\":\"alice\",\"slots\":{\"CPU\":2},\"running_jobs\":1,"
                              "\"queued_jobs\":0,\"fair_share_slot_seconds\":"));
  EXPECT_THAT(list, HasSubstr("{\"user\":\"bob\",\"slots\":{},\"running_jobs\":0,"
                              "\"queued_jobs\":1,\"fair_share_slot_seconds\":0.0}"));

  // /metrics reads the same snapshot.
  ClusterSnapshot snapshot;
  scheduler_->reads().Snapshot(snapshot);
  const std::string text = metrics_.Render(snapshot);
  EXPECT_THAT(text, HasSubstr("chorus_user_slots{device=\"CPU\",user=\"alice\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_user_jobs{state=\"queued\",user=\"anonymous\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_queued_jobs{reason=\"free_slots\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_queued_jobs{reason=\"reservation\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("chorus_queued_jobs{reason=\"quota\"} 0\n"));
}

TEST_F(StatusPageTest, UnknownJobIsNotFoundAndInlineJsonCannotEndTheScript) {
  EXPECT_EQ(JobPageJson(Sources(), "job-999999", clock_.Now()).status().code(),
            absl::StatusCode::kNotFound);
  const std::string html = JobPageHtml("job-1", "{\"job_id\":\"</script><script>alert(1)\"}");
  EXPECT_THAT(html, Not(HasSubstr("</script><script>alert")));
  EXPECT_EQ(EmbeddedText(html), "</script><script>alert(1)");
  EXPECT_THAT(html, HasSubstr("data-job=\"job-1\""));
  EXPECT_THAT(JobPageHtml("a\"<b", "{}"), HasSubstr("data-job=\"a&quot;&lt;b\""));
  EXPECT_THAT(NotFoundHtml("no job <x>"), HasSubstr("no job &lt;x&gt;"));
  EXPECT_THAT(kUplotJs, HasSubstr("uPlot")) << "the charting library is embedded";
  EXPECT_THAT(kStatusPageJs, HasSubstr("renderJob"));
}

// A job whose last output line is an HTML comment (or holds "<!--" anywhere)
// once made the embedded JSON invalid, and the page never rendered.
TEST_F(StatusPageTest, PageJsonStaysValidJsonWhateverTheJobPrinted) {
  for (const std::string text :
       {"<!-- done -->", "a <!--b--> & c", "<\\!-- x", "</SCRIPT >", "<<!--!-->>", "\\<&amp;>"}) {
    const std::string json = absl::StrCat("{\"job_id\":", JsonString(text), "}");
    for (const std::string& html : {JobPageHtml("job-1", json), JobListHtml(json)}) {
      const std::string script = EmbeddedScript(html);
      EXPECT_THAT(script, Not(HasSubstr("<"))) << text;
      EXPECT_EQ(EmbeddedText(html), text) << "JSON in the page: " << script;
    }
  }
}

}  // namespace
}  // namespace chorus
