#include "worker/comm/gloo_communicator.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/machine_facts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Rank r's input: small integers, exact in every dtype we test.
at::Tensor Input(int rank, int64_t n, at::ScalarType dtype) {
  at::Tensor i = at::arange(n, at::kDouble);
  return (at::fmod(i * (rank + 1), 13) - 3 * rank).to(dtype);
}

at::Tensor Reference(int ranks, int64_t n, ReduceOp op) {
  at::Tensor acc = Input(0, n, at::kDouble);
  for (int r = 1; r < ranks; ++r) {
    at::Tensor x = Input(r, n, at::kDouble);
    if (op == ReduceOp::kMin) {
      acc = at::minimum(acc, x);
    } else if (op == ReduceOp::kMax) {
      acc = at::maximum(acc, x);
    } else {
      acc = acc + x;
    }
  }
  if (op == ReduceOp::kAvg) acc = acc / ranks;
  return acc;
}

// How the ranks of a test all-reduce: the TCP ring, shared memory staging
// every tensor, or shared memory with even ranks' tensors in NewBuffer
// memory (reduced in place) and odd ranks' staged.
enum class Transport { kTcp, kShm, kShmBuffers };

GlooOptions WithTransport(Transport transport) {
  GlooOptions options;
  options.shared_memory = transport != Transport::kTcp;
  // These cases test one path each; MeasuredTransport* test the choice.
  options.measure_transport = false;
  // Small segments, so that the larger sizes below take several.
  options.shm_segment_bytes = 4096;
  return options;
}

std::string TransportName(Transport t) {
  switch (t) {
    case Transport::kTcp:
      return "Tcp";
    case Transport::kShm:
      return "Shm";
    case Transport::kShmBuffers:
      return "ShmBuffers";
  }
  return "";
}

class AllReduceTest : public ::testing::TestWithParam<std::tuple<int, Transport>> {};

TEST_P(AllReduceTest, EveryOpDtypeAndSizeMatchesReference) {
  const auto [n, transport] = GetParam();
  const std::vector<at::ScalarType> dtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                              at::kBFloat16, at::kInt,    at::kLong};
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                     ReduceOp::kMax};
  const std::vector<int64_t> sizes = {0, 1, 7, 1001, 5000};
  RunGlooRanks(
      n,
      [&](int rank, Communicator& comm) {
        for (at::ScalarType dtype : dtypes) {
          for (ReduceOp op : ops) {
            const bool integral = dtype == at::kInt || dtype == at::kLong;
            if (integral && op == ReduceOp::kAvg) continue;
            for (int64_t size : sizes) {
              at::Tensor t = Input(rank, size, dtype);
              if (transport == Transport::kShmBuffers && rank % 2 == 0) {
                t = comm.NewBuffer(size, at::TensorOptions().dtype(dtype)).copy_(t);
              }
              absl::Status s = comm.AllReduce(t, op, "test")->Wait(In(absl::Seconds(30)));
              ASSERT_TRUE(s.ok()) << s;
              at::Tensor want = Reference(n, size, op);
              const double tol = (op == ReduceOp::kAvg && dtype == at::kBFloat16) ? 0.1
                                 : (op == ReduceOp::kAvg && dtype == at::kHalf)   ? 0.02
                                                                                  : 1e-6;
              EXPECT_TRUE(at::allclose(t.to(at::kDouble), want, 0, tol))
                  << "rank " << rank << " of " << n << " " << c10::toString(dtype) << " "
                  << ReduceOpName(op) << " size " << size;
            }
          }
        }
      },
      WithTransport(transport));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(Transport::kTcp, Transport::kShm,
                                                              Transport::kShmBuffers)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Transport>>& info) {
                           return absl::StrCat(std::get<0>(info.param), "Ranks",
                                               TransportName(std::get<1>(info.param)));
                         });

// Where `p` lies in this process's memory map ("" if in no file mapping).
std::string MappingOf(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    if (addr >= lo && addr < hi) {
      const size_t slash = line.find('/');
      return slash == std::string::npos ? "" : line.substr(slash);
    }
  }
  return "";
}

// Names this process left in /dev/shm.
std::vector<std::string> OwnShmNames() {
  std::vector<std::string> names;
  const std::string prefix = absl::StrCat("chorus-", getpid(), "-");
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) names.push_back(e->d_name);
  }
  closedir(dir);
  return names;
}

