// RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / absl::StatusOr.
//
// Our abseil (20220623) ships neither, so they live here once.
//
// Example:
//   absl::StatusOr<JobSpec> LoadAndCheck(const std::string& path) {
//     ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(path));
//     RETURN_IF_ERROR(ValidateJobSpec(spec));
//     return spec;
//   }
#ifndef CHORUS_COMMON_STATUS_MACROS_H_
#define CHORUS_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing
// function if it is not OK.
#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status chorus_status_macro_status_ = (expr); \
    if (!chorus_status_macro_status_.ok()) {             \
      return chorus_status_macro_status_;                \
    }                                                    \
  } while (false)

#define CHORUS_STATUS_CONCAT_INNER_(a, b) a##b
#define CHORUS_STATUS_CONCAT_(a, b) CHORUS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs`, which may be a
// declaration (`auto x`, `const Foo& y` is not allowed) or an existing lvalue.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  CHORUS_ASSIGN_OR_RETURN_IMPL_(CHORUS_STATUS_CONCAT_(chorus_statusor_, __LINE__), lhs, rexpr)

#define CHORUS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) {                                     \
    return std::move(statusor).status();                    \
  }                                                         \
  lhs = std::move(statusor).value()

#endif  // CHORUS_COMMON_STATUS_MACROS_H_
