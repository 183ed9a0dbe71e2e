#include "coordinator/scheduling/call_outbox.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

class CallOutboxTest : public ::testing::Test {
 protected:
  // An outbox whose every effect is logged in `log_`, in order.
  std::unique_ptr<CallOutbox> Outbox() {
    return std::make_unique<CallOutbox>(
        agent_joins_, order_,
        [this](const std::vector<std::string>& settled, const std::vector<std::string>& unrecorded,
               bool requeued) {
          log_.push_back("after");
          settled_ = settled;
          unrecorded_ = unrecorded;
          requeued_ = requeued;
        });
  }
  AgentSender Sender(const std::string& name) {
    return [this, name](const v1::CoordinatorMessage&) { log_.push_back(name); };
  }
  CallOutbox::Launch LaunchOf(const std::string& job_id, bool recorded) {
    CallOutbox::Launch launch;
    launch.job_id = job_id;
    launch.recorded = std::make_shared<bool>(recorded);
    launch.messages.emplace_back(Sender("launch " + job_id), v1::CoordinatorMessage());
    return launch;
  }

  AgentJoinOutbox agent_joins_;
  JobWrites order_;
  std::vector<std::string> log_;
  std::vector<std::string> settled_;
  std::vector<std::string> unrecorded_;
  bool requeued_ = false;
};

// Writes are durable before anything goes out; a launch goes only if its
// start was recorded; join answers last; then what the writes settled.
TEST_F(CallOutboxTest, WritesFirstThenMessagesRecordedLaunchesAndJoins) {
  std::unique_ptr<CallOutbox> out = Outbox();
  out->joins.emplace_back([this](absl::StatusOr<v1::JoinResponse>) { log_.push_back("join"); },
                          v1::JoinResponse());
  out->launches.push_back(LaunchOf("job-000001", true));
  out->launches.push_back(LaunchOf("job-000002", false));
  out->messages.emplace_back(Sender("message"), v1::CoordinatorMessage());
  out->writes.Add("job-000001", [this] { log_.push_back("write"); });
  out->settling.push_back("job-000003");
  out->requeued = true;
  out->Flush();
  EXPECT_THAT(log_, ElementsAre("write", "message", "launch job-000001", "join", "after"));
  EXPECT_THAT(settled_, ElementsAre("job-000003"));
  EXPECT_THAT(unrecorded_, ElementsAre("job-000002"));
  EXPECT_TRUE(requeued_);

  // Flushed means empty: a second Flush sends nothing again.
  log_.clear();
  out->Flush();
  EXPECT_TRUE(log_.empty());
}

TEST_F(CallOutboxTest, NothingSettledNeedsNoAfterStep) {
  std::unique_ptr<CallOutbox> out = Outbox();
  out->messages.emplace_back(Sender("message"), v1::CoordinatorMessage());
  out->launches.push_back(LaunchOf("job-000001", true));
  out->Flush();
  EXPECT_THAT(log_, ElementsAre("message", "launch job-000001"));
}

// A call that returns before its Flush still makes its writes durable.
TEST_F(CallOutboxTest, WritesLeftUnflushedRunWhenTheOutboxGoes) {
  {
    std::unique_ptr<CallOutbox> out = Outbox();
    out->writes.Add("job-000001", [this] { log_.push_back("write 1"); });
    out->writes.Add("job-000001", [this] { log_.push_back("write 2"); });
    out->messages.emplace_back(Sender("message"), v1::CoordinatorMessage());
  }
  EXPECT_THAT(log_, ElementsAre("write 1", "write 2"));
}

}  // namespace
}  // namespace chorus
