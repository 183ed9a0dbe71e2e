// SampleTrace: a test mode that writes down which samples each step of a rank
// trained, and the fingerprint of its final model, so that an end-to-end
// test can prove what elastic re-formation promises (docs/elastic.md): every
// sample of an interrupted epoch is trained exactly once, and every rank
// ends with the same parameters. chorus-rank turns it on when the
// environment names a directory in CHORUS_SAMPLE_TRACE (one file per rank
// process, <dir>/<pid>.trace); it is off otherwise.
//
// Lines (one write(2) each, so a process killed mid-run leaves whole lines):
//   step GENERATION RANK STEP EPOCH I1,I2,...   before the step's first
//       collective: the samples this rank feeds into step STEP (0-based),
//       one line per micro-batch (gradient accumulation)
//   state GENERATION RANK source SOURCE step STEP had HELD model CRC32C
//       after a re-formed generation shared its state (HELD -1: a newcomer;
//       SOURCE -1: no member held any and the generation started over, Note
//       [Starting over] in trainer.cc); CRC32C as in `final`, of the model
//       this rank starts the generation with (the same on every member)
//   final GENERATION RANK STEP CRC32C           the parameters' and buffers'
//       bytes, in order, after the last step
//
// Thread-safety: one training thread writes.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<SampleTrace> trace, SampleTrace::Open(dir));
//   if (trace) trace->Step(generation, rank, step, epoch, idx);
#ifndef CHORUS_WORKER_TRAIN_SAMPLE_TRACE_H_
#define CHORUS_WORKER_TRAIN_SAMPLE_TRACE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/train/model.h"

namespace chorus {

class SampleTrace {
 public:
  // The trace of this process in directory `dir`; null for an empty `dir`.
  // INVALID_ARGUMENT naming the file if it cannot be opened.
  static absl::StatusOr<std::unique_ptr<SampleTrace>> Open(const std::string& dir);
  ~SampleTrace();
  SampleTrace(const SampleTrace&) = delete;
  SampleTrace& operator=(const SampleTrace&) = delete;

  void Step(int64_t generation, int rank, int64_t step, int64_t epoch, const at::Tensor& indices);
  void State(int64_t generation, int rank, int source, int64_t step, int64_t held, Model& model);
  void Final(int64_t generation, int rank, int64_t step, Model& model);

  // CRC-32C of the bytes of the model's parameters, then buffers, in order.
  static uint32_t Fingerprint(Model& model);

 private:
  explicit SampleTrace(int fd) : fd_(fd) {}
  void Write(const std::string& line);

  const int fd_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SAMPLE_TRACE_H_
