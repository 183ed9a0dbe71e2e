#include "chorus/metrics.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// The coordinator's Report, recording what it is sent.
class FakeRanks : public v1::RankService::Service {
 public:
  grpc::Status Report(grpc::ServerContext*, const v1::ReportRequest* request,
                      v1::ReportResponse*) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*request);
    return refuse_
               ? grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job-000001 is not running")
               : grpc::Status::OK;
  }
  std::vector<v1::ReportRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  void Refuse() {
    absl::MutexLock lock(&mu_);
    refuse_ = true;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::ReportRequest> requests_ ABSL_GUARDED_BY(mu_);
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
};

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&ranks_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override { server_->Shutdown(); }

  FakeRanks ranks_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(MetricsTest, ReportsAreNeverFinal) {
  MetricsReporter metrics(channel_, "job-000001", /*generation=*/2, /*rank=*/1);
  v1::Metrics m;
  m.set_step(100);
  m.set_loss(0.25);
  (*m.mutable_values())["episode_return"] = -3.5;
  ASSERT_TRUE(metrics.Report(m).ok());
  std::vector<v1::ReportRequest> got = ranks_.requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job_id(), "job-000001");
  EXPECT_EQ(got[0].generation(), 2);
  EXPECT_EQ(got[0].rank(), 1);
  EXPECT_FALSE(got[0].final());
  EXPECT_EQ(got[0].metrics().step(), 100);
  EXPECT_DOUBLE_EQ(got[0].metrics().loss(), 0.25);
  EXPECT_DOUBLE_EQ(got[0].metrics().values().at("episode_return"), -3.5);
}

TEST_F(MetricsTest, RefusalKeepsItsCodeAndNamesTheStep) {
  ranks_.Refuse();
  MetricsReporter metrics(channel_, "job-000001", 1, 0);
  v1::Metrics m;
  m.set_step(7);
  absl::Status s = metrics.Report(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "reporting metrics of step 7 to the coordinator: job-000001 is not running");
}

TEST_F(MetricsTest, UnreachableCoordinatorCostsAtMostTheTimeout) {
  server_->Shutdown();
  MetricsReporter metrics(channel_, "job-000001", 1, 0, absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::Status s = metrics.Report(v1::Metrics());
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace chorus
