// Coordinators on etcd state: the checkpoint directory check, and two
// CoordinatorServers in this process taking over from each other through
// a real etcd member, the deposed one's RPCs refused by the fence.
#include "coordinator/etcd/etcd_coordinator_state.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/job_credentials.h"
#include "common/job_spec.h"
#include "common/private_files.h"
#include "coordinator/etcd/etcd_test_cluster.h"
#include "coordinator/service/server.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

std::string TempDir(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/", name);
}

std::unique_ptr<EtcdCoordinatorState> Coordinator(
    const EtcdTestCluster& etcd, const std::string& id, const std::string& checkpoint_dir,
    absl::Duration lease_ttl = EtcdCoordinatorStateOptions().lease_ttl) {
  EtcdCoordinatorStateOptions options;
  options.url = *ParseStateUrl(absl::StrCat("etcd://", etcd.endpoints(), "/chorus"));
  options.self.id = id;
  options.checkpoint_dir = checkpoint_dir;
  options.lease_ttl = lease_ttl;
  absl::StatusOr<std::unique_ptr<EtcdCoordinatorState>> state =
      EtcdCoordinatorState::Connect(options);
  EXPECT_TRUE(state.ok()) << state.status();
  return state.ok() ? *std::move(state) : nullptr;
}

TEST(EtcdCoordinatorStateTest, OptionsNameTheFlag) {
  EtcdCoordinatorStateOptions options;
  options.url = *ParseStateUrl("etcd://127.0.0.1:2379/chorus");
  EXPECT_TRUE(absl::StrContains(ValidateEtcdCoordinatorStateOptions(options).message(),
                                "needs --checkpoint_dir"));
  options.checkpoint_dir = "/shared/checkpoints";
  EXPECT_TRUE(ValidateEtcdCoordinatorStateOptions(options).ok());
  options.lease_ttl = absl::Milliseconds(500);
  EXPECT_TRUE(absl::StrContains(ValidateEtcdCoordinatorStateOptions(options).message(),
                                "--leader_lease_seconds"));
}

TEST(EtcdCoordinatorStateTest, ALeaderWithoutTheSharedCheckpointDirectoryRefusesToStart) {
  auto etcd = EtcdTestCluster::Start(1);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string shared = TempDir("shared_checkpoints");
  auto a = Coordinator(**etcd, "a", shared);
  auto b = Coordinator(**etcd, "b", TempDir("local_checkpoints"));
  auto c = Coordinator(**etcd, "c", shared);
  ASSERT_TRUE(a && b && c);

  EXPECT_TRUE(b->CheckCheckpointDirectory().ok()) << "nothing claimed yet";
  ASSERT_TRUE(a->leadership().Campaign().ok());
  ASSERT_TRUE(a->OpenState().ok());
  a->leadership().Resign();
  // Before campaigning (Note [Shared checkpoint directory]): b is refused
  // at start, c, on the shared directory, is not.
  const absl::Status early = b->CheckCheckpointDirectory();
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  EXPECT_TRUE(absl::StrContains(early.message(), TempDir("local_checkpoints"))) << early;
  EXPECT_TRUE(absl::StrContains(early.message(), "another cluster uses")) << early;
  EXPECT_TRUE(c->CheckCheckpointDirectory().ok());
  ASSERT_TRUE(b->leadership().Campaign().ok());
  absl::StatusOr<std::unique_ptr<StateStore>> refused = b->OpenState();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), TempDir("local_checkpoints")))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "shared storage")) << refused.status();
  b->leadership().Resign();
  ASSERT_TRUE(c->leadership().Campaign().ok());
  absl::StatusOr<std::unique_ptr<StateStore>> opened = c->OpenState();
  EXPECT_TRUE(opened.ok()) << opened.status();
}

