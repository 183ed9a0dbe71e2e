// RankAccounts: the order in which a job's account is chosen (Note [Rank
// accounts]), the range's uids held per job and given back, what the
// ranks' environment gets, the errors that say what to fix, and (as root)
// the job directory's owner, mode and removal.
#include "worker/agent/rank_accounts.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// A launcher that records what it is asked to run and starts nothing.
class RecordingLauncher final : public RankLauncher {
 public:
  absl::StatusOr<std::unique_ptr<RankProcess>> Start(const RankCommand& command) override {
    commands.push_back(command);
    return absl::UnavailableError("not started in this test");
  }
  std::vector<RankCommand> commands;
};

std::optional<PasswdEntry> Accounts(const std::string& name) {
  if (name == "alice") return PasswdEntry{1001, 1001, "/home/alice"};
  if (name == "toor") return PasswdEntry{0, 0, "/root"};
  return std::nullopt;
}

RankAccounts::Options RootAgent(std::optional<UidRange> range = std::nullopt) {
  RankAccounts::Options options;
  options.uid_range = range;
  options.agent_uid = 0;
  options.lookup = Accounts;
  options.launcher = std::make_shared<RecordingLauncher>();
  return options;
}

TEST(ParseUidRangeTest, TakesFirstDashLastAndRefusesTheRestNamingTheFlag) {
  absl::StatusOr<UidRange> range = ParseUidRange("61000-61002");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->first, 61000u);
  EXPECT_EQ(range->last, 61002u);
  for (const char* bad : {"", "61000", "0-10", "10-5", "a-b", "1-2-3", "5-4294967295"}) {
    absl::Status s = ParseUidRange(bad).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--rank_uid_range: expected FIRST-LAST")) << bad;
  }
}

TEST(RankAccountsTest, AMappedAccountComesFirstThenTheRangeThenTheAgentsOwn) {
  RankAccounts accounts(RootAgent(UidRange{61000, 61001}));
  absl::StatusOr<RankAccounts::ForJob> mapped = accounts.Acquire("job-1", "alice");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE(mapped->account.has_value());
  EXPECT_EQ(mapped->account->uid, 1001u);
  EXPECT_EQ(mapped->account->gid, 1001u);
  EXPECT_THAT(mapped->env, UnorderedElementsAre(Pair("HOME", "/home/alice"), Pair("USER", "alice"),
                                                Pair("LOGNAME", "alice")));

  absl::StatusOr<RankAccounts::ForJob> ranged = accounts.Acquire("job-2", "");
  ASSERT_TRUE(ranged.ok()) << ranged.status();
  ASSERT_TRUE(ranged->account.has_value());
  EXPECT_EQ(ranged->account->uid, 61000u);
  EXPECT_EQ(ranged->account->gid, 61000u);

  RankAccounts single(RootAgent());
  single.Acquire("job-3", "").value();
  RankAccounts::Options user_agent = RootAgent();
  user_agent.agent_uid = 1001;
  RankAccounts as_user(user_agent);
  for (RankAccounts* each : {&single, &as_user}) {
    absl::StatusOr<RankAccounts::ForJob> own = each->Acquire("job-4", "");
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_FALSE(own->account.has_value());
    EXPECT_TRUE(own->env.empty());
  }
  // A mapping to the agent's own account changes nothing either.
  absl::StatusOr<RankAccounts::ForJob> own = as_user.Acquire("job-5", "alice");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_FALSE(own->account.has_value());
}

TEST(RankAccountsTest, AJobKeepsItsRangeUidUntilItsLastRankIsGone) {
  RankAccounts accounts(RootAgent(UidRange{61000, 61001}));
  EXPECT_EQ(accounts.Acquire("job-1", "")->account->uid, 61000u);
  EXPECT_EQ(accounts.Acquire("job-1", "")->account->uid, 61000u);  // its second rank
  EXPECT_EQ(accounts.Acquire("job-2", "")->account->uid, 61001u);
  absl::Status full = accounts.Acquire("job-3", "").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(full)) << full;
  EXPECT_EQ(full.message(),
            "every uid of --rank_uid_range=61000-61001 is held by another job on this node; give "
            "a wider range");
  accounts.Release("job-1");
  EXPECT_FALSE(accounts.Acquire("job-3", "").ok()) << "job-1 still has a rank";
  accounts.Release("job-1");
  EXPECT_EQ(accounts.Acquire("job-3", "")->account->uid, 61000u);
}

