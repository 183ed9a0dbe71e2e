// GrpcStore, the rendezvous store client, end to end: a real coordinator on
// 127.0.0.1:0, GrpcStore clients, and a Gloo communicator of 3 ranks
// bootstrapped through it. (The service alone is tested in
// coordinator/service/store_service_test.cc.)

#include "worker/comm/grpc_store.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "common/grpc_util.h"
#include "coordinator/service/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/grpc_store_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = MakeCoordinatorChannel(server_->address());
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcStoreTest, SetGetAddAcrossClients) {
  GrpcStore a(channel_, "job-1/gen-0");
  GrpcStore b(MakeCoordinatorChannel(server_->address()), "job-1/gen-0");
  ASSERT_TRUE(a.Set("addr/0", std::string("\0bytes", 6)).ok());
  auto value = b.Get("addr/0", absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("\0bytes", 6));
  EXPECT_EQ(*a.Add("count", 2), 2);
  EXPECT_EQ(*b.Add("count", 5), 7);
  EXPECT_EQ(a.Add("addr/0", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcStoreTest, NamespacesAreIsolated) {
  GrpcStore gen0(channel_, "job-1/gen-0");
  GrpcStore gen1(channel_, "job-1/gen-1");
  ASSERT_TRUE(gen0.Set("k", "old").ok());
  auto missing = gen1.Get("k", absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("\"job-1/gen-1\": these keys were never set: k"));
}

// A coordinator that takes over (a new leader, or a restart on the same
// address) starts with an empty store: ranks waiting in a rendezvous when the
// old one died set their keys again and wait on, instead of failing with
// UNAVAILABLE ("Socket closed").
TEST_F(GrpcStoreTest, RanksWaitingWhenTheCoordinatorIsReplacedSetTheirKeysAgain) {
  const std::string address = server_->address();
  GrpcStore rank0(channel_, "job-1/gen-1");
  GrpcStore rank1(MakeCoordinatorChannel(address), "job-1/gen-1");
  ASSERT_TRUE(rank0.Set("0", "addr0").ok());
  ASSERT_TRUE(rank1.Set("1", "addr1").ok());
  const std::vector<std::string> keys = {"0", "1", "2"};
  absl::Status waited0, waited1;
  std::thread t0([&] { waited0 = rank0.Wait(keys, absl::Now() + absl::Seconds(20)); });
  std::thread t1([&] { waited1 = rank1.Wait(keys, absl::Now() + absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(200));  // both wait for key 2
  server_.reset();
  ServerOptions options;
  options.listen = address;
  options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/grpc_store_replaced";
  auto replaced = CoordinatorServer::Start(options);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  server_ = std::move(*replaced);
  GrpcStore rank2(MakeCoordinatorChannel(address), "job-1/gen-1");
  ASSERT_TRUE(rank2.Set("2", "addr2").ok());
  t0.join();
  t1.join();
  EXPECT_TRUE(waited0.ok()) << waited0;
  EXPECT_TRUE(waited1.ok()) << waited1;
  auto value = rank2.Get("0", absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "addr0");
}

TEST_F(GrpcStoreTest, WaitIsWokenBySetFromAnotherClient) {
  GrpcStore waiter(channel_, "ns");
  GrpcStore setter(MakeCoordinatorChannel(server_->address()), "ns");
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(setter.Set("a", "1").ok());
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(setter.Set("b", "2").ok());
  });
  absl::Time start = absl::Now();
  std::vector<std::string> keys = {"a", "b"};
  absl::Status s = waiter.Wait(keys, absl::Now() + absl::Seconds(20));
  later.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(GrpcStoreTest, WaitDeadlineNamesMissingKeys) {
  GrpcStore store(channel_, "ns");
  ASSERT_TRUE(store.Set("present", "x").ok());
  std::vector<std::string> keys = {"present", "absent1", "absent2"};
  absl::Time start = absl::Now();
  absl::Status s = store.Wait(keys, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("never set: absent1, absent2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(GrpcStoreTest, BadRequestsAreRejected) {
  GrpcStore no_ns(channel_, "");
  EXPECT_EQ(no_ns.Set("k", "v").code(), absl::StatusCode::kInvalidArgument);
  GrpcStore store(channel_, "ns");
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  // Over the coordinator's per-value quota (--store_max_value_bytes).
  EXPECT_EQ(store.Set("huge", std::string((16 << 20) + 1, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(GrpcStoreTest, ShutdownEndsPendingWaits) {
  GrpcStore store(channel_, "ns");
  absl::Status result;
  std::thread waiter([&] {
    std::vector<std::string> keys = {"never"};
    result = store.Wait(keys, absl::Now() + absl::Seconds(3));
  });
  absl::SleepFor(absl::Milliseconds(200));
  absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(100));
  server_->Wait();
  // The server does not wait for the pending call to end on its own.
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The client waits for a coordinator to come back (Note [Store after a
  // takeover]) until its deadline, then fails.
  waiter.join();
  EXPECT_FALSE(result.ok());
}

TEST_F(GrpcStoreTest, GlooCommunicatorOfThreeRanksThroughTheCoordinator) {
  const int n = 3;
  std::vector<std::thread> threads;
  std::vector<float> results(n, 0);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GrpcStore store(MakeCoordinatorChannel(server_->address()), "job-7/gen-0");
      GlooOptions options;
      options.rank = r;
      options.size = n;
      auto comm = CreateGlooCommunicator(options, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      at::Tensor t = at::full({1000}, static_cast<float>(r + 1));
      ASSERT_TRUE((*comm)
                      ->AllReduce(t, ReduceOp::kSum, "via-coordinator")
                      ->Wait(absl::Now() + absl::Seconds(30))
                      .ok());
      results[r] = t[999].item<float>();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(results[r], 6.0f);
}

}  // namespace
}  // namespace chorus
