#include "common/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "glog/logging.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// Note [Rank log tag]: the coordinator recognises chorus-rank's log lines
// by their start, so the tag must come first and glog's prefix after it.
TEST(LoggingTest, RankLogLinesBeginWithTheTagThenGlogsPrefix) {
  InitRankLogging("logging_test", 0);
  char path[] = "/tmp/chorus-logging-test-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const int saved = dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  std::fflush(stderr);
  ASSERT_GE(dup2(fd, STDERR_FILENO), 0);
  LOG(INFO) << "hello from the supervisor";
  LOG(WARNING) << "second";
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  std::istringstream lines(text.str());
  std::string first, second;
  ASSERT_TRUE(std::getline(lines, first)) << text.str();
  ASSERT_TRUE(std::getline(lines, second)) << text.str();
  const std::regex glog_line(
      R"(\[chorus-rank\] [IW]\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ logging_test\.cc:\d+\] (.*))");
  std::smatch match;
  ASSERT_TRUE(std::regex_match(first, match, glog_line)) << first;
  EXPECT_EQ(match[1], "hello from the supervisor");
  EXPECT_EQ(first.rfind(kRankLogTag, 0), 0u);
  ASSERT_TRUE(std::regex_match(second, match, glog_line)) << second;
  EXPECT_EQ(second[14], 'W');
  EXPECT_EQ(match[1], "second");
}

}  // namespace
}  // namespace chorus
