// shard_bench: sharded data (data.shards) against its peers, in one
// invocation, on data it generates (docs/benchmarks.md, "Datasets larger
// than memory"). One section per run, each printing its JSON result line
// (docs/benchmarks.md) last:
//
//   page_cache  a data-bound job (a TorchScript linear layer on 64 values of
//               each 16 KiB sample: its step costs next to nothing, Note [A
//               data-bound model]; 1 rank) trains 8 epochs of 302 MB of tar
//               shards already in the page cache (Note [Data-bound
//               settings]); ours = the bytes trained / the time of the
//               whole Train() call (start-up, index, training loop; not the
//               communicator's set-up), peer = an epoch's bytes / the time
//               of `cat SHARDS > /dev/null`; the medians of 7 rounds of cat
//               and the job in one process. A second line (_loop): ours =
//               the bytes / the training loop's time (wall_seconds). The
//               shards are cached by reading them from disk first (Note
//               [Page cache states]). _cores: the process's CPU time over
//               the Train() call's (the cores the job keeps busy), median
//               round. Then the same with: _pooled, a model whose step reads
//               every value (the means of 64 groups); _block_512, shuffle
//               blocks of two batches; _defaults, the default
//               read_ahead_bytes and shuffle_buffer; _reader, the job's
//               ShardReader alone, nothing trained; _in_memory, the job's
//               loop on the same samples in memory (a tensor_file, each
//               batch gathered on the step's thread).
//   page_cache_2k  page_cache's main, _loop, _defaults and _reader lines on
//               2 KiB samples (float32 [512]): 8 shards x 10,240 samples,
//               303 MB, the same model on their first 64 values; the
//               reader's cost per sample, not per byte, is what it shows.
//   cold        the same after `echo 3 > /proc/sys/vm/drop_caches` (root),
//               after a warm-up run; peer = `dd if=SHARD of=/dev/null bs=1M`
//               over every shard, also from dropped caches; the medians of
//               3 rounds of dd and the job.
//   compute     a compute-bound job (mlp 784 -> 1024 -> 1024 -> 10, batch 64,
//               1 thread) trains 80 steps on 20,000 samples from tar shards
//               (ours) and from the same samples in a tensor_file in memory
//               (peer); seconds per step (the jobs' wall_seconds / steps) in
//               12 rounds of in memory, shards, shards, in memory in one
//               process; ratio = the median of the rounds' shards / in
//               memory (Note [Compute-bound rounds]). _null: the same over
//               12 rounds of four in-memory jobs between them, the method's
//               own noise; _median_step and its _null: the same with each
//               job's median step.
//   lm          transformer_lm trains 60 steps from a 1 GiB uint16 token file
//               the bench writes (read_ahead_bytes 16 MiB); ours = the process's
//               peak resident memory (VmHWM), peer = the file's size; a second
//               line: the peak less the peak before training (LibTorch loaded).
//   lm_4g       the same from a 4 GiB token file (4 GiB of disk more).
//   lm_in_memory  the same model on 1,024 synthetic sequences in memory: the
//               process's peak without a dataset to stream (printed only).
//
//   bazel run -c opt //bench:shard_bench -- SECTION [DIR]
//
// DIR (default /tmp/chorus-shard-bench) holds the generated data, which is
// reused by later runs when present.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/train/dataset_pack.h"
#include "worker/train/sampler.h"
#include "worker/train/shard_reader.h"
#include "worker/train/shard_writer.h"
#include "worker/train/trainer.h"

namespace chorus {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

void Json(const std::string& bench, const std::string& metric, const std::string& unit, double ours,
          double peer, const std::string& peer_name) {
  std::cout << absl::StrFormat(
                   "{\"bench\": \"%s\", \"metric\": \"%s\", \"unit\": \"%s\", \"ours\": %.6g, "
                   "\"peer\": %.6g, \"peer_name\": \"%s\", \"ratio\": %.4f}",
                   bench, metric, unit, ours, peer, peer_name, ours / peer)
            << std::endl;
}

// Trains `text` (a job spec) on one rank; the final metrics, or exits.
// `train_seconds`: the time of the Train() call alone (not parsing the spec
// or making and closing the communicator); `step_seconds`: the
// step_time_seconds of every report but the final one (with
// training.log_every_steps 1, each step's).
// `text` (a job spec) parsed and normalized, or exits.
v1::JobSpec ParsedSpec(const std::string& text) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, SpecFormat::kTextProto, "bench");
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    std::exit(1);
  }
  NormalizeJobSpec(*spec);
  return *std::move(spec);
}

