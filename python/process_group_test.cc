#include "python/process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

// The group over a rank thread's communicator, which RunGlooRanks owns.
c10::intrusive_ptr<CommunicatorProcessGroup> GroupOver(Communicator& comm) {
  return c10::make_intrusive<CommunicatorProcessGroup>(
      std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), nullptr);
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CommunicatorProcessGroupTest, AllReduceSumsAndItsFutureHoldsTheResult) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<at::Tensor> tensors = {at::full({3}, rank + 1.0)};
    c10d::AllreduceOptions opts;
    auto work = group->allreduce(tensors, opts);
    work->wait();
    EXPECT_TRUE(at::equal(tensors[0], at::full({3}, 3.0)));
    c10::intrusive_ptr<c10::ivalue::Future> future = work->getFuture();
    ASSERT_TRUE(future->completed());
    std::vector<at::Tensor> result = future->value().toTensorVector();
    ASSERT_EQ(result.size(), 1u);
    EXPECT_TRUE(result[0].is_same(tensors[0]));
    opts.reduceOp = c10d::ReduceOp::MAX;
    std::vector<at::Tensor> max = {at::full({2}, static_cast<double>(rank))};
    group->allreduce(max, opts)->wait();
    EXPECT_TRUE(at::equal(max[0], at::full({2}, 1.0)));
  });
}

TEST(CommunicatorProcessGroupTest, BroadcastAndBarrier) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<at::Tensor> tensors = {at::full({4}, rank == 1 ? 7.0 : 0.0)};
    c10d::BroadcastOptions opts;
    opts.rootRank = 1;
    group->broadcast(tensors, opts)->wait();
    EXPECT_TRUE(at::equal(tensors[0], at::full({4}, 7.0)));
    EXPECT_TRUE(group->barrier(c10d::BarrierOptions())->wait());
    EXPECT_EQ(group->getSequenceNumberForGroup(), 2u);
  });
}

TEST(CommunicatorProcessGroupTest, AllGatherFillsEveryRanksSlot) {
  RunGlooRanks(3, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<at::Tensor> inputs = {at::full({2, 2}, static_cast<double>(rank), at::kDouble)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < 3; ++r) outputs[0].push_back(at::zeros({2, 2}, at::kDouble));
    group->allgather(outputs, inputs, c10d::AllgatherOptions())->wait();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(at::equal(outputs[0][r], at::full({2, 2}, static_cast<double>(r), at::kDouble)))
          << r;
    }
    at::Tensor flat = at::zeros({6}, at::kFloat);
    at::Tensor in = at::full({2}, rank + 0.5, at::kFloat);
    group->_allgather_base(flat, in, c10d::AllgatherOptions())->wait();
    EXPECT_TRUE(at::equal(flat, at::tensor({0.5f, 0.5f, 1.5f, 1.5f, 2.5f, 2.5f})));
  });
}

TEST(CommunicatorProcessGroupTest, ReduceScatterLeavesTheInputAndGivesEachRankItsPart) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    at::Tensor input = at::arange(4, at::kFloat) + rank;  // rank 0: 0 1 2 3, rank 1: 1 2 3 4
    at::Tensor before = input.clone();
    at::Tensor output = at::zeros({2}, at::kFloat);
    group->_reduce_scatter_base(output, input, c10d::ReduceScatterOptions())->wait();
    EXPECT_TRUE(at::equal(input, before));
    EXPECT_TRUE(at::equal(output, rank == 0 ? at::tensor({1.0f, 3.0f}) : at::tensor({5.0f, 7.0f})));
    std::vector<at::Tensor> outputs = {at::zeros({2}, at::kFloat)};
    std::vector<std::vector<at::Tensor>> inputs = {{input.narrow(0, 0, 2), input.narrow(0, 2, 2)}};
    group->reduce_scatter(outputs, inputs, c10d::ReduceScatterOptions())->wait();
    EXPECT_TRUE(at::equal(outputs[0], output));
  });
}

