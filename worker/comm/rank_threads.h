// Test support: N ranks as threads of one process, each with a Gloo
// communicator over one in-memory store.
//
// Example:
//   RunGlooRanks(3, [](int rank, Communicator& comm) { ... });
#ifndef CHORUS_WORKER_COMM_RANK_THREADS_H_
#define CHORUS_WORKER_COMM_RANK_THREADS_H_

#include <ATen/Parallel.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"

namespace chorus {

// Runs body(rank, comm) for every rank, each in its own thread with one
// intra-op thread. Communicators live until every body has returned, so a
// rank that finishes first does not cut its peers off.
inline void RunGlooRanks(int n, const std::function<void(int, Communicator&)>& body,
                         GlooOptions base = GlooOptions()) {
  MemoryStore store;
  std::vector<std::shared_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      at::set_num_threads(1);
      GlooOptions options = base;
      options.rank = r;
      options.size = n;
      options.connect_timeout = absl::Seconds(30);
      auto comm = CreateGlooCommunicator(options, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[r] = *comm;
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_RANK_THREADS_H_
