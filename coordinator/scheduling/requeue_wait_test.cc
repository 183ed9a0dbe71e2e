#include "coordinator/scheduling/requeue_wait.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);
constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr char kCause[] = "preempted by job-000007 (HIGH, alice)";

// A tick: the newest committed checkpoint `after` the wait began.
struct Tick {
  absl::Duration after;
  int64_t newest_checkpoint = 0;
};

struct Case {
  std::string name;
  int64_t reported_step = 0;
  int64_t newest_at_begin = 0;
  std::vector<Tick> ticks;
  // Expected.
  int64_t target_step = 0;
  int due_at_tick = -1;  // index of the tick that ends the wait; -1: none does
  int64_t resume_step = 0;
  std::string reason;
  std::optional<std::string> warning;
};

TEST(RequeueWaitTest, TicksEndTheWaitOnceTheCheckpointCommitsOrAtTheDeadline) {
  const std::vector<Case> cases = {
      {"it waits while the checkpoint has not reached the target step",
       120,
       100,
       {{absl::Seconds(1), 100}, {absl::Seconds(59), 119}},
       120,
       -1},
      {"a checkpoint of the target step ends the wait; the job resumes from it",
       120,
       100,
       {{absl::Seconds(1), 100}, {absl::Seconds(2), 120}},
       120,
       1,
       120,
       std::string(kCause) + "; resumes from step 120",
       std::nullopt},
      {"a later one too",
       120,
       100,
       {{absl::Seconds(2), 121}},
       120,
       0,
       121,
       std::string(kCause) + "; resumes from step 121",
       std::nullopt},
      {"the target is past the newest checkpoint when the ranks reported less",
       90,
       100,
       {{absl::Seconds(1), 100}, {absl::Seconds(2), 101}},
       101,
       1,
       101,
       std::string(kCause) + "; resumes from step 101",
       std::nullopt},
      {"at the deadline it goes anyway from the newest, saying what is lost",
       120,
       100,
       {{absl::Seconds(59), 100}, {kTimeout, 110}},
       120,
       1,
       110,
       std::string(kCause) + "; resumes from step 110",
       "warning: the checkpoint asked for (step 120 or later) did not commit within 1m; the job "
       "goes back to the queue anyway and resumes from step 110, losing 10 step(s)"},
      {"without any checkpoint it starts from scratch",
       5,
       0,
       {{kTimeout + absl::Seconds(1), 0}},
       5,
       0,
       0,
       std::string(kCause) + "; starts from scratch",
       "warning: the checkpoint asked for (step 5 or later) did not commit within 1m; the job "
       "goes back to the queue anyway and starts from scratch, losing 5 step(s)"},
      {"once due, it is over: later ticks ask nothing",
       10,
       0,
       {{absl::Seconds(1), 10}, {absl::Seconds(2), 11}, {kTimeout * 2, 11}},
       10,
       0,
       10,
       std::string(kCause) + "; resumes from step 10",
       std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RequeueWait wait;
    EXPECT_FALSE(wait.active());
    wait.Begin(kCause, c.reported_step, c.newest_at_begin, kStart, kTimeout);
    ASSERT_TRUE(wait.active());
    EXPECT_EQ(wait.cause(), kCause);
    EXPECT_EQ(wait.target_step(), c.target_step);
    int due_at = -1;
    std::optional<RequeueWait::Due> due;
    for (size_t i = 0; i < c.ticks.size(); ++i) {
      std::optional<RequeueWait::Due> d =
          wait.OnTick(c.ticks[i].newest_checkpoint, kStart + c.ticks[i].after);
      if (!d.has_value()) continue;
      EXPECT_EQ(due_at, -1) << "due twice";
      due_at = static_cast<int>(i);
      due = std::move(d);
    }
    EXPECT_EQ(due_at, c.due_at_tick);
    EXPECT_EQ(wait.active(), c.due_at_tick < 0);
    if (!due.has_value()) continue;
    EXPECT_EQ(due->resume_step, c.resume_step);
    EXPECT_EQ(due->reason, c.reason);
    EXPECT_EQ(due->warning, c.warning);
  }
}

}  // namespace
}  // namespace chorus
