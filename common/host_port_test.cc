#include "common/host_port.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

TEST(ParseHostPortTest, AcceptsV4V6AndNames) {
  absl::StatusOr<HostPort> v4 = ParseHostPort("127.0.0.1:29650");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 29650);
  absl::StatusOr<HostPort> v6 = ParseHostPort("[::1]:80");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 80);
  absl::StatusOr<HostPort> name = ParseHostPort("localhost:0");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->host, "localhost");
  EXPECT_EQ(name->port, 0);
  absl::StatusOr<HostPort> top = ParseHostPort("node-7.example.com:65535");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->host, "node-7.example.com");
  EXPECT_EQ(top->port, 65535);
}

TEST(ParseHostPortTest, PortsOutsideTheRangeOrNotNumbersAreRejectedNamingTheInput) {
  for (const char* bad : {"127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:http",
                          "127.0.0.1:", "127.0.0.1:+80", "127.0.0.1:8 0"}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(std::string("\"") + bad + "\"")) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("[0, 65535]")) << bad;
  }
}

TEST(ParseHostPortTest, MalformedHostsAreRejectedWithTheReason) {
  struct Case {
    const char* address;
    const char* why;
  };
  for (const Case& c :
       {Case{"29650", "no :PORT"}, Case{":29650", "no host"}, Case{"[]:29650", "no host"},
        Case{"[::1:29650", "unbalanced brackets"}, Case{"::1]:29650", "unbalanced brackets"},
        Case{"::1:29650", "needs brackets"}, Case{"unix:/tmp/chorus.sock", "the port must be"},
        Case{"dns:///node7:29650", "path or URI"}}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(c.address);
    ASSERT_FALSE(parsed.ok()) << c.address;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.address;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.why)) << c.address;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.address)) << c.address;
  }
}

TEST(FormatHostPortTest, BracketsIpv6HostsOnlyAndRoundTrips) {
  EXPECT_EQ(FormatHostPort("127.0.0.1", 29650), "127.0.0.1:29650");
  EXPECT_EQ(FormatHostPort("node7", 0), "node7:0");
  EXPECT_EQ(FormatHostPort("::1", 80), "[::1]:80");
  absl::StatusOr<HostPort> back = ParseHostPort(FormatHostPort("fe80::2", 1234));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host, "fe80::2");
  EXPECT_EQ(back->port, 1234);
}

TEST(ParseHostPortListTest, OneAddressOrACommaSeparatedList) {
  absl::StatusOr<std::vector<HostPort>> one = ParseHostPortList("127.0.0.1:29650");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].host, "127.0.0.1");
  absl::StatusOr<std::vector<HostPort>> three = ParseHostPortList("a:1, [::1]:2 ,c.example:3");
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[0].host, "a");
  EXPECT_EQ((*three)[1].host, "::1");
  EXPECT_EQ((*three)[1].port, 2);
  EXPECT_EQ((*three)[2].host, "c.example");
  EXPECT_EQ((*three)[2].port, 3);
}

TEST(ParseHostPortListTest, ErrorsNameTheBadEntry) {
  absl::StatusOr<std::vector<HostPort>> bad_port = ParseHostPortList("a:1,b:http,c:3");
  ASSERT_FALSE(bad_port.ok());
  EXPECT_EQ(bad_port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_port.status().message(), HasSubstr("entry 2 of \"a:1,b:http,c:3\""));
  EXPECT_THAT(bad_port.status().message(), HasSubstr("\"b:http\""));
  absl::StatusOr<std::vector<HostPort>> empty = ParseHostPortList("a:1,,c:3");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("entry 2"));
  EXPECT_THAT(empty.status().message(), HasSubstr("empty"));
  absl::StatusOr<std::vector<HostPort>> twice = ParseHostPortList("a:1,b:2,a:1");
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("entry 3"));
  EXPECT_THAT(twice.status().message(), HasSubstr("twice"));
  EXPECT_FALSE(ParseHostPortList("").ok());
  // A single bad address reads as before: no "entry 1 of".
  absl::StatusOr<std::vector<HostPort>> single = ParseHostPortList("nohost");
  ASSERT_FALSE(single.ok());
  EXPECT_THAT(single.status().message(), ::testing::Not(HasSubstr("entry")));
}

}  // namespace
}  // namespace chorus
