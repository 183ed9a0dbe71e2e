#include "worker/runtime/rank_failure.h"

#include <c10/util/Exception.h>
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <typeinfo>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace chorus {
namespace {

// Longer messages are cut: the line becomes a job's reason.
constexpr size_t kMaxMessage = 600;

std::string OneLine(absl::string_view text) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    if (!out.empty()) out += " | ";
    absl::StrAppend(&out, absl::StripAsciiWhitespace(line));
  }
  if (out.size() > kMaxMessage) out = absl::StrCat(out.substr(0, kMaxMessage), "...");
  return out;
}

// The demangled name of a type ("std::runtime_error").
std::string TypeName(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name != nullptr ? std::string(name.get()) : std::string(type.name());
}

}  // namespace

ExceptionCause DescribeException(std::exception_ptr error) {
  ExceptionCause cause;
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc& e) {
    cause.out_of_memory = true;
    cause.kind = "out of memory";
    cause.message = OneLine(e.what());
  } catch (const c10::Error& e) {
    cause.message = OneLine(e.what_without_backtrace());
    // LibTorch's CPU allocator says "can't allocate memory" (posix_memalign
    // failed) or "not enough memory", CUDA's allocator "out of memory".
    const std::string lower = absl::AsciiStrToLower(cause.message);
    cause.out_of_memory = absl::StrContains(lower, "can't allocate memory") ||
                          absl::StrContains(lower, "not enough memory") ||
                          absl::StrContains(lower, "out of memory");
    cause.kind = cause.out_of_memory ? "out of memory" : "LibTorch error";
  } catch (const std::exception& e) {
    cause.kind = absl::StrCat("error (", TypeName(typeid(e)), ")");
    cause.message = OneLine(e.what());
  } catch (...) {
    cause.kind = "unknown exception";
    cause.message = "an exception that is not a std::exception";
  }
  return cause;
}

std::string RankFailureLine(int rank, absl::string_view where, std::exception_ptr error,
                            absl::string_view hint) {
  const ExceptionCause cause = DescribeException(error);
  std::string line = rank >= 0 ? absl::StrCat("rank ", rank, ": ") : std::string();
  absl::StrAppend(&line, cause.kind, " ", where, ": ", cause.message);
  if (!hint.empty()) absl::StrAppend(&line, "; ", OneLine(hint));
  return line;
}

}  // namespace chorus