TEST(CommunicatorProcessGroupTest, GatherScatterAndReduceAtTheRoot) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<at::Tensor> inputs = {at::full({2}, rank + 1.0, at::kDouble)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    if (rank == 0) outputs[0] = {at::zeros({2}, at::kDouble), at::zeros({2}, at::kDouble)};
    c10d::GatherOptions gather;
    gather.rootRank = 0;
    group->gather(outputs, inputs, gather)->wait();
    if (rank == 0) {
      EXPECT_TRUE(at::equal(outputs[0][1], at::full({2}, 2.0, at::kDouble)));
    }

    std::vector<at::Tensor> part = {at::zeros({3}, at::kFloat)};
    std::vector<std::vector<at::Tensor>> parts(1);
    if (rank == 1) parts[0] = {at::full({3}, 10.0f), at::full({3}, 11.0f)};
    c10d::ScatterOptions scatter;
    scatter.rootRank = 1;
    group->scatter(part, parts, scatter)->wait();
    EXPECT_TRUE(at::equal(part[0], at::full({3}, 10.0f + rank)));

    std::vector<at::Tensor> mine = {at::full({2}, rank + 1.0)};
    c10d::ReduceOptions reduce;
    reduce.rootRank = 1;
    group->reduce(mine, reduce)->wait();
    EXPECT_TRUE(at::equal(mine[0], at::full({2}, rank == 1 ? 3.0 : 1.0)));
  });
}

TEST(CommunicatorProcessGroupTest, SendAndRecvPairUp) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<at::Tensor> t = {rank == 0 ? at::arange(5, at::kLong) : at::zeros({5}, at::kLong)};
    if (rank == 0) {
      group->send(t, 1, 0)->wait();
    } else {
      group->recv(t, 0, 0)->wait();
      EXPECT_TRUE(at::equal(t[0], at::arange(5, at::kLong)));
    }
  });
}

// torch's isend/irecv ring: every rank posts its send to the right, then its
// receive from the left, then waits for both (it hung: Note
// [Point-to-point progress] in worker/comm/p2p_lanes.h).
TEST(CommunicatorProcessGroupTest, AnIsendIrecvRingCompletesInEitherOrder) {
  GlooOptions quick;
  quick.op_timeout = absl::Seconds(20);  // a hang fails the test, not its timeout
  for (int n : {2, 3}) {
    for (bool receive_first : {false, true}) {
      RunGlooRanks(
          n,
          [&](int rank, Communicator& comm) {
            auto group = GroupOver(comm);
            std::vector<at::Tensor> out = {at::full({4}, 100.0f * n + rank)};
            std::vector<at::Tensor> in = {at::zeros({4})};
            const int next = (rank + 1) % n;
            const int prev = (rank + n - 1) % n;
            c10::intrusive_ptr<c10d::Work> sent, received;
            if (receive_first) received = group->recv(in, prev, 0);
            sent = group->send(out, next, 0);
            if (!receive_first) received = group->recv(in, prev, 0);
            EXPECT_TRUE(sent->wait());
            EXPECT_TRUE(received->wait());
            EXPECT_TRUE(at::equal(in[0], at::full({4}, 100.0f * n + prev)))
                << "rank " << rank << " of " << n;
            EXPECT_TRUE(received->getFuture()->completed());
          },
          quick);
    }
  }
}