v1::Metrics TrainOneRank(const std::string& text, double* train_seconds = nullptr,
                         std::vector<double>* step_seconds = nullptr) {
  const v1::JobSpec spec = ParsedSpec(text);
  MemoryStore store;
  GlooOptions options;
  auto comm = CreateGlooCommunicator(options, store);
  const auto start = std::chrono::steady_clock::now();
  auto report = [step_seconds](const v1::Metrics& m) {
    if (step_seconds != nullptr && !m.values().contains("wall_seconds")) {
      step_seconds->push_back(m.step_time_seconds());
    }
  };
  absl::StatusOr<v1::Metrics> m = comm.ok() ? Train(spec, **comm, report, nullptr, TrainOptions{})
                                            : absl::StatusOr<v1::Metrics>(comm.status());
  if (train_seconds != nullptr) *train_seconds = Seconds(start);
  if (!m.ok()) {
    std::cerr << "training failed: " << m.status() << "\n";
    std::exit(1);
  }
  return *m;
}

// `count` shards of `per_shard` samples x float32 [features], y int64 in
// [0, 10), at DIR/NAME-K.tar; the paths.
std::vector<std::string> WriteShards(const std::string& dir, const std::string& name, int count,
                                     int per_shard, int features) {
  std::vector<std::string> paths;
  at::Generator gen = at::detail::createCPUGenerator(1);
  for (int s = 0; s < count; ++s) {
    const std::string path = absl::StrCat(dir, "/", name, "-", s, ".tar");
    paths.push_back(path);
    if (Exists(path)) continue;
    auto tar = TarWriter::Create(path);
    const at::Tensor x = at::randn({per_shard, features}, gen, at::kFloat).contiguous();
    for (int i = 0; i < per_shard; ++i) {
      const int64_t y = (s * per_shard + i) % 10;
      const std::string key = absl::StrFormat("%08d", s * per_shard + i);
      if (!tar.ok() ||
          !(*tar)
               ->Add(key + ".x.npy",
                     NpyBytes(ElementType::kFloat32, {features}, x[i].data_ptr<float>()))
               .ok() ||
          !(*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok()) {
        std::cerr << "cannot write " << path << "\n";
        std::exit(1);
      }
    }
    if (!(*tar)->Close().ok()) std::exit(1);
  }
  for (const std::string& path : paths) {  // as `chorus dataset pack` writes them
    if (!Exists(IndexFilePath(path)) && !WriteIndexFile(path, "x.npy", "y.npy").ok()) {
      std::cerr << "cannot write the index of " << path << "\n";
      std::exit(1);
    }
  }
  return paths;
}

// The data-bound jobs' models (Note [A data-bound model]), written as
// TorchScript files, as a user's model would be: a linear layer to 10
// classes on 64 values of each sample, either the first 64 (`pooled`
// false: "sliced", the step costs next to nothing) or the means of 64
// groups of all of them (`pooled`: the step reads every value once). The
// input needs no gradient, so backward never touches the batch. Returns
// the file's path in `dir`.
std::string WriteDataBoundModel(const std::string& dir, bool pooled) {
  const std::string path = dir + (pooled ? "/pooled.pt" : "/sliced.pt");
  if (Exists(path)) return path;
  torch::jit::Module m(pooled ? "PooledLinear" : "SlicedLinear");
  at::Generator gen = at::detail::createCPUGenerator(3);
  m.register_parameter("weight",
                       (at::randn({10, 64}, gen, at::kFloat) * 0.1).set_requires_grad(true),
                       /*is_buffer=*/false);
  m.register_parameter("bias", at::zeros({10}, at::kFloat).set_requires_grad(true),
                       /*is_buffer=*/false);
  m.define(pooled ? R"(
def forward(self, x):
    pooled = x.reshape([x.size(0), 64, -1]).mean(2)
    return torch.addmm(self.bias, pooled, self.weight.t())
)"
                  : R"(
def forward(self, x):
    return torch.addmm(self.bias, x.narrow(1, 0, 64), self.weight.t())
)");
  m.save(path);
  return path;
}

