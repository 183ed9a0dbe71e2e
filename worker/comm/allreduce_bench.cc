// allreduce_bench: Chorus's Communicator::AllReduce + Wait against raw
// gloo::allreduce on the same library, buffers and process pair.
//
//   bazel run -c opt //worker/comm:allreduce_bench \
//       [-- --iters_scale 1.0 --segment_kb 1024 --shm_segment_kb 4096]
//
// Starts 2 rank processes of itself on 127.0.0.1 (1 intra-op thread each).
// For 1, 100 and 25 MB of float32 it alternates raw, ours (shared memory, as
// both ranks share this host) and ours over TCP, each started after a barrier,
// and prints one result line (docs/benchmarks.md) per size (25 MB last) with the median
// time per all-reduce after 8 warm-up rounds; ratio = ours (shared memory) / raw. The TCP figure
// goes to stderr.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/machine_facts.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_store.h"
#include "worker/comm/store.h"

extern char** environ;

namespace chorus {
namespace {

// CPU time of this whole process (all threads), in milliseconds.
double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunRank(int rank, const std::string& store_dir, double iters_scale, size_t segment_kb,
            size_t shm_segment_kb) {
  at::set_num_threads(1);
  auto store = FileStore::Open(store_dir);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 1;
  }
  // Raw gloo: its own context over the same kind of TCP device.
  PrefixStore raw_store(**store, "raw");
  GlooStore raw_gloo_store(raw_store, absl::Seconds(60));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto raw = std::make_shared<gloo::rendezvous::Context>(rank, 2);
  raw->setTimeout(std::chrono::seconds(120));
  raw->connectFullMesh(raw_gloo_store, device);

  PrefixStore ours_store(**store, "ours");
  GlooOptions options;
  options.rank = rank;
  options.size = 2;
  options.op_timeout = absl::Seconds(120);
  if (segment_kb > 0) options.segment_bytes = segment_kb * 1024;
  if (shm_segment_kb > 0) options.shm_segment_bytes = shm_segment_kb * 1024;
  auto comm = CreateGlooCommunicator(options, ours_store);
  if (!comm.ok()) {
    std::cerr << comm.status() << "\n";
    return 1;
  }
  // Ours again with shared memory off: the TCP ring, for comparison (the
  // default above uses shared memory since both ranks share this host).
  PrefixStore tcp_store(**store, "tcp");
  GlooOptions tcp_options = options;
  tcp_options.shared_memory = false;
  auto tcp_comm = CreateGlooCommunicator(tcp_options, tcp_store);
  if (!tcp_comm.ok()) {
    std::cerr << tcp_comm.status() << "\n";
    return 1;
  }

