// The Chorus SDK: run your own C++ LibTorch training loop as a Chorus job.
// One include gives the whole API (docs/sdk.md is the tour):
//   Session             the job as this process sees it: rank, world size,
//                       spec, resume checkpoint, communicator (session.h)
//   DistributedDataParallelFor / DecentralizedDataParallelFor
//                       data parallelism over a module or a named subset of
//                       its parameters (data_parallel.h)
//   ProgressReporter, PhaseScope
//                       step and phase reporting for the hang detector
//                       (progress.h)
//   TensorCheckpoints   checkpoints of named tensors, and resume
//                       (checkpoints.h)
//   MetricsReporter     metrics to `chorus watch` (metrics.h)
//
// Thread-safety: as each header says.
//
// Example:
//   #include "chorus/chorus.h"
//   int main() {
//     auto session = chorus::Session::FromEnvironment();
//     if (!session.ok()) { std::cerr << session.status() << "\n"; return 2; }
//     std::cout << "rank " << (*session)->rank() << " of " << (*session)->world_size() << "\n";
//   }
#ifndef CHORUS_SDK_CHORUS_H_
#define CHORUS_SDK_CHORUS_H_

#include "chorus/checkpoints.h"
#include "chorus/data_parallel.h"
#include "chorus/environment.h"
#include "chorus/metrics.h"
#include "chorus/progress.h"
#include "chorus/session.h"

#endif  // CHORUS_SDK_CHORUS_H_
