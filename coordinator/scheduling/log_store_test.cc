#include "coordinator/scheduling/log_store.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/output_limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::EndsWith;

std::vector<std::string> Texts(const v1::GetLogsResponse& r) {
  std::vector<std::string> out;
  for (const v1::LogLine& l : r.lines()) out.push_back(l.text());
  return out;
}

v1::GetLogsRequest Request(const std::string& job, int64_t after = 0) {
  v1::GetLogsRequest r;
  r.set_job_id(job);
  r.set_after_seq(after);
  return r;
}

TEST(LogStoreTest, LinesComeBackInOrderWithSeqAndRankAndFollowFromNextSeq) {
  LogStore logs;
  logs.Append("job-1", 0, 0, "agent-1", 100, {"a0", "a1"});
  logs.Append("job-1", 1, 1, "agent-1", 200, {"b0"});
  logs.Append("job-2", 0, 0, "agent-1", 300, {"other job"});
  v1::GetLogsResponse all = logs.Get(Request("job-1"));
  EXPECT_EQ(Texts(all), (std::vector<std::string>{"a0", "a1", "b0"}));
  EXPECT_EQ(all.lines(2).rank(), 1);
  EXPECT_EQ(all.lines(2).seq(), 3);
  EXPECT_EQ(all.lines(2).time_us(), 200);
  EXPECT_EQ(all.next_seq(), 3);

  v1::GetLogsRequest rank0 = Request("job-1");
  rank0.set_rank(0);
  EXPECT_EQ(Texts(logs.Get(rank0)), (std::vector<std::string>{"a0", "a1"}));

  // Following: nothing new, then exactly the new line.
  EXPECT_TRUE(logs.Get(Request("job-1", all.next_seq())).lines().empty());
  logs.Append("job-1", 0, 0, "agent-1", 400, {"a2"});
  v1::GetLogsResponse next = logs.Get(Request("job-1", all.next_seq()));
  EXPECT_EQ(Texts(next), (std::vector<std::string>{"a2"}));
  EXPECT_EQ(next.next_seq(), 4);
  // A rank filter still advances past the other ranks' lines.
  v1::GetLogsRequest rank1 = Request("job-1", 3);
  rank1.set_rank(1);
  EXPECT_TRUE(logs.Get(rank1).lines().empty());
  EXPECT_EQ(logs.Get(rank1).next_seq(), 4);

  EXPECT_TRUE(logs.Get(Request("job-9")).lines().empty());
}

// Note [Bounded job output]: the agent is not trusted to have bounded them.
TEST(LogStoreTest, BatchesAndJobsAreBoundedWhateverTheAgentSends) {
  LogStore logs(/*max_lines_per_job=*/100000, /*max_jobs=*/2, /*max_bytes_per_job=*/1 << 20);
  std::vector<std::string> batch(kMaxLogBatchLines + 744, "line");
  batch.front() = "first";
  logs.Append("job-1", 0, 0, "a", 1, batch);
  v1::GetLogsResponse got = logs.Get(Request("job-1"));
  ASSERT_EQ(got.lines_size(), static_cast<int>(kMaxLogBatchLines) + 1);
  EXPECT_EQ(got.lines(0).text(), "first");
  EXPECT_EQ(got.lines(got.lines_size() - 1).text(),
            absl::StrCat("[744 more lines of this batch dropped: an agent sends at most ",
                         kMaxLogBatchLines, " at once]"));

  // 200 lines of 1 MB each, cut to ~16 KiB: the job keeps at most 1 MB.
  for (int i = 0; i < 200; ++i) {
    logs.Append("job-2", 0, 0, "a", 1, {absl::StrCat(i, std::string(1 << 20, 'z'))});
  }
  got = logs.Get(Request("job-2"));
  size_t bytes = 0;
  for (const v1::LogLine& line : got.lines()) bytes += line.text().size();
  EXPECT_LE(bytes, size_t{1} << 20);
  EXPECT_GT(got.dropped(), 0);
  EXPECT_TRUE(absl::StartsWith(got.lines(got.lines_size() - 1).text(), "199zzz"));
}