// Note [A data-bound model]
// A job is data-bound when its step costs far less than reading its batch.
// The built-in mlp cannot be: even with one hidden unit its forward x·W and
// backward gradᵀ·x each pass over the whole batch, with OpenBLAS's packing
// copies (0.65-0.9 ms for a 4 MB batch, against 0.3-0.8 ms for `cat` to move
// 4 MB), so that job measured the matrix product, not the reader. The
// sliced model's step is the trainer's own work and a 256 x 64 product
// (the forward of the pooled one, which reads the whole 4.2 MB batch, took
// 0.15-0.17 ms, a core's worth at `cat`'s speed on the bench machine): the
// job's throughput is then its reader's. The pooled model is reported too.

// How a data-bound job reads and what it trains (Note [Data-bound
// settings]).
struct DataBoundSettings {
  std::string shards = "bound";  // DIR/SHARDS-*.tar
  int64_t read_ahead_bytes = 16 << 20;
  int64_t shuffle_buffer = 256;
  int epochs = 1;
  bool pooled = false;  // the model (WriteDataBoundModel)
  int batch_size = 256;
};

std::string DataBoundSpec(const std::string& dir, const DataBoundSettings& settings) {
  const std::string model = WriteDataBoundModel(dir, settings.pooled);
  return absl::StrCat(R"(model { torchscript { path: ")", model, R"(" } }
    data { shards { format: TAR paths: ")",
                      dir, "/", settings.shards, R"(-*.tar" num_classes: 10 read_ahead_bytes: )",
                      settings.read_ahead_bytes, " shuffle_buffer: ", settings.shuffle_buffer,
                      R"( } }
    training { batch_size_per_rank: )",
                      settings.batch_size, " epochs: ", settings.epochs,
                      R"( log_every_steps: 1000 }
    optimizer { kind: SGD lr: 0.01 })");
}

// Runs `command` (a peer: cat, dd) with the shell; exits if it fails, since
// its time would mean nothing.
void Shell(const std::string& command) {
  if (std::system(command.c_str()) != 0) {
    std::cerr << "failed: " << command << "\n";
    std::exit(1);
  }
}

void DropCaches() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// page_cache: rounds of `cat` and the job, alternating in one process; the
// medians of each (a single 50 ms `cat` beside other builds varied 2x).
constexpr int kPageCacheRounds = 7;

// Note [Page cache states]
// How fast `cat` copies a file out of the page cache depends on how its
// pages got there. On the bench machine (Linux 6.18, ext4) the bench's
// shards right after it wrote them (a write per tar member) were read at
// 6.8-7.0 GB/s; the same shards dropped from the cache
// (POSIX_FADV_DONTNEED) and read once from the disk, which the kernel's
// read-ahead caches in large folios, at 18-20 GB/s; copies made with
// `cp -p` at 17.8 GB/s; an older set, part of it read back, at 11 GB/s.
// Earlier runs' `cat` figures (3.9-12.6 GB/s) moved with this as much as
// with the load. So page_cache puts the shards in the same state in every
// run, the one a dataset read from disk is in: every shard dropped from the
// cache, then read once by `cat` (ReadIn).
void ReadIn(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);  // only clean pages are dropped
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  Shell(absl::StrCat("cat ", absl::StrJoin(paths, " "), " > /dev/null"));
}

