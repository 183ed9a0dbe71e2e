// Chooses how same-host all-reduces travel — through shared memory or over
// the TCP ring — per message size, from timings of the first ops of each
// size on this machine, as NCCL tunes its algorithms. Which path wins
// depends on the machine (cores, memory bandwidth, what else runs) and on
// the message size, so it is measured rather than assumed.
//
// Every rank must take the same path for the same op. The tuner is a pure
// function of the op sequence until a size class has its samples; then the
// caller agrees on the timings across ranks (the maximum of each) and passes
// the agreed values to Decide, so every rank decides alike.
//
// Thread-safety: none; the communicator's op thread owns it.
//
// Example (on the op thread):
//   TransportTuner::Path path = tuner.Next(bytes);
//   double seconds = RunOn(path);
//   if (tuner.Record(bytes, path, seconds)) {
//     TransportTuner::Timings t = tuner.Measured(bytes);
//     AgreeOnMaximum(t);  // a small all-reduce
//     LOG(INFO) << tuner.Decide(bytes, t);
//   }
#ifndef CHORUS_WORKER_COMM_TRANSPORT_TUNER_H_
#define CHORUS_WORKER_COMM_TRANSPORT_TUNER_H_

#include <cstddef>
#include <map>
#include <string>

namespace chorus {

class TransportTuner {
 public:
  enum class Path { kSharedMemory, kTcp };

  struct Options {
    // Ops per path whose time is not counted (first-use costs: page faults,
    // buffer growth, connection warm-up).
    int warmup_per_path = 1;
    // Timed ops per path; the best of them is the path's time.
    int samples_per_path = 3;
    // The TCP ring is chosen only when it is faster than shared memory by
    // more than this fraction (Note [Shared memory on near ties]).
    double tcp_margin = 0.1;
  };

  // The best time of each path in one size class, in seconds.
  struct Timings {
    double shared_memory = 0;
    double tcp = 0;
  };

  TransportTuner() : TransportTuner(Options()) {}
  explicit TransportTuner(const Options& options) : options_(options) {}

  // The path for the next all-reduce of `bytes`: the decided one, or while
  // measuring, the paths in turn (shared memory first).
  Path Next(size_t bytes) const;

  // Records the time of an op of `bytes` that ran on `path` (from Next).
  // Returns true when this op completed the class's samples: the caller
  // must then agree on Measured(bytes) and call Decide.
  bool Record(size_t bytes, Path path, double seconds);

  Timings Measured(size_t bytes) const;

  // Whether the class of `bytes` is still being measured (its ops are
  // samples, worth timing from aligned starts).
  bool Measuring(size_t bytes) const;

  // Fixes the class's path from timings every rank agreed on (shared memory
  // unless the TCP ring is faster by more than options.tcp_margin). Returns
  // a line for the log naming the sizes, both timings and the choice.
  std::string Decide(size_t bytes, const Timings& agreed);

  // Size classes are powers of two: [2^k, 2^(k+1)) bytes; below 4 KiB one class.
  static int SizeClass(size_t bytes);

 private:
  struct Class {
    int ops = 0;  // ops recorded so far
    Timings best{-1, -1};
    bool decided = false;
    Path path = Path::kSharedMemory;
  };

  const Options options_;
  std::map<int, Class> classes_;
};

const char* PathName(TransportTuner::Path path);

// Note [Shared memory on near ties]
// The samples of a size class are single ops timed during a job's first
// steps, and even from aligned starts they scatter by some percent.
// Shared memory also takes a fraction of the TCP ring's CPU (0.23 against
// 0.89 ms of CPU for 1 MB, 6.3 against 19.1 ms for 25 MB in
// bench/allreduce_bench), which training on the same cores gets back. So a near
// tie goes to shared memory: on a 2-core machine a DDP run once picked the
// TCP ring for 4-8 MiB on 4.506 against 4.536 ms, and its steps took 31 ms
// instead of 19 (docs/benchmarks.md, DDP step time).

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_TRANSPORT_TUNER_H_