TEST(GlooCommunicatorTest, SameHostRanksShareMemoryAndLeaveNoNamesBehind) {
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    // DDP's buckets: shared memory, mapped from an already unlinked name.
    at::Tensor bucket = comm.NewBuffer(1 << 20, at::kFloat).fill_(static_cast<float>(rank + 1));
    EXPECT_THAT(MappingOf(bucket.data_ptr()), HasSubstr("/dev/shm/chorus-"));
    EXPECT_THAT(MappingOf(bucket.data_ptr()), HasSubstr("(deleted)"));
    ASSERT_TRUE(comm.AllReduce(bucket, ReduceOp::kAvg, "b")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::equal(bucket, at::full({1 << 20}, 2.0f)));
    EXPECT_THAT(OwnShmNames(), ::testing::IsEmpty());
  });
  GlooOptions tcp;
  tcp.shared_memory = false;
  RunGlooRanks(
      2,
      [&](int rank, Communicator& comm) {
        at::Tensor bucket = comm.NewBuffer(1 << 20, at::kFloat);
        EXPECT_EQ(MappingOf(bucket.data_ptr()).find("/dev/shm"), std::string::npos);
      },
      tcp);
}

TEST(GlooCommunicatorTest, MeasuredTransportIsTheSameOnEveryRankAndExact) {
  for (int n : {2, 3}) {
    absl::Mutex mu;
    std::vector<std::string> decisions;
    GlooOptions options;
    options.on_transport_decision = [&](const std::string& line) {
      absl::MutexLock lock(&mu);
      decisions.push_back(line);
    };
    constexpr int64_t kCount = 64 << 10;  // 256 KiB of float32
    RunGlooRanks(
        n,
        [&](int rank, Communicator& comm) {
          at::Tensor bucket = comm.NewBuffer(kCount, at::kFloat);
          for (int i = 0; i < 10; ++i) {
            // Alternately ordinary memory (staged) and the rank's arena.
            at::Tensor t = i % 2 == 0 ? at::full({kCount}, static_cast<float>(rank + i))
                                      : bucket.fill_(static_cast<float>(rank + i));
            ASSERT_TRUE(comm.AllReduce(t, ReduceOp::kSum, "m")->Wait(In(absl::Seconds(30))).ok());
            const float want = static_cast<float>(n * (n - 1) / 2 + n * i);
            ASSERT_TRUE(at::equal(t, at::full({kCount}, want))) << "rank " << rank << " op " << i;
          }
        },
        options);
    ASSERT_EQ(decisions.size(), static_cast<size_t>(n)) << "one decision per rank";
    const bool shm = absl::StrContains(decisions[0], "using shared memory");
    for (const std::string& line : decisions) {
      EXPECT_THAT(line, HasSubstr("all-reduces of 256 KiB to 512 KiB"));
      EXPECT_EQ(absl::StrContains(line, "using shared memory"), shm) << line;
      // Every rank decided from the same agreed timings.
      EXPECT_EQ(line.substr(line.find(':')), decisions[0].substr(decisions[0].find(':')));
    }
  }
}

// Page faults allowed in a steady-state window: a few from allocator
// bookkeeping; AddressSanitizer's shadow memory and quarantine add some.
// Churn would be thousands (a 4 MiB buffer is 1024 pages).
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kFaultSlack = 128;
#else
constexpr int64_t kFaultSlack = 16;
#endif

// Steady state: once buffers and connections exist, an all-reduce maps no
// new memory, through shared memory (staged or in the arena) or TCP.
TEST(GlooCommunicatorTest, SteadyStateAllReducesTakeNoPageFaults) {
  if (!kPageFaultCountsAreMeaningful) GTEST_SKIP() << "ThreadSanitizer's shadow memory faults too";

  for (bool measure : {false, true}) {
    GlooOptions options;
    options.measure_transport = measure;
    options.shm_segment_bytes = 1 << 20;  // 4 MiB ops take several segments
    constexpr int64_t kCount = 1 << 20;
    constexpr int kOps = 20;
    std::atomic<int64_t> faults{-1};
    RunGlooRanks(
        2,
        [&](int rank, Communicator& comm) {
          at::Tensor staged = at::ones({kCount});
          at::Tensor bucket = comm.NewBuffer(kCount, at::kFloat).fill_(1.0f);
          auto step = [&] {
            for (at::Tensor& t : {std::ref(staged), std::ref(bucket)}) {
              ASSERT_TRUE(comm.AllReduce(t, ReduceOp::kAvg, "s")->Wait(In(absl::Seconds(30))).ok());
            }
          };
          for (int i = 0; i < 8; ++i) step();  // warm-up, and the tuner's samples
          ASSERT_TRUE(comm.Barrier("before")->Wait(In(absl::Seconds(30))).ok());
          const int64_t before = MinorPageFaults();
          for (int i = 0; i < kOps; ++i) step();
          ASSERT_TRUE(comm.Barrier("after")->Wait(In(absl::Seconds(30))).ok());
          if (rank == 0) faults = MinorPageFaults() - before;
          // Checking allocates: only once rank 0 has counted.
          ASSERT_TRUE(comm.Barrier("counted")->Wait(In(absl::Seconds(30))).ok());
          EXPECT_TRUE(at::equal(staged, at::ones({kCount})));
          EXPECT_TRUE(at::equal(bucket, at::ones({kCount})));
        },
        options);
    // This process holds both ranks: 2 x 2 x kOps all-reduces of 4 MiB
    // (1024 pages each). A few faults may come from allocator bookkeeping.
    EXPECT_LE(faults.load(), kFaultSlack) << (measure ? "measured transport" : "shared memory");
  }
}

