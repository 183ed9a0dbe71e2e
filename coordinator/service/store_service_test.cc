// StoreService over gRPC with no client library: a real coordinator on
// 127.0.0.1:0 and raw StoreService stubs. (The GrpcStore client and a Gloo
// communicator bootstrapped through the service are tested in
// worker/comm/grpc_store_test.cc.)
#include "coordinator/service/store_service.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/grpc_util.h"
#include "coordinator/service/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

class StoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/store_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = NewStub();
  }

  std::unique_ptr<v1::StoreService::Stub> NewStub() {
    return v1::StoreService::NewStub(MakeCoordinatorChannel(server_->address()));
  }

  static void Bound(grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  grpc::Status Set(v1::StoreService::Stub& stub, const std::string& ns, const std::string& key,
                   const std::string& value) {
    v1::StoreSetRequest request;
    request.set_ns(ns);
    request.set_key(key);
    request.set_value(value);
    v1::StoreSetResponse response;
    grpc::ClientContext context;
    Bound(context);
    return stub.Set(&context, request, &response);
  }

  grpc::Status Get(v1::StoreService::Stub& stub, const std::string& ns, const std::string& key,
                   double wait_seconds, std::string* value) {
    v1::StoreGetRequest request;
    request.set_ns(ns);
    request.set_key(key);
    request.set_wait_seconds(wait_seconds);
    v1::StoreGetResponse response;
    grpc::ClientContext context;
    Bound(context);
    grpc::Status status = stub.Get(&context, request, &response);
    *value = response.value();
    return status;
  }

  grpc::Status Add(v1::StoreService::Stub& stub, const std::string& ns, const std::string& key,
                   int64_t delta, int64_t* value) {
    v1::StoreAddRequest request;
    request.set_ns(ns);
    request.set_key(key);
    request.set_delta(delta);
    v1::StoreAddResponse response;
    grpc::ClientContext context;
    Bound(context);
    grpc::Status status = stub.Add(&context, request, &response);
    *value = response.value();
    return status;
  }

  grpc::Status Wait(v1::StoreService::Stub& stub, const std::string& ns,
                    const std::vector<std::string>& keys, double wait_seconds) {
    v1::StoreWaitRequest request;
    request.set_ns(ns);
    for (const std::string& key : keys) request.add_keys(key);
    request.set_wait_seconds(wait_seconds);
    v1::StoreWaitResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub.Wait(&context, request, &response);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

TEST_F(StoreServiceTest, SetGetAddAcrossClients) {
  std::unique_ptr<v1::StoreService::Stub> other = NewStub();
  ASSERT_TRUE(Set(*stub_, "job-1/gen-0", "addr/0", std::string("\0bytes", 6)).ok());
  std::string value;
  grpc::Status got = Get(*other, "job-1/gen-0", "addr/0", 5, &value);
  ASSERT_TRUE(got.ok()) << got.error_message();
  EXPECT_EQ(value, std::string("\0bytes", 6));
  int64_t count = 0;
  ASSERT_TRUE(Add(*stub_, "job-1/gen-0", "count", 2, &count).ok());
  EXPECT_EQ(count, 2);
  ASSERT_TRUE(Add(*other, "job-1/gen-0", "count", 5, &count).ok());
  EXPECT_EQ(count, 7);
  EXPECT_EQ(Add(*stub_, "job-1/gen-0", "addr/0", 1, &count).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(StoreServiceTest, NamespacesAreIsolated) {
  ASSERT_TRUE(Set(*stub_, "job-1/gen-0", "k", "old").ok());
  std::string value;
  grpc::Status missing = Get(*stub_, "job-1/gen-1", "k", 0.2, &value);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(missing.error_message(), HasSubstr("\"job-1/gen-1\": these keys were never set: k"));
}

TEST_F(StoreServiceTest, WaitIsWokenBySetFromAnotherClient) {
  std::unique_ptr<v1::StoreService::Stub> setter = NewStub();
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(Set(*setter, "ns", "a", "1").ok());
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(Set(*setter, "ns", "b", "2").ok());
  });
  const absl::Time start = absl::Now();
  grpc::Status s = Wait(*stub_, "ns", {"a", "b"}, 20);
  later.join();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(StoreServiceTest, WaitDeadlineNamesMissingKeys) {
  ASSERT_TRUE(Set(*stub_, "ns", "present", "x").ok());
  const absl::Time start = absl::Now();
  grpc::Status s = Wait(*stub_, "ns", {"present", "absent1", "absent2"}, 0.3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(s.error_message(), HasSubstr("never set: absent1, absent2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(StoreServiceTest, BadRequestsAreRejected) {
  EXPECT_EQ(Set(*stub_, "", "k", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Set(*stub_, "ns", "", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Over the per-value quota (--store_max_value_bytes).
  EXPECT_EQ(Set(*stub_, "ns", "huge", std::string((16 << 20) + 1, 'x')).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(StoreServiceTest, ShutdownEndsPendingWaits) {
  grpc::Status result;
  std::thread waiter([&] { result = Wait(*stub_, "ns", {"never"}, 60); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(100));
  server_->Wait();
  waiter.join();
  EXPECT_FALSE(result.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace chorus
