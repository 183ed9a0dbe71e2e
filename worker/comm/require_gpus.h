// Test support for GPU tests: REQUIRE_GPUS skips a test that needs GPUs where
// there are too few, saying what is missing (an NCCL build, a CUDA LibTorch,
// the GPUs themselves); RunNcclRanks runs ranks as threads, one GPU each.
//
// Example:
//   TEST(X, Y) {
//     REQUIRE_GPUS(2);
//     RunNcclRanks(2, [](int rank, Communicator& comm) { ... });
//   }
#ifndef CHORUS_WORKER_COMM_REQUIRE_GPUS_H_
#define CHORUS_WORKER_COMM_REQUIRE_GPUS_H_

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/store.h"

namespace chorus {

// GPUs a test can use: none without NCCL in the build or a CUDA LibTorch.
inline int UsableGpus() {
  if (!NcclAvailable() || !at::hasCUDA()) return 0;
  return static_cast<int>(torch::cuda::device_count());
}

// Runs body(rank, comm) for `n` ranks of one NCCL communicator, rank r in its
// own thread on GPU r, over one in-memory store. Communicators live until
// every body has returned, so a rank that finishes first does not cut its
// peers off.
inline void RunNcclRanks(int n, const std::function<void(int, Communicator&)>& body,
                         absl::Duration op_timeout = absl::Seconds(30)) {
  MemoryStore store;
  std::vector<std::shared_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions options;
      options.rank = r;
      options.size = n;
      options.device = r;
      options.op_timeout = op_timeout;
      auto comm = CreateNcclCommunicator(options, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[r] = *comm;
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace chorus

#define REQUIRE_GPUS(n)                                                                         \
  do {                                                                                          \
    if (::chorus::UsableGpus() < (n)) {                                                         \
      GTEST_SKIP() << "needs an NCCL build (--config=cuda), a CUDA LibTorch and " << (n)        \
                   << " GPU(s); here: nccl=" << ::chorus::NcclAvailable()                       \
                   << " libtorch_cuda=" << at::hasCUDA() << " gpus=" << ::chorus::UsableGpus(); \
    }                                                                                           \
  } while (false)

#endif  // CHORUS_WORKER_COMM_REQUIRE_GPUS_H_
