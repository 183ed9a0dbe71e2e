#include "coordinator/scheduling/leaving_ranks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

using Slot = LeavingRanks::Slot;

// One event of a job's leaving ranks.
struct Event {
  enum Kind { kYield, kDepart, kGenerationBegun, kExits, kAgentGone };
  Kind kind;
  std::string agent;
  int slot = 0;
  std::vector<Slot> left;  // kGenerationBegun
};

struct Case {
  std::string name;
  std::vector<Event> events;
  // Expected: what each exit freed, then the state.
  std::vector<bool> exits_free;
  std::vector<Slot> yielding;
  std::vector<Slot> departing;
};

TEST(LeavingRanksTest, EventsMoveEachRankFromStateToState) {
  const std::vector<Case> cases = {
      {"nothing leaves", {}, {}, {}, {}},
      {"a preempted rank yields until the change", {{Event::kYield, "a", 1}}, {}, {{"a", 1}}, {}},
      {"at the change it departs, and its exit frees the slot once",
       {{Event::kYield, "a", 1},
        {Event::kGenerationBegun, "", 0, {{"a", 1}}},
        {Event::kExits, "a", 1},
        {Event::kExits, "a", 1}},
       {true, false},
       {},
       {}},
      {"a yielding rank's exit is a rank's exit, not a departure",
       {{Event::kYield, "a", 1}, {Event::kExits, "a", 1}},
       {false},
       {{"a", 1}},
       {}},
      {"a yielding rank that did not leave at the boundary (exited, agent gone) is dropped",
       {{Event::kYield, "a", 1},
        {Event::kYield, "b", 0},
        {Event::kGenerationBegun, "", 0, {{"b", 0}}}},
       {},
       {},
       {{"b", 0}}},
      {"ranks of a draining agent depart at the change; those departing before stay",
       {{Event::kDepart, "c", 0}, {Event::kGenerationBegun, "", 0, {{"a", 0}, {"a", 1}}}},
       {},
       {},
       {{"a", 0}, {"a", 1}, {"c", 0}}},
      {"a stopped staged newcomer departs; its slot frees on exit",
       {{Event::kDepart, "c", 0}, {Event::kExits, "c", 0}},
       {true},
       {},
       {}},
      {"a slot departs once however often it is stopped",
       {{Event::kDepart, "c", 0},
        {Event::kDepart, "c", 0},
        {Event::kExits, "c", 0},
        {Event::kExits, "c", 0}},
       {true, false},
       {},
       {}},
      {"a lost agent takes its departing ranks, not those of others or yielding ones",
       {{Event::kDepart, "a", 0},
        {Event::kDepart, "b", 0},
        {Event::kYield, "a", 1},
        {Event::kAgentGone, "a"}},
       {},
       {{"a", 1}},
       {{"b", 0}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LeavingRanks leaving;
    std::vector<bool> exits_free;
    for (const Event& e : c.events) {
      switch (e.kind) {
        case Event::kYield:
          leaving.Yield(e.agent, e.slot);
          break;
        case Event::kDepart:
          leaving.Depart(e.agent, e.slot);
          break;
        case Event::kGenerationBegun:
          leaving.OnGenerationBegun(e.left);
          break;
        case Event::kExits:
          exits_free.push_back(leaving.OnExited(e.agent, e.slot));
          break;
        case Event::kAgentGone:
          leaving.OnAgentGone(e.agent);
          break;
      }
    }
    EXPECT_EQ(exits_free, c.exits_free);
    EXPECT_EQ(leaving.Departing(), c.departing);
    std::vector<Slot> yielding;
    for (const std::string agent : {"a", "b", "c"}) {
      for (int slot = 0; slot < 2; ++slot) {
        if (leaving.yielding(agent, slot)) yielding.emplace_back(agent, slot);
        EXPECT_EQ(leaving.departing(agent, slot),
                  std::count(c.departing.begin(), c.departing.end(), Slot(agent, slot)) == 1);
      }
    }
    EXPECT_EQ(yielding, c.yielding);
    EXPECT_EQ(leaving.size(), static_cast<int>(c.yielding.size() + c.departing.size()));
    EXPECT_EQ(leaving.empty(), c.yielding.empty() && c.departing.empty());
    for (const std::string agent : {"a", "b", "c"}) {
      const bool on = std::any_of(c.departing.begin(), c.departing.end(),
                                  [&](const Slot& s) { return s.first == agent; });
      EXPECT_EQ(leaving.DepartingOn(agent), on) << agent;
    }
  }
}

}  // namespace
}  // namespace chorus
