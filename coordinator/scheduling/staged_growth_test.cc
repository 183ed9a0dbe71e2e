#include "coordinator/scheduling/staged_growth.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using Slots = std::vector<std::pair<std::string, int>>;

const absl::Time kStart = absl::FromUnixSeconds(1000);
constexpr absl::Duration kWait = absl::Seconds(60);

RankSlot At(const std::string& agent_id, int slot) {
  RankSlot r;
  r.agent_id = agent_id;
  r.slot = slot;
  return r;
}

// A growth to generation 5 of 4 ranks, with newcomers rank 2 on b:0 and
// rank 3 on c:1, staged at kStart.
StagedGrowth Staged() {
  StagedGrowth staged;
  staged.Start(5, 4, "2 free slot(s) let the job grow",
               {{At("b", 0), 2, false}, {At("c", 1), 3, false}}, kStart, kWait);
  return staged;
}

// One event of a job's staged growth.
struct Event {
  enum Kind { kChorusRankJoins, kProgramJoins, kExits, kTick, kGenerationBegun, kDrop };
  Kind kind = kTick;
  std::string agent;
  int slot = 0;
  int64_t generation = 5;
  bool change_requested = false;
  absl::Duration after = absl::ZeroDuration();  // kTick: time since the start
  std::vector<RankSlot> next_ranks;             // kGenerationBegun
};

Event Join(Event::Kind kind, const std::string& agent, int slot, bool change_requested = false,
           int64_t generation = 5) {
  Event e;
  e.kind = kind;
  e.agent = agent;
  e.slot = slot;
  e.generation = generation;
  e.change_requested = change_requested;
  return e;
}
Event Exits(const std::string& agent, int slot, bool change_requested) {
  return Join(Event::kExits, agent, slot, change_requested);
}
Event Tick(absl::Duration after, bool change_requested = false) {
  Event e;
  e.after = after;
  e.change_requested = change_requested;
  return e;
}
Event Begun(std::vector<RankSlot> next_ranks) {
  Event e;
  e.kind = Event::kGenerationBegun;
  e.next_ranks = std::move(next_ranks);
  return e;
}

// What the events asked of the Scheduler, gathered.
struct Seen {
  std::vector<std::string> joins;  // per Join: "not staged", "starts program" (rank), "up"
  int change_requests = 0;
  Slots freed;
  std::map<std::string, std::vector<int>> stopped;
  std::string stop_reason;
  Slots adopted;
  bool active = false;
  std::vector<bool> up;  // of the newcomers left
};

void Gather(const StagedGrowth::Actions& actions, Seen& seen) {
  seen.freed.insert(seen.freed.end(), actions.freed.begin(), actions.freed.end());
  for (const auto& [agent, slots] : actions.stop) {
    seen.stopped[agent].insert(seen.stopped[agent].end(), slots.begin(), slots.end());
  }
  if (!actions.stop_reason.empty()) seen.stop_reason = actions.stop_reason;
  seen.adopted.insert(seen.adopted.end(), actions.adopted.begin(), actions.adopted.end());
  if (actions.request_change) ++seen.change_requests;
}

Seen Replay(const std::vector<Event>& events) {
  StagedGrowth staged = Staged();
  Seen seen;
  for (const Event& e : events) {
    switch (e.kind) {
      case Event::kChorusRankJoins:
      case Event::kProgramJoins: {
        const StagedGrowth::JoinOutcome join = staged.OnJoin(
            e.agent, e.slot, e.generation, e.kind == Event::kChorusRankJoins, e.change_requested);
        seen.joins.push_back(join.kind == StagedGrowth::JoinOutcome::kNotStaged ? "not staged"
                             : join.kind == StagedGrowth::JoinOutcome::kUp
                                 ? "up"
                                 : "starts program as rank " + std::to_string(join.newcomer.rank));
        if (join.request_change) ++seen.change_requests;
        break;
      }
      case Event::kExits:
        if (std::optional<StagedGrowth::Actions> a =
                staged.OnExited(e.agent, e.slot, e.change_requested)) {
          Gather(*a, seen);
        } else {
          seen.joins.push_back("exit of no newcomer");
        }
        break;
      case Event::kTick:
        Gather(staged.OnTick(kStart + e.after, e.change_requested), seen);
        break;
      case Event::kGenerationBegun:
        Gather(staged.OnGenerationBegun(e.next_ranks), seen);
        break;
      case Event::kDrop:
        Gather(staged.Drop("the job ends"), seen);
        break;
    }
  }
  seen.active = staged.active();
  for (const StagedNewcomer& n : staged.newcomers()) seen.up.push_back(n.up);
  return seen;
}

struct Case {
  std::string name;
  std::vector<Event> events;
  // Expected.
  std::vector<std::string> joins;
  int change_requests = 0;
  Slots freed;
  std::map<std::string, std::vector<int>> stopped;
  std::string stop_reason;
  Slots adopted;
  bool active = true;
  std::vector<bool> up;
};

