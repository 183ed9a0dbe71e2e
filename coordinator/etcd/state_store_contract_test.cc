// The same cases against both StateStores: SQLite in a directory, and etcd
// (a real one-member cluster started by the test) under a prefix. A case
// that passes for one and fails for the other is a difference callers of
// StateStore would see.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_state_store.h"
#include "coordinator/etcd/etcd_test_cluster.h"
#include "coordinator/state/state_store.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

class SqliteBackend {
 public:
  // The state named `name`: the same name opens the same state again.
  absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& name) {
    return StateStore::Open(absl::StrCat(testing::TempDir(), "/contract_", name));
  }
};

// One etcd member for the whole binary, killed at exit.
EtcdTestCluster& SharedEtcd() {
  static std::unique_ptr<EtcdTestCluster> cluster = [] {
    absl::StatusOr<std::unique_ptr<EtcdTestCluster>> started = EtcdTestCluster::Start(1);
    if (!started.ok()) {
      fprintf(stderr, "starting etcd: %s\n", std::string(started.status().message()).c_str());
      abort();
    }
    return *std::move(started);
  }();
  return *cluster;
}

class EtcdBackend {
 public:
  absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& name) {
    if (client_ == nullptr) {
      EtcdOptions options;
      options.endpoints = SharedEtcd().endpoints();
      absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
      if (!client.ok()) return client.status();
      client_ = *std::move(client);
    }
    // A prefix per test run and name, so that reruns start empty.
    const std::string prefix = absl::StrCat("/contract/", getpid(), "/", name);
    absl::StatusOr<LeaderFence> fence = PermanentTestFence(*client_, prefix);
    if (!fence.ok()) return fence.status();
    EtcdStateStoreOptions options;
    options.page_size = 7;  // many pages even for small cases
    absl::StatusOr<std::unique_ptr<EtcdStateStore>> store =
        EtcdStateStore::Open(*client_, prefix, *fence, options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<StateStore>(*std::move(store));
  }

 private:
  std::unique_ptr<EtcdClient> client_;
};

template <typename Backend>
class StateStoreContractTest : public testing::Test {
 protected:
  std::unique_ptr<StateStore> Open(const std::string& name) {
    absl::StatusOr<std::unique_ptr<StateStore>> store = backend_.Open(name);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  Backend backend_;
};

using Backends = testing::Types<SqliteBackend, EtcdBackend>;
TYPED_TEST_SUITE(StateStoreContractTest, Backends);

v1::Job MakeJob(const std::string& id, int64_t submit_time_us,
                v1::Job::State state = v1::Job::PENDING) {
  v1::Job job;
  job.set_job_id(id);
  job.set_submit_time_us(submit_time_us);
  job.set_state(state);
  job.mutable_spec()->set_name("spec of " + id);
  return job;
}

v1::JobEvent MakeEvent(const std::string& job_id, int64_t seq) {
  v1::JobEvent event;
  event.set_job_id(job_id);
  event.set_seq(seq);
  event.set_message(absl::StrCat("event ", seq));
  return event;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.job_id());
  return ids;
}

TYPED_TEST(StateStoreContractTest, JobsComeBackInSubmissionOrderAndReplace) {
  auto state = this->Open("jobs");
  ASSERT_NE(state, nullptr);
  ASSERT_TRUE(state->SaveJob(MakeJob("job-a", 30)).ok());
  ASSERT_TRUE(state->SaveJob(MakeJob("job-c", 10)).ok());
  ASSERT_TRUE(state->SaveJob(MakeJob("job-b", 10)).ok());
  ASSERT_TRUE(state->SaveJob(MakeJob("job-a", 30, v1::Job::RUNNING)).ok());

  absl::StatusOr<std::vector<v1::Job>> jobs = state->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(Ids(*jobs), (std::vector<std::string>{"job-b", "job-c", "job-a"}));
  EXPECT_EQ(jobs->back().state(), v1::Job::RUNNING) << "the second save replaced the first";

  absl::StatusOr<v1::Job> c = state->LoadJob("job-c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->SerializeAsString(), MakeJob("job-c", 10).SerializeAsString());
  EXPECT_TRUE(absl::IsNotFound(state->LoadJob("job-z").status()));
}

TYPED_TEST(StateStoreContractTest, ManyJobsAreAllVisitedInOrder) {
  auto state = this->Open("many");
  ASSERT_NE(state, nullptr);
  constexpr int kJobs = 230;  // more than one read transaction and many pages
  for (int i = kJobs; i > 0; --i) {
    ASSERT_TRUE(state->SaveJob(MakeJob(absl::StrFormat("job-%06d", i), 1000 - i)).ok());
  }
  std::vector<std::string> seen;
  ASSERT_TRUE(state->ForEachJob([&](v1::Job job) { seen.push_back(job.job_id()); }).ok());
  ASSERT_EQ(seen.size(), kJobs);
  EXPECT_EQ(seen.front(), absl::StrFormat("job-%06d", kJobs)) << "submitted first";
  EXPECT_EQ(seen.back(), "job-000001");
}

TYPED_TEST(StateStoreContractTest, JobsBeforeAnIdGreatestFirst) {
  auto state = this->Open("before");
  ASSERT_NE(state, nullptr);
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE(state->SaveJob(MakeJob(absl::StrCat("job-00", i), i)).ok());
  }
  absl::StatusOr<std::vector<v1::Job>> newest = state->LoadJobsBefore("", 2);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(Ids(*newest), (std::vector<std::string>{"job-005", "job-004"}));
  absl::StatusOr<std::vector<v1::Job>> older = state->LoadJobsBefore("job-003", 10);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(Ids(*older), (std::vector<std::string>{"job-002", "job-001"}));
}

