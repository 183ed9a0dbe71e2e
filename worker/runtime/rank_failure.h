// The message a rank process leaves on stderr, as its error record, when it
// fails with an exception: what happened (out of memory, a LibTorch error,
// another exception), where (which rank, which stage of its work) and the
// cause's message, with no backtrace. The coordinator makes a rank's last
// error record the job's reason (Note [Rank error record] in
// common/output_limits.h), so it must say everything on its own.
//
// Thread-safety: pure functions.
//
// Example:
//   try {
//     return Run(where);
//   } catch (...) {
//     std::cerr << RankErrorRecord(RankFailureLine(where.rank, where.Describe(),
//                                                  std::current_exception(), ""))
//               << std::endl;
//     return 1;
//   }
#ifndef CHORUS_WORKER_RUNTIME_RANK_FAILURE_H_
#define CHORUS_WORKER_RUNTIME_RANK_FAILURE_H_

#include <exception>
#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

struct ExceptionCause {
  bool out_of_memory = false;
  // "out of memory", "LibTorch error", "error (TYPE)" for another
  // std::exception, or "unknown exception".
  std::string kind;
  // The message on one line: a c10::Error's without its backtrace.
  std::string message;
};

// Classifies `error` (which must not be null). std::bad_alloc and LibTorch's
// allocation failures ("can't allocate memory", "not enough memory", "out of
// memory") count as out of memory.
ExceptionCause DescribeException(std::exception_ptr error);

// "rank 1: out of memory while setting up training: std::bad_alloc; <hint>".
// `rank` < 0 (not joined yet) leaves the rank out; `hint` may be empty.
std::string RankFailureLine(int rank, absl::string_view where, std::exception_ptr error,
                            absl::string_view hint);

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_RANK_FAILURE_H_
