// `keys retire` and the commits that still need the key (issue 12, item 8),
// with real `travel-booking` processes on a real SQLite journal.
//
// Before: retiring the key that signed a waiting approval's token succeeded,
// and approve, reject and resolve all refused the token from then on: the
// trip waited out its approval TTL. Now the retirement is refused with the
// list of the waiting steps (kExitKeyInUse), unless --re-preview: the step
// is previewed again with the active key (the old approval journaled as
// superseded), the new token commits once, the old one is refused.

#include <gtest/gtest.h>

#include "cli/cli.h"
#include "tests/cli_process.h"

namespace idem::testing_cli {
namespace {

class KeysRetireTest : public CliProcessTest {
 protected:
  // The trip up to its payment's approval; returns the waiting token.
  std::string TripWaiting(std::string* saga_id) {
    ProcResult run = RunTrip();
    EXPECT_EQ(run.code, cli::kExitAwaitingApproval) << run.Describe();
    Json pending = Approvals();
    if (pending.size() != 1) {
      ADD_FAILURE() << pending.dump();
      return "";
    }
    *saga_id = pending[0].value("saga_id", "");
    return pending[0].value("token", "");
  }
};

TEST_F(KeysRetireTest, RefusedWhileAnApprovalNeedsTheKey) {
  std::string saga;
  const std::string token = TripWaiting(&saga);
  ASSERT_FALSE(token.empty());
  ASSERT_EQ(Run({"keys", "rotate"}).code, 0);

  ProcResult retire = Run({"keys", "retire", "k1"});
  EXPECT_EQ(retire.code, cli::kExitKeyInUse) << retire.Describe();
  EXPECT_NE(retire.err.find("saga " + saga + " step charge_payment"), std::string::npos)
      << retire.err;
  EXPECT_NE(retire.err.find("--re-preview"), std::string::npos) << retire.err;
  // Nothing changed: k1 is not retired and the token still commits.
  ProcResult list = Run({"keys", "list"});
  EXPECT_EQ(list.out.find("retired"), std::string::npos) << list.Describe();
  ProcResult approve = Run({"approve", token, "--as", "alice"});
  EXPECT_EQ(approve.code, 0) << approve.Describe();
  EXPECT_EQ(LedgerRows("effects", "payments.charge"), 1);
  // With nothing waiting on it, the key retires.
  ProcResult again = Run({"keys", "retire", "k1"});
  EXPECT_EQ(again.code, 0) << again.Describe();
  EXPECT_NE(again.out.find("retired k1"), std::string::npos) << again.Describe();
}

TEST_F(KeysRetireTest, RePreviewAsksAgainWithTheActiveKey) {
  std::string saga;
  const std::string old_token = TripWaiting(&saga);
  ASSERT_FALSE(old_token.empty());
  ASSERT_EQ(Run({"keys", "rotate"}).code, 0);
  ProcResult nameless = Run({"keys", "retire", "k1", "--re-preview"});
  EXPECT_EQ(nameless.code, cli::kExitUsage) << nameless.Describe();

  ProcResult retire = Run({"keys", "retire", "k1", "--re-preview", "--as", "ops"});
  ASSERT_EQ(retire.code, 0) << retire.Describe();
  EXPECT_NE(retire.out.find("previewed again: saga " + saga + " step charge_payment"),
            std::string::npos)
      << retire.out;
  EXPECT_NE(retire.out.find("retired k1"), std::string::npos) << retire.out;

  Json pending = Approvals();
  ASSERT_EQ(pending.size(), 1u) << pending.dump();
  const std::string new_token = pending[0].value("token", "");
  EXPECT_NE(new_token, old_token);
  ProcResult status = Run({"status", saga, "--json"});
  Json rec = Json::parse(status.out, nullptr, false);
  int superseded = 0, previews = 0;
  for (const auto& e : rec["journal"]) {
    if (e["event"] == "approval_superseded") {
      ++superseded;
      EXPECT_EQ(e["data"].value("by", ""), "ops");
      EXPECT_EQ(e["data"].value("token_key", ""), "k1");
    }
    previews += e["event"] == "previewed";
  }
  EXPECT_EQ(superseded, 1) << status.out;
  EXPECT_EQ(previews, 2) << status.out;

  // The old token is refused (its key is retired), the new one commits once.
  ProcResult old_approve = Run({"approve", old_token, "--as", "alice"});
  EXPECT_EQ(old_approve.code, cli::kExitUsage) << old_approve.Describe();
  EXPECT_NE(old_approve.err.find("invalid commit token"), std::string::npos) << old_approve.err;
  EXPECT_EQ(LedgerRows("effects", "payments.charge"), 0);
  ProcResult approve = Run({"approve", new_token, "--as", "alice"});
  EXPECT_EQ(approve.code, 0) << approve.Describe();
  ProcResult replay = Run({"approve", new_token, "--as", "alice"});
  EXPECT_EQ(replay.code, 0) << replay.Describe();
  EXPECT_EQ(LedgerRows("effects", "payments.charge"), 1);
}

TEST_F(KeysRetireTest, TheActiveKeyIsNotRetired) {
  ProcResult retire = Run({"keys", "retire", "k1"});
  EXPECT_EQ(retire.code, cli::kExitUsage) << retire.Describe();
  EXPECT_NE(retire.err.find("active key"), std::string::npos) << retire.err;
  ProcResult unknown = Run({"keys", "retire", "k9"});
  EXPECT_EQ(unknown.code, cli::kExitNotFound) << unknown.Describe();
}

}  // namespace
}  // namespace idem::testing_cli