  uint32_t raw_tag = 1;
  auto barrier = [&] {
    gloo::BarrierOptions opts(raw);
    opts.setTag(raw_tag++);
    gloo::barrier(opts);
  };
  struct Size {
    const char* name;
    int64_t mb;
    int iters;
  };
  const std::vector<Size> sizes = {{"1MB", 1, 60}, {"100MB", 100, 6}, {"25MB", 25, 16}};
  for (const Size& size : sizes) {
    const int64_t n = size.mb * 1024 * 1024 / 4;
    at::Tensor raw_buf = at::ones({n});
    at::Tensor our_buf = at::ones({n});
    at::Tensor tcp_buf = at::ones({n});
    const int iters = std::max(3, static_cast<int>(size.iters * iters_scale));
    std::vector<double> raw_ms, our_ms, tcp_ms, raw_cpu, our_cpu;
    // Minor page faults of this process per op, summed over measured ops.
    int64_t raw_faults = 0, our_faults = 0, tcp_faults = 0;
    // 8 warm-up rounds on every side: ours measures both transports on its
    // first 8 all-reduces of a size (TransportTuner) before it settles.
    for (int i = -8; i < iters; ++i) {
      barrier();
      double c0 = ProcessCpuMs();
      int64_t f0 = MinorPageFaults();
      absl::Time t0 = absl::Now();
      {
        gloo::AllreduceOptions opts(raw);
        opts.setOutput(raw_buf.data_ptr<float>(), static_cast<size_t>(n));
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(raw_tag++);
        gloo::allreduce(opts);
      }
      double raw_t = absl::ToDoubleMilliseconds(absl::Now() - t0);
      double raw_c = ProcessCpuMs() - c0;
      const int64_t raw_f = MinorPageFaults() - f0;
      barrier();
      c0 = ProcessCpuMs();
      f0 = MinorPageFaults();
      t0 = absl::Now();
      absl::Status s = (*comm)
                           ->AllReduce(our_buf, ReduceOp::kSum, "bench")
                           ->Wait(absl::Now() + absl::Seconds(120));
      double our_t = absl::ToDoubleMilliseconds(absl::Now() - t0);
      double our_c = ProcessCpuMs() - c0;
      const int64_t our_f = MinorPageFaults() - f0;
      if (!s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
      barrier();
      f0 = MinorPageFaults();
      t0 = absl::Now();
      s = (*tcp_comm)
              ->AllReduce(tcp_buf, ReduceOp::kSum, "bench")
              ->Wait(absl::Now() + absl::Seconds(120));
      double tcp_t = absl::ToDoubleMilliseconds(absl::Now() - t0);
      const int64_t tcp_f = MinorPageFaults() - f0;
      if (!s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
      if (i >= 0) {
        raw_ms.push_back(raw_t);
        our_ms.push_back(our_t);
        tcp_ms.push_back(tcp_t);
        raw_cpu.push_back(raw_c);
        our_cpu.push_back(our_c);
        raw_faults += raw_f;
        our_faults += our_f;
        tcp_faults += tcp_f;
      }
    }
    // Both buffers saw the same number of sums: check they agree.
    if (!at::equal(raw_buf, our_buf) || !at::equal(raw_buf, tcp_buf)) {
      std::cerr << "results differ between raw gloo and Chorus\n";
      return 1;
    }
    if (rank == 0) {
      const double ours = Median(our_ms);
      const double peer = Median(raw_ms);
      const double gbps = 2.0 * (size.mb / 1024.0) / (peer / 1000.0);
      std::cerr << absl::StrFormat(
          "allreduce %s: ours %.2f ms (%.2f ms CPU), raw gloo %.2f ms (%.2f ms CPU), %.2f GB/s "
          "algorithm bandwidth for raw gloo, %d iters; ours with shared memory off (TCP ring) "
          "%.2f ms (ratio %.2f); page faults per op on rank 0: ours %.1f, raw %.1f, TCP ring "
          "%.1f\n",
          size.name, ours, Median(our_cpu), peer, Median(raw_cpu), gbps / 2.0, iters,
          Median(tcp_ms), Median(tcp_ms) / peer, static_cast<double>(our_faults) / iters,
          static_cast<double>(raw_faults) / iters, static_cast<double>(tcp_faults) / iters);
      std::cout << absl::StrFormat(
                       "{\"bench\": \"allreduce_%s\", \"metric\": \"median_time_per_allreduce\", "
                       "\"unit\": \"ms\", \"ours\": %.3f, \"peer\": %.3f, \"peer_name\": \"raw "
                       "gloo::allreduce\", \"ratio\": %.4f, \"ours_page_faults_per_op\": %.1f, "
                       "\"peer_page_faults_per_op\": %.1f}",
                       size.name, ours, peer, ours / peer, static_cast<double>(our_faults) / iters,
                       static_cast<double>(raw_faults) / iters)
                << std::endl;
    }
  }
  barrier();
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  int rank = -1;
  std::string store_dir;
  double iters_scale = 1.0;
  size_t segment_kb = 0;
  size_t shm_segment_kb = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (flag == "--store")
      store_dir = argv[i + 1];
    else if (flag == "--iters_scale")
      iters_scale = std::atof(argv[i + 1]);
    else if (flag == "--segment_kb")
      segment_kb = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--shm_segment_kb")
      shm_segment_kb = std::strtoul(argv[i + 1], nullptr, 10);
  }
  if (rank >= 0) {
    return chorus::RunRank(rank, store_dir, iters_scale, segment_kb, shm_segment_kb);
  }

  std::cerr << "machine: " << chorus::ReadMachineFacts().ToString() << "\n";
  char tmpl[] = "/tmp/chorus-allreduce-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {"/proc/self/exe",
                                     "--rank",
                                     std::to_string(r),
                                     "--store",
                                     tmpl,
                                     "--iters_scale",
                                     std::to_string(iters_scale),
                                     "--segment_kb",
                                     std::to_string(segment_kb),
                                     "--shm_segment_kb",
                                     std::to_string(shm_segment_kb)};
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
    pids.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  std::string cleanup = std::string("rm -rf ") + tmpl;
  if (std::system(cleanup.c_str()) != 0) std::cerr << "could not remove " << tmpl << "\n";
  return failures == 0 ? 0 : 1;
}
