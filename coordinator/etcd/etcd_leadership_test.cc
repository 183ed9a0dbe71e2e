// Leader election, the fence and quorum loss against real etcd members.
#include "coordinator/etcd/etcd_leadership.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_state_store.h"
#include "coordinator/etcd/etcd_test_cluster.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

constexpr absl::Duration kLease = absl::Seconds(2);

std::unique_ptr<EtcdTestCluster> StartEtcd(int members) {
  absl::StatusOr<std::unique_ptr<EtcdTestCluster>> cluster = EtcdTestCluster::Start(members);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

std::unique_ptr<EtcdClient> Connect(const std::string& endpoints,
                                    absl::Duration call_timeout = absl::Seconds(3)) {
  EtcdOptions options;
  options.endpoints = endpoints;
  options.call_timeout = call_timeout;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

EtcdLeadershipOptions Options(const std::string& id) {
  EtcdLeadershipOptions options;
  options.prefix = "/chorus";
  options.self.id = id;
  options.self.address = id + ".example:29650";
  options.lease_ttl = kLease;
  return options;
}

v1::Job MakeJob(const std::string& id, v1::Job::State state) {
  v1::Job job;
  job.set_job_id(id);
  job.set_state(state);
  return job;
}

// Campaign on a thread; `won` is notified when it returns OK.
class Campaigner {
 public:
  explicit Campaigner(EtcdLeadership& leadership)
      : thread_([this, &leadership] {
          status_ = leadership.Campaign();
          won_at_ = absl::Now();
          done_.Notify();
        }) {}
  ~Campaigner() { thread_.join(); }
  bool WaitForWin(absl::Duration timeout) {
    return done_.WaitForNotificationWithTimeout(timeout) && status_.ok();
  }
  bool done() const { return done_.HasBeenNotified(); }
  absl::Time won_at() const { return won_at_; }

 private:
  absl::Notification done_;
  absl::Status status_;
  absl::Time won_at_;
  std::thread thread_;
};

TEST(EtcdLeadershipTest, OneLeadsTheOtherWaitsAndTakesOverOnResign) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client_a = Connect(etcd->endpoints());
  auto client_b = Connect(etcd->endpoints());
  EtcdLeadership a(*client_a, Options("a"));
  EtcdLeadership b(*client_b, Options("b"));

  ASSERT_TRUE(a.Campaign().ok());
  EXPECT_TRUE(a.IsLeader());
  {
    Campaigner waiting(b);
    EXPECT_FALSE(waiting.WaitForWin(absl::Milliseconds(600))) << "b won while a leads";
    EXPECT_FALSE(b.IsLeader());
    ASSERT_TRUE(b.Leader().has_value());
    EXPECT_EQ(b.Leader()->id, "a");
    EXPECT_EQ(b.Leader()->address, "a.example:29650");

    a.Resign();
    EXPECT_FALSE(a.IsLeader());
    ASSERT_TRUE(waiting.WaitForWin(absl::Seconds(2))) << "b did not take over after a resigned";
  }
  EXPECT_TRUE(b.IsLeader());
  EXPECT_EQ(a.Leader()->id, "b");
  EXPECT_GT(b.fence().create_revision, a.fence().create_revision);
}

// Note [Standbys watch the leader key]: a waiting coordinator reads the key
// about once per recheck_interval (3 s) rather than every 100 ms, and still
// takes over as soon as the key is deleted.
TEST(EtcdLeadershipTest, AWaitingCoordinatorWatchesTheKeyInsteadOfPollingIt) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client_a = Connect(etcd->endpoints());
  auto client_b = Connect(etcd->endpoints());
  EtcdLeadership a(*client_a, Options("a"));
  EtcdLeadership b(*client_b, Options("b"));
  ASSERT_TRUE(a.Campaign().ok());
  Campaigner waiting(b);
  const absl::Time started = absl::Now();
  while (client_b->range_calls() == 0 && absl::Now() < started + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(client_b->range_calls(), 0) << "b never read the leader key";
  absl::SleepFor(absl::Milliseconds(200));  // b is in its watch now
  const int64_t before = client_b->range_calls();
  absl::SleepFor(absl::Seconds(2));
  // Polling every 100 ms would have read it about 20 times.
  EXPECT_LE(client_b->range_calls() - before, 2) << "b polls the leader key";
  EXPECT_FALSE(waiting.done()) << "b won while a leads";

  // The key goes (as when a's lease ends): b learns it from its watch.
  etcdserverpb::DeleteRangeRequest remove;
  remove.set_key(a.key());
  const absl::Time deleted = absl::Now();
  ASSERT_TRUE(client_a->DeleteRange(remove).ok());
  ASSERT_TRUE(waiting.WaitForWin(absl::Seconds(2))) << "b did not take over";
  EXPECT_LT(waiting.won_at() - deleted, absl::Seconds(1)) << "b waited for a re-check";
  EXPECT_TRUE(b.IsLeader());
}

TEST(EtcdLeadershipTest, StoppingAWaitingCoordinatorEndsItsWatchAtOnce) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client_a = Connect(etcd->endpoints());
  auto client_b = Connect(etcd->endpoints());
  EtcdLeadership a(*client_a, Options("a"));
  EtcdLeadership b(*client_b, Options("b"));
  ASSERT_TRUE(a.Campaign().ok());
  absl::Status campaign;
  absl::Notification ended;
  std::thread waiting([&] {
    campaign = b.Campaign();
    ended.Notify();
  });
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  const absl::Time stopped = absl::Now();
  b.Stop();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  waiting.join();
  EXPECT_TRUE(absl::IsCancelled(campaign)) << campaign;
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(1)) << "Stop waited for the watch's re-check";
}