// A buffer freed and allocated again (DDP rebuilt, say) reuses pages that are
// still mapped in this rank and in its peers.
TEST(GlooCommunicatorTest, ArenaBuffersAllocatedAgainTakeNoPageFaults) {
  if (!kPageFaultCountsAreMeaningful) GTEST_SKIP() << "ThreadSanitizer's shadow memory faults too";

  GlooOptions options;
  options.measure_transport = false;
  constexpr int64_t kCount = 1 << 20;
  std::atomic<int64_t> faults{-1};
  RunGlooRanks(
      2,
      [&](int rank, Communicator& comm) {
        auto round = [&] {
          at::Tensor bucket = comm.NewBuffer(kCount, at::kFloat).fill_(static_cast<float>(rank));
          ASSERT_TRUE(
              comm.AllReduce(bucket, ReduceOp::kSum, "r")->Wait(In(absl::Seconds(30))).ok());
          ASSERT_EQ(bucket[kCount - 1].item<float>(), 1.0f);
        };
        round();  // first use: this rank's pages and the peer's mapping of them
        ASSERT_TRUE(comm.Barrier("before")->Wait(In(absl::Seconds(30))).ok());
        const int64_t before = MinorPageFaults();
        for (int i = 0; i < 3; ++i) round();
        ASSERT_TRUE(comm.Barrier("after")->Wait(In(absl::Seconds(30))).ok());
        if (rank == 0) faults = MinorPageFaults() - before;
      },
      options);
  // Both ranks, 3 rounds of 1024 pages filled and 1024 read by the peer.
  EXPECT_LE(faults.load(), kFaultSlack);
}

class TransportTest : public ::testing::TestWithParam<Transport> {};

