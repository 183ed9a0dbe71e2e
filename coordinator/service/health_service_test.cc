#include "coordinator/service/health_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using grpc::health::v1::HealthCheckResponse;

// One event of a Watch stream.
struct Event {
  enum Kind { kNotify, kEnd, kWriteDone } kind;
  HealthCheckResponse::ServingStatus status = HealthCheckResponse::SERVING;  // kNotify
  bool ok = true;                                                            // kWriteDone
};
Event Notify(HealthCheckResponse::ServingStatus status) { return {Event::kNotify, status}; }
Event End() { return {Event::kEnd}; }
Event WriteDone(bool ok) { return {Event::kWriteDone, HealthCheckResponse::UNKNOWN, ok}; }

struct Case {
  std::string name;
  std::vector<Event> events;
  // What the reactor did, in order: "write SERVING", "finish 14".
  std::vector<std::string> expected;
};

TEST(HealthWatchStreamTest, EveryOrderOfEventsWritesInTurnAndFinishesOnce) {
  constexpr auto kServing = HealthCheckResponse::SERVING;
  constexpr auto kNot = HealthCheckResponse::NOT_SERVING;
  const std::vector<Case> cases = {
      {"the current status is written", {Notify(kServing)}, {"write SERVING"}},
      {"a change waits for the write in flight; the newest is sent",
       {Notify(kServing), Notify(kNot), Notify(kServing), Notify(kNot), WriteDone(true)},
       {"write SERVING", "write NOT_SERVING"}},
      {"what the client has is not sent again",
       {Notify(kServing), WriteDone(true), Notify(kServing)},
       {"write SERVING"}},
      {"a change back to what was sent, while writing, sends nothing more",
       {Notify(kServing), Notify(kNot), Notify(kServing), WriteDone(true)},
       {"write SERVING"}},
      {"the end with no write in flight finishes at once",
       {Notify(kServing), WriteDone(true), End(), Notify(kNot), WriteDone(true)},
       {"write SERVING", "finish 14"}},
      {"the end during a write finishes when it completes",
       {Notify(kServing), End(), WriteDone(true)},
       {"write SERVING", "finish 14"}},
      // The elected follower that never served: the write in flight fails
      // once Shutdown cancels the call, after the stream was told to end.
      {"the end during a write that then fails still finishes, once",
       {Notify(kServing), End(), WriteDone(false), End()},
       {"write SERVING", "finish 14"}},
      {"a failed write means the client went away",
       {Notify(kServing), Notify(kNot), WriteDone(false), Notify(kNot), End()},
       {"write SERVING", "finish 1"}},
      {"an end before anything was written", {End(), Notify(kServing)}, {"finish 14"}},
      {"ends after the first change nothing", {End(), End()}, {"finish 14"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    HealthWatchStream stream;
    std::vector<std::string> did;
    for (const Event& e : c.events) {
      HealthWatchStream::Step step;
      switch (e.kind) {
        case Event::kNotify:
          step = stream.Notify(e.status);
          break;
        case Event::kEnd:
          step = stream.End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
          break;
        case Event::kWriteDone:
          step = stream.WriteDone(e.ok);
          break;
      }
      if (step.write.has_value()) {
        did.push_back("write " + HealthCheckResponse::ServingStatus_Name(*step.write));
      }
      if (step.finish.has_value()) {
        did.push_back(absl::StrCat("finish ", static_cast<int>(step.finish->error_code())));
      }
    }
    EXPECT_EQ(absl::StrJoin(did, "; "), absl::StrJoin(c.expected, "; "));
    EXPECT_EQ(stream.finished(), !c.expected.empty() && c.expected.back().rfind("finish", 0) == 0);
  }
}

}  // namespace
}  // namespace chorus