// The split brain the fence exists for: a leader whose lease is gone (here
// revoked behind its back) has been replaced, and a write it makes with its
// old leadership is refused by etcd, whatever it believes.
TEST(EtcdLeadershipTest, ADeposedLeadersWriteIsRejectedByTheFence) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client_a = Connect(etcd->endpoints());
  auto client_b = Connect(etcd->endpoints());
  EtcdLeadership a(*client_a, Options("a"));
  EtcdLeadership b(*client_b, Options("b"));
  ASSERT_TRUE(a.Campaign().ok());
  auto state_a = EtcdStateStore::Open(*client_a, "/chorus", a.fence());
  ASSERT_TRUE(state_a.ok()) << state_a.status();
  ASSERT_TRUE((*state_a)->SaveJob(MakeJob("job-000001", v1::Job::RUNNING)).ok());

  etcdserverpb::RangeRequest get;
  get.set_key(a.key());
  auto held = client_b->Range(get);
  ASSERT_TRUE(held.ok() && held->kvs_size() == 1);
  ASSERT_TRUE(client_b->LeaseRevoke(held->kvs(0).lease()).ok());

  Campaigner taking_over(b);
  ASSERT_TRUE(taking_over.WaitForWin(absl::Seconds(3)));
  const absl::Time deadline = absl::Now() + kLease;
  while (a.IsLeader() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(a.IsLeader()) << "a still believes it leads a lease after its lease was revoked";

  absl::Status stale = (*state_a)->SaveJob(MakeJob("job-000001", v1::Job::FAILED));
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_TRUE(absl::StrContains(stale.message(), "no longer leads (fenced by etcd)")) << stale;
  auto state_b = EtcdStateStore::Open(*client_b, "/chorus", b.fence());
  ASSERT_TRUE(state_b.ok()) << state_b.status();
  EXPECT_EQ((*state_b)->LoadJob("job-000001")->state(), v1::Job::RUNNING)
      << "the deposed leader's write landed";
  EXPECT_TRUE((*state_b)->SaveJob(MakeJob("job-000001", v1::Job::SUCCEEDED)).ok());
  EXPECT_EQ((*state_b)->cluster_id(), (*state_a)->cluster_id());
}

