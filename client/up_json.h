// The last line `chorus up --json` prints: the job's outcome as one JSON
// object, for scripts (field names and order are part of the interface):
//   {"job_id": "job-000001", "state": "SUCCEEDED", "reason": "...",
//    "final_metrics": {"test_accuracy": 0.81, "test_loss": 0.52, "train_loss": 0.49,
//                      "steps": 200, "samples_per_second": 1234.5, "wall_seconds": 12.3}}
//
// Thread-safety: a plain function of its argument.
//
// Example:
//   std::cout << UpJsonLine(followed->job) << std::endl;
#ifndef CHORUS_CLIENT_UP_JSON_H_
#define CHORUS_CLIENT_UP_JSON_H_

#include <string>

#include "chorus/v1/coordinator.pb.h"

namespace chorus::client {

// `job`'s line, without a newline. Metrics that are not numbers (NaN) are
// null; a metric the job never reported is 0. wall_seconds is the job's own
// measure, else its start to end time on the coordinator. A program job's
// final_metrics has only the metrics its program reported (a zero counts as
// not reported) and wall_seconds when known: {} for a program that reported
// nothing and never started.
std::string UpJsonLine(const v1::Job& job);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_UP_JSON_H_
