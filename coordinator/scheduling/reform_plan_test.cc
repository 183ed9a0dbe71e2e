#include "coordinator/scheduling/reform_plan.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);

const std::vector<std::string>& History() {
  static const std::vector<std::string>* history =
      new std::vector<std::string>{"generation 5 after a drain"};
  return *history;
}

// Four ranks on agent "a" (slots 0-3) in generation 5, rank 1 lost, after
// 1 of 3 restarts, elastic.wait_seconds 30.
ReformJob FourRanks() {
  ReformJob job;
  job.cause = "rank 1 exited with code 1";
  job.kind = ReformKind::kRankLost;
  job.generation = 5;
  job.restarts = 1;
  job.max_restarts = 3;
  job.wait_seconds = 30;
  for (int slot = 0; slot < 4; ++slot) {
    RankSlot& r = job.ranks.emplace_back();
    r.agent_id = "a";
    r.slot = slot;
  }
  job.lost = {false, true, false, false};
  job.history = &History();
  return job;
}

std::vector<AgentSlots> FreeOnB(std::vector<int> slots) {
  if (slots.empty()) return {};
  AgentSlots b;
  b.agent_id = "b";
  b.device = v1::ResourceSpec::CPU;
  b.free_slots = std::move(slots);
  return {b};
}

QueuedJob Resources(int min_ranks, int max_ranks) {
  QueuedJob spec;
  spec.job_id = "job-000001";
  spec.resources.set_min_ranks(min_ranks);
  spec.resources.set_max_ranks(max_ranks);
  spec.resources.set_device(v1::ResourceSpec::CPU);
  return spec;
}

enum Verdict { kFail, kWait, kForm };

// Changes to FourRanks() and the slots and resources it is planned with.
struct Inputs {
  ReformKind kind = ReformKind::kRankLost;
  int restarts = 1;
  bool stages_replacements = false;
  std::vector<bool> lost = {false, true, false, false};
  std::optional<absl::Duration> waiting_for;  // a wait begun this long ago
  std::vector<int> free_on_b;
  int min_ranks = 2;
  int max_ranks = 4;
};

template <typename Change>
Inputs With(Change change) {
  Inputs in;
  change(in);
  return in;
}

// What PlanReform answers.
struct Expect {
  Verdict verdict = kForm;
  int world = 0;                   // kForm
  int newcomers = 0;               // kForm
  bool replacements_owed = false;  // kForm
  bool begins = false;             // kWait
  absl::Time until;                // kWait
  std::string reason;              // kFail: its start; kWait: in `why`
};

Expect Forms(int world, int newcomers, bool replacements_owed = false) {
  Expect e;
  e.world = world;
  e.newcomers = newcomers;
  e.replacements_owed = replacements_owed;
  return e;
}

Expect Waits(bool begins, absl::Time until) {
  Expect e;
  e.verdict = kWait;
  e.begins = begins;
  e.until = until;
  e.reason = "min_ranks";
  return e;
}

Expect Fails(std::string reason) {
  Expect e;
  e.verdict = kFail;
  e.reason = std::move(reason);
  return e;
}

struct Case {
  const char* name;
  Inputs in;
  Expect expect;
};