// Note [Leader lease]: a leader that cannot reach etcd stops believing it
// leads before anyone else can win, and within its lease.
TEST(EtcdLeadershipTest, ALeaderCutOffFromEtcdStepsDownBeforeAnotherWins) {
  auto etcd = StartEtcd(3);
  ASSERT_NE(etcd, nullptr);
  auto client_a = Connect(etcd->endpoint(0));  // a reaches etcd only through member 0
  auto client_b = Connect(etcd->endpoint(1) + "," + etcd->endpoint(2));
  EtcdLeadership a(*client_a, Options("a"));
  EtcdLeadership b(*client_b, Options("b"));
  ASSERT_TRUE(a.Campaign().ok());
  auto state_a = EtcdStateStore::Open(*client_a, "/chorus", a.fence());
  ASSERT_TRUE(state_a.ok()) << state_a.status();

  const absl::Time cut = absl::Now();
  etcd->Kill(0);
  Campaigner taking_over(b);
  absl::Time stepped_down = absl::InfiniteFuture();
  const absl::Time deadline = cut + absl::Seconds(6);
  while (!taking_over.done() && absl::Now() < deadline) {
    if (stepped_down == absl::InfiniteFuture() && !a.IsLeader()) stepped_down = absl::Now();
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(taking_over.WaitForWin(absl::ZeroDuration())) << "b did not take over";
  ASSERT_NE(stepped_down, absl::InfiniteFuture()) << "a still leads after b won";
  EXPECT_LT(stepped_down, taking_over.won_at()) << "two leaders at once";
  EXPECT_LE(stepped_down - cut, kLease) << "a kept leading past its lease";
  // If member 0 was etcd's raft leader, etcd first elects another (one to
  // two election timeouts, 0.5-1 s here), then extends every lease by an
  // election timeout (0.5 s), and revokes expired leases only on its 0.5 s
  // sweep: up to 2 s past the lease before b can win, plus b's own retry
  // and a sanitizer-slowed process (4.02 s was seen under tsan).
  EXPECT_LE(taking_over.won_at() - cut, kLease + absl::Seconds(3)) << "the takeover was slow";

  EXPECT_TRUE(absl::IsUnavailable((*state_a)->SaveJob(MakeJob("job-000001", v1::Job::PENDING))));
  ASSERT_TRUE(etcd->Restart(0).ok());
  ASSERT_TRUE(etcd->WaitHealthy(absl::Seconds(10)).ok());
  absl::Status stale = (*state_a)->SaveJob(MakeJob("job-000001", v1::Job::PENDING));
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
}

// Note [Taking back a lapsed term]: a leader whose own bound on its lease
// passed while etcd kept the lease (as while etcd elects a new raft leader)
// leads again under the same fence, and no other coordinator takes over in
// between.
TEST(EtcdLeadershipTest, ALeaderWhoseBoundLapsedWhileEtcdKeptItsLeaseLeadsAgainUnderTheSameFence) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client_a = Connect(etcd->endpoints());
  auto client_b = Connect(etcd->endpoints());
  EtcdLeadershipOptions lapsing = Options("a");
  // Its bound ends 1 s after each keep-alive is sent and keep-alives go out
  // every 2 s: it stops believing it leads while etcd holds its lease for
  // 5 s more.
  lapsing.lease_ttl = absl::Seconds(6);
  lapsing.safety_margin = absl::Seconds(5);
  EtcdLeadership a(*client_a, lapsing);
  EtcdLeadership b(*client_b, Options("b"));
  ASSERT_TRUE(a.Campaign().ok());
  const LeaderFence first = a.fence();
  Campaigner waiting(b);

  const absl::Time before = absl::Now();
  a.WaitUntilLost();
  EXPECT_LT(absl::Now() - before, absl::Seconds(2)) << "the bound passes 1 s after the win";
  EXPECT_FALSE(a.IsLeader());
  ASSERT_TRUE(a.Campaign().ok());
  EXPECT_LT(absl::Now() - before, absl::Seconds(3)) << "taking the term back waited";
  EXPECT_TRUE(a.IsLeader());
  EXPECT_EQ(a.fence().create_revision, first.create_revision);
  EXPECT_FALSE(waiting.done()) << "b won although a's key was never gone";
  ASSERT_TRUE(b.Leader().has_value());
  EXPECT_EQ(b.Leader()->id, "a");
  auto state_a = EtcdStateStore::Open(*client_a, "/chorus", a.fence());
  ASSERT_TRUE(state_a.ok()) << state_a.status();
  EXPECT_TRUE((*state_a)->SaveJob(MakeJob("job-000001", v1::Job::PENDING)).ok());

  a.Resign();
  EXPECT_TRUE(waiting.WaitForWin(absl::Seconds(3))) << "b did not take over after a resigned";
  EXPECT_GT(b.fence().create_revision, first.create_revision);
}

// A coordinator that campaigns while etcd cannot answer says why
// (ElectionError, what its follower server tells clients) and clears it
// once etcd answers again.
TEST(EtcdLeadershipTest, ACampaignWithoutQuorumReportsWhyUntilEtcdAnswersAgain) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client = Connect(etcd->endpoints(), absl::Seconds(1));
  EtcdLeadership follower(*client, Options("f"));
  EXPECT_TRUE(follower.ElectionError().ok());
  etcd->Kill(0);
  Campaigner campaigning(follower);
  absl::Status error;
  for (int i = 0; i < 100 && error.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    error = follower.ElectionError();
  }
  EXPECT_TRUE(absl::IsUnavailable(error)) << error;
  EXPECT_TRUE(absl::StrContains(error.message(), "etcd at " + etcd->endpoints())) << error;
  EXPECT_TRUE(absl::StrContains(error.message(), "no quorum")) << error;
  EXPECT_FALSE(campaigning.done());

  EXPECT_TRUE(etcd->Restart(0).ok());
  EXPECT_TRUE(campaigning.WaitForWin(absl::Seconds(10)));
  EXPECT_TRUE(follower.ElectionError().ok()) << follower.ElectionError();
  follower.Stop();
}