// A mixture of experts' dispatch: rank r sends (r + p + 1) rows to rank p,
// so every pair exchanges a different count (Note [All-to-all as sends and
// receives]).
TEST(CommunicatorProcessGroupTest, AllToAllSingleWithUnevenSplits) {
  const int n = 3;
  RunGlooRanks(n, [&](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<int64_t> in_splits, out_splits;
    for (int p = 0; p < n; ++p) {
      in_splits.push_back(rank + p + 1);
      out_splits.push_back(p + rank + 1);
    }
    std::vector<at::Tensor> rows;  // row value: 100 x sender + receiver, 2 columns
    for (int p = 0; p < n; ++p) rows.push_back(at::full({rank + p + 1, 2}, 100.0 * rank + p));
    at::Tensor input = at::cat(rows);
    at::Tensor output = at::zeros({3 * rank + 6, 2});
    group->alltoall_base(output, input, out_splits, in_splits, c10d::AllToAllOptions())->wait();
    std::vector<at::Tensor> want;
    for (int p = 0; p < n; ++p) want.push_back(at::full({p + rank + 1, 2}, 100.0 * p + rank));
    EXPECT_TRUE(at::equal(output, at::cat(want))) << "rank " << rank << "\n" << output;

    // Equal splits, and the list form with a part of no rows.
    at::Tensor even_in = at::arange(6, at::kLong) + 10 * rank;
    at::Tensor even_out = at::zeros({6}, at::kLong);
    std::vector<int64_t> none;
    group->alltoall_base(even_out, even_in, none, none, c10d::AllToAllOptions())->wait();
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(even_out[2 * p].item<int64_t>(), 10 * p + 2 * rank);
    }
    std::vector<at::Tensor> ins, outs;
    for (int p = 0; p < n; ++p) {
      ins.push_back(at::full({p == 1 ? 0 : 2}, 1.0 * rank));
      outs.push_back(at::zeros({rank == 1 ? 0 : 2}));
    }
    group->alltoall(outs, ins, c10d::AllToAllOptions())->wait();
    for (int p = 0; p < n; ++p) {
      if (rank != 1) EXPECT_TRUE(at::equal(outs[p], at::full({2}, 1.0 * p)));
    }
  });
}

TEST(CommunicatorProcessGroupTest, AllToAllRefusesSplitsThatDoNotAddUp) {
  RunGlooRanks(2, [](int, Communicator& comm) {
    auto group = GroupOver(comm);
    at::Tensor in = at::zeros({5});
    at::Tensor out = at::zeros({5});
    std::vector<int64_t> bad = {1, 3};
    std::vector<int64_t> none;
    EXPECT_EQ(ErrorOf([&] { group->alltoall_base(out, in, none, bad, c10d::AllToAllOptions()); }),
              "chorus backend: all_to_all_single: input_split_sizes add up to 4, the input has 5 "
              "rows along dimension 0");
    at::Tensor even = at::zeros({4});
    EXPECT_EQ(ErrorOf([&] { group->alltoall_base(out, even, none, none, c10d::AllToAllOptions()); }),
              "chorus backend: all_to_all_single: the output's dimension 0 (5) does not divide "
              "into 2 equal parts; pass output_split_sizes");
  });
}

// uint8, int8 and bool, and the bitwise reductions, as on gloo.
TEST(CommunicatorProcessGroupTest, SmallIntegersBoolsAndBitwiseReductions) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    auto group = GroupOver(comm);
    auto reduce = [&](at::Tensor t, c10d::ReduceOp::RedOpType kind) {
      std::vector<at::Tensor> ts = {t};
      c10d::AllreduceOptions opts;
      opts.reduceOp = kind;
      group->allreduce(ts, opts)->wait();
      return t;
    };
    // rank 0: 0b1100, rank 1: 0b1010
    at::Tensor bits = at::full({3}, rank == 0 ? 12 : 10, at::kByte);
    EXPECT_TRUE(at::equal(reduce(bits.clone(), c10d::ReduceOp::BAND), at::full({3}, 8, at::kByte)));
    EXPECT_TRUE(at::equal(reduce(bits.clone(), c10d::ReduceOp::BOR), at::full({3}, 14, at::kByte)));
    EXPECT_TRUE(at::equal(reduce(bits.clone(), c10d::ReduceOp::BXOR), at::full({3}, 6, at::kByte)));
    EXPECT_TRUE(at::equal(reduce(bits.clone(), c10d::ReduceOp::SUM), at::full({3}, 22, at::kByte)));
    at::Tensor small = at::full({2}, rank == 0 ? -3 : 5, at::kChar);
    EXPECT_TRUE(at::equal(reduce(small.clone(), c10d::ReduceOp::MIN), at::full({2}, -3, at::kChar)));
    EXPECT_TRUE(at::equal(reduce(small.clone(), c10d::ReduceOp::SUM), at::full({2}, 2, at::kChar)));
    auto bools = [](std::vector<uint8_t> v) {
      return at::tensor(v, at::kByte).to(at::kBool);
    };
    at::Tensor flags = bools({rank == 0, 0, 1});
    EXPECT_TRUE(at::equal(reduce(flags.clone(), c10d::ReduceOp::SUM), bools({1, 0, 1})));
    EXPECT_TRUE(at::equal(reduce(flags.clone(), c10d::ReduceOp::BAND), bools({0, 0, 1})));
    EXPECT_TRUE(at::equal(reduce(flags.clone(), c10d::ReduceOp::MAX), bools({1, 0, 1})));
    std::string error = ErrorOf([&] { reduce(at::ones({2}), c10d::ReduceOp::BOR); });
    EXPECT_NE(error.find("bor needs an integer or bool dtype, got float32"), std::string::npos)
        << error;
  });
}

