#include "worker/runtime/rank_failure.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Runs `f`, which must throw, and returns what it threw.
template <typename F>
std::exception_ptr Thrown(F f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  ADD_FAILURE() << "nothing was thrown";
  return std::make_exception_ptr(std::logic_error("nothing was thrown"));
}

TEST(RankFailureTest, BadAllocIsOutOfMemoryWithTheHint) {
  EXPECT_EQ(
      RankFailureLine(1, "while setting up training", std::make_exception_ptr(std::bad_alloc()),
                      "the spec's estimate for a rank is about 3.1 TB"),
      "rank 1: out of memory while setting up training: std::bad_alloc; the spec's "
      "estimate for a rank is about 3.1 TB");
}

TEST(RankFailureTest, LibTorchErrorsLoseTheirBacktraceAndLineBreaks) {
  // A real failure inside LibTorch: pooling a 1x1 image by 2.
  std::exception_ptr error = Thrown([] { at::max_pool2d(at::zeros({1, 1, 1, 1}), {2}); });
  const ExceptionCause cause = DescribeException(error);
  EXPECT_FALSE(cause.out_of_memory);
  EXPECT_EQ(cause.kind, "LibTorch error");
  EXPECT_THAT(cause.message, HasSubstr("Output size is too small"));
  const std::string line = RankFailureLine(0, "in phase FORWARD at step 0", error, "");
  EXPECT_THAT(line, StartsWith("rank 0: LibTorch error in phase FORWARD at step 0: "));
  EXPECT_THAT(line, Not(HasSubstr("\n")));
  EXPECT_THAT(line, Not(HasSubstr("Exception raised from")));
}

TEST(RankFailureTest, OtherLibTorchExceptionsNameTheirType) {
  // What a loss of the wrong shape does in the trainer: LibTorch 1.13's
  // shape inference throws std::runtime_error, not c10::Error.
  std::exception_ptr error = Thrown([] { at::zeros({16, 3}).reshape({16}); });
  const ExceptionCause cause = DescribeException(error);
  EXPECT_FALSE(cause.out_of_memory);
  EXPECT_EQ(cause.kind, "error (std::runtime_error)");
  EXPECT_EQ(cause.message, "shape '[16]' is invalid for input of size 48");
}

TEST(RankFailureTest, LibTorchAllocationFailureIsOutOfMemory) {
  // 2^60 bytes: no machine has them, so the CPU allocator refuses at once.
  std::exception_ptr error = Thrown([] { at::empty({int64_t{1} << 58}, at::kFloat); });
  const ExceptionCause cause = DescribeException(error);
  EXPECT_TRUE(cause.out_of_memory) << cause.message;
  EXPECT_EQ(cause.kind, "out of memory");
  EXPECT_THAT(cause.message, HasSubstr("you tried to allocate 1152921504606846976 bytes"));
}

TEST(RankFailureTest, OtherExceptions) {
  EXPECT_EQ(RankFailureLine(-1, "while joining the job",
                            std::make_exception_ptr(std::runtime_error("first\n  second\n")), ""),
            "error (std::runtime_error) while joining the job: first | second");
  EXPECT_EQ(RankFailureLine(2, "while training", std::make_exception_ptr(42), ""),
            "rank 2: unknown exception while training: an exception that is not a std::exception");
}

}  // namespace
}  // namespace chorus
