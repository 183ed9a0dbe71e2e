// What a collective puts on the wire, counted on the loopback device of a
// network namespace of the test's own, where nothing else sends: a ring
// reduce-scatter sends (n - 1) / n of its input from each rank, half of
// what an all-reduce of the same input sends (the chorus backend's
// reduce_scatter was such an all-reduce). Prints the benchmark line of
// docs/benchmarks.md ("Reduce-scatter on the wire").

#include <ATen/ATen.h>
#include <sched.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Bytes sent on `lo` in this thread's network namespace (/proc/self/net/dev:
// "lo: rx_bytes rx_packets ... (8 receive fields) tx_bytes ...").
int64_t LoopbackSentBytes() {
  std::ifstream dev("/proc/self/net/dev");
  std::string line;
  while (std::getline(dev, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.substr(0, colon).find("lo") == std::string::npos) {
      continue;
    }
    std::istringstream fields(line.substr(colon + 1));
    int64_t value = 0;
    for (int i = 0; i < 9; ++i) fields >> value;
    return value;
  }
  return -1;
}

TEST(GlooWireBytesTest, ReduceScatterSendsHalfWhatAnAllReduceSends) {
  if (unshare(CLONE_NEWNET) != 0) {
    GTEST_SKIP() << "a network namespace of its own needs CAP_SYS_ADMIN: " << std::strerror(errno);
  }
  ASSERT_EQ(std::system("ip link set lo up"), 0);
  ASSERT_GE(LoopbackSentBytes(), 0);
  const int n = 4;
  const int64_t count = int64_t{1} << 20;  // 4 MB of float32 per rank
  GlooOptions tcp;
  tcp.shared_memory = false;  // every byte crosses the transport
  int64_t reduce_scatter = 0;
  int64_t all_reduce = 0;
  RunGlooRanks(
      n,
      [&](int rank, Communicator& comm) {
        at::Tensor input = at::ones({count});
        at::Tensor part = at::empty({count / n});
        auto step = [&](const std::shared_ptr<Work>& work) {
          ASSERT_TRUE(work->Wait(In(absl::Seconds(60))).ok());
        };
        step(comm.Barrier("start"));
        const int64_t before = rank == 0 ? LoopbackSentBytes() : 0;
        step(comm.Barrier("measure"));
        step(comm.ReduceScatter(input, part, ReduceOp::kSum, "rs"));
        step(comm.Barrier("after reduce-scatter"));
        const int64_t middle = rank == 0 ? LoopbackSentBytes() : 0;
        step(comm.Barrier("measure"));
        step(comm.AllReduce(input, ReduceOp::kSum, "ar"));
        step(comm.Barrier("after all-reduce"));
        if (rank == 0) {
          reduce_scatter = middle - before;
          all_reduce = LoopbackSentBytes() - middle;
        }
      },
      tcp);
  const double input_bytes = 4.0 * count;
  const double per_rank = static_cast<double>(reduce_scatter) / n / input_bytes;
  // Two barriers and TCP/IP headers (64 KiB loopback frames) add little.
  EXPECT_GE(per_rank, 0.75);
  EXPECT_LE(per_rank, 0.79);
  const double ratio = static_cast<double>(reduce_scatter) / static_cast<double>(all_reduce);
  EXPECT_GE(ratio, 0.48);
  EXPECT_LE(ratio, 0.52);
  std::printf(
      "{\"bench\": \"reduce_scatter_wire_bytes\", \"metric\": \"bytes sent per rank / input "
      "bytes, 4 ranks, 4 MB float32\", \"unit\": \"ratio\", \"ours\": %.4f, \"peer\": %.4f, "
      "\"peer_name\": \"all-reduce of the whole input (the backend's reduce_scatter before)\", "
      "\"ratio\": %.4f}\n",
      per_rank, static_cast<double>(all_reduce) / n / input_bytes, ratio);
}

}  // namespace
}  // namespace chorus
