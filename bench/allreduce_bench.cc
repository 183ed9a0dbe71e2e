// allreduce_bench: Chorus's Communicator::AllReduce + Wait against raw
// gloo::allreduce on the same library, buffers and process pair.
//
//   bazel run -c opt //bench:allreduce_bench \
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
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// The three all-reduces a rank compares, each connected to the other rank:
// raw gloo on a context of its own, ours (shared memory, as both ranks share
// this host) and ours again with shared memory off (the TCP ring).
class AllreduceSides {
 public:
  static absl::StatusOr<std::unique_ptr<AllreduceSides>> Connect(int rank, Store& store,
                                                                 size_t segment_kb,
                                                                 size_t shm_segment_kb) {
    std::unique_ptr<AllreduceSides> sides(new AllreduceSides(store));
    // Raw gloo: its own context over the same kind of TCP device.
    GlooStore raw_gloo_store(sides->raw_store_, absl::Seconds(60));
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    sides->raw_ = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    sides->raw_->setTimeout(std::chrono::seconds(120));
    sides->raw_->connectFullMesh(raw_gloo_store, device);

    GlooOptions options;
    options.rank = rank;
    options.size = 2;
    options.op_timeout = absl::Seconds(120);
    if (segment_kb > 0) options.segment_bytes = segment_kb * 1024;
    if (shm_segment_kb > 0) options.shm_segment_bytes = shm_segment_kb * 1024;
    auto ours = CreateGlooCommunicator(options, sides->ours_store_);
    if (!ours.ok()) return ours.status();
    sides->ours_ = *ours;
    GlooOptions tcp_options = options;
    tcp_options.shared_memory = false;
    auto tcp = CreateGlooCommunicator(tcp_options, sides->tcp_store_);
    if (!tcp.ok()) return tcp.status();
    sides->tcp_ = *tcp;
    return sides;
  }

  // A barrier on the raw context, which every side's op starts after.
  void Barrier() {
    gloo::BarrierOptions opts(raw_);
    opts.setTag(raw_tag_++);
    gloo::barrier(opts);
  }

  void RawAllReduce(at::Tensor& buf) {
    gloo::AllreduceOptions opts(raw_);
    opts.setOutput(buf.data_ptr<float>(), static_cast<size_t>(buf.numel()));
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(raw_tag_++);
    gloo::allreduce(opts);
  }

  absl::Status OurAllReduce(at::Tensor& buf) { return AllReduceWith(*ours_, buf); }
  absl::Status TcpAllReduce(at::Tensor& buf) { return AllReduceWith(*tcp_, buf); }

 private:
  explicit AllreduceSides(Store& store)
      : raw_store_(store, "raw"), ours_store_(store, "ours"), tcp_store_(store, "tcp") {}

  static absl::Status AllReduceWith(Communicator& comm, at::Tensor& buf) {
    return comm.AllReduce(buf, ReduceOp::kSum, "bench")->Wait(absl::Now() + absl::Seconds(120));
  }

  PrefixStore raw_store_;
  PrefixStore ours_store_;
  PrefixStore tcp_store_;
  std::shared_ptr<gloo::rendezvous::Context> raw_;
  uint32_t raw_tag_ = 1;
  std::shared_ptr<Communicator> ours_;
  std::shared_ptr<Communicator> tcp_;
};

// One timed op: wall time, CPU time of this process and its minor page
// faults.
struct OpSample {
  double ms = 0;
  double cpu_ms = 0;
  int64_t faults = 0;
};

absl::StatusOr<OpSample> TimeOp(absl::FunctionRef<absl::Status()> op) {
  const double c0 = ProcessCpuMs();
  const int64_t f0 = MinorPageFaults();
  const absl::Time t0 = absl::Now();
  const absl::Status s = op();
  OpSample sample;
  sample.ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  sample.cpu_ms = ProcessCpuMs() - c0;
  sample.faults = MinorPageFaults() - f0;
  if (!s.ok()) return s;
  return sample;
}

// One side's measured ops of one size.
struct SideTimes {
  std::vector<double> ms;
  std::vector<double> cpu_ms;
  int64_t faults = 0;  // summed over the measured ops

  void Add(const OpSample& op) {
    ms.push_back(op.ms);
    cpu_ms.push_back(op.cpu_ms);
    faults += op.faults;
  }
};

struct Size {
  const char* name;
  int64_t mb;
  int iters;
};