TEST(RankAccountsTest, AReleasedRangeUidIsClearedOfLeftoverProcessesAsThatUid) {
  RankAccounts::Options options = RootAgent(UidRange{61000, 61000});
  auto launcher = std::make_shared<RecordingLauncher>();
  options.launcher = launcher;
  RankAccounts accounts(options);
  ASSERT_TRUE(accounts.Acquire("job-1", "").ok());
  accounts.Release("job-1");
  ASSERT_EQ(launcher->commands.size(), 1u);
  const RankCommand& cleaner = launcher->commands[0];
  ASSERT_TRUE(cleaner.account.has_value());
  EXPECT_EQ(cleaner.account->uid, 61000u);
  EXPECT_THAT(cleaner.argv[2], HasSubstr("kill -KILL -1"));
}

TEST(RankAccountsTest, AccountsThatCannotBeTakenAreRefusedSayingWhatToFix) {
  RankAccounts accounts(RootAgent());
  absl::Status unknown = accounts.Acquire("job-1", "mallory").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(unknown)) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("Unix account \"mallory\" (unix= in the coordinator's "
                                           "token file), which this node does not have"));
  absl::Status root = accounts.Acquire("job-1", "toor").status();
  EXPECT_THAT(root.message(), HasSubstr("which is root (uid 0); ranks never run as root"));
  RankAccounts::Options user_agent = RootAgent();
  user_agent.agent_uid = 1002;
  absl::Status not_root = RankAccounts(user_agent).Acquire("job-1", "alice").status();
  EXPECT_THAT(not_root.message(), HasSubstr("this agent runs as uid 1002, not root"));
}

TEST(RankAccountsTest, TheAgentSaysHowRanksRunAndWarnsWhenAsRoot) {
  EXPECT_TRUE(RankAccounts(RootAgent()).Describe().second);
  EXPECT_THAT(RankAccounts(RootAgent()).Describe().first,
              HasSubstr("ranks run as root, like this agent, unless"));
  EXPECT_FALSE(RankAccounts(RootAgent(UidRange{61000, 61009})).Describe().second);
  RankAccounts::Options user_agent = RootAgent();
  user_agent.agent_uid = 1001;
  EXPECT_THAT(RankAccounts(user_agent).Describe().first, HasSubstr("single-user mode"));
}

TEST(RankAccountsTest, TheJobDirectoryIsTheAccountsAloneAndGoesWithTheJob) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another uid";
  RankAccounts::Options options = RootAgent(UidRange{61000, 61000});
  // Under /tmp: the uid must reach it (TEST_TMPDIR may lie under a 0700 home).
  char root[] = "/tmp/rank_accounts_test.XXXXXX";
  ASSERT_NE(mkdtemp(root), nullptr);
  ASSERT_EQ(chmod(root, 0711), 0);
  options.temp_root = root;
  options.launcher = nullptr;  // the real one: it empties the directory as the uid
  RankAccounts accounts(options);
  absl::StatusOr<RankAccounts::ForJob> job = accounts.Acquire("job-7", "");
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string dir = options.temp_root + "/chorus-job-7-61000";
  EXPECT_THAT(job->env, UnorderedElementsAre(Pair("TMPDIR", dir), Pair("HOME", dir),
                                             Pair("USER", ""), Pair("LOGNAME", "")));
  struct stat made {};
  ASSERT_EQ(stat(dir.c_str(), &made), 0);
  EXPECT_EQ(made.st_uid, 61000u);
  EXPECT_EQ(made.st_gid, 61000u);
  EXPECT_EQ(made.st_mode & 07777, 0700u);
  // What the job leaves there (root makes it here; the uid owns it) goes too.
  std::ofstream(dir + "/left.txt") << "x";
  ASSERT_EQ(chown((dir + "/left.txt").c_str(), 61000, 61000), 0);
  accounts.Release("job-7");
  EXPECT_NE(stat(dir.c_str(), &made), 0) << dir << " outlived its job";
  EXPECT_EQ(rmdir(root), 0);
}

}  // namespace
}  // namespace chorus
