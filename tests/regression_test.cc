// A journal that went back in time (issue 12, item 9), with real processes.
//
// The trip runs in `travel-booking` processes killed by failpoints, so that
// the SQLite WAL holds the commits (a SIGKILL leaves no checkpoint). Then:
//   - WalPutBackAtAnEarlierCommit: the journal's files are copied after the
//     flight's `submitted`, the trip runs on (hotel, car booked, payment
//     previewed), and the earlier files are put back, as a disk that lied
//     about its fsyncs or a restored copy leaves them. Before the
//     high-water mark, `recover` booked the hotel and the car a second
//     time under the same keys and exited 0.
//   - LostWal: the WAL is deleted; before, `recover` found no saga at all
//     and exited 0.
// In both, `recover` (and `run`) must now be refused with
// kExitJournalRegressed and no provider is called again; `journal
// accept-regression` records the decision, after which the journal drives.

#include <gtest/gtest.h>

#include "cli/cli.h"
#include "tests/cli_process.h"

namespace idem::testing_cli {
namespace {

class RegressionTest : public CliProcessTest {
 protected:
  std::vector<std::string> JournalFiles() { return {db_, db_ + "-wal"}; }
  void CopyJournal(const std::string& suffix) {
    for (const auto& f : JournalFiles()) {
      ASSERT_TRUE(fs::exists(f)) << f;
      fs::copy_file(f, f + suffix, fs::copy_options::overwrite_existing);
    }
  }
  void PutJournalBack(const std::string& suffix) {
    fs::remove(db_ + "-shm");
    for (const auto& f : JournalFiles()) {
      fs::copy_file(f + suffix, f, fs::copy_options::overwrite_existing);
    }
  }
  int Booked(const char* tool) { return LedgerRows("effects", tool); }
  int Called(const char* tool) { return LedgerRows("calls", tool); }
};

TEST_F(RegressionTest, WalPutBackAtAnEarlierCommit) {
  // The flight is submitted; the process dies before calling it.
  ProcResult first = RunSequentialTrip({"IDEM_FAILPOINT=step.after_submitted=kill@1"});
  ASSERT_EQ(first.code, 128 + SIGKILL) << first.Describe();
  CopyJournal(".earlier");
  // The trip runs on to the payment's preview and dies there: the hotel and
  // the car are booked, once each.
  ProcResult on = Run({"recover"}, {"IDEM_FAILPOINT=preview.after_journal=kill"});
  ASSERT_EQ(on.code, 128 + SIGKILL) << on.Describe();
  ASSERT_EQ(Booked("hotels.book"), 1);
  ASSERT_EQ(Booked("cars.rent"), 1);
  const int hotel_calls = Called("hotels.book"), car_calls = Called("cars.rent");

  CopyJournal(".later");
  PutJournalBack(".earlier");
  ProcResult again = Run({"recover"});
  EXPECT_EQ(again.code, cli::kExitJournalRegressed) << again.Describe();
  EXPECT_NE(again.err.find("went back in time"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("accept-regression"), std::string::npos) << again.err;
  EXPECT_EQ(Booked("hotels.book"), 1);
  EXPECT_EQ(Booked("cars.rent"), 1);
  EXPECT_EQ(Called("hotels.book"), hotel_calls);
  EXPECT_EQ(Called("cars.rent"), car_calls);
  // Nothing else drives it either, and a new saga is not started on it.
  ProcResult run = RunSequentialTrip();
  EXPECT_EQ(run.code, cli::kExitJournalRegressed) << run.Describe();
  EXPECT_EQ(Booked("flights.reserve"), 1);
  // Reads still answer, so the operator can see what is left.
  ProcResult list = Run({"list"});
  EXPECT_EQ(list.code, 0) << list.Describe();
  ProcResult check = Run({"journal", "check"});
  EXPECT_EQ(check.code, cli::kExitJournalRegressed) << check.Describe();

  // Putting the lost commits back (the files as they were) clears it, and
  // the trip goes on from where it was: the payment waits for a person.
  PutJournalBack(".later");
  ProcResult restored = Run({"recover"});
  EXPECT_EQ(restored.code, 0) << restored.Describe();
  EXPECT_EQ(Approvals().size(), 1u);
  EXPECT_EQ(Booked("hotels.book"), 1);
  EXPECT_EQ(Booked("cars.rent"), 1);
}

TEST_F(RegressionTest, LostWal) {
  ProcResult first = RunSequentialTrip({"IDEM_FAILPOINT=step.after_submitted=kill@3"});
  ASSERT_EQ(first.code, 128 + SIGKILL) << first.Describe();
  ASSERT_EQ(Booked("cars.rent"), 0);  // killed before the car's call
  fs::remove(db_ + "-wal");
  fs::remove(db_ + "-shm");

  ProcResult again = Run({"recover"});
  EXPECT_EQ(again.code, cli::kExitJournalRegressed) << again.Describe();
  EXPECT_EQ(Booked("flights.reserve"), 1);
  EXPECT_EQ(Booked("hotels.book"), 1);
  EXPECT_EQ(Booked("cars.rent"), 0);

  // Accepting needs a name and a reason, and is recorded.
  ProcResult bare = Run({"journal", "accept-regression", "--as", "ops"});
  EXPECT_EQ(bare.code, cli::kExitUsage) << bare.Describe();
  ProcResult accept =
      Run({"journal", "accept-regression", "--as", "ops", "--reason", "WAL lost with the disk"});
  EXPECT_EQ(accept.code, 0) << accept.Describe();
  const std::string log = Slurp(db_ + ".hwm.log");
  EXPECT_NE(log.find("\"by\":\"ops\""), std::string::npos) << log;
  EXPECT_NE(log.find("WAL lost with the disk"), std::string::npos) << log;
  ProcResult check = Run({"journal", "check"});
  EXPECT_EQ(check.code, 0) << check.Describe();
  // After the decision the journal drives again: a new trip runs.
  ProcResult run = RunSequentialTrip();
  EXPECT_EQ(run.code, cli::kExitAwaitingApproval) << run.Describe();
  ProcResult twice = Run({"journal", "accept-regression", "--as", "ops", "--reason", "again"});
  EXPECT_NE(twice.code, 0) << twice.Describe();
}

TEST_F(RegressionTest, AJournalThatRanOnIsNotFlagged) {
  // A kill and a recovery are not a regression: the mark follows commits.
  ProcResult first = RunSequentialTrip({"IDEM_FAILPOINT=step.after_submitted=kill@2"});
  ASSERT_EQ(first.code, 128 + SIGKILL) << first.Describe();
  ProcResult recover = Run({"recover"});
  EXPECT_EQ(recover.code, 0) << recover.Describe();
  EXPECT_EQ(Approvals().size(), 1u);
  EXPECT_TRUE(fs::exists(db_ + ".hwm"));
  ProcResult check = Run({"journal", "check"});
  EXPECT_EQ(check.code, 0) << check.Describe();
}

}  // namespace
}  // namespace idem::testing_cli