TEST(ReformPlanTest, FailsWaitsOrForms) {
  const Case cases[] = {
      {"a lost rank is replaced on a free slot", With([](Inputs& in) { in.free_on_b = {0}; }),
       Forms(4, 1)},
      {"no free slot: the survivors form alone above min_ranks", Inputs(), Forms(3, 0)},
      {"a program that re-forms in process forms its survivors and owes the newcomer",
       With([](Inputs& in) {
         in.stages_replacements = true;
         in.free_on_b = {0};
       }),
       Forms(3, 0, /*replacements_owed=*/true)},
      {"below min_ranks without it, a staging program takes its newcomer at once",
       With([](Inputs& in) {
         in.stages_replacements = true;
         in.free_on_b = {0};
         in.min_ranks = 4;
       }),
       Forms(4, 1)},
      {"a planned change is never staged: the growth takes its slots at once", With([](Inputs& in) {
         in.kind = ReformKind::kScaleUp;
         in.stages_replacements = true;
         in.lost = {false, false, false, false};
         in.free_on_b = {0, 1};
         in.max_ranks = 6;
       }),
       Forms(6, 2)},
      {"a hang restart forms the same members again", With([](Inputs& in) {
         in.kind = ReformKind::kHangRestart;
         in.lost = {false, false, false, false};
       }),
       Forms(4, 0)},
      {"a failure with max_restarts used up fails the job", With([](Inputs& in) {
         in.restarts = 3;
         in.free_on_b = {0};
       }),
       Fails("rank 1 exited with code 1; elastic.max_restarts 3 used up in generation 5; "
             "history: generation 5 after a drain")},
      {"a planned change is not a restart, whatever the count", With([](Inputs& in) {
         in.kind = ReformKind::kDrain;
         in.restarts = 3;
       }),
       Forms(3, 0)},
      {"below min_ranks with no free slot: the wait begins",
       With([](Inputs& in) { in.min_ranks = 4; }), Waits(true, kNow + absl::Seconds(30))},
      {"a wait under way goes on until its end", With([](Inputs& in) {
         in.waiting_for = absl::Seconds(10);
         in.min_ranks = 4;
       }),
       Waits(false, kNow + absl::Seconds(20))},
      {"slots that come during the wait form the generation", With([](Inputs& in) {
         in.waiting_for = absl::Seconds(10);
         in.free_on_b = {3};
         in.min_ranks = 4;
       }),
       Forms(4, 1)},
      {"a wait that has run out fails the job", With([](Inputs& in) {
         in.waiting_for = absl::Seconds(30);
         in.min_ranks = 4;
       }),
       Fails("rank 1 exited with code 1; generation 6 cannot form: waited "
             "elastic.wait_seconds 30 s and ")},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.name);
    const Inputs& in = test.in;
    const Expect& c = test.expect;
    ReformJob job = FourRanks();
    job.kind = in.kind;
    job.restarts = in.restarts;
    job.stages_replacements = in.stages_replacements;
    job.lost = in.lost;
    if (in.waiting_for.has_value()) job.waiting_until = kNow - *in.waiting_for + absl::Seconds(30);
    const ReformDecision d =
        PlanReform(job, FreeOnB(in.free_on_b), Resources(in.min_ranks, in.max_ranks), kNow);
    ASSERT_EQ(d.verdict.index(), static_cast<size_t>(c.verdict));
    switch (c.verdict) {
      case kForm: {
        const auto& form = std::get<ReformDecision::Form>(d.verdict);
        EXPECT_EQ(static_cast<int>(form.next.ranks.size()), c.world);
        EXPECT_EQ(form.next.newcomers(), c.newcomers);
        EXPECT_EQ(form.replacements_owed, c.replacements_owed);
        break;
      }
      case kWait: {
        const auto& wait = std::get<ReformDecision::Wait>(d.verdict);
        EXPECT_EQ(wait.begins, c.begins);
        EXPECT_EQ(wait.until, c.until);
        EXPECT_TRUE(absl::StrContains(wait.why, c.reason)) << wait.why;
        break;
      }
      case kFail: {
        const auto& fail = std::get<ReformDecision::Fail>(d.verdict);
        EXPECT_TRUE(absl::StartsWith(fail.reason, c.reason)) << fail.reason;
        EXPECT_TRUE(absl::EndsWith(fail.reason, "; history: generation 5 after a drain"))
            << fail.reason;
        break;
      }
    }
  }
}

TEST(ReformPlanTest, RestartsUsedUpOnlyForFailures) {
  ReformJob job = FourRanks();
  job.restarts = 3;
  EXPECT_TRUE(RestartsUsedUp(job).has_value());
  job.kind = ReformKind::kScaleUp;
  EXPECT_FALSE(RestartsUsedUp(job).has_value());
  job.kind = ReformKind::kAgentLost;
  job.restarts = 2;
  EXPECT_FALSE(RestartsUsedUp(job).has_value()) << "2 of 3 used: one left";
}

}  // namespace
}  // namespace chorus