// Unless `path` exists: a tensor_file of `n` x [features] float32 from
// randn and int64 classes in [0, 10), drawn from `seed`.
void WriteRandomTensorFile(const std::string& path, int64_t n, int64_t features, uint64_t seed) {
  if (Exists(path)) return;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("x", at::randn({n, features}, gen, at::kFloat));
  dict.insert("y", at::randint(10, {n}, gen, at::kLong));
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

// The data-bound job's samples in memory: a tensor_file of 16,384 x [4096]
// float32 and int64 classes (its values random: the step's cost does not
// depend on them); the spec of the same job on it.
std::string InMemoryBoundSpec(const std::string& dir, int epochs) {
  const std::string path = dir + "/bound.pt";
  WriteRandomTensorFile(path, 16384, 4096, 4);
  const std::string model = WriteDataBoundModel(dir, /*pooled=*/false);
  return absl::StrCat(R"(model { torchscript { path: ")", model, R"(" } }
    data { tensor_file { path: ")",
                      path, R"(" } }
    training { batch_size_per_rank: 256 epochs: )",
                      epochs, R"( log_every_steps: 1000 }
    optimizer { kind: SGD lr: 0.01 })");
}

struct DataBoundTimes {
  double peer = 0, ours = 0, loop = 0;  // seconds
  double cores = 0;                     // the process's CPU seconds / ours
};

// The process's CPU time so far (every thread's, user and system), seconds.
double CpuSeconds() {
  rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// cold: rounds of `dd` over every shard, then the job, each from dropped
// caches; the medians of each (one `dd` of the 302 MB moved 1.5-2.2 GB/s
// from one minute to the next).
constexpr int kColdRounds = 3;

DataBoundTimes Cold(const std::vector<std::string>& paths, const std::string& spec) {
  // Warm-up run, as page_cache's: the process's code (LibTorch's
  // TorchScript paths among it) mapped before the caches are dropped,
  // which leaves mapped pages alone, so that cold means the data.
  TrainOneRank(spec);
  std::vector<double> peer, ours, loop;
  for (int round = 0; round < kColdRounds; ++round) {
    DropCaches();
    auto start = std::chrono::steady_clock::now();
    for (const std::string& p : paths) {
      Shell(absl::StrCat("dd if=", p, " of=/dev/null bs=1M status=none"));
    }
    peer.push_back(Seconds(start));
    DropCaches();
    ours.push_back(0);
    loop.push_back(TrainOneRank(spec, &ours.back()).values().at("wall_seconds"));
    std::cerr << absl::StrFormat("round %d: dd %.3f s, training %.3f s (its loop %.3f s)\n", round,
                                 peer.back(), ours.back(), loop.back());
  }
  return DataBoundTimes{Median(peer), Median(ours), Median(loop)};
}

// The job's reader alone (ShardReader, as the trainer drives it, with
// nothing trained): one epoch of the job's batches per round; the median
// round's seconds. What a reader gives a step that costs nothing.
double ReaderAlone(const std::string& text) {
  const v1::JobSpec spec = ParsedSpec(text);
  const v1::ShardedData& data = spec.data().shards();
  absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(data, {});
  if (!reader.ok()) {
    std::cerr << reader.status() << "\n";
    std::exit(1);
  }
  const std::vector<int64_t> sizes = (*reader)->index().ShardSizes();
  SamplerOptions o;
  for (int64_t n : sizes) o.num_samples += n;
  o.batch_size = spec.training().batch_size_per_rank();
  o.seed = spec.training().seed();
  std::vector<double> rounds;
  for (int round = 0; round < kPageCacheRounds + 1; ++round) {
    const auto start = std::chrono::steady_clock::now();
    StreamCursor cursor(sizes, data.shuffle_buffer(), o, round);
    (*reader)->Start({cursor.size(), [cursor]() mutable { return cursor.Next(); }}, o.batch_size);
    for (int64_t b = 0; b < (cursor.size() + o.batch_size - 1) / o.batch_size; ++b) {
      if (!(*reader)->Next().ok()) std::exit(1);
    }
    if (round > 0) rounds.push_back(Seconds(start));  // round 0 fills the buffer pool
  }
  return Median(rounds);
}

// page_cache: the medians of kPageCacheRounds rounds of `cat` and the job.
DataBoundTimes PageCache(const std::vector<std::string>& paths, const std::string& spec) {
  const std::string cat = absl::StrCat("cat ", absl::StrJoin(paths, " "), " > /dev/null");
  TrainOneRank(spec);  // warm-up run
  std::vector<double> peer, ours, loop, cores;
  for (int round = 0; round < kPageCacheRounds; ++round) {
    auto start = std::chrono::steady_clock::now();
    Shell(cat);
    peer.push_back(Seconds(start));
    ours.push_back(0);
    const double cpu = CpuSeconds();
    const v1::Metrics m = TrainOneRank(spec, &ours.back());
    cores.push_back((CpuSeconds() - cpu) / ours.back());
    loop.push_back(m.values().at("wall_seconds"));
    std::cerr << absl::StrFormat(
        "round %d: cat %.3f s, training %.3f s (its loop %.3f s, %.2f cores busy), waited for "
        "data %.2f ms a step of %.2f ms\n",
        round, peer.back(), ours.back(), loop.back(), cores.back(),
        1e3 * m.values().at("data_wait_seconds"), 1e3 * loop.back() / m.step());
  }
  return DataBoundTimes{Median(peer), Median(ours), Median(loop), Median(cores)};
}

// Note [Data-bound settings]
// The page-cache jobs train kPageCacheEpochs epochs per round (each round
// 0.12-0.3 s), so that a round's first steps (the TorchScript executor's
// first calls, the batch buffers' first touch) weigh as little on the whole
// call as in a job of many epochs: with 4 epochs the main line read
// 0.76-0.98 of `cat` in ten runs, with 8 0.90-1.07 in six. The main line's job reads with
// read_ahead_bytes 16 MiB and shuffle_buffer 256, one batch: each batch is
// then a whole shuffle block, which a group (Note [Grouped reads] in
// worker/train/shard_reader.cc) reads in runs of neighbours, and 16 MiB of batches stay
// in the CPU's 32 MiB cache from the reader's copy to the step (with 64
// MiB a step of the pooled model took 0.56-0.60 ms against 0.36-0.43 ms).
// A shuffle block of one batch mixes samples no further than the batch:
// it suits shards written in shuffled order (WebDataset's practice), and
// the _block_512 and _defaults lines show what larger blocks cost. Cold
// reads one epoch with the main line's settings: after the first, the
// page cache holds the shards.
constexpr int kPageCacheEpochs = 8;

// The shards a data-bound section reads and the prefix of its lines.
struct DataBoundShards {
  std::string name;  // DIR/NAME-K.tar
  int per_shard = 0;
  int features = 0;    // float32 values per sample
  std::string prefix;  // of the JSON lines' names
};

// 8 shards x 2048 samples x (16 KiB + headers): 302 MB.
const DataBoundShards kLargeSamples{"bound", 2048, 4096, "shards_page_cache"};
// 8 shards x 10,240 samples x (2 KiB + headers): 303 MB.
const DataBoundShards kSmallSamples{"bound2k", 10240, 512, "shards_page_cache_2k"};

// The shards' paths and their bytes in all.
std::pair<std::vector<std::string>, int64_t> DataBoundPaths(const std::string& dir,
                                                            const DataBoundShards& shards) {
  std::pair<std::vector<std::string>, int64_t> out;
  out.first = WriteShards(dir, shards.name, 8, shards.per_shard, shards.features);
  for (const std::string& p : out.first) out.second += FileSize(p);
  return out;
}

void ReportDataBound(const std::string& name, const DataBoundTimes& t, int epochs, int64_t bytes,
                     bool cold) {
  const std::string peer = cold ? "dd" : "cat";
  std::cerr << absl::StrFormat(
      "%s: %d bytes x %d epochs: training %.3f s (its loop %.3f s), %s %.3f s\n", name, bytes,
      epochs, t.ours, t.loop, peer, t.peer);
  Json(name, "shard read throughput of a data-bound job, the whole Train() call", "MB/s",
       epochs * bytes / t.ours / 1e6, bytes / t.peer / 1e6, peer);
  Json(name + "_loop", "shard read throughput of a data-bound job, its training loop", "MB/s",
       epochs * bytes / t.loop / 1e6, bytes / t.peer / 1e6, peer);
}

// page_cache_2k: the main line, the defaults, a batch of 256 and the
// reader alone on 2 KiB samples (docs/benchmarks.md, "Small samples").
int DataBoundSmallSamples(const std::string& dir) {
  const auto [paths, bytes] = DataBoundPaths(dir, kSmallSamples);
  const std::string prefix = kSmallSamples.prefix;
  ReadIn(paths);
  const DataBoundSettings settings{.shards = kSmallSamples.name,
                                   .shuffle_buffer = 2048,
                                   .epochs = kPageCacheEpochs,
                                   .batch_size = 2048};
  const DataBoundTimes page_cache = PageCache(paths, DataBoundSpec(dir, settings));
  ReportDataBound(prefix, page_cache, kPageCacheEpochs, bytes, false);
  DataBoundSettings defaults = settings;
  defaults.read_ahead_bytes = 64 << 20;
  defaults.shuffle_buffer = 4096;
  ReportDataBound(prefix + "_defaults", PageCache(paths, DataBoundSpec(dir, defaults)),
                  kPageCacheEpochs, bytes, false);
  DataBoundSettings batch_256 = settings;
  batch_256.batch_size = 256;
  batch_256.shuffle_buffer = 256;
  ReportDataBound(prefix + "_batch_256", PageCache(paths, DataBoundSpec(dir, batch_256)),
                  kPageCacheEpochs, bytes, false);
  const double reader = ReaderAlone(DataBoundSpec(dir, settings));
  std::cerr << absl::StrFormat("the reader alone: %.4f s an epoch\n", reader);
  Json(prefix + "_reader",
       "the job's reader alone, nothing trained (ShardReader as the trainer drives it): an "
       "epoch's bytes / its time",
       "MB/s", bytes / reader / 1e6, bytes / page_cache.peer / 1e6, "cat");
  return 0;
}

// page_cache and cold.
int DataBound(const std::string& dir, bool cold) {
  const auto [paths, bytes] = DataBoundPaths(dir, kLargeSamples);
  auto report = [&, bytes = bytes](const std::string& name, const DataBoundTimes& t, int epochs) {
    ReportDataBound(name, t, epochs, bytes, cold);
  };
  if (cold) {
    report("shards_cold", Cold(paths, DataBoundSpec(dir, {})), 1);
    return 0;
  }
  ReadIn(paths);
  const DataBoundSettings settings{.epochs = kPageCacheEpochs};
  const DataBoundTimes page_cache = PageCache(paths, DataBoundSpec(dir, settings));
  report("shards_page_cache", page_cache, kPageCacheEpochs);
  Json("shards_page_cache_cores",
       "the cores the job keeps busy: the process's CPU time / the Train() call's, median round",
       "cores", page_cache.cores, std::thread::hardware_concurrency(), "the machine's cores");
  DataBoundSettings pooled = settings;
  pooled.pooled = true;
  report("shards_page_cache_pooled", PageCache(paths, DataBoundSpec(dir, pooled)),
         kPageCacheEpochs);
  DataBoundSettings block_512 = settings;
  block_512.shuffle_buffer = 512;
  report("shards_page_cache_block_512", PageCache(paths, DataBoundSpec(dir, block_512)),
         kPageCacheEpochs);
  DataBoundSettings defaults = settings;
  defaults.read_ahead_bytes = 64 << 20;
  defaults.shuffle_buffer = 4096;
  report("shards_page_cache_defaults", PageCache(paths, DataBoundSpec(dir, defaults)),
         kPageCacheEpochs);
  const double reader = ReaderAlone(DataBoundSpec(dir, settings));
  std::cerr << absl::StrFormat("the reader alone: %.4f s an epoch\n", reader);
  Json("shards_page_cache_reader",
       "the job's reader alone, nothing trained (ShardReader as the trainer drives it): an "
       "epoch's bytes / its time",
       "MB/s", bytes / reader / 1e6, bytes / page_cache.peer / 1e6, "cat");
  // The same job's loop with its samples in memory.
  const std::string in_memory = InMemoryBoundSpec(dir, kPageCacheEpochs);
  TrainOneRank(in_memory);  // warm-up run
  std::vector<double> loops;
  for (int round = 0; round < kPageCacheRounds; ++round) {
    loops.push_back(TrainOneRank(in_memory).values().at("wall_seconds"));
  }
  std::cerr << absl::StrFormat("in memory: loops %s s\n", absl::StrJoin(loops, " "));
  Json("shards_page_cache_in_memory",
       "the same job with the same samples in memory (a tensor_file; the step's thread gathers "
       "each batch): the bytes / its training loop",
       "MB/s", kPageCacheEpochs * bytes / Median(loops) / 1e6, bytes / page_cache.peer / 1e6,
       "cat");
  return 0;
}

// Note [Compute-bound rounds]
// The compute-bound target is a 2 % difference, below what separate runs
// of the same job can show (in-memory steps varied 4.4 % from one run to
// the next on a quiet machine). So one process runs kComputeRounds rounds
// of four jobs of kComputeSteps steps back to back, alternately
// "compared" rounds (in memory, shards, shards, in memory) and "null"
// rounds (four in memory). A round's figure is the mean of its two middle
// jobs against the mean of its first and last, so a drift of the
// machine's speed that is linear over the round cancels; the figure is the
// median of the rounds' ratios, so that neither one disturbed round nor the
// machine's speed moving from round to round (6.0-7.9 ms a step within one
// run) moves it. The null rounds compute the same estimator on the same code
// in the same positions: their ratio's distance from 1 is the method's own
// noise, to read the figure against. (An earlier form, in memory, shards,
// in memory, took the second in-memory job against the first as its null,
// which measured the drift within a round, 1-5 % slower later in the
// round on a quiet machine, rather than the estimator's noise.) Two
// figures of a job: wall_seconds / steps (every step counted: a reader
// that made one step in ten wait shows) and its median step (each step's
// step_time_seconds, reported every step), which a burst of another
// process's work moves less.
constexpr int kComputeRounds = 24;
constexpr int kComputeSteps = 80;

// The compute section's data: DIR/compute.pt (20,000 x [784] and classes)
// and the same samples packed into 4 tar shards; the tensor file's path, or
// the packing's error.
absl::StatusOr<std::string> WriteComputeData(const std::string& dir) {
  const std::string tensor_file = dir + "/compute.pt";
  WriteRandomTensorFile(tensor_file, 20000, 784, 2);
  if (!Exists(dir + "/compute-000000.tar")) {
    absl::StatusOr<PackResult> packed = PackDataset({tensor_file, dir + "/compute", 5000});
    if (!packed.ok()) return packed.status();
  }
  return tensor_file;
}

// compute: shards against the same samples in memory.
int ComputeBound(const std::string& dir) {
  const absl::StatusOr<std::string> written = WriteComputeData(dir);
  if (!written.ok()) {
    std::cerr << written.status() << "\n";
    return 1;
  }
  const std::string& tensor_file = *written;
  const std::string common = absl::StrCat(R"(model { mlp { hidden_sizes: [1024, 1024] } }
    training { batch_size_per_rank: 64 log_every_steps: 1 shuffle: true max_steps: )",
                                          kComputeSteps, R"( }
    optimizer { kind: SGD lr: 0.01 } eval { disabled: true }
    resources { threads_per_rank: 1 })");
  const std::string in_memory =
      absl::StrCat(common, "data { tensor_file { path: \"", tensor_file, "\" } }");
  const std::string shards = absl::StrCat(common, "data { shards { format: TAR paths: \"", dir,
                                          "/compute-*.tar\" num_classes: 10 } }");
  struct Job {
    double mean = 0;    // wall_seconds / steps: every step counted
    double median = 0;  // the median step
  };
  auto run = [](const std::string& spec) {
    std::vector<double> steps;
    const v1::Metrics m = TrainOneRank(spec, nullptr, &steps);
    return Job{m.values().at("wall_seconds") / m.step(), Median(steps)};
  };
  run(in_memory);  // warm-up: the process's first job pays for its allocations
  // Note [Compute-bound rounds]: (outer, inner) = the means of a round's
  // first and last jobs, and of its two middle ones.
  struct Round {
    Job outer, inner;
  };
  std::vector<Round> compared, null;
  for (int round = 0; round < kComputeRounds; ++round) {
    const bool is_null = round % 2 == 1;
    const std::string& inner = is_null ? in_memory : shards;
    Job jobs[4] = {run(in_memory), run(inner), run(inner), run(in_memory)};
    auto mean = [](const Job& a, const Job& b) {
      return Job{(a.mean + b.mean) / 2, (a.median + b.median) / 2};
    };
    (is_null ? null : compared).push_back({mean(jobs[0], jobs[3]), mean(jobs[1], jobs[2])});
    std::cerr << absl::StrFormat(
        "round %d (%s), s/step (mean, median step): in memory %.5f %.5f, %s %.5f %.5f, %.5f "
        "%.5f, in memory %.5f %.5f\n",
        round, is_null ? "null" : "compared", jobs[0].mean, jobs[0].median,
        is_null ? "in memory" : "shards", jobs[1].mean, jobs[1].median, jobs[2].mean,
        jobs[2].median, jobs[3].mean, jobs[3].median);
  }
  // The median over rounds of inner / outer, by one figure of the jobs.
  auto ratio = [](const std::vector<Round>& rounds, double Job::*f) {
    std::vector<double> v;
    for (const Round& r : rounds) v.push_back(r.inner.*f / r.outer.*f);
    return Median(v);
  };
  const std::string memory = "the same round's in-memory jobs (= 1)";
  Json("shards_compute_bound",
       "seconds per step of the mlp (wall_seconds / steps), shards / in memory in rounds of in "
       "memory, shards, shards, in memory: the median of the rounds' ratios",
       "ratio", ratio(compared, &Job::mean), 1.0, memory);
  Json("shards_compute_bound_null", "the same with every job in memory (the method's own noise)",
       "ratio", ratio(null, &Job::mean), 1.0, memory);
  Json("shards_compute_bound_median_step",
       "the median step of the mlp, shards / in memory in rounds of in memory, shards, shards, "
       "in memory: the median of the rounds' ratios",
       "ratio", ratio(compared, &Job::median), 1.0, memory);
  Json("shards_compute_bound_median_step_null",
       "the same with every job in memory (the method's own noise)", "ratio",
       ratio(null, &Job::median), 1.0, memory);
  return 0;
}

// Peak resident memory of this process (VmHWM), bytes.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    int64_t kb = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) return kb * 1024;
  }
  return -1;
}

