// LeaderLoop with servers that only record what happened to them: which
// starts when, on which ports, and what a failed start does.
#include "coordinator/service/leader_loop.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/state/fake_leadership.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

// What the fake servers did, in order: "follower:PORT", "leader:PORT",
// "stop follower", "stop leader grace=S".
class Journal {
 public:
  void Add(std::string entry) {
    absl::MutexLock lock(&mu_);
    entries_.push_back(std::move(entry));
  }
  std::vector<std::string> entries() const {
    absl::MutexLock lock(&mu_);
    return entries_;
  }
  // Waits (bounded) until there are `n` entries.
  bool AwaitSize(size_t n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return entries_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(5));
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> entries_ ABSL_GUARDED_BY(mu_);
};

class FakeServing : public LeaderLoop::Serving {
 public:
  FakeServing(Journal& journal, std::string name, int port)
      : journal_(journal), name_(std::move(name)), port_(port) {}
  int port() const override { return port_; }
  int http_port() const override { return port_ + 1; }
  void Shutdown(absl::Duration grace) override {
    journal_.Add(absl::StrCat("stop ", name_, " grace=", absl::FormatDuration(grace)));
  }

 private:
  Journal& journal_;
  const std::string name_;
  const int port_;
};

// A starter that binds 4000 when asked for any port, else the one asked for.
LeaderLoop::Starter Starter(Journal& journal, const std::string& name) {
  return
      [&journal, name](
          const LeaderLoop::Ports& ports) -> absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> {
        const int port = ports.grpc == 0 ? 4000 : ports.grpc;
        journal.Add(absl::StrCat(name, ":", port, "/", ports.http));
        return std::make_unique<FakeServing>(journal, name, port);
      };
}

TEST(LeaderLoopTest, EveryServerAfterTheFirstGetsItsPortsAndLosingStopsTheLeaderAtOnce) {
  FakeLeadership leadership;
  Journal journal;
  LeaderLoop::Options options;
  options.start_leader = Starter(journal, "leader");
  options.start_follower = Starter(journal, "follower");
  std::vector<int> listening;
  options.on_listening = [&](const LeaderLoop::Ports& ports) { listening.push_back(ports.grpc); };
  LeaderLoop loop(leadership, options);
  absl::Status ran = absl::UnknownError("not run");
  std::thread run([&] { ran = loop.Run(); });

  ASSERT_TRUE(journal.AwaitSize(1));
  leadership.Win();
  ASSERT_TRUE(journal.AwaitSize(3));
  leadership.Lose();
  ASSERT_TRUE(journal.AwaitSize(5));
  loop.Stop();
  run.join();
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_THAT(journal.entries(),
              ElementsAre("follower:4000/0", "stop follower grace=0", "leader:4000/4001",
                          "stop leader grace=0", "follower:4000/4001", "stop follower grace=0"));
  EXPECT_THAT(listening, ElementsAre(4000));  // once
  EXPECT_EQ(loop.leader_changes(), 2);
}

TEST(LeaderLoopTest, StoppingWhileLeadingGivesCallsTheGraceAndEndsRun) {
  FakeLeadership leadership;
  Journal journal;
  LeaderLoop::Options options;
  options.start_leader = Starter(journal, "leader");
  options.stop_grace = absl::Seconds(3);
  LeaderLoop loop(leadership, options);
  leadership.Win();
  absl::Status ran = absl::UnknownError("not run");
  std::thread run([&] { ran = loop.Run(); });
  ASSERT_TRUE(journal.AwaitSize(1));
  loop.Stop();
  run.join();
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_THAT(journal.entries(), ElementsAre("leader:4000/0", "stop leader grace=3s"));
  EXPECT_FALSE(loop.leading());
}

TEST(LeaderLoopTest, ALeaderThatCannotStartResignsAndRunFails) {
  FakeLeadership leadership;
  LeaderLoop::Options options;
  options.start_leader =
      [](const LeaderLoop::Ports&) -> absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> {
    return absl::FailedPreconditionError("--state_dir /x: locked");
  };
  LeaderLoop loop(leadership, options);
  leadership.Win();
  const absl::Status ran = loop.Run();
  EXPECT_EQ(ran.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leadership.resigns(), 1);
  EXPECT_FALSE(leadership.IsLeader());
}

TEST(LeaderLoopTest, StopWhileCampaigningEndsRun) {
  FakeLeadership leadership;
  Journal journal;
  LeaderLoop::Options options;
  options.start_leader = Starter(journal, "leader");
  LeaderLoop loop(leadership, options);
  absl::Status ran = absl::UnknownError("not run");
  std::thread run([&] { ran = loop.Run(); });
  absl::SleepFor(absl::Milliseconds(50));
  loop.Stop();
  run.join();
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_TRUE(journal.entries().empty());
}

}  // namespace
}  // namespace chorus