// One size's buffers (each side sums into its own) and measured ops.
struct SizeRun {
  explicit SizeRun(int64_t n)
      : raw_buf(at::ones({n})), our_buf(at::ones({n})), tcp_buf(at::ones({n})) {}

  at::Tensor raw_buf, our_buf, tcp_buf;
  SideTimes raw, ours, tcp;
};

// 8 warm-up rounds on every side, then `iters` measured ones; in each round
// raw, ours and ours over TCP run one after another, each after a barrier.
// Ours measures both transports on its first 8 all-reduces of a size
// (TransportTuner) before it settles.
absl::Status RunRounds(AllreduceSides& sides, int iters, SizeRun& run) {
  for (int i = -8; i < iters; ++i) {
    sides.Barrier();
    absl::StatusOr<OpSample> raw = TimeOp([&] {
      sides.RawAllReduce(run.raw_buf);
      return absl::OkStatus();
    });
    sides.Barrier();
    absl::StatusOr<OpSample> ours = TimeOp([&] { return sides.OurAllReduce(run.our_buf); });
    if (!ours.ok()) return ours.status();
    sides.Barrier();
    absl::StatusOr<OpSample> tcp = TimeOp([&] { return sides.TcpAllReduce(run.tcp_buf); });
    if (!tcp.ok()) return tcp.status();
    if (i >= 0) {
      run.raw.Add(*raw);
      run.ours.Add(*ours);
      run.tcp.Add(*tcp);
    }
  }
  return absl::OkStatus();
}

// Rank 0's report of one size: the details on stderr, the result line on
// stdout.
void PrintResult(const Size& size, int iters, const SizeRun& run) {
  const double ours = Median(run.ours.ms);
  const double peer = Median(run.raw.ms);
  const double tcp = Median(run.tcp.ms);
  const double gbps = 2.0 * (size.mb / 1024.0) / (peer / 1000.0);
  const double our_faults = static_cast<double>(run.ours.faults) / iters;
  const double raw_faults = static_cast<double>(run.raw.faults) / iters;
  std::cerr << absl::StrFormat(
      "allreduce %s: ours %.2f ms (%.2f ms CPU), raw gloo %.2f ms (%.2f ms CPU), %.2f GB/s "
      "algorithm bandwidth for raw gloo, %d iters; ours with shared memory off (TCP ring) "
      "%.2f ms (ratio %.2f); page faults per op on rank 0: ours %.1f, raw %.1f, TCP ring "
      "%.1f\n",
      size.name, ours, Median(run.ours.cpu_ms), peer, Median(run.raw.cpu_ms), gbps / 2.0, iters,
      tcp, tcp / peer, our_faults, raw_faults, static_cast<double>(run.tcp.faults) / iters);
  std::cout << absl::StrFormat(
                   "{\"bench\": \"allreduce_%s\", \"metric\": \"median_time_per_allreduce\", "
                   "\"unit\": \"ms\", \"ours\": %.3f, \"peer\": %.3f, \"peer_name\": \"raw "
                   "gloo::allreduce\", \"ratio\": %.4f, \"ours_page_faults_per_op\": %.1f, "
                   "\"peer_page_faults_per_op\": %.1f}",
                   size.name, ours, peer, ours / peer, our_faults, raw_faults)
            << std::endl;
}

int RunRank(int rank, const std::string& store_dir, double iters_scale, size_t segment_kb,
            size_t shm_segment_kb) {
  at::set_num_threads(1);
  auto store = FileStore::Open(store_dir);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 1;
  }
  auto sides = AllreduceSides::Connect(rank, **store, segment_kb, shm_segment_kb);
  if (!sides.ok()) {
    std::cerr << sides.status() << "\n";
    return 1;
  }
  const std::vector<Size> sizes = {{"1MB", 1, 60}, {"100MB", 100, 6}, {"25MB", 25, 16}};
  for (const Size& size : sizes) {
    SizeRun run(size.mb * 1024 * 1024 / 4);
    const int iters = std::max(3, static_cast<int>(size.iters * iters_scale));
    if (absl::Status s = RunRounds(**sides, iters, run); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    // Every buffer saw the same number of sums: check they agree.
    if (!at::equal(run.raw_buf, run.our_buf) || !at::equal(run.raw_buf, run.tcp_buf)) {
      std::cerr << "results differ between raw gloo and Chorus\n";
      return 1;
    }
    if (rank == 0) PrintResult(size, iters, run);
  }
  (*sides)->Barrier();
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