TEST_P(TransportTest, PeerThatAbortsFailsTheOpAtOnce) {
  GlooOptions options = WithTransport(GetParam());
  options.op_timeout = absl::Seconds(60);
  RunGlooRanks(
      2,
      [&](int rank, Communicator& comm) {
        if (rank == 1) {
          absl::SleepFor(absl::Milliseconds(300));
          comm.Abort("rank 1 leaves");
          return;
        }
        at::Tensor t = at::ones({100000});
        absl::Time start = absl::Now();
        absl::Status s = comm.AllReduce(t, ReduceOp::kSum, "left")->Wait(In(absl::Seconds(30)));
        EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
        EXPECT_THAT(s.message(), HasSubstr("a peer is gone"));
        EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "must not wait for the op timeout";
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest,
                         ::testing::Values(Transport::kTcp, Transport::kShm),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return TransportName(info.param);
                         });

class DataMovementTest : public ::testing::TestWithParam<int> {};

TEST_P(DataMovementTest, BroadcastAllGatherAndRingForEveryDtypeAndSize) {
  const int n = GetParam();
  const std::vector<at::ScalarType> dtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                              at::kBFloat16, at::kInt,    at::kLong};
  RunGlooRanks(n, [&](int rank, Communicator& comm) {
    for (at::ScalarType dtype : dtypes) {
      for (int64_t size : {0, 1, 7, 1001}) {
        const int root = n - 1;
        at::Tensor b = Input(rank, size, dtype);
        ASSERT_TRUE(comm.Broadcast(b, root, "b")->Wait(In(absl::Seconds(30))).ok());
        EXPECT_TRUE(at::equal(b, Input(root, size, dtype))) << c10::toString(dtype) << " " << size;

        at::Tensor out = at::empty({n, size}, dtype);
        ASSERT_TRUE(
            comm.AllGather(Input(rank, size, dtype), out, "g")->Wait(In(absl::Seconds(30))).ok());
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(at::equal(out[r], Input(r, size, dtype)))
              << c10::toString(dtype) << " " << size;
        }

        at::Tensor recv = at::empty({size}, dtype);
        const int next = (rank + 1) % n;
        const int prev = (rank + n - 1) % n;
        ASSERT_TRUE(comm.SendRecv(Input(rank, size, dtype), next, recv, prev, "ring")
                        ->Wait(In(absl::Seconds(30)))
                        .ok());
        EXPECT_TRUE(at::equal(recv, Input(prev, size, dtype)));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DataMovementTest, ::testing::Values(2, 3, 4));

TEST(GlooCommunicatorTest, LargeAllReduce64MB) {
  const int64_t n = 16 * 1024 * 1024;  // 64 MB of float32
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    at::Tensor t = at::full({n}, static_cast<float>(rank + 1));
    t[n - 1] = rank == 0 ? 10.0f : -4.0f;
    ASSERT_TRUE(comm.AllReduce(t, ReduceOp::kSum, "big")->Wait(In(absl::Seconds(120))).ok());
    EXPECT_EQ(t[0].item<float>(), 3.0f);
    EXPECT_EQ(t[n / 2].item<float>(), 3.0f);
    EXPECT_EQ(t[n - 1].item<float>(), 6.0f);
    EXPECT_DOUBLE_EQ(t.sum(at::kDouble).item<double>(), 3.0 * (n - 1) + 6.0);
  });
}

TEST(GlooCommunicatorTest, NonContiguousTensorsAreHandled) {
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4}) * (rank + 1);
    at::Tensor view = base.t();  // strided
    ASSERT_FALSE(view.is_contiguous());
    ASSERT_TRUE(comm.AllReduce(view, ReduceOp::kSum, "t")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::equal(base, at::arange(12, at::kFloat).reshape({3, 4}) * 6));

    at::Tensor column = at::zeros({4, 2});
    at::Tensor col1 = column.select(1, 1);  // stride 2
    if (rank == 2) col1.copy_(at::tensor({1.f, 2.f, 3.f, 4.f}));
    ASSERT_TRUE(comm.Broadcast(col1, 2, "col")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::equal(column.select(1, 1), at::tensor({1.f, 2.f, 3.f, 4.f})));
    EXPECT_TRUE(at::equal(column.select(1, 0), at::zeros({4})));
  });
}

TEST(GlooCommunicatorTest, BroadcastFromEveryRoot) {
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    for (int root = 0; root < 3; ++root) {
      at::Tensor t = at::full({5}, static_cast<double>(rank * 10 + root));
      ASSERT_TRUE(comm.Broadcast(t, root, "b")->Wait(In(absl::Seconds(30))).ok());
      EXPECT_TRUE(at::equal(t, at::full({5}, static_cast<double>(root * 10 + root))));
    }
  });
}

TEST(GlooCommunicatorTest, AllGatherPlacesEachRankInItsSlice) {
  RunGlooRanks(4, [&](int rank, Communicator& comm) {
    for (int64_t n : {1, 3, 0}) {
      at::Tensor in = at::full({n}, static_cast<int64_t>(rank), at::kLong);
      at::Tensor out = at::full({4, n}, int64_t{-1}, at::kLong);
      ASSERT_TRUE(comm.AllGather(in, out, "g")->Wait(In(absl::Seconds(30))).ok());
      for (int r = 0; r < 4; ++r) {
        EXPECT_TRUE(at::equal(out[r], at::full({n}, static_cast<int64_t>(r), at::kLong)));
      }
    }
  });
}

TEST(GlooCommunicatorTest, BarrierHoldsUntilEveryRankArrives) {
  std::atomic<int> arrived{0};
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    if (rank == 1) absl::SleepFor(absl::Milliseconds(300));
    arrived.fetch_add(1);
    ASSERT_TRUE(comm.Barrier("b")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_EQ(arrived.load(), 3);
  });
}

TEST(GlooCommunicatorTest, SendRecvRing) {
  const int n = 4;
  RunGlooRanks(n, [&](int rank, Communicator& comm) {
    for (int round = 0; round < 3; ++round) {
      at::Tensor send = at::full({6}, static_cast<float>(100 * round + rank));
      at::Tensor recv = at::zeros({6});
      const int next = (rank + 1) % n;
      const int prev = (rank + n - 1) % n;
      ASSERT_TRUE(comm.SendRecv(send, next, recv, prev, "ring")->Wait(In(absl::Seconds(30))).ok());
      EXPECT_TRUE(at::equal(recv, at::full({6}, static_cast<float>(100 * round + prev))));
    }
  });
}

