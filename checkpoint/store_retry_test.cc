#include "checkpoint/store_retry.h"

#include <deque>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Answers Store with the scripted statuses in turn (OK once they run out),
// reading every file in full and noting when (on the fake clock) each call
// came.
class ScriptedStorage : public CheckpointStorage {
 public:
  ScriptedStorage(FakeClock& clock, std::vector<absl::Status> script)
      : clock_(clock), script_(script.begin(), script.end()) {}

  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override {
    calls.push_back(clock_.Now());
    for (const CheckpointFileSource& f : files) {
      absl::StatusOr<CheckpointFileData> data = ReadAll(f);
      if (!data.ok()) return data.status();
      stored_bytes.push_back(data->bytes);
    }
    steps.push_back(step);
    if (script_.empty()) return absl::OkStatus();
    absl::Status s = script_.front();
    script_.pop_front();
    return s;
  }
  absl::StatusOr<std::vector<CheckpointFileData>> Load(const v1::CheckpointManifest&) override {
    return absl::UnimplementedError("not in this test");
  }

  std::vector<absl::Time> calls;
  std::vector<int64_t> steps;
  std::vector<std::string> stored_bytes;

 private:
  FakeClock& clock_;
  std::deque<absl::Status> script_;
};

std::vector<CheckpointFileSource> OneFile() {
  return {{"model.pt", [](const CheckpointByteSink& out) { return out("weights"); }}};
}

StoreRetryOptions Options(FakeClock& clock, absl::Duration give_up_after) {
  StoreRetryOptions options;
  options.give_up_after = give_up_after;
  options.clock = &clock;
  options.jitter = 0;  // exact times (one test below draws them)
  return options;
}

TEST(StoreRetryTest, ClassifiesWhatAnotherAttemptMayFix) {
  EXPECT_TRUE(IsCoordinatorUnreachable(absl::UnavailableError("Socket closed")));
  EXPECT_TRUE(
      IsCoordinatorUnreachable(absl::UnavailableError("failed to connect to all addresses")));
  EXPECT_TRUE(IsCoordinatorUnreachable(absl::DeadlineExceededError("Deadline Exceeded")));
  EXPECT_TRUE(IsCoordinatorUnreachable(absl::CancelledError("Cancelled")));
  EXPECT_FALSE(IsCoordinatorUnreachable(absl::FailedPreconditionError("generation 1 of 3")));
  EXPECT_FALSE(IsCoordinatorUnreachable(absl::DataLossError("CRC-32C mismatch")));
  EXPECT_FALSE(IsCoordinatorUnreachable(absl::InvalidArgumentError("bad chunk")));
  EXPECT_FALSE(IsCoordinatorUnreachable(absl::InternalError("serializing")));
  EXPECT_FALSE(IsCoordinatorUnreachable(absl::PermissionDeniedError("bad worker token")));
}

TEST(StoreRetryTest, RetriesWithBackoffUntilTheCoordinatorIsBack) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  ScriptedStorage storage(clock, {absl::UnavailableError("Socket closed"),
                                  absl::UnavailableError("failed to connect to all addresses"),
                                  absl::UnavailableError("failed to connect to all addresses")});
  StoreRetryResult r = StoreRetrying(storage, 1000, OneFile(), Options(clock, absl::Minutes(1)));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_FALSE(r.gave_up_unreachable);
  EXPECT_EQ(r.attempts, 4);
  // 200 ms, 400 ms, 800 ms apart.
  ASSERT_EQ(storage.calls.size(), 4u);
  EXPECT_EQ(storage.calls[1] - storage.calls[0], absl::Milliseconds(200));
  EXPECT_EQ(storage.calls[2] - storage.calls[1], absl::Milliseconds(400));
  EXPECT_EQ(storage.calls[3] - storage.calls[2], absl::Milliseconds(800));
  EXPECT_EQ(storage.calls[3] - start, absl::Milliseconds(1400));
  // Every attempt sent the whole file again, for the same step.
  EXPECT_EQ(storage.steps, std::vector<int64_t>(4, 1000));
  EXPECT_EQ(storage.stored_bytes, std::vector<std::string>(4, "weights"));
}

