#include "worker/train/sample_trace.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace chorus {
namespace {

class TwoTensors : public Model {
 public:
  explicit TwoTensors(float value) : w_(torch::full({3}, value)), b_(torch::zeros({1})) {}
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override { return input; }
  std::vector<NamedTensor> NamedParameters() override { return {{"w", w_}}; }
  std::vector<NamedTensor> NamedBuffers() override { return {{"b", b_}}; }
  void SetTraining(bool) override {}

 private:
  at::Tensor w_, b_;
};

TEST(SampleTraceTest, WritesOneLinePerEventIntoThisProcessesFile) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  absl::StatusOr<std::unique_ptr<SampleTrace>> trace = SampleTrace::Open(dir);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_NE(*trace, nullptr);
  TwoTensors model(1.5f);
  (*trace)->Step(2, 1, 7, 0, torch::tensor({5, 9, 3}, torch::kLong));
  (*trace)->State(2, 1, 0, 7, -1, model);
  (*trace)->Final(2, 1, 12, model);
  trace->reset();
  std::ifstream in(dir + "/" + std::to_string(::getpid()) + ".trace");
  std::stringstream text;
  text << in.rdbuf();
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", SampleTrace::Fingerprint(model));
  EXPECT_EQ(text.str(), std::string("step 2 1 7 0 5,9,3\nstate 2 1 source 0 step 7 had -1 model ") +
                            crc + "\nfinal 2 1 12 " + crc + "\n");
}

TEST(SampleTraceTest, TheFingerprintSeesEveryByte) {
  TwoTensors a(1.5f), b(1.5f), c(1.25f);
  EXPECT_EQ(SampleTrace::Fingerprint(a), SampleTrace::Fingerprint(b));
  EXPECT_NE(SampleTrace::Fingerprint(a), SampleTrace::Fingerprint(c));
}

TEST(SampleTraceTest, NoDirectoryNoTraceAndABadOneIsNamed) {
  absl::StatusOr<std::unique_ptr<SampleTrace>> none = SampleTrace::Open("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  absl::StatusOr<std::unique_ptr<SampleTrace>> bad = SampleTrace::Open("/nonexistent/dir");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("CHORUS_SAMPLE_TRACE: cannot open /nonexistent/dir/"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace chorus
