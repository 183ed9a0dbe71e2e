#include "common/metrics_text.h"

#include "gtest/gtest.h"

namespace chorus {
namespace {

// With eval { disabled: true } the last line once read "test accuracy
// 0.0000, test loss 0.0000", as if the model had been evaluated.
TEST(EvaluationTextTest, SaysWhenThereWasNoEvaluation) {
  v1::Metrics m;
  m.set_step(40);
  m.set_loss(0.5);
  EXPECT_EQ(EvaluationText(m), "no evaluation");
  m.set_eval_loss(0);  // an evaluation that measured zero is still one
  EXPECT_EQ(EvaluationText(m), "test loss 0.0000");
  m.set_eval_loss(0.3120);
  m.set_eval_accuracy(0.88914);
  EXPECT_EQ(EvaluationText(m), "test accuracy 0.8891, test loss 0.3120");
}

}  // namespace
}  // namespace chorus