TEST(StoreRetryTest, JitteredRetriesComeWithinTheUpperHalfOfEachCeiling) {
  FakeClock clock;
  std::vector<absl::Status> down(5, absl::UnavailableError("Socket closed"));
  ScriptedStorage storage(clock, down);
  StoreRetryOptions options = Options(clock, absl::Minutes(1));
  options.jitter = 0.5;
  StoreRetryResult r = StoreRetrying(storage, 7, OneFile(), options);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(storage.calls.size(), 6u);
  const absl::Duration ceilings[] = {absl::Milliseconds(200), absl::Milliseconds(400),
                                     absl::Milliseconds(800), absl::Milliseconds(1600),
                                     absl::Seconds(2)};
  for (int i = 0; i < 5; ++i) {
    const absl::Duration gap = storage.calls[i + 1] - storage.calls[i];
    EXPECT_GE(gap, ceilings[i] / 2) << "retry " << i + 1;
    EXPECT_LE(gap, ceilings[i]) << "retry " << i + 1;
  }
}

TEST(StoreRetryTest, GivesUpWhenTheCoordinatorStaysAwayForTheWholeBound) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::vector<absl::Status> down(100, absl::UnavailableError("failed to connect to all addresses"));
  ScriptedStorage storage(clock, down);
  StoreRetryResult r = StoreRetrying(storage, 60, OneFile(), Options(clock, absl::Seconds(10)));
  EXPECT_TRUE(r.gave_up_unreachable);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status.message(), HasSubstr("failed to connect to all addresses"));
  EXPECT_THAT(r.status.message(), HasSubstr("could not be reached for 10s"));
  // 0.2 + 0.4 + 0.8 + 1.6, then every 2 s up to 10 s: the last retry starts
  // at the bound, none after it.
  EXPECT_EQ(storage.calls.back() - start, absl::Seconds(10));
  EXPECT_EQ(r.attempts, 9);
  EXPECT_EQ(static_cast<int>(storage.calls.size()), r.attempts);
}

TEST(StoreRetryTest, ABoundOfZeroMeansOneAttempt) {
  FakeClock clock;
  ScriptedStorage storage(clock, {absl::UnavailableError("Socket closed")});
  StoreRetryResult r = StoreRetrying(storage, 60, OneFile(), Options(clock, absl::ZeroDuration()));
  EXPECT_TRUE(r.gave_up_unreachable);
  EXPECT_EQ(r.attempts, 1);
}

TEST(StoreRetryTest, PermanentErrorsAreNotRetried) {
  for (const absl::Status& permanent :
       {absl::FailedPreconditionError("checkpoint upload from generation 1 of job-000001, whose "
                                      "current generation is 2"),
        absl::DataLossError("chunk CRC-32C mismatch"),
        absl::InternalError("serializing checkpoint file model.pt")}) {
    FakeClock clock;
    ScriptedStorage storage(clock, {permanent});
    StoreRetryResult r = StoreRetrying(storage, 60, OneFile(), Options(clock, absl::Minutes(1)));
    EXPECT_EQ(r.status, permanent);
    EXPECT_FALSE(r.gave_up_unreachable);
    EXPECT_EQ(r.attempts, 1);
  }
}

TEST(StoreRetryTest, APermanentErrorOnARetryEndsIt) {
  FakeClock clock;
  ScriptedStorage storage(
      clock, {absl::UnavailableError("Socket closed"),
              absl::FailedPreconditionError("checkpoint upload for job-000001, which is not "
                                            "running")});
  StoreRetryResult r = StoreRetrying(storage, 60, OneFile(), Options(clock, absl::Minutes(1)));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status.message(), HasSubstr("which is not running"));
  EXPECT_FALSE(r.gave_up_unreachable);
  EXPECT_EQ(r.attempts, 2);
}

TEST(StoreRetryTest, ACommitWhoseAnswerWasLostCountsAsStored) {
  FakeClock clock;
  ScriptedStorage storage(
      clock,
      {absl::UnavailableError("receiving the coordinator's answer: the connection was closed"),
       absl::AlreadyExistsError("checkpoint job-000001 step 20 is already committed")});
  StoreRetryResult r = StoreRetrying(storage, 20, OneFile(), Options(clock, absl::Minutes(1)));
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.attempts, 2);
}

TEST(StoreRetryTest, AlreadyExistsAtTheFirstAttemptIsAnError) {
  FakeClock clock;
  ScriptedStorage storage(
      clock, {absl::AlreadyExistsError("checkpoint job-000001 step 20 is already committed")});
  StoreRetryResult r = StoreRetrying(storage, 20, OneFile(), Options(clock, absl::Minutes(1)));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.attempts, 1);
}

}  // namespace
}  // namespace chorus