int LanguageModel(const std::string& dir, bool in_memory, int gib) {
  const std::string path =
      gib == 1 ? dir + "/tokens.bin" : absl::StrCat(dir, "/tokens-", gib, "g.bin");
  const int64_t kTokens = int64_t{gib} << 29;  // GIB GiB of uint16
  if (FileSize(path) != kTokens * 2) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    std::vector<uint16_t> chunk(1 << 22);
    uint32_t state = 1;
    for (int64_t written = 0; written < kTokens; written += chunk.size()) {
      for (uint16_t& t : chunk) {
        state = state * 1664525u + 1013904223u;
        t = static_cast<uint16_t>(state >> 24);  // 0..255
      }
      out.write(reinterpret_cast<const char*>(chunk.data()), chunk.size() * 2);
    }
  }
  const int64_t before = PeakRss();
  const std::string data = in_memory ? std::string("synthetic { kind: TOKENS num_samples: 1024 }")
                                     : absl::StrCat("shards { format: TOKENS paths: '", path,
                                                    "' read_ahead_bytes: 16777216 }");
  const std::string spec =
      "model { transformer_lm { vocab_size: 256 context_length: 128 d_model: 64 num_heads: 2 "
      "num_layers: 1 } } data { " +
      data +
      " } "
      "training { batch_size_per_rank: 16 max_steps: 60 log_every_steps: 1000 } "
      "optimizer { kind: ADAMW lr: 0.001 }";
  const v1::Metrics m = TrainOneRank(spec);
  const int64_t peak = PeakRss();
  const double file = static_cast<double>(FileSize(path));
  std::cerr << absl::StrFormat(
      "%d steps, loss %.3f, peak RSS %d bytes (%d before training, %d more in training), file %d "
      "bytes: peak %.4f, before %.4f, difference %.4f of the file\n",
      m.step(), m.loss(), peak, before, peak - before, FileSize(path), peak / file, before / file,
      (peak - before) / file);
  if (in_memory) return 0;  // the figure to compare with by hand: see docs/benchmarks.md
  const std::string name =
      gib == 1 ? "shards_lm_memory" : absl::StrCat("shards_lm_memory_", gib, "g");
  Json(name,
       absl::StrCat("peak resident memory of a rank training from a ", gib, " GiB token file"),
       "bytes", peak, file, "the token file's size");
  Json(name + "_training", "peak resident memory less the process's peak before training", "bytes",
       peak - before, file, "the token file's size");
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: shard_bench page_cache|page_cache_2k|cold|compute|lm|lm_4g|lm_in_memory "
                 "[DIR]\n";
    return 2;
  }
  const std::string section = argv[1];
  const std::string dir = argc > 2 ? argv[2] : "/tmp/chorus-shard-bench";
  ::mkdir(dir.c_str(), 0755);
  if (section == "page_cache") return chorus::DataBound(dir, false);
  if (section == "page_cache_2k") return chorus::DataBoundSmallSamples(dir);
  if (section == "cold") return chorus::DataBound(dir, true);
  if (section == "compute") return chorus::ComputeBound(dir);
  if (section == "lm") return chorus::LanguageModel(dir, /*in_memory=*/false, 1);
  if (section == "lm_4g") return chorus::LanguageModel(dir, /*in_memory=*/false, 4);
  if (section == "lm_in_memory") return chorus::LanguageModel(dir, /*in_memory=*/true, 1);
  std::cerr << "unknown section " << section << "\n";
  return 2;
}
