#include "coordinator/hang/hang_policy.h"

#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::Diagnosis Diagnosis(v1::Diagnosis::Kind kind, std::vector<int> ranks, int64_t seq,
                        const std::string& message = "") {
  v1::Diagnosis d;
  d.set_kind(kind);
  for (int r : ranks) d.add_ranks(r);
  d.set_seq(seq);
  d.set_message(message);
  return d;
}

TEST(HangPolicyTest, DiagnosisKeyNamesKindCulpritsAndCollective) {
  EXPECT_EQ(DiagnosisKey(Diagnosis(v1::Diagnosis::MISMATCH, {0, 1}, 12)),
            "MISMATCH ranks 0,1 at #12");
  EXPECT_EQ(DiagnosisKey(Diagnosis(v1::Diagnosis::DEAD, {3}, 0)), "DEAD rank 3");
}

TEST(HangPolicyTest, HistoryRecordsADiagnosisWhenItAppearsAndWhenItClears) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  DiagnosisHistory history;
  std::vector<v1::Diagnosis> now = {Diagnosis(v1::Diagnosis::DEAD, {1}, 0, "rank 1 is silent")};
  std::vector<v1::JobEvent> events = history.Update(now, clock.Now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].diagnosis().kind(), v1::Diagnosis::DEAD);
  EXPECT_EQ(events[0].diagnosis().first_seen_us(), 1000 * 1000000LL);
  EXPECT_EQ(now[0].first_seen_us(), 1000 * 1000000LL);

  clock.Advance(absl::Seconds(2));
  now = {Diagnosis(v1::Diagnosis::DEAD, {1}, 0, "rank 1 is silent")};
  EXPECT_TRUE(history.Update(now, clock.Now()).empty()) << "the same problem is recorded once";
  EXPECT_EQ(now[0].first_seen_us(), 1000 * 1000000LL) << "first seen stays the first sighting";

  clock.Advance(absl::Milliseconds(2500));
  now.clear();
  events = history.Update(now, clock.Now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].message(), "cleared: DEAD rank 1 (seen for 4.5 s)");
}

TEST(HangPolicyTest, AnnotateSetsFirstSeenWithoutRemembering) {
  FakeClock clock(absl::FromUnixSeconds(50));
  DiagnosisHistory history;
  std::vector<v1::Diagnosis> seen = {Diagnosis(v1::Diagnosis::STRAGGLER, {2}, 0)};
  history.Update(seen, clock.Now());
  clock.Advance(absl::Seconds(10));
  std::vector<v1::Diagnosis> status = {Diagnosis(v1::Diagnosis::STRAGGLER, {2}, 0),
                                       Diagnosis(v1::Diagnosis::DEAD, {0}, 0)};
  history.Annotate(status, clock.Now());
  EXPECT_EQ(status[0].first_seen_us(), 50 * 1000000LL);
  EXPECT_EQ(status[1].first_seen_us(), 60 * 1000000LL);
  std::vector<v1::Diagnosis> again = {Diagnosis(v1::Diagnosis::DEAD, {0}, 0)};
  EXPECT_EQ(history.Update(again, clock.Now()).size(), 2u)
      << "DEAD is new (Annotate remembered nothing), "
         "STRAGGLER cleared";
}

TEST(HangPolicyTest, AbortAndRestartWithoutElasticFailTheJobReportDoesNot) {
  const std::vector<v1::Diagnosis> diagnoses = {
      Diagnosis(v1::Diagnosis::STRAGGLER, {2}, 0, "rank 2 is slow"),
      Diagnosis(v1::Diagnosis::STUCK_IN_COLLECTIVE, {0, 1}, 7, "every rank is inside #7")};
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::REPORT, diagnoses), std::nullopt);
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::ACTION_UNSPECIFIED, diagnoses), std::nullopt);
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::ABORT, diagnoses),
            "hang detection: STUCK_IN_COLLECTIVE every rank is inside #7");
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::RESTART, diagnoses),
            "hang detection: STUCK_IN_COLLECTIVE every rank is inside #7 (hang_detection.action "
            "RESTART needs an elastic block in the job spec to re-form the job; without one it "
            "fails the job as ABORT does)");
}

TEST(HangPolicyTest, StragglersAndSlowNodesAloneAreOnlyWarnings) {
  EXPECT_EQ(
      HangFailure(v1::HangDetectionSpec::ABORT, {Diagnosis(v1::Diagnosis::STRAGGLER, {2}, 0)}),
      std::nullopt);
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::ABORT,
                        {Diagnosis(v1::Diagnosis::NODE_SLOW, {0, 1}, 7, "starved of CPU")}),
            std::nullopt);
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::RESTART,
                        {Diagnosis(v1::Diagnosis::NODE_SLOW, {0, 1}, 7, "starved of CPU")}),
            std::nullopt);
  EXPECT_EQ(HangFailure(v1::HangDetectionSpec::ABORT, {}), std::nullopt);
}

}  // namespace
}  // namespace chorus