TEST(CommunicatorProcessGroupTest, UnsupportedOpsAndReductionsAreRefusedByName) {
  RunGlooRanks(1, [](int, Communicator& comm) {
    auto group = GroupOver(comm);
    std::vector<at::Tensor> t = {at::ones({2})};
    c10d::AllreduceOptions product;
    product.reduceOp = c10d::ReduceOp::PRODUCT;
    EXPECT_EQ(ErrorOf([&] { group->allreduce(t, product); }),
              "chorus backend: all_reduce with ReduceOp.PRODUCT is not supported; use SUM, AVG, "
              "MIN, MAX, BAND, BOR or BXOR");
    std::vector<std::vector<at::Tensor>> lists(1);
    EXPECT_NE(ErrorOf([&] { group->allgather_coalesced(lists, t, c10d::AllgatherOptions()); })
                  .find("all_gather_coalesced is not supported"),
              std::string::npos);
    std::vector<at::Tensor> strided = {at::ones({4, 4}).t()};
    EXPECT_NE(ErrorOf([&] { group->allreduce(strided, c10d::AllreduceOptions()); })
                  .find("needs a contiguous tensor"),
              std::string::npos);
  });
}

TEST(CommunicatorProcessGroupTest, AFailedOpRaisesTheChorusStatusAndFailsTheFuture) {
  RunGlooRanks(1, [](int, Communicator& comm) {
    auto group = GroupOver(comm);
    comm.Abort("the generation ended");
    std::vector<at::Tensor> t = {at::ones({2})};
    auto work = group->allreduce(t, c10d::AllreduceOptions());
    std::string error = ErrorOf([&] { work->wait(); });
    EXPECT_EQ(error.rfind("ABORTED", 0), 0u) << error;
    EXPECT_NE(error.find("the generation ended"), std::string::npos) << error;
    EXPECT_TRUE(work->getFuture()->hasError());
    EXPECT_FALSE(work->isSuccess());
  });
}

TEST(CommunicatorProcessGroupTest, DroppingAGroupWithAnOpStuckOnAPeerEndsWithinItsGrace) {
  RunGlooRanks(2, [](int rank, Communicator& comm) {
    if (rank == 1) return;  // never enters the all-reduce
    c10::intrusive_ptr<c10d::Work> work;
    const absl::Time start = absl::Now();
    {
      auto group = c10::make_intrusive<CommunicatorProcessGroup>(
          std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), nullptr, nullptr,
          absl::Milliseconds(300));
      std::vector<at::Tensor> t = {at::ones({4})};
      work = group->allreduce(t, c10d::AllreduceOptions());
    }
    const absl::Duration took = absl::Now() - start;
    EXPECT_GE(took, absl::Milliseconds(250));
    EXPECT_LT(took, absl::Seconds(5));
    std::string error = ErrorOf([&] { work->wait(); });
    EXPECT_NE(error.find("destroyed with 1 op(s) still running"), std::string::npos) << error;
  });
}

}  // namespace
}  // namespace chorus