TEST(GlooCommunicatorTest, SendAndRecvMatchInIssueOrder) {
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    if (rank == 0) {
      auto first = comm.Send(at::full({3}, 1.0f), 1, "p2p");
      auto second = comm.Send(at::full({3}, 2.0f), 1, "p2p");
      ASSERT_TRUE(first->Wait(In(absl::Seconds(30))).ok());
      ASSERT_TRUE(second->Wait(In(absl::Seconds(30))).ok());
    } else {
      at::Tensor a = at::zeros({3});
      at::Tensor b = at::zeros({3});
      auto wa = comm.Recv(a, 0, "p2p");
      auto wb = comm.Recv(b, 0, "p2p");
      ASSERT_TRUE(wb->Wait(In(absl::Seconds(30))).ok());
      EXPECT_TRUE(wa->Done());  // one peer's receives finish in issue order
      EXPECT_TRUE(at::equal(a, at::full({3}, 1.0f)));
      EXPECT_TRUE(at::equal(b, at::full({3}, 2.0f)));
    }
  });
}

TEST(GlooCommunicatorTest, ReduceScatterGivesEachRankItsReducedSliceAndLeavesTheInput) {
  for (int n : {2, 3, 4}) {
    RunGlooRanks(n, [&](int rank, Communicator& comm) {
      const int block = 5;
      // Element i of rank r's input: 100 r + i.
      at::Tensor input = at::arange(n * block, at::kDouble) + 100.0 * rank;
      at::Tensor before = input.clone();
      at::Tensor sum = at::zeros({block}, at::kDouble);
      ASSERT_TRUE(comm.ReduceScatter(input, sum, ReduceOp::kSum, "rs")
                      ->Wait(In(absl::Seconds(30)))
                      .ok());
      EXPECT_TRUE(at::equal(input, before));
      // Sum over r of (100 r + rank * block + j).
      at::Tensor want = at::arange(block, at::kDouble) * n + rank * block * n + 50.0 * n * (n - 1);
      EXPECT_TRUE(at::equal(sum, want)) << "rank " << rank << " of " << n << "\n" << sum;
      at::Tensor avg = at::zeros({block}, at::kDouble);
      ASSERT_TRUE(comm.ReduceScatter(input, avg, ReduceOp::kAvg, "rs")
                      ->Wait(In(absl::Seconds(30)))
                      .ok());
      EXPECT_TRUE(at::allclose(avg, want / n));
      at::Tensor ints = at::full({n * 3}, rank + 1, at::kInt);
      at::Tensor max = at::zeros({3}, at::kInt);
      ASSERT_TRUE(comm.ReduceScatter(ints, max, ReduceOp::kMax, "rs")
                      ->Wait(In(absl::Seconds(30)))
                      .ok());
      EXPECT_TRUE(at::equal(max, at::full({3}, n, at::kInt)));
    });
  }
  RunGlooRanks(2, [&](int, Communicator& comm) {
    absl::Status bad = comm.ReduceScatter(at::ones({5}), at::ones({2}), ReduceOp::kSum, "rs")
                           ->Wait(In(absl::Seconds(5)));
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.message(), HasSubstr("must hold size x the output's elements (2 x 2"));
  });
}

// Note [Point-to-point progress]: every rank sends to its right, then
// receives from its left, then waits (torch's isend/irecv ring).
TEST(GlooCommunicatorTest, ARingOfSendsThenReceivesCompletes) {
  GlooOptions quick;
  quick.op_timeout = absl::Seconds(20);  // a hang fails the test, not its timeout
  for (int n : {2, 3}) {
    RunGlooRanks(
        n,
        [&](int rank, Communicator& comm) {
          const int next = (rank + 1) % n;
          const int prev = (rank + n - 1) % n;
          for (int round = 0; round < 3; ++round) {
            at::Tensor recv = at::zeros({5}, at::kDouble);
            auto sent = comm.Send(at::full({5}, 10.0 * round + rank, at::kDouble), next, "ring");
            auto received = comm.Recv(recv, prev, "ring");
            ASSERT_TRUE(sent->Wait(In(absl::Seconds(30))).ok()) << "rank " << rank << " of " << n;
            ASSERT_TRUE(received->Wait(In(absl::Seconds(30))).ok());
            EXPECT_TRUE(at::equal(recv, at::full({5}, 10.0 * round + prev, at::kDouble)));
          }
        },
        quick);
  }
}