// Between the moment a coordinator stops believing it leads and the moment
// etcd deletes its key, the fence alone would let a write through: that is
// when a deposed leader shuts its services down, and their ending must not
// be written.
TEST(EtcdStateStoreTest, AWriteOnceThisCoordinatorNoLongerLeadsIsRefusedBeforeTheFence) {
  auto etcd = StartEtcd(1);
  ASSERT_NE(etcd, nullptr);
  auto client = Connect(etcd->endpoints());
  auto fence = PermanentTestFence(*client, "/chorus");
  ASSERT_TRUE(fence.ok()) << fence.status();
  std::atomic<bool> leading{true};
  EtcdStateStoreOptions options;
  options.still_leading = [&leading] { return leading.load(); };
  auto state = EtcdStateStore::Open(*client, "/chorus", *fence, options);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE((*state)->SaveJob(MakeJob("job-000001", v1::Job::RUNNING)).ok());

  leading = false;
  absl::Status refused = (*state)->SaveJob(MakeJob("job-000001", v1::Job::FAILED));
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "no longer leads (its lease ended"))
      << refused;
  absl::StatusOr<v1::Job> kept = (*state)->LoadJob("job-000001");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->state(), v1::Job::RUNNING);
}

TEST(EtcdStateQuorumTest, WritesGoOnWithoutAMinorityAndFailClearlyWithoutAMajority) {
  auto etcd = StartEtcd(3);
  ASSERT_NE(etcd, nullptr);
  auto client = Connect(etcd->endpoints(), absl::Seconds(3));
  auto fence = PermanentTestFence(*client, "/chorus");
  ASSERT_TRUE(fence.ok()) << fence.status();
  auto state = EtcdStateStore::Open(*client, "/chorus", *fence);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE((*state)->SaveJob(MakeJob("job-000001", v1::Job::RUNNING)).ok());

  etcd->Kill(0);
  absl::Status minority = (*state)->SaveJob(MakeJob("job-000002", v1::Job::PENDING));
  EXPECT_TRUE(minority.ok()) << minority;
  EXPECT_TRUE((*state)->LoadJob("job-000001").ok());

  etcd->Kill(1);
  const absl::Time start = absl::Now();
  absl::Status majority = (*state)->SaveJob(MakeJob("job-000003", v1::Job::PENDING));
  EXPECT_TRUE(absl::IsUnavailable(majority)) << majority;
  EXPECT_TRUE(absl::StrContains(majority.message(), "etcd at " + etcd->endpoints())) << majority;
  EXPECT_TRUE(absl::StrContains(majority.message(), "no quorum")) << majority;
  EXPECT_LE(absl::Now() - start, absl::Seconds(4)) << "the call outlived its deadline";

  ASSERT_TRUE(etcd->Restart(0).ok());
  ASSERT_TRUE(etcd->Restart(1).ok());
  ASSERT_TRUE(etcd->WaitHealthy(absl::Seconds(10)).ok());
  absl::Status back = (*state)->SaveJob(MakeJob("job-000003", v1::Job::PENDING));
  EXPECT_TRUE(back.ok()) << back;
  EXPECT_EQ((*state)->LoadJobs()->size(), 3u);
}

TEST(EtcdOptionsTest, BadOptionsNameTheFlag) {
  EtcdOptions options;
  EXPECT_TRUE(absl::StrContains(ValidateEtcdOptions(options).message(), "none given"));
  options.endpoints = "127.0.0.1:2379,nohost";
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateEtcdOptions(options)));
  options.endpoints = "127.0.0.1:2379";
  options.cert_file = "c.pem";
  EXPECT_TRUE(absl::StrContains(ValidateEtcdOptions(options).message(), "--etcd_key"));
  options.key_file = "k.pem";
  EXPECT_TRUE(absl::StrContains(ValidateEtcdOptions(options).message(), "--etcd_ca"));
  options.ca_file = "ca.pem";
  EXPECT_TRUE(ValidateEtcdOptions(options).ok());
  options.user = "root";
  EXPECT_TRUE(absl::StrContains(ValidateEtcdOptions(options).message(), "--etcd_password_file"));
  options.password_file = "/nonexistent/password";
  options.ca_file = options.cert_file = options.key_file = "";
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  EXPECT_TRUE(absl::IsFailedPrecondition(client.status())) << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(), "/nonexistent/password"));
}

}  // namespace
}  // namespace chorus
