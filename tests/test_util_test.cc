// The shared test helpers (tests/test_util.h) do what their contracts say:
// the directory goes with its tree, the assertions pass and fail on the
// status, the matchers match code, message and value.

#include "tests/test_util.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "common/status.h"

namespace idem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(TempDirTest, IsCreatedFreshAndRemovedWithItsTree) {
  std::string path;
  {
    test::TempDir a("idem_util");
    test::TempDir b("idem_util");
    path = a.path();
    EXPECT_NE(a.path(), b.path());
    EXPECT_TRUE(fs::is_directory(path));
    EXPECT_EQ(fs::path(path).filename().string().rfind("idem_util_", 0), 0u) << path;
    EXPECT_EQ(a.File("x.db"), path + "/x.db");
    fs::create_directories(a.File("sub/dir"));
    std::ofstream(a.File("sub/dir/f")) << "text";
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(TempDirTest, KeepLeavesTheTree) {
  std::string path;
  {
    test::TempDir dir("idem_util_keep");
    path = dir.path();
    dir.Keep();
  }
  EXPECT_TRUE(fs::is_directory(path));
  fs::remove_all(path);
}

TEST(ReadFileTest, ReadsTheWholeFileOrNothing) {
  test::TempDir dir;
  std::ofstream(dir.File("f"), std::ios::binary) << std::string("a\0b\nc", 5);
  EXPECT_EQ(test::ReadFile(dir.File("f")), std::string("a\0b\nc", 5));
  EXPECT_EQ(test::ReadFile(dir.File("missing")), "");
}

TEST(UnusedPortTest, IsALoopbackPort) {
  int port = test::UnusedPort();
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

TEST(AssertOkTest, PassesOnOkAndFailsWithTheExpressionAndStatus) {
  ASSERT_OK(Status::Ok());
  EXPECT_OK(Result<int>(3));
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(Status::NotFound("saga x")),
                          "Status::NotFound(\"saga x\") -> not_found: saga x");
  EXPECT_FATAL_FAILURE(ASSERT_OK(Result<int>(Status::Conflict("key k"))), "conflict: key k");
}

TEST(AssertOkTest, AssignsTheValue) {
  ASSERT_OK_AND_ASSIGN(auto p, Result<std::unique_ptr<int>>(std::make_unique<int>(7)));
  EXPECT_EQ(*p, 7);
  int n = 0;
  ASSERT_OK_AND_ASSIGN(n, Result<int>(9));
  EXPECT_EQ(n, 9);
}

void AssignFromAnError() {
  ASSERT_OK_AND_ASSIGN(int n, Result<int>(Status::Unavailable("busy")));
  (void)n;
  ADD_FAILURE() << "not reached";
}

TEST(AssertOkTest, AssignFailsAndReturnsOnAnError) {
  EXPECT_FATAL_FAILURE(AssignFromAnError(), "unavailable: busy");
}

TEST(MatchersTest, IsOk) {
  EXPECT_THAT(Status::Ok(), test::IsOk());
  EXPECT_THAT(Result<int>(1), test::IsOk());
  EXPECT_THAT(Status::Internal("x"), Not(test::IsOk()));
  EXPECT_THAT(Result<int>(Status::Internal("x")), Not(test::IsOk()));
}

TEST(MatchersTest, StatusIsChecksTheCodeAndPartOfTheMessage) {
  Status s = Status::FailedPrecondition("saga sg_1 is leased by worker-2");
  EXPECT_THAT(s, test::StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(s, test::StatusIs(Code::kFailedPrecondition, "leased by"));
  EXPECT_THAT(s, Not(test::StatusIs(Code::kFailedPrecondition, "not there")));
  EXPECT_THAT(s, Not(test::StatusIs(Code::kConflict)));
  EXPECT_THAT(Result<int>(Status::NotFound("saga x")), test::StatusIs(Code::kNotFound, "saga x"));
  EXPECT_THAT(Status::Ok(), test::StatusIs(Code::kOk));
}

TEST(MatchersTest, IsOkAndHoldsMatchesTheValue) {
  EXPECT_THAT(Result<std::string>("ok then"), test::IsOkAndHolds(HasSubstr("then")));
  EXPECT_THAT(Result<int>(4), test::IsOkAndHolds(4));
  EXPECT_THAT(Result<int>(4), Not(test::IsOkAndHolds(5)));
  EXPECT_THAT(Result<int>(Status::Aborted("lost lease")), Not(test::IsOkAndHolds(4)));
}

TEST(SqliteTestStoreTest, OpensAndReopensOneFile) {
  test::SqliteTestStore fixture;
  EXPECT_EQ(fixture.path(), fixture.dir().File("journal.db"));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::Store> store, fixture.Open());
    EXPECT_GT(store->SchemaVersion(), 0);
  }
  EXPECT_TRUE(fs::exists(fixture.path()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::Store> again, fixture.Open());
  EXPECT_THAT(again->LoadSaga("sg_none"), test::StatusIs(Code::kNotFound));
}

TEST(PgUrlTest, SplitsAndRebuildsAUrl) {
  test::PgUrlParts p = test::SplitPgUrl("postgresql://idem@127.0.0.1:54321/postgres");
  EXPECT_EQ(p.prefix, "postgresql://idem@");
  EXPECT_EQ(p.host, "127.0.0.1");
  EXPECT_EQ(p.port, 54321);
  EXPECT_EQ(p.database, "postgres");
  p.database = "t_1";
  EXPECT_EQ(p.Url(), "postgresql://idem@127.0.0.1:54321/t_1");
  EXPECT_NE(test::RandomName("t_"), test::RandomName("t_"));
  EXPECT_EQ(test::RandomName("t_").size(), 2u + 16u);
}

}  // namespace
}  // namespace idem
