#include "client/up_json.h"

#include <cmath>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace chorus::client {
namespace {

google::protobuf::Struct Parse(const std::string& line) {
  google::protobuf::Struct parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(line, &parsed);
  EXPECT_TRUE(status.ok()) << line << ": " << status.ToString();
  return parsed;
}

v1::Job FinishedJob() {
  v1::Job job;
  job.set_job_id("job-000001");
  job.set_state(v1::Job::SUCCEEDED);
  job.set_reason("all ranks finished");
  v1::Metrics* m = job.mutable_latest_metrics();
  m->set_step(200);
  m->set_eval_accuracy(0.8123);
  m->set_eval_loss(0.5);
  m->set_loss(0.25);
  m->set_samples_per_second(1234.5);
  (*m->mutable_values())["wall_seconds"] = 12.25;
  return job;
}

TEST(UpJsonLineTest, KeepsItsLayout) {
  EXPECT_EQ(
      UpJsonLine(FinishedJob()),
      "{\"job_id\": \"job-000001\", \"state\": \"SUCCEEDED\", \"reason\": \"all ranks finished\", "
      "\"final_metrics\": {\"test_accuracy\": 0.812300, \"test_loss\": 0.500000, \"train_loss\": "
      "0.250000, "
      "\"steps\": 200, \"samples_per_second\": 1234.50, \"wall_seconds\": 12.250}}");
}

TEST(UpJsonLineTest, AddsTheRanksPeakMemoryWhenMeasured) {
  v1::Job job = FinishedJob();
  (*job.mutable_latest_metrics()->mutable_values())["peak_rss_bytes"] = 3049930752;
  EXPECT_EQ(UpJsonLine(job),
            "{\"job_id\": \"job-000001\", \"state\": \"SUCCEEDED\", \"reason\": \"all ranks "
            "finished\", \"final_metrics\": {\"test_accuracy\": 0.812300, \"test_loss\": 0.500000, "
            "\"train_loss\": 0.250000, \"steps\": 200, \"samples_per_second\": 1234.50, "
            "\"wall_seconds\": 12.250, \"peak_rss_bytes\": 3049930752}}");
}

TEST(UpJsonLineTest, AReasonWithQuotesBackslashNewlineApostropheAndUtf8IsValidJson) {
  v1::Job job = FinishedJob();
  job.set_state(v1::Job::FAILED);
  const std::string reason =
      "rank 1 exited 1: can't load \"C:\\model.pt\"\nRuntimeError: caf\xc3\xa9 \xe2\x9c\x97";
  job.set_reason(reason);
  job.mutable_latest_metrics()->set_eval_loss(std::nan(""));
  const google::protobuf::Struct parsed = Parse(UpJsonLine(job));
  EXPECT_EQ(parsed.fields().at("job_id").string_value(), "job-000001");
  EXPECT_EQ(parsed.fields().at("state").string_value(), "FAILED");
  EXPECT_EQ(parsed.fields().at("reason").string_value(), reason);
  const auto& metrics = parsed.fields().at("final_metrics").struct_value().fields();
  EXPECT_EQ(metrics.at("test_loss").kind_case(), google::protobuf::Value::kNullValue);
  EXPECT_DOUBLE_EQ(metrics.at("test_accuracy").number_value(), 0.8123);
  EXPECT_DOUBLE_EQ(metrics.at("steps").number_value(), 200);
  EXPECT_DOUBLE_EQ(metrics.at("wall_seconds").number_value(), 12.25);
}

TEST(UpJsonLineTest, IllFormedUtf8InTheReasonStillParses) {
  v1::Job job = FinishedJob();
  job.set_reason("stderr: \xff\xfe binary");
  EXPECT_EQ(Parse(UpJsonLine(job)).fields().at("reason").string_value(),
            "stderr: \xef\xbf\xbd\xef\xbf\xbd binary");
}

TEST(UpJsonLineTest, MissingMetricsAreZero) {
  v1::Job job;
  job.set_job_id("job-000002");
  job.set_state(v1::Job::CANCELLED);
  const google::protobuf::Struct parsed = Parse(UpJsonLine(job));
  const auto& metrics = parsed.fields().at("final_metrics").struct_value().fields();
  EXPECT_DOUBLE_EQ(metrics.at("wall_seconds").number_value(), 0);
  EXPECT_DOUBLE_EQ(metrics.at("steps").number_value(), 0);
  // Not evaluated (eval.disabled, no test split): null, not a zero that
  // reads as a result.
  EXPECT_EQ(metrics.at("test_accuracy").kind_case(), google::protobuf::Value::kNullValue);
  EXPECT_EQ(metrics.at("test_loss").kind_case(), google::protobuf::Value::kNullValue);
}

TEST(UpJsonLineTest, WithoutItsOwnWallSecondsAJobHasItsStartToEnd) {
  v1::Job job = FinishedJob();
  job.mutable_latest_metrics()->mutable_values()->clear();
  job.set_start_time_us(1'000'000);
  job.set_end_time_us(3'500'000);
  const google::protobuf::Struct parsed = Parse(UpJsonLine(job));
  const auto& metrics = parsed.fields().at("final_metrics").struct_value().fields();
  EXPECT_DOUBLE_EQ(metrics.at("wall_seconds").number_value(), 2.5);
}

TEST(UpJsonLineTest, AProgramThatReportedNothingClaimsNoMetrics) {
  v1::Job job;
  job.set_job_id("job-000003");
  job.set_state(v1::Job::SUCCEEDED);
  job.mutable_spec()->mutable_program()->add_argv("/bin/true");
  job.set_start_time_us(1'000'000);
  job.set_end_time_us(1'250'000);
  EXPECT_EQ(UpJsonLine(job),
            "{\"job_id\": \"job-000003\", \"state\": \"SUCCEEDED\", \"reason\": \"\", "
            "\"final_metrics\": {\"wall_seconds\": 0.250}}");
  job.set_start_time_us(0);  // cancelled before it started
  EXPECT_EQ(Parse(UpJsonLine(job)).fields().at("final_metrics").struct_value().fields_size(), 0);
}

TEST(UpJsonLineTest, AProgramShowsWhatItReported) {
  v1::Job job;
  job.set_job_id("job-000004");
  job.set_state(v1::Job::SUCCEEDED);
  job.mutable_spec()->mutable_program()->add_argv("/bin/true");
  job.mutable_latest_metrics()->set_step(40);
  job.mutable_latest_metrics()->set_eval_accuracy(0.875);
  job.set_start_time_us(1'000'000);
  job.set_end_time_us(2'000'000);
  EXPECT_EQ(UpJsonLine(job),
            "{\"job_id\": \"job-000004\", \"state\": \"SUCCEEDED\", \"reason\": \"\", "
            "\"final_metrics\": {\"test_accuracy\": 0.875000, \"steps\": 40, \"wall_seconds\": "
            "1.000}}");
}

}  // namespace
}  // namespace chorus::client