// A rank may wait for a receive (and go on to a collective) before its peer
// has taken its earlier send: the peer receives it only after that
// collective, so the receive must not wait behind the send.
TEST(GlooCommunicatorTest, AReceiveFinishesBeforeAnEarlierSendIsTaken) {
  GlooOptions quick;
  quick.op_timeout = absl::Seconds(20);
  RunGlooRanks(
      2,
      [&](int rank, Communicator& comm) {
        at::Tensor sum = at::ones({4});
        if (rank == 0) {
          auto sent = comm.Send(at::full({3}, 7.0f), 1, "x");
          at::Tensor y = at::zeros({3});
          ASSERT_TRUE(comm.Recv(y, 1, "y")->Wait(In(absl::Seconds(30))).ok());
          EXPECT_TRUE(at::equal(y, at::full({3}, 9.0f)));
          EXPECT_FALSE(sent->Done());  // rank 1 has not posted its receive
          ASSERT_TRUE(comm.AllReduce(sum, ReduceOp::kSum, "s")->Wait(In(absl::Seconds(30))).ok());
          ASSERT_TRUE(sent->Wait(In(absl::Seconds(30))).ok());
        } else {
          ASSERT_TRUE(comm.Send(at::full({3}, 9.0f), 0, "y")->Wait(In(absl::Seconds(30))).ok());
          ASSERT_TRUE(comm.AllReduce(sum, ReduceOp::kSum, "s")->Wait(In(absl::Seconds(30))).ok());
          at::Tensor x = at::zeros({3});
          ASSERT_TRUE(comm.Recv(x, 0, "x")->Wait(In(absl::Seconds(30))).ok());
          EXPECT_TRUE(at::equal(x, at::full({3}, 7.0f)));
        }
        EXPECT_TRUE(at::equal(sum, at::full({4}, 2.0f)));
      },
      quick);
}

TEST(GlooCommunicatorTest, SubGroupsReduceIndependentlyAndAreCached) {
  RunGlooRanks(4, [&](int rank, Communicator& comm) {
    std::vector<int> pair = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto group = comm.NewGroup(pair);
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_EQ((*group)->size(), 2);
    EXPECT_EQ((*group)->rank(), rank % 2);
    EXPECT_EQ((*group)->group(), pair);
    auto again = comm.NewGroup(pair);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(group->get(), again->get());

    at::Tensor t = at::full({4}, static_cast<float>(rank));
    ASSERT_TRUE((*group)->AllReduce(t, ReduceOp::kSum, "pair")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::equal(t, at::full({4}, rank < 2 ? 1.0f : 5.0f)));

    // Odd ranks form another group; even ranks are not members.
    auto odd = comm.NewGroup({1, 3});
    if (rank % 2 == 1) {
      ASSERT_TRUE(odd.ok()) << odd.status();
      at::Tensor u = at::full({2}, static_cast<float>(rank));
      ASSERT_TRUE((*odd)->AllReduce(u, ReduceOp::kMax, "odd")->Wait(In(absl::Seconds(30))).ok());
      EXPECT_TRUE(at::equal(u, at::full({2}, 3.0f)));
      EXPECT_EQ((*odd)->flight_recorder().TakeSnapshot(1).recent[0].fingerprint.group,
                (std::vector<int>{1, 3}));
    } else {
      EXPECT_EQ(odd.status().code(), absl::StatusCode::kNotFound);
    }
    EXPECT_EQ(comm.NewGroup({1, 0}).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.NewGroup({0, 9}).status().code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST(GlooCommunicatorTest, InvalidArgumentsFailWithoutConsumingASequenceNumber) {
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    auto bad_dtype = comm.AllReduce(at::ones({2}, at::kComplexFloat), ReduceOp::kSum, "x");
    EXPECT_EQ(bad_dtype->Wait(In(absl::Seconds(1))).code(), absl::StatusCode::kInvalidArgument);
    absl::Status bitwise_float =
        comm.AllReduce(at::ones({2}), ReduceOp::kBxor, "x")->Wait(In(absl::Seconds(1)));
    EXPECT_THAT(bitwise_float.message(), HasSubstr("bxor needs an integer or bool dtype"));
    absl::Status avg_int =
        comm.AllReduce(at::ones({2}, at::kInt), ReduceOp::kAvg, "x")->Wait(In(absl::Seconds(1)));
    EXPECT_EQ(avg_int.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(avg_int.message(), HasSubstr("avg needs a floating dtype"));
    absl::Status root = comm.Broadcast(at::ones({2}), 5, "x")->Wait(In(absl::Seconds(1)));
    EXPECT_THAT(root.message(), HasSubstr("root must be in [0, 2), got 5"));
    absl::Status self = comm.Send(at::ones({2}), rank, "x")->Wait(In(absl::Seconds(1)));
    EXPECT_THAT(self.message(), HasSubstr("dst must be in [0, 2) and not this rank"));
    absl::Status gather =
        comm.AllGather(at::ones({3}), at::ones({5}), "x")->Wait(In(absl::Seconds(1)));
    EXPECT_EQ(gather.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.flight_recorder().TakeSnapshot().last_enqueued_seq, 0);
    // The communicator is still healthy.
    at::Tensor t = at::ones({2});
    EXPECT_TRUE(comm.AllReduce(t, ReduceOp::kSum, "ok")->Wait(In(absl::Seconds(30))).ok());
    EXPECT_TRUE(at::equal(t, at::full({2}, 2.0f)));
  });
}

TEST(GlooCommunicatorTest, SingleRankWorldIsTrivial) {
  RunGlooRanks(1, [&](int, Communicator& comm) {
    at::Tensor t = at::arange(5, at::kFloat);
    ASSERT_TRUE(comm.AllReduce(t, ReduceOp::kAvg, "solo")->Wait(In(absl::Seconds(10))).ok());
    EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat)));
    ASSERT_TRUE(comm.Barrier("solo")->Wait(In(absl::Seconds(10))).ok());
  });
}

