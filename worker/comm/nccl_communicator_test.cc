// Runs for real only with --config=cuda, a CUDA LibTorch (LIBTORCH_HOME) and
// at least 2 GPUs; otherwise checks that the absence is reported clearly and
// skips, saying why.

#include "worker/comm/nccl_communicator.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <thread>
#include <vector>

#include "common/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Skips the test unless 2 GPUs and a CUDA LibTorch are here.
#define REQUIRE_TWO_GPUS()                                                                       \
  do {                                                                                           \
    absl::StatusOr<int> gpus = CudaDeviceCount();                                                \
    if (!NcclAvailable() || !gpus.ok() || *gpus < 2 || !at::hasCUDA()) {                         \
      GTEST_SKIP() << "NCCL tests need --config=cuda, a CUDA LibTorch and 2 GPUs; here: "        \
                   << "nccl=" << NcclAvailable() << " gpus="                                     \
                   << (gpus.ok() ? std::to_string(*gpus) : std::string(gpus.status().message())) \
                   << " libtorch_cuda=" << at::hasCUDA();                                        \
    }                                                                                            \
  } while (false)

void RunTwoRanks(const std::function<void(int, Communicator&)>& body) {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions options;
      options.rank = r;
      options.size = 2;
      options.device = r;
      options.op_timeout = absl::Seconds(30);
      auto comm = CreateNcclCommunicator(options, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

at::Tensor OnGpu(const at::Tensor& t, int rank) { return t.to(at::Device(at::kCUDA, rank)); }

TEST(NcclCommunicatorTest, WithoutCudaBuildSaysHowToGetIt) {
  if (NcclAvailable()) GTEST_SKIP() << "this build has NCCL";
  MemoryStore store;
  auto comm = CreateNcclCommunicator(NcclOptions(), store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(comm.status().message(), HasSubstr("--config=cuda"));
}

TEST(NcclCommunicatorTest, CollectivesMatchReference) {
  REQUIRE_TWO_GPUS();
  RunTwoRanks([](int rank, Communicator& comm) {
    at::Tensor x = OnGpu(at::arange(1000, at::kFloat) * (rank + 1), rank);
    ASSERT_TRUE(comm.AllReduce(x, ReduceOp::kSum, "sum")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::allclose(x.cpu(), at::arange(1000, at::kFloat) * 3));
    at::Tensor h = OnGpu(at::full({33}, static_cast<float>(rank)), rank).to(at::kBFloat16);
    ASSERT_TRUE(comm.AllReduce(h, ReduceOp::kAvg, "avg")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::allclose(h.cpu().to(at::kFloat), at::full({33}, 0.5f)));
    at::Tensor b = OnGpu(at::full({7}, static_cast<double>(rank + 5)), rank);
    ASSERT_TRUE(comm.Broadcast(b, 1, "bcast")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::equal(b.cpu(), at::full({7}, 6.0, at::kDouble)));
    at::Tensor out = OnGpu(at::zeros({2, 3}, at::kLong), rank);
    ASSERT_TRUE(comm.AllGather(OnGpu(at::full({3}, int64_t{rank}, at::kLong), rank), out, "g")
                    ->Wait(In(absl::Seconds(30)))
                    .ok());
    EXPECT_TRUE(at::equal(out.cpu()[1], at::ones({3}, at::kLong)));
    at::Tensor recv = OnGpu(at::zeros({4}), rank);
    ASSERT_TRUE(comm.SendRecv(OnGpu(at::full({4}, static_cast<float>(rank)), rank), 1 - rank, recv,
                              1 - rank, "swap")
                    ->Wait(In(absl::Seconds(30)))
                    .ok());
    EXPECT_TRUE(at::equal(recv.cpu(), at::full({4}, static_cast<float>(1 - rank))));
    ASSERT_TRUE(comm.Barrier("end")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_EQ(comm.flight_recorder().TakeSnapshot().last_completed_seq, 6);
  });
}

TEST(NcclCommunicatorTest, CpuTensorsAreRefused) {
  REQUIRE_TWO_GPUS();
  RunTwoRanks([](int, Communicator& comm) {
    absl::Status s = comm.AllReduce(at::ones({2}), ReduceOp::kSum, "x")->Wait(In(absl::Seconds(1)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("takes CUDA tensors"));
  });
}

TEST(NcclCommunicatorTest, AbortEndsAnOpThePeerNeverJoins) {
  REQUIRE_TWO_GPUS();
  RunTwoRanks([](int rank, Communicator& comm) {
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(2));
      comm.Abort("test over");
      return;
    }
    at::Tensor x = OnGpu(at::ones({1 << 20}), rank);
    auto work = comm.AllReduce(x, ReduceOp::kSum, "lonely");
    EXPECT_EQ(work->Wait(In(absl::Milliseconds(500))).code(), absl::StatusCode::kDeadlineExceeded);
    absl::Time start = absl::Now();
    comm.Abort("peer never joined");
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_FALSE(work->Wait(In(absl::Seconds(1))).ok());
  });
}

}  // namespace
}  // namespace chorus