// Note [Shared job credentials]: the first leader puts its own secret into
// etcd; a later one without a file uses it, one whose file differs refuses.
TEST(EtcdCoordinatorStateTest, TheJobCredentialSecretIsSharedThroughEtcd) {
  auto etcd = EtcdTestCluster::Start(1);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string shared = TempDir("credentials_checkpoints");
  auto a = Coordinator(**etcd, "a", shared);
  auto b = Coordinator(**etcd, "b", shared);
  auto c = Coordinator(**etcd, "c", shared);
  ASSERT_TRUE(a && b && c);
  const std::string a_key = TempDir("a_job_credentials.key");
  const std::string b_key = TempDir("b_job_credentials.key");
  const std::string c_key = TempDir("c_job_credentials.key");
  const std::string a_secret(64, 'a');
  ASSERT_TRUE(WritePrivateFile(a_key, a_secret + "\n").ok());
  ASSERT_TRUE(WritePrivateFile(b_key, std::string(64, 'b') + "\n").ok());

  ASSERT_TRUE(a->leadership().Campaign().ok());
  absl::StatusOr<std::unique_ptr<StateStore>> a_state = a->OpenState();
  ASSERT_TRUE(a_state.ok()) << a_state.status();
  absl::StatusOr<JobCredentials> first = (*a_state)->LoadJobCredentials(a_key);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->For("job-000001"), JobCredentials(a_secret).For("job-000001"));
  a->leadership().Resign();

  ASSERT_TRUE(c->leadership().Campaign().ok());
  absl::StatusOr<std::unique_ptr<StateStore>> c_state = c->OpenState();
  ASSERT_TRUE(c_state.ok()) << c_state.status();
  absl::StatusOr<JobCredentials> later = (*c_state)->LoadJobCredentials(c_key);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->For("job-000001"), first->For("job-000001"));
  EXPECT_EQ(later->JobOf(first->For("job-000002")), "job-000002");
  EXPECT_FALSE(std::ifstream(c_key).good()) << "the shared secret was copied into a file";
  c->leadership().Resign();

  ASSERT_TRUE(b->leadership().Campaign().ok());
  absl::StatusOr<std::unique_ptr<StateStore>> b_state = b->OpenState();
  ASSERT_TRUE(b_state.ok()) << b_state.status();
  absl::StatusOr<JobCredentials> refused = (*b_state)->LoadJobCredentials(b_key);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), b_key)) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "/chorus/job_credentials_secret"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "Remove " + b_key))
      << refused.status();
}

std::unique_ptr<CoordinatorServer> StartServer(EtcdCoordinatorState& etcd, const std::string& name,
                                               const std::string& checkpoint_dir) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.http_listen = "off";
  options.checkpoint_data_port = -1;
  options.state_dir = TempDir(name);
  options.checkpoint_dir = checkpoint_dir;
  options.open_state = [&etcd] { return etcd.OpenState(); };
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

grpc::Status Submit(const CoordinatorServer& server, v1::SubmitJobResponse* submitted) {
  auto stub = v1::JobService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *ParseJobSpec(
      "model { mlp {} } data { synthetic {} } resources { min_ranks: 2 max_ranks: 2 }",
      SpecFormat::kTextProto, "test");
  return stub->SubmitJob(&context, request, submitted);
}

std::vector<std::string> ListJobs(const CoordinatorServer& server) {
  auto stub = v1::JobService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListJobsRequest request;
  v1::ListJobsResponse listed;
  EXPECT_TRUE(stub->ListJobs(&context, request, &listed).ok());
  std::vector<std::string> ids;
  for (const v1::Job& job : listed.jobs()) ids.push_back(job.job_id());
  return ids;
}