TEST(GlooCommunicatorTest, RankThatNeverIssuesLeavesOthersStartedUntilAbort) {
  GlooOptions options;
  options.op_timeout = absl::Seconds(60);  // Abort, not the timeout, must end the wait
  std::atomic<int> waited{0};
  std::atomic<bool> rank0_done{false};
  RunGlooRanks(
      3,
      [&](int rank, Communicator& comm) {
        if (rank == 1) {
          // Never issues the all-reduce; leaves after the others have given up
          // (they wait 0.8 s; the margin is for a loaded machine).
          absl::SleepFor(absl::Seconds(4));
          comm.Abort("test over");
          return;
        }
        at::Tensor t = at::ones({1000});
        auto work = comm.AllReduce(t, ReduceOp::kSum, "ddp:model/bucket0");
        absl::Status s = work->Wait(In(absl::Milliseconds(800)));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
        EXPECT_THAT(s.message(),
                    HasSubstr("op #1 (allreduce/sum float32[1000] ddp:model/bucket0)"));
        FlightRecorder::Snapshot snap = comm.flight_recorder().TakeSnapshot();
        EXPECT_EQ(snap.last_enqueued_seq, 1);
        EXPECT_EQ(snap.last_started_seq, 1);
        EXPECT_EQ(snap.last_completed_seq, 0);
        ASSERT_EQ(snap.in_flight.size(), 1u);
        EXPECT_EQ(snap.in_flight[0].state, OpState::kStarted);
        // A peer's abort fails the op at once (UNAVAILABLE, and the
        // communicator is broken by that): both waiting ranks first see their
        // own deadline pass, then rank 0 aborts, then rank 2.
        ++waited;
        for (int i = 0; i < 10000 && waited.load() < 2; ++i) absl::SleepFor(absl::Milliseconds(1));
        if (rank == 2) {
          for (int i = 0; i < 10000 && !rank0_done.load(); ++i)
            absl::SleepFor(absl::Milliseconds(1));
        }

        absl::Time start = absl::Now();
        comm.Abort("rank 1 never joined");
        EXPECT_LT(absl::Now() - start, absl::Seconds(10))
            << "Abort must not wait for the op timeout";
        absl::Status after = work->Wait(In(absl::Seconds(1)));
        EXPECT_FALSE(after.ok());
        absl::Status later = comm.AllReduce(t, ReduceOp::kSum, "x")->Wait(In(absl::Seconds(1)));
        EXPECT_FALSE(later.ok());
        if (rank == 0) {
          EXPECT_EQ(later.code(), absl::StatusCode::kAborted);
          EXPECT_THAT(later.message(), HasSubstr("rank 1 never joined"));
          rank0_done = true;
        }
      },
      options);
}