TEST(StagedGrowthTest, EventsGiveTheirActions) {
  const std::vector<Case> cases = {
      {"staged: both newcomers wait, nothing is asked",
       {},
       {},
       0,
       {},
       {},
       "",
       {},
       true,
       {false, false}},
      {"a chorus-rank is told its planned rank; its newcomer is not up yet",
       {Join(Event::kChorusRankJoins, "c", 1)},
       {"starts program as rank 3"},
       0,
       {},
       {},
       "",
       {},
       true,
       {false, false}},
      {"one program up: no change yet",
       {Join(Event::kProgramJoins, "b", 0)},
       {"up"},
       0,
       {},
       {},
       "",
       {},
       true,
       {true, false}},
      {"the last program up requests the change, once per Join while none is requested",
       {Join(Event::kProgramJoins, "b", 0), Join(Event::kProgramJoins, "c", 1),
        Join(Event::kProgramJoins, "c", 1, /*change_requested=*/true)},
       {"up", "up", "up"},
       1,
       {},
       {},
       "",
       {},
       true,
       {true, true}},
      {"a Join of another generation or slot is an ordinary Join",
       {Join(Event::kProgramJoins, "b", 0, false, /*generation=*/4),
        Join(Event::kProgramJoins, "b", 1), Join(Event::kProgramJoins, "a", 0)},
       {"not staged", "not staged", "not staged"},
       0,
       {},
       {},
       "",
       {},
       true,
       {false, false}},
      {"a newcomer that exits before the change frees its slot and drops the growth",
       {Exits("b", 0, /*change_requested=*/false)},
       {},
       0,
       {{"b", 0}},
       {{"c", {1}}},
       "staged newcomer(s) stopped: another newcomer of the growth exited",
       {},
       false,
       {}},
      {"after the change is requested, an exit frees its slot and the change plans without it",
       {Join(Event::kProgramJoins, "b", 0), Join(Event::kProgramJoins, "c", 1),
        Exits("c", 1, /*change_requested=*/true)},
       {"up", "up"},
       1,
       {{"c", 1}},
       {},
       "",
       {},
       true,
       {true}},
      {"the last newcomer's exit ends the growth even after the request",
       {Exits("c", 1, true), Exits("b", 0, true)},
       {},
       0,
       {{"c", 1}, {"b", 0}},
       {},
       "",
       {},
       false,
       {}},
      {"the exit of a process that is no newcomer is not the growth's",
       {Exits("a", 0, false)},
       {"exit of no newcomer"},
       0,
       {},
       {},
       "",
       {},
       true,
       {false, false}},
      {"not all up by the deadline: every newcomer is stopped",
       {Join(Event::kProgramJoins, "b", 0), Tick(kWait - absl::Seconds(1)), Tick(kWait)},
       {"up"},
       0,
       {},
       {{"b", {0}}, {"c", {1}}},
       "staged newcomer(s) stopped: not up within elastic.wait_seconds 60 s",
       {},
       false,
       {}},
      {"past the deadline with the change requested, the growth waits for it",
       {Tick(kWait * 2, /*change_requested=*/true)},
       {},
       0,
       {},
       {},
       "",
       {},
       true,
       {false, false}},
      {"the generation takes both newcomers: adopted, none stopped",
       {Begun({At("a", 0), At("a", 1), At("b", 0), At("c", 1)})},
       {},
       0,
       {},
       {},
       "",
       {{"b", 0}, {"c", 1}},
       false,
       {}},
      {"a failure's generation without them stops them",
       {Begun({At("a", 0), At("c", 1)})},
       {},
       0,
       {},
       {{"b", {0}}},
       "staged newcomer(s) stopped: the next generation does not take them",
       {{"c", 1}},
       false,
       {}},
      {"a drop stops every newcomer; events after it are ordinary",
       {Event{Event::kDrop}, Join(Event::kProgramJoins, "b", 0), Tick(kWait * 2)},
       {"not staged"},
       0,
       {},
       {{"b", {0}}, {"c", {1}}},
       "staged newcomer(s) stopped: the job ends",
       {},
       false,
       {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Seen seen = Replay(c.events);
    EXPECT_EQ(seen.joins, c.joins);
    EXPECT_EQ(seen.change_requests, c.change_requests);
    EXPECT_EQ(seen.freed, c.freed);
    EXPECT_EQ(seen.stopped, c.stopped);
    EXPECT_EQ(seen.stop_reason, c.stop_reason);
    EXPECT_EQ(seen.adopted, c.adopted);
    EXPECT_EQ(seen.active, c.active);
    EXPECT_EQ(seen.up, c.up);
  }
}

TEST(StagedGrowthTest, ItsSlotsComeFirstOnRegisteredAgentsThatAreNotDraining) {
  AgentRegistry agents;
  v1::AgentHello hello;
  hello.set_host("hb");
  hello.set_slots(2);
  const std::string b = agents.Add(hello, nullptr).value();
  hello.set_host("hc");
  const std::string c = agents.Add(hello, nullptr).value();
  StagedGrowth staged;
  staged.Start(5, 4, "growth", {{At(c, 1), 3, false}, {At(b, 0), 2, false}, {At(c, 0), 4, false}},
               kStart, kWait);
  AgentSlots other;
  other.agent_id = "z";
  other.free_slots = {0};
  std::vector<AgentSlots> slots = staged.SlotsFirst(agents, {other});
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].agent_id, c);
  EXPECT_EQ(slots[0].free_slots, (std::vector<int>{0, 1}));
  EXPECT_EQ(slots[0].host, "hc");
  EXPECT_EQ(slots[0].total_slots, 2);
  EXPECT_EQ(slots[1].agent_id, b);
  EXPECT_EQ(slots[2].agent_id, "z");

  agents.SetDraining(c);
  slots = staged.SlotsFirst(agents, {other});
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].agent_id, b);
  EXPECT_EQ(StagedGrowth().SlotsFirst(agents, {other}).size(), 1u);
}

}  // namespace
}  // namespace chorus
