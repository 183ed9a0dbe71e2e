// Test helper: skips a test that needs GPUs where there are too few, saying
// what is missing (an NCCL build, a CUDA LibTorch, the GPUs themselves).
//
// Example:
//   TEST(X, Y) {
//     REQUIRE_GPUS(2);
//     ...
//   }
#ifndef CHORUS_WORKER_COMM_REQUIRE_GPUS_H_
#define CHORUS_WORKER_COMM_REQUIRE_GPUS_H_

#include <ATen/Context.h>
#include <torch/cuda.h>

#include "gtest/gtest.h"
#include "worker/comm/nccl_communicator.h"

namespace chorus {

// GPUs a test can use: none without NCCL in the build or a CUDA LibTorch.
inline int UsableGpus() {
  if (!NcclAvailable() || !at::hasCUDA()) return 0;
  return static_cast<int>(torch::cuda::device_count());
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
