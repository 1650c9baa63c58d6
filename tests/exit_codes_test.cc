// The CLI's exit codes for the answers that used to exit 1 ("internal or
// store error"), with real `travel-booking` processes (issue 12, exit codes
// and messages): an expired commit token (9), a commit already decided
// otherwise (10), "busy; try again" from the store (8), an approval after
// which the saga waits for its next one (7), and `[]` as the auth file
// (reported as an empty caller list, exit 2).

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "cli/cli.h"
#include "tests/cli_process.h"

namespace idem::testing_cli {
namespace {

// A payment step of the travel providers, approved by a person within `ttl`.
std::string PaymentStep(const std::string& id, const std::string& ttl) {
  return R"({"id": ")" + id + R"(", "tool": "payments.charge",
     "args": {"traveller": "Ana", "amount_cents": 100, "currency": "EUR", "description": ")" +
         id + R"("},
     "two_phase": true, "approval": "human", "approval_ttl": ")" +
         ttl + R"(",
     "on_expiry": "rollback",
     "compensate": {"tool": "payments.refund",
                    "args": {"charge_id": "${steps.)" +
         id + R"(.result.charge_id}",
                             "amount_cents": "${steps.)" +
         id + R"(.result.amount_cents}"}}})";
}

class ExitCodesTest : public CliProcessTest {
 protected:
  // Writes a spec of payment steps and runs it to its first approval.
  std::string RunPayments(const std::vector<std::string>& steps) {
    std::string body;
    for (const auto& s : steps) body += (body.empty() ? "" : ",") + s;
    const std::string spec = (dir_ / "pay.json").string();
    std::ofstream(spec) << R"({"name": "pay", "version": 1, "steps": [)" << body << "]}";
    ProcResult run = Run({"run", spec});
    EXPECT_EQ(run.code, cli::kExitAwaitingApproval) << run.Describe();
    Json pending = Approvals();
    if (pending.empty()) return "";
    return pending.back().value("token", "");
  }
};

TEST_F(ExitCodesTest, ExpiredToken) {
  const std::string token = RunPayments({PaymentStep("deposit", "1s")});
  ASSERT_FALSE(token.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  ProcResult approve = Run({"approve", token, "--as", "alice"});
  EXPECT_EQ(approve.code, cli::kExitTokenExpired) << approve.Describe();
  EXPECT_NE(approve.err.find("commit token expired"), std::string::npos) << approve.err;
}

TEST_F(ExitCodesTest, AlreadyDecidedOtherwise) {
  const std::string token = RunPayments({PaymentStep("deposit", "15m")});
  ASSERT_FALSE(token.empty());
  ProcResult reject = Run({"reject", token, "--as", "bob", "--reason", "too much"});
  EXPECT_EQ(reject.code, cli::kExitRolledBack) << reject.Describe();
  ProcResult approve = Run({"approve", token, "--as", "alice"});
  EXPECT_EQ(approve.code, cli::kExitAlreadyDecided) << approve.Describe();
  EXPECT_NE(approve.err.find("already rejected by bob"), std::string::npos) << approve.err;
  // The same decision again is a replay, not an error.
  ProcResult replay = Run({"reject", token, "--as", "bob", "--reason", "too much"});
  EXPECT_EQ(replay.code, cli::kExitRolledBack) << replay.Describe();
}

TEST_F(ExitCodesTest, ApprovalThatLeavesTheNextWaiting) {
  const std::string token =
      RunPayments({PaymentStep("deposit", "15m"), PaymentStep("balance", "15m")});
  ASSERT_FALSE(token.empty());
  ProcResult first = Run({"approve", token, "--as", "alice"});
  EXPECT_EQ(first.code, cli::kExitAwaitingApproval) << first.Describe();
  Json pending = Approvals();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].value("step", ""), "balance");
  ProcResult second = Run({"approve", pending[0].value("token", ""), "--as", "alice"});
  EXPECT_EQ(second.code, cli::kExitOk) << second.Describe();
}

TEST_F(ExitCodesTest, BusyStoreIsBusy) {
  const std::string token = RunPayments({PaymentStep("deposit", "15m")});
  ASSERT_FALSE(token.empty());
  // Another connection holds the journal's write lock past the busy timeout.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  ProcResult approve = Run({"approve", token, "--as", "alice"});
  sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  EXPECT_EQ(approve.code, cli::kExitBusy) << approve.Describe();
  // Nothing was decided: the approval goes through once the lock is gone.
  ProcResult again = Run({"approve", token, "--as", "alice"});
  EXPECT_EQ(again.code, cli::kExitOk) << again.Describe();
  EXPECT_EQ(LedgerRows("effects", "payments.charge"), 1);
}

TEST_F(ExitCodesTest, EmptyAuthFileIsAnEmptyCallerList) {
  const std::string auth = (dir_ / "auth.json").string();
  std::ofstream(auth) << "[]";
  fs::permissions(auth, fs::perms::owner_read | fs::perms::owner_write);
  ProcResult serve = Run({"serve", "--listen", "127.0.0.1:0", "--auth", auth});
  EXPECT_EQ(serve.code, cli::kExitUsage) << serve.Describe();
  EXPECT_NE(serve.err.find("empty caller list"), std::string::npos) << serve.err;
  EXPECT_EQ(serve.err.find("no --auth file"), std::string::npos) << serve.err;
}

}  // namespace
}  // namespace idem::testing_cli