// The split brain at the RPC level: coordinator a's lease is revoked behind
// its back and b takes over with a's jobs; a submission a still accepts is
// refused by the fence and never reaches b's state.
TEST(EtcdCoordinatorStateTest, ANewLeaderServesTheJobsAndTheOldOnesWritesAreFenced) {
  auto etcd = EtcdTestCluster::Start(1);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string shared = TempDir("server_checkpoints");
  auto a = Coordinator(**etcd, "a", shared);
  auto b = Coordinator(**etcd, "b", shared);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->leadership().Campaign().ok());
  auto server_a = StartServer(*a, "server_a", shared);
  ASSERT_NE(server_a, nullptr);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(Submit(*server_a, &submitted).ok());
  EXPECT_EQ(submitted.job_id(), "job-000001");

  etcdserverpb::RangeRequest get;
  get.set_key(a->leadership().key());
  auto held = b->client().Range(get);
  ASSERT_TRUE(held.ok() && held->kvs_size() == 1);
  ASSERT_TRUE(b->client().LeaseRevoke(held->kvs(0).lease()).ok());
  ASSERT_TRUE(b->leadership().Campaign().ok());
  auto server_b = StartServer(*b, "server_b", shared);
  ASSERT_NE(server_b, nullptr);
  EXPECT_EQ(ListJobs(*server_b), std::vector<std::string>{"job-000001"});

  const grpc::Status stale = Submit(*server_a, &submitted);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << stale.error_message();
  EXPECT_TRUE(absl::StrContains(stale.error_message(), "no longer leads (fenced by etcd)"))
      << stale.error_message();
  EXPECT_EQ(ListJobs(*server_b), std::vector<std::string>{"job-000001"});
  for (auto* server : {server_a.get(), server_b.get()}) {
    server->Shutdown(absl::Seconds(1));
    server->Wait();
  }
}

// A leader whose key was replaced behind its back (its lease still alive,
// so only the next renewal's read of the key would tell, up to a third of
// the lease later) learns it from the first write etcd refuses: the term
// ends then, and the coordinator steps down instead of serving as leader.
TEST(EtcdCoordinatorStateTest, AWriteRefusedByTheFenceEndsTheTermAtOnce) {
  auto etcd = EtcdTestCluster::Start(1);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string shared = TempDir("fenced_checkpoints");
  // Renewals every 20 s: none falls inside this test's few seconds.
  auto a = Coordinator(**etcd, "a", shared, absl::Seconds(60));
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->leadership().Campaign().ok());
  auto server_a = StartServer(*a, "fenced_server_a", shared);
  ASSERT_NE(server_a, nullptr);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(Submit(*server_a, &submitted).ok());

  // Another coordinator's key in place of a's: deleted and written again,
  // so its create_revision is no longer a's fence.
  const std::string key = a->leadership().key();
  etcdserverpb::TxnRequest replace;
  replace.add_success()->mutable_request_delete_range()->set_key(key);
  ASSERT_TRUE(a->client().Txn(replace).ok());
  etcdserverpb::TxnRequest put;
  put.add_success()->mutable_request_put()->set_key(key);
  put.mutable_success(0)->mutable_request_put()->set_value("another coordinator");
  ASSERT_TRUE(a->client().Txn(put).ok());
  ASSERT_TRUE(a->leadership().IsLeader()) << "a renewal noticed first; the test proves nothing";

  const absl::Time refused_at = absl::Now();
  const grpc::Status stale = Submit(*server_a, &submitted);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << stale.error_message();
  EXPECT_TRUE(absl::StrContains(stale.error_message(), "no longer leads (fenced by etcd)"))
      << stale.error_message();
  EXPECT_FALSE(a->leadership().IsLeader()) << "the refused write did not end the term";
  a->leadership().WaitUntilLost();  // what the leader loop waits on before it stops serving
  EXPECT_LT(absl::Now() - refused_at, absl::Seconds(5));

  // A later write is refused before etcd is asked (IsLeader is false).
  const grpc::Status again = Submit(*server_a, &submitted);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << again.error_message();
  EXPECT_TRUE(absl::StrContains(again.error_message(), "no longer leads")) << again.error_message();
  server_a->Shutdown(absl::Seconds(1));
  server_a->Wait();
}

}  // namespace
}  // namespace chorus