TYPED_TEST(StateStoreContractTest, EventsAppendInOrderPerJob) {
  auto state = this->Open("events");
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(*state->LastEventSeq("job-1"), 0);
  ASSERT_TRUE(state->AppendEvent(MakeEvent("job-1", 1)).ok());
  ASSERT_TRUE(state->AppendEvent(MakeEvent("job-1", 2)).ok());
  ASSERT_TRUE(state->AppendEvent(MakeEvent("job-10", 7)).ok()) << "a job whose id extends job-1";
  ASSERT_TRUE(state->SaveJobAndEvent(MakeJob("job-1", 5, v1::Job::RUNNING), MakeEvent("job-1", 3))
                  .ok());

  EXPECT_EQ(*state->LastEventSeq("job-1"), 3);
  EXPECT_EQ(*state->LastEventSeq("job-10"), 7);
  absl::StatusOr<std::vector<v1::JobEvent>> events = state->LoadEvents("job-1", 1);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].message(), "event 2");
  EXPECT_EQ((*events)[1].message(), "event 3");
  EXPECT_EQ(state->LoadEvents("job-1", 0)->size(), 3u);
  EXPECT_EQ(state->LoadJob("job-1")->state(), v1::Job::RUNNING) << "saved with its event";
}

TYPED_TEST(StateStoreContractTest, ManifestsByJobAndStep) {
  auto state = this->Open("manifests");
  ASSERT_NE(state, nullptr);
  auto manifest = [](const std::string& job_id, int64_t step, int world_size) {
    v1::CheckpointManifest m;
    m.set_job_id(job_id);
    m.set_step(step);
    m.set_world_size(world_size);
    return m;
  };
  ASSERT_TRUE(state->SaveManifest(manifest("job-b", 2, 1)).ok());
  ASSERT_TRUE(state->SaveManifest(manifest("job-a", 50, 1)).ok());
  ASSERT_TRUE(state->SaveManifest(manifest("job-a", 5, 1)).ok());
  ASSERT_TRUE(state->SaveManifest(manifest("job-a", 50, 4)).ok()) << "replaces";

  absl::StatusOr<std::vector<v1::CheckpointManifest>> a = state->LoadManifests("job-a");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].step(), 5);
  EXPECT_EQ((*a)[1].step(), 50);
  EXPECT_EQ((*a)[1].world_size(), 4);
  absl::StatusOr<std::vector<v1::CheckpointManifest>> all = state->LoadManifests("");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[2].job_id(), "job-b");

  ASSERT_TRUE(state->DeleteManifest("job-a", 5).ok());
  ASSERT_TRUE(state->DeleteManifest("job-a", 6).ok()) << "deleting what is not there is fine";
  EXPECT_EQ(state->LoadManifests("job-a")->size(), 1u);
}

TYPED_TEST(StateStoreContractTest, ElasticRecordsAreReplaced) {
  auto state = this->Open("elastic");
  ASSERT_NE(state, nullptr);
  absl::StatusOr<coordinator::ElasticRecord> none = state->LoadElasticRecord("job-1");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->generation(), 0);
  coordinator::ElasticRecord record;
  record.set_generation(3);
  record.add_lost_ranks(2);
  ASSERT_TRUE(state->SaveElasticRecord("job-1", record).ok());
  record.set_generation(4);
  ASSERT_TRUE(state->SaveElasticRecord("job-1", record).ok());
  absl::StatusOr<coordinator::ElasticRecord> loaded = state->LoadElasticRecord("job-1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->generation(), 4);
  EXPECT_EQ(loaded->lost_ranks_size(), 1);
}

TYPED_TEST(StateStoreContractTest, ClusterIdSurvivesReopening) {
  std::string first;
  {
    auto state = this->Open("cluster_x");
    ASSERT_NE(state, nullptr);
    first = state->cluster_id();
    ASSERT_TRUE(state->SaveJob(MakeJob("job-1", 1)).ok());
  }
  EXPECT_EQ(first.size(), 12u);
  auto again = this->Open("cluster_x");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->cluster_id(), first);
  EXPECT_TRUE(again->LoadJob("job-1").ok()) << "the job survived reopening";
  auto other = this->Open("cluster_y");
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->cluster_id(), first);
}

}  // namespace
}  // namespace chorus