// A soak run of jobs printing 2 MB each held 340 MB of short lines: lines
// are counted by what they cost, and all jobs together are bounded.
TEST(LogStoreTest, AllJobsTogetherStayWithinTheTotalTheOldestGoingFirst) {
  constexpr size_t kTotal = 1 << 20;
  LogStore logs(/*max_lines_per_job=*/100000, /*max_jobs=*/64, /*max_bytes_per_job=*/8 << 20,
                kTotal);
  const std::vector<std::string> batch(200, std::string(76, 'b'));  // 200 base64 lines
  for (int job = 1; job <= 20; ++job) {
    for (int i = 0; i < 10; ++i) logs.Append(absl::StrCat("job-", 100 + job), 0, 0, "a", 1, batch);
  }
  size_t cost = 0;
  int jobs_kept = 0;
  for (int job = 1; job <= 20; ++job) {
    const v1::GetLogsResponse got = logs.Get(Request(absl::StrCat("job-", 100 + job)));
    if (got.lines_size() > 0) ++jobs_kept;
    for (const v1::LogLine& line : got.lines()) {
      cost += line.text().size() + LogStore::kLineOverheadBytes;
    }
  }
  EXPECT_LE(cost, kTotal);
  EXPECT_GE(cost, kTotal / 2);
  EXPECT_EQ(logs.Get(Request("job-101")).lines_size(), 0) << "the oldest job went first";
  EXPECT_EQ(logs.Get(Request("job-120")).lines_size(), 2000) << "the newest is whole";
  EXPECT_GT(jobs_kept, 1);
  EXPECT_LT(jobs_kept, 20);
  // One job alone beyond the total keeps its newest lines.
  LogStore small(100000, 64, 8 << 20, /*max_total_bytes=*/10 * (76 + LogStore::kLineOverheadBytes));
  small.Append("job-1", 0, 0, "a", 1, batch);
  const v1::GetLogsResponse got = small.Get(Request("job-1"));
  EXPECT_EQ(got.lines_size(), 10);
  EXPECT_EQ(got.dropped(), 190);
}

TEST(LogStoreTest, PagesTailsAndBoundsMemory) {
  LogStore logs(/*max_lines_per_job=*/5, /*max_jobs=*/2);
  logs.Append("job-1", 0, 0, "a", 1, {"1", "2", "3", "4", "5", "6", "7"});
  v1::GetLogsResponse kept = logs.Get(Request("job-1"));
  EXPECT_EQ(Texts(kept), (std::vector<std::string>{"3", "4", "5", "6", "7"}));
  EXPECT_EQ(kept.dropped(), 2);

  v1::GetLogsRequest page = Request("job-1");
  page.set_max_lines(2);
  v1::GetLogsResponse first = logs.Get(page);
  EXPECT_EQ(Texts(first), (std::vector<std::string>{"3", "4"}));
  page.set_after_seq(first.next_seq());
  EXPECT_EQ(Texts(logs.Get(page)), (std::vector<std::string>{"5", "6"}));

  v1::GetLogsRequest tail = Request("job-1");
  tail.set_max_lines(2);
  tail.set_tail(true);
  v1::GetLogsResponse last = logs.Get(tail);
  EXPECT_EQ(Texts(last), (std::vector<std::string>{"6", "7"}));
  EXPECT_EQ(last.next_seq(), 7);

  logs.Append("job-1", 0, 0, "a", 1, {std::string(5 << 20, 'x')});
  v1::GetLogsResponse cut = logs.Get(Request("job-1", 7));
  ASSERT_EQ(cut.lines_size(), 1);
  EXPECT_LE(cut.lines(0).text().size(), kMaxBoundedLineBytes + 64);
  EXPECT_THAT(cut.lines(0).text(), EndsWith(" bytes of this line dropped]"));

  logs.Append("job-2", 0, 0, "a", 1, {"two"});
  logs.Append("job-3", 0, 0, "a", 1, {"three"});
  EXPECT_TRUE(logs.Get(Request("job-1")).lines().empty()) << "the oldest job's logs go first";
  EXPECT_EQ(Texts(logs.Get(Request("job-3"))), (std::vector<std::string>{"three"}));
}

}  // namespace
}  // namespace chorus
