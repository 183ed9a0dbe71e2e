// EtcdClient against a real etcd member with authentication enabled.
#include "coordinator/etcd/etcd_client.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/etcd/etcd_test_cluster.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// Runs etcdctl (etcd-client) against `endpoint`; its exit status.
int Etcdctl(const std::string& endpoint, const std::string& args) {
  return std::system(absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --dial-timeout=3s --endpoints=",
                                  endpoint, " ", args, " >/dev/null 2>&1")
                         .c_str());
}

std::string PasswordFile(const std::string& name, const std::string& password) {
  const std::string path = absl::StrCat(testing::TempDir(), "/", name);
  std::ofstream(path) << password << "\n";
  return path;
}

etcdserverpb::PutRequest PutOf(const std::string& key) {
  etcdserverpb::PutRequest put;
  put.set_key(key);
  put.set_value("v");
  return put;
}

TEST(EtcdClientTest, AuthenticatesWithAUserAndAPasswordFile) {
  auto etcd = EtcdTestCluster::Start(1);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string endpoint = (*etcd)->endpoints();
  ASSERT_EQ(Etcdctl(endpoint, "user add root:s3cret-pw"), 0);
  ASSERT_EQ(Etcdctl(endpoint, "auth enable"), 0);

  EtcdOptions anonymous;
  anonymous.endpoints = endpoint;
  anonymous.call_timeout = absl::Seconds(2);
  auto no_user = EtcdClient::Connect(anonymous);
  ASSERT_TRUE(no_user.ok()) << no_user.status();
  absl::Status refused = (*no_user)->Put(PutOf("/chorus/x")).status();
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.message(), "etcd at " + endpoint)) << refused;

  EtcdOptions wrong = anonymous;
  wrong.user = "root";
  wrong.password_file = PasswordFile("wrong_password", "not-it");
  absl::StatusOr<std::unique_ptr<EtcdClient>> bad = EtcdClient::Connect(wrong);
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "authenticate")) << bad.status();

  EtcdOptions right = wrong;
  right.password_file = PasswordFile("right_password", "s3cret-pw");
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(right);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Put(PutOf("/chorus/x")).ok());
  etcdserverpb::RangeRequest get;
  get.set_key("/chorus/x");
  absl::StatusOr<etcdserverpb::RangeResponse> read = (*client)->Range(get);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->kvs_size(), 1);
}

TEST(EtcdClientTest, PrefixRangeEndCoversEveryKeyUnderThePrefix) {
  EXPECT_EQ(PrefixRangeEnd("/chorus/"), "/chorus0");
  EXPECT_EQ(PrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(PrefixRangeEnd(std::string("\xff\xff")), std::string(1, '\0'));
}

TEST(EtcdClientTest, EtcdsOwnDeadlineCountsAsNoQuorumLikeTheClients) {
  EXPECT_TRUE(IsEtcdUnavailable(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused")));
  EXPECT_TRUE(IsEtcdUnavailable(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline")));
  EXPECT_TRUE(IsEtcdUnavailable(grpc::Status(grpc::StatusCode::UNKNOWN,
                                             "context deadline exceeded")));
  EXPECT_FALSE(IsEtcdUnavailable(grpc::Status(grpc::StatusCode::UNKNOWN, "malformed header")));
  EXPECT_FALSE(IsEtcdUnavailable(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                              "etcdserver: request is too large")));
  EXPECT_FALSE(IsEtcdUnavailable(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                              "etcdserver: permission denied")));
}

}  // namespace
}  // namespace chorus