TEST(GlooCommunicatorTest, DifferentCollectivesAtTheSameSeqWaitInsteadOfMixingData) {
  GlooOptions options;
  options.op_timeout = absl::Seconds(60);
  std::atomic<int> gave_up{0};
  RunGlooRanks(
      2,
      [&](int rank, Communicator& comm) {
        // Same size and dtype, different tags: exchanging would "work" and
        // silently add one op's data into the other.
        at::Tensor t = at::full({256}, rank + 1.0);
        auto work =
            comm.AllReduce(t, ReduceOp::kSum, rank == 0 ? "model_a/bucket0" : "model_b/bucket0");
        absl::Status s = work->Wait(In(absl::Milliseconds(1500)));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_TRUE(at::equal(t, at::full({256}, rank + 1.0))) << "no data was exchanged";
        // Abort only once both ranks have seen their deadline: an abort closes
        // the connections, which the other rank would see as a lost peer.
        gave_up.fetch_add(1);
        for (int i = 0; i < 1000 && gave_up.load() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
        comm.Abort("mismatch");
        EXPECT_FALSE(work->Wait(In(absl::Seconds(5))).ok());
      },
      options);
}

TEST(GlooCommunicatorTest, OpTimeoutBreaksTheCommunicator) {
  GlooOptions options;
  options.op_timeout = absl::Seconds(1);
  RunGlooRanks(
      2,
      [&](int rank, Communicator& comm) {
        if (rank == 1) {
          absl::SleepFor(absl::Seconds(3));
          return;
        }
        at::Tensor t = at::ones({10});
        absl::Status s = comm.AllReduce(t, ReduceOp::kSum, "late")->Wait(In(absl::Seconds(20)));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_THAT(s.message(), HasSubstr("op timeout"));
        FlightRecorder::Snapshot snap = comm.flight_recorder().TakeSnapshot(1);
        ASSERT_EQ(snap.recent.size(), 1u);
        EXPECT_EQ(snap.recent[0].state, OpState::kTimedOut);
        absl::Status next = comm.Barrier("next")->Wait(In(absl::Seconds(5)));
        EXPECT_EQ(next.code(), absl::StatusCode::kDeadlineExceeded);
        EXPECT_THAT(next.message(), HasSubstr("communicator broken by an earlier op"));
      },
      options);
}

TEST(GlooCommunicatorTest, FingerprintsAgreeAcrossRanksForTheSameProgram) {
  const int n = 3;
  std::vector<FlightRecorder::Snapshot> snaps(n);
  RunGlooRanks(n, [&](int rank, Communicator& comm) {
    at::Tensor a = at::ones({17});
    at::Tensor b = at::ones({4}, at::kDouble);
    std::vector<std::shared_ptr<Work>> works = {
        comm.AllReduce(a, ReduceOp::kAvg, "ddp:m/bucket0"), comm.Broadcast(b, 2, "ddp:m/buffers"),
        comm.Barrier("epoch"), comm.AllReduce(b, ReduceOp::kMax, "metrics")};
    for (auto& w : works) ASSERT_TRUE(w->Wait(In(absl::Seconds(30))).ok());
    snaps[rank] = comm.flight_recorder().TakeSnapshot(10);
  });
  ASSERT_EQ(snaps[0].recent.size(), 4u);
  EXPECT_EQ(snaps[0].recent[1].fingerprint.ToString(), "broadcast/root2 float64[4] ddp:m/buffers");
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(snaps[r].recent.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(snaps[r].recent[i].seq, snaps[0].recent[i].seq);
      EXPECT_EQ(snaps[r].recent[i].fingerprint, snaps[0].recent[i].fingerprint)
          << snaps[r].recent[i].fingerprint.ToString();
    }
  }
}

TEST(GlooCommunicatorTest, CreationTimesOutNamingMissingPeers) {
  MemoryStore store;
  GlooOptions options;
  options.rank = 0;
  options.size = 3;
  options.connect_timeout = absl::Milliseconds(500);
  auto comm = CreateGlooCommunicator(options, store);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("rank 0 of 3 could not connect"));
}

TEST(GlooCommunicatorTest, CudaTensorsAreRefusedWithAHint) {
  RunGlooRanks(1, [&](int, Communicator& comm) {
    at::Tensor meta = at::empty({2}, at::TensorOptions().device(at::kMeta));
    absl::Status s = comm.AllReduce(meta, ReduceOp::kSum, "x")->Wait(In(absl::Seconds(1)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("takes CPU tensors"));
  });
}

}  // namespace
}  // namespace chorus
