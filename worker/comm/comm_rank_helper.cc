// A rank process for multi-process communicator tests and benchmarks.
//
//   comm_rank_helper --rank R --size N --store DIR --mode survive_kill
//
// survive_kill: all-reduce in a loop (publishing "ready/R" after the first
// one) until an op fails, as it must once the test kills a peer with SIGKILL.
// Then Abort, rebuild a communicator among the survivors (ranks listed in the
// store key "survivors", e.g. "0,1"), check one all-reduce, and write
// "result/R" = "<status code> <ms from failure-visible to error> ok".
// Exits 0 only if every step behaved.

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

int Fail(const std::string& why) {
  std::cerr << "comm_rank_helper: " << why << "\n";
  return 1;
}

int SurviveKill(int rank, int size, Store& store) {
  GlooOptions options;
  options.rank = rank;
  options.size = size;
  options.op_timeout = absl::Seconds(60);
  PrefixStore gen0(store, "gen0");
  auto comm = CreateGlooCommunicator(options, gen0);
  if (!comm.ok()) return Fail(std::string(comm.status().message()));

  at::Tensor t = at::ones({256 * 1024});  // 1 MB
  absl::Status failure;
  absl::Time failed_at;
  for (int i = 0; i < 100000; ++i) {
    absl::Status s =
        (*comm)->AllReduce(t, ReduceOp::kAvg, "loop")->Wait(absl::Now() + absl::Seconds(20));
    if (!s.ok()) {
      failure = s;
      failed_at = absl::Now();
      break;
    }
    if (i == 0 && !store.Set(absl::StrCat("ready/", rank), "1").ok()) return Fail("store");
  }
  if (failure.ok()) return Fail("the loop never saw a failure");
  absl::StatusOr<std::string> killed_at =
      store.Get("killed_at_us", absl::Now() + absl::Seconds(10));
  int64_t killed_us = 0;
  if (!killed_at.ok() || !absl::SimpleAtoi(*killed_at, &killed_us)) return Fail("killed_at_us");
  const int64_t detect_ms = (absl::ToUnixMicros(failed_at) - killed_us) / 1000;
  (*comm)->Abort("peer died");
  comm->reset();

  absl::StatusOr<std::string> survivors_text =
      store.Get("survivors", absl::Now() + absl::Seconds(10));
  if (!survivors_text.ok()) return Fail("no survivors key");
  std::vector<int> survivors;
  for (absl::string_view part : absl::StrSplit(*survivors_text, ',')) {
    int r = 0;
    if (absl::SimpleAtoi(part, &r)) survivors.push_back(r);
  }
  int new_rank = -1;
  for (size_t i = 0; i < survivors.size(); ++i) {
    if (survivors[i] == rank) new_rank = static_cast<int>(i);
  }
  if (new_rank < 0) return Fail("not a survivor");
  GlooOptions next = options;
  next.rank = new_rank;
  next.size = static_cast<int>(survivors.size());
  PrefixStore gen1(store, "gen1");
  auto comm2 = CreateGlooCommunicator(next, gen1);
  if (!comm2.ok()) return Fail(std::string(comm2.status().message()));
  at::Tensor u = at::full({1000}, static_cast<float>(rank + 1));
  absl::Status s =
      (*comm2)->AllReduce(u, ReduceOp::kSum, "gen1")->Wait(absl::Now() + absl::Seconds(30));
  float want = 0;
  for (int r : survivors) want += static_cast<float>(r + 1);
  const bool ok = s.ok() && at::equal(u, at::full({1000}, want));
  const std::string result = absl::StrCat(absl::StatusCodeToString(failure.code()), " ", detect_ms,
                                          " ", ok ? "ok" : "bad", " | ", failure.message());
  if (!store.Set(absl::StrCat("result/", rank), result).ok()) return Fail("store");
  return ok ? 0 : Fail("generation 1 all-reduce: " + std::string(s.message()));
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  int rank = -1, size = 0;
  std::string store_dir, mode;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (flag == "--size")
      size = std::atoi(argv[i + 1]);
    else if (flag == "--store")
      store_dir = argv[i + 1];
    else if (flag == "--mode")
      mode = argv[i + 1];
  }
  if (rank < 0 || size < 1 || store_dir.empty() || mode != "survive_kill") {
    std::cerr << "usage: comm_rank_helper --rank R --size N --store DIR --mode survive_kill\n";
    return 2;
  }
  auto store = chorus::FileStore::Open(store_dir);
  if (!store.ok()) return chorus::Fail(std::string(store.status().message()));
  return chorus::SurviveKill(rank, size, **store);
}
