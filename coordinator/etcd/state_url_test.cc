#include "coordinator/etcd/state_url.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(ParseStateUrlTest, EmptyMeansSqlite) {
  absl::StatusOr<StateUrl> url = ParseStateUrl("");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->kind, StateUrl::Kind::kSqlite);
}

TEST(ParseStateUrlTest, EtcdEndpointsAndPrefix) {
  absl::StatusOr<StateUrl> url = ParseStateUrl("etcd://10.0.0.1:2379,etcd-b:2379,[::1]:2379/a/b");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->kind, StateUrl::Kind::kEtcd);
  EXPECT_EQ(url->endpoints, "10.0.0.1:2379,etcd-b:2379,[::1]:2379");
  EXPECT_EQ(url->prefix, "/a/b");
}

TEST(ParseStateUrlTest, MistakesSayWhatIsWrong) {
  struct Case {
    const char* flag;
    const char* says;
  };
  for (const Case& c : {
           Case{"/var/lib/chorus", "not a URL"},
           Case{"zk://h:1/p", "unknown scheme"},
           Case{"etcd://h:2379", "no PREFIX"},
           Case{"etcd://h:2379/", "no PREFIX"},
           Case{"etcd:///chorus", "no etcd endpoint"},
           Case{"etcd://h/chorus", "h"},
           Case{"etcd://h:0/chorus", "port 0"},
           Case{"etcd://h:2379,/chorus", "etcd://"},
           Case{"etcd://h:2379/chorus/", "ends with '/'"},
           Case{"etcd://h:2379/a//b", "empty part"},
       }) {
    absl::StatusOr<StateUrl> url = ParseStateUrl(c.flag);
    ASSERT_FALSE(url.ok()) << c.flag;
    EXPECT_TRUE(absl::IsInvalidArgument(url.status())) << c.flag;
    EXPECT_TRUE(absl::StrContains(url.status().message(), c.says))
        << c.flag << ": " << url.status().message();
    EXPECT_TRUE(absl::StrContains(url.status().message(), "etcd://HOST:PORT")) << c.flag;
  }
}

}  // namespace
}  // namespace chorus
