#include "common/cpu_pressure.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cpu_binding.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(CpuPressureTest, PsiSomeAvg10IsTheShare) {
  EXPECT_DOUBLE_EQ(*ParsePsiCpuSome("some avg10=76.66 avg60=72.73 avg300=35.29 total=142060932\n"
                                    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
                   0.7666);
  EXPECT_DOUBLE_EQ(*ParsePsiCpuSome("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"), 0.0);
  // "full" alone (or nothing) is not the figure.
  EXPECT_FALSE(ParsePsiCpuSome("full avg10=12.00 avg60=0.00 avg300=0.00 total=0\n").has_value());
  EXPECT_FALSE(ParsePsiCpuSome("").has_value());
  EXPECT_FALSE(ParsePsiCpuSome("some avg10=x avg60=1\n").has_value());
}

TEST(CpuPressureTest, FromTheLoadTheShareOfDemandTheCpusCannotServe) {
  EXPECT_DOUBLE_EQ(PressureFromLoad(1.5, 2), 0.0);
  EXPECT_DOUBLE_EQ(PressureFromLoad(2.0, 2), 0.0);
  EXPECT_NEAR(PressureFromLoad(6.0, 2), 2.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(PressureFromLoad(8.0, 4), 0.5);
  EXPECT_DOUBLE_EQ(PressureFromLoad(8.0, 0), 0.0);
}

class NodeCpuPressureTest : public testing::Test {
 protected:
  void SetUp() override {
    proc_ = absl::StrCat(testing::TempDir(), "/proc_",
                         testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(proc_ + "/pressure");
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(proc_ + "/" + name) << text;
  }
  std::string proc_;
};

TEST_F(NodeCpuPressureTest, PsiWhenTheKernelHasIt) {
  Write("pressure/cpu", "some avg10=55.00 avg60=1.00 avg300=0.00 total=9\n");
  Write("loadavg", "100.00 1.00 1.00 3/100 999\n");
  EXPECT_DOUBLE_EQ(NodeCpuPressure(proc_), 0.55);
}

TEST_F(NodeCpuPressureTest, TheLoadAverageWithoutPsi) {
  const int cpus = static_cast<int>(AllowedCpus().size());
  ASSERT_GT(cpus, 0);
  Write("loadavg", absl::StrCat(cpus * 4, ".00 1.00 1.00 3/100 999\n"));
  EXPECT_DOUBLE_EQ(NodeCpuPressure(proc_), 0.75);
  Write("loadavg", "0.10 1.00 1.00 3/100 999\n");
  EXPECT_DOUBLE_EQ(NodeCpuPressure(proc_), 0.0);
}

TEST_F(NodeCpuPressureTest, NothingToReadIsNoPressure) {
  EXPECT_DOUBLE_EQ(NodeCpuPressure(proc_ + "/missing"), 0.0);
  Write("loadavg", "garbage\n");
  EXPECT_DOUBLE_EQ(NodeCpuPressure(proc_), 0.0);
}

TEST(CpuPressureTest, ThisMachinesFigureIsAShare) {
  const double pressure = NodeCpuPressure();
  EXPECT_GE(pressure, 0.0);
  EXPECT_LE(pressure, 1.0);
}

}  // namespace
}  // namespace chorus
