// The Store conformance suite on SqliteStore, plus the SQLite-specific tests
// (WAL, PRAGMAs, migrations, append-only triggers, locking, SIGKILL).
//
// The SQLite-specific tests inspect the file through a second connection
// made with the sqlite3 C API, so they see what is on disk, not what the
// store believes.

#include "tests/store_conformance.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "storage/sqlite_store.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include <sys/wait.h>
#include <unistd.h>

namespace idem::storage {
namespace {

using conformance::MakeEffect;
using conformance::MakeEntry;
using conformance::MakeSaga;

using test::TempDir;

/// The conformance suite's factory: a real SQLite file in a fresh temp
/// directory per test. (A class of its own: ctest names the typed tests
/// after it.)
class SqliteFactory : public test::SqliteTestStore {};

}  // namespace

namespace conformance {
using Backends = ::testing::Types<SqliteFactory>;
INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, StoreConformanceTest, Backends);
}  // namespace conformance

namespace {

/// A second, raw connection to the same file.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    int rc = sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr);
    if (rc != SQLITE_OK) ADD_FAILURE() << "sqlite3_open_v2(" << path << "): " << rc;
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;
  RawDb(RawDb&&) = delete;
  RawDb& operator=(RawDb&&) = delete;

  /// Runs `sql`; returns "" on success, else SQLite's error message.
  std::string Exec(const std::string& sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    std::string msg = rc == SQLITE_OK ? "" : (err != nullptr ? err : "error");
    sqlite3_free(err);
    return msg;
  }

  /// The first column of the first row of `sql`, as text ("" if no row).
  std::string Text(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    std::string out;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "prepare " << sql << ": " << sqlite3_errmsg(db_);
      return out;
    }
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

// Takes a database back to before version 9 (retention): the triggers of
// version 1, no pruned_at_ms. Run first, so that the later undos meet no
// trigger that names the column.
void UndoVersion9(RawDb* raw) {
  for (const char* sql : {"DROP INDEX sagas_prunable", "DROP TRIGGER journal_no_update",
                          "CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal"
                          " BEGIN SELECT RAISE(ABORT, 'journal is append-only'); END",
                          "DROP TRIGGER effects_no_update",
                          "CREATE TRIGGER effects_no_update BEFORE UPDATE ON effects"
                          " BEGIN SELECT RAISE(ABORT, 'effects are append-only'); END",
                          "ALTER TABLE sagas DROP COLUMN pruned_at_ms"}) {
    ASSERT_EQ("", raw->Exec(sql)) << sql;
  }
}

// Back to what version 10 left: no step checks, no drift findings, no
// effects_by_time (migration 11).
void UndoVersion11(RawDb* raw) {
  for (const char* sql :
       {"DROP TABLE step_checks", "DROP TABLE drift_findings", "DROP INDEX effects_by_time"}) {
    ASSERT_EQ("", raw->Exec(sql)) << sql;
  }
}

// Takes a database back from version 15 (the kept state counts) to 14.
void UndoVersion15(RawDb* raw) {
  for (const char* sql :
       {"DROP TRIGGER saga_state_counts_insert", "DROP TRIGGER saga_state_counts_update",
        "DROP TRIGGER saga_state_counts_delete", "DROP TABLE saga_state_counts",
        "DELETE FROM schema_migrations WHERE version = 15"}) {
    ASSERT_EQ("", raw->Exec(sql)) << sql;
  }
}

// Takes a database back from version 14 (the listing indexes) to 13.
void UndoVersion14(RawDb* raw) {
  for (const char* sql : {"DROP INDEX sagas_by_created", "DROP INDEX sagas_by_owner",
                          "DROP INDEX sagas_by_state_lease",
                          "CREATE INDEX sagas_by_state_lease ON sagas (state, lease_expires_ms)"}) {
    ASSERT_EQ("", raw->Exec(sql)) << sql;
  }
}

std::unique_ptr<SqliteStore> MustOpen(const SqliteOptions& options) {
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(options);
  EXPECT_OK(store);
  return store.ok() ? std::move(store).value() : nullptr;
}

std::unique_ptr<SqliteStore> MustOpen(const std::string& path) {
  SqliteOptions options;
  options.path = path;
  return MustOpen(options);
}

TEST(SqliteStoreTest, FreshDatabaseIsWalWithSynchronousFull) {
  TempDir dir;
  const std::string path = dir.File("wal.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  Result<SqliteSettings> settings = store->EffectiveSettings();
  STORE_ASSERT_OK(settings);
  EXPECT_EQ("wal", settings->journal_mode);
  EXPECT_EQ("FULL", settings->synchronous);
  EXPECT_TRUE(settings->foreign_keys);
  EXPECT_EQ(5000, settings->busy_timeout_ms);

  // WAL is a property of the file: a second connection sees it.
  RawDb raw(path);
  EXPECT_EQ("wal", raw.Text("PRAGMA journal_mode"));
}

TEST(SqliteStoreTest, SynchronousOptionIsApplied) {
  TempDir dir;
  SqliteOptions options;
  options.path = dir.File("sync.db");
  options.synchronous = "extra";
  options.busy_timeout_ms = 250;
  std::unique_ptr<SqliteStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  Result<SqliteSettings> settings = store->EffectiveSettings();
  STORE_ASSERT_OK(settings);
  EXPECT_EQ("EXTRA", settings->synchronous);
  EXPECT_EQ(250, settings->busy_timeout_ms);
  EXPECT_EQ("wal", settings->journal_mode);
}

TEST(SqliteStoreTest, RejectsBadOptions) {
  TempDir dir;
  SqliteOptions memory;
  memory.path = ":memory:";
  EXPECT_EQ(Code::kInvalidArgument, SqliteStore::Open(memory).status().code());

  SqliteOptions empty;
  EXPECT_EQ(Code::kInvalidArgument, SqliteStore::Open(empty).status().code());

  SqliteOptions sync;
  sync.path = dir.File("x.db");
  sync.synchronous = "FULL; DROP TABLE sagas";
  Result<std::unique_ptr<SqliteStore>> bad_sync = SqliteStore::Open(sync);
  EXPECT_EQ(Code::kInvalidArgument, bad_sync.status().code());
  EXPECT_NE(std::string::npos, bad_sync.status().message().find("synchronous"));

  SqliteOptions timeout;
  timeout.path = dir.File("x.db");
  timeout.busy_timeout_ms = -1;
  EXPECT_EQ(Code::kInvalidArgument, SqliteStore::Open(timeout).status().code());
  EXPECT_FALSE(std::filesystem::exists(dir.File("x.db")));
}

TEST(SqliteStoreTest, NotADatabaseIsAnErrorNotACrash) {
  TempDir dir;
  const std::string path = dir.File("garbage.db");
  {
    std::ofstream out(path);
    out << std::string(4096, 'x');
  }
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(SqliteOptions{path});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(Code::kInternal, store.status().code());
  EXPECT_NE(std::string::npos, store.status().message().find("garbage.db"))
      << store.status().message();
}

TEST(SqliteStoreTest, MigrationsAreAppliedOnceAndRecorded) {
  TempDir dir;
  const std::string path = dir.File("m.db");
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<SqliteStore> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(SqliteStore::LatestSchemaVersion(), store->SchemaVersion());
  }
  RawDb raw(path);
  const std::string latest = std::to_string(SqliteStore::LatestSchemaVersion());
  const std::string known = std::to_string(SqliteStore::KnownSchemaVersions());
  EXPECT_EQ(known, raw.Text("SELECT COUNT(*) FROM schema_migrations"));
  EXPECT_EQ(latest, raw.Text("SELECT MAX(version) FROM schema_migrations"));
  EXPECT_EQ(known, raw.Text("SELECT COUNT(*) FROM schema_migrations WHERE applied_at > 0"));
  for (const char* table : {"intents", "sagas", "steps", "journal", "effects", "consumed_tokens"}) {
    EXPECT_EQ(table, raw.Text(std::string("SELECT name FROM sqlite_master WHERE type = 'table'"
                                          " AND name = '") +
                              table + "'"));
  }
  for (const char* index : {"journal_by_saga", "effects_by_saga", "sagas_by_state_lease"}) {
    EXPECT_EQ(index, raw.Text(std::string("SELECT name FROM sqlite_master WHERE type = 'index'"
                                          " AND name = '") +
                              index + "'"));
  }
  // Version 4: no index that another covers, no AUTOINCREMENT bookkeeping.
  EXPECT_EQ("", raw.Text("SELECT name FROM sqlite_master WHERE name = 'sagas_by_state'"));
  EXPECT_EQ("", raw.Text("SELECT name FROM sqlite_sequence WHERE name = 'journal'"));
  for (const char* trigger : {"journal_no_update", "journal_no_delete"}) {
    EXPECT_EQ(trigger, raw.Text(std::string("SELECT name FROM sqlite_master WHERE type ="
                                            " 'trigger' AND name = '") +
                                trigger + "'"));
  }
}

TEST(SqliteStoreTest, Version3JournalKeepsItsEntriesAndOrderThroughVersion4) {
  TempDir dir;
  const std::string path = dir.File("v3.db");
  {
    std::unique_ptr<SqliteStore> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
  }
  {
    // Back to what version 3 left: the AUTOINCREMENT journal (with entries
    // whose seqs have gaps) and sagas_by_state.
    RawDb raw(path);
    ASSERT_NO_FATAL_FAILURE(UndoVersion15(&raw));
    ASSERT_NO_FATAL_FAILURE(UndoVersion14(&raw));
    ASSERT_NO_FATAL_FAILURE(UndoVersion9(&raw));
    ASSERT_EQ("", raw.Exec("DROP TABLE journal"));
    ASSERT_EQ("", raw.Exec("CREATE TABLE journal (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                           " saga_id TEXT NOT NULL REFERENCES sagas (saga_id),"
                           " step_id TEXT NOT NULL DEFAULT '', event TEXT NOT NULL, data TEXT,"
                           " at_ms INTEGER NOT NULL)"));
    ASSERT_EQ("", raw.Exec("CREATE INDEX journal_by_saga ON journal (saga_id, seq)"));
    ASSERT_EQ("", raw.Exec("INSERT INTO journal (seq, saga_id, event, at_ms) VALUES"
                           " (5, 'old', 'first', 1), (9, 'old', 'second', 2),"
                           " (12, 'old', 'third', 3)"));
    ASSERT_EQ("", raw.Exec("CREATE INDEX sagas_by_state ON sagas (state)"));
    // Versions 7, 10 and 11 did not exist yet either.
    ASSERT_NO_FATAL_FAILURE(UndoVersion11(&raw));
    ASSERT_EQ("", raw.Exec("DROP TABLE open_calls"));
    ASSERT_EQ("", raw.Exec("DROP TABLE spec_owners"));
    ASSERT_EQ("", raw.Exec("ALTER TABLE sagas DROP COLUMN spec_version"));
    ASSERT_EQ("", raw.Exec("ALTER TABLE sagas DROP COLUMN spec_sha256"));
    ASSERT_EQ("", raw.Exec("DELETE FROM schema_migrations WHERE version >= 4"));
  }
  // A version-3 journal had no high-water mark; the one the first open made
  // would (rightly) see the rewritten journal as another one.
  std::filesystem::remove(path + ".hwm");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(SqliteStore::LatestSchemaVersion(), store->SchemaVersion());
  Result<std::vector<JournalEntry>> j = store->ReadJournal("old");
  STORE_ASSERT_OK(j);
  ASSERT_EQ(3u, j->size());
  EXPECT_EQ(5, (*j)[0].seq);
  EXPECT_EQ("first", (*j)[0].event);
  EXPECT_EQ(12, (*j)[2].seq);
  EXPECT_EQ("third", (*j)[2].event);
  WriteBatch b;
  b.saga_id = "old";
  b.journal = {MakeEntry("old", "", "fourth", 4)};
  STORE_ASSERT_OK(store->Commit(b));
  j = store->ReadJournal("old");
  STORE_ASSERT_OK(j);
  ASSERT_EQ(4u, j->size());
  EXPECT_GT((*j)[3].seq, 12);
  RawDb raw(path);
  EXPECT_EQ("", raw.Text("SELECT name FROM sqlite_master WHERE name = 'sagas_by_state'"));
  EXPECT_NE("", raw.Exec("DELETE FROM journal"));  // still append-only
}

TEST(SqliteStoreTest, DatabaseWithoutVersion11GetsTheStepChecksAndDriftTables) {
  TempDir dir;
  const std::string path = dir.File("v10.db");
  {
    std::unique_ptr<SqliteStore> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
  }
  {
    RawDb raw(path);
    ASSERT_NO_FATAL_FAILURE(UndoVersion11(&raw));
    ASSERT_EQ("", raw.Exec("DELETE FROM schema_migrations WHERE version = 11"));
    EXPECT_EQ("", raw.Text("SELECT name FROM sqlite_master WHERE name = 'step_checks'"));
  }
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(SqliteStore::LatestSchemaVersion(), store->SchemaVersion());
  // The saga of version 10 can wait for its provider.
  WriteBatch b;
  b.saga_id = "old";
  b.saga_state = "awaiting_completion";
  b.journal = {MakeEntry("old", "step0", "processing", 2000)};
  b.checks = {StepCheck{"step0", 5000, 100'000, 0, 2000}};
  STORE_ASSERT_OK(store->Commit(b));
  Result<std::vector<DueCheck>> due = store->ListDueChecks("awaiting_completion", 5000, 10);
  STORE_ASSERT_OK(due);
  ASSERT_EQ(1u, due->size());
  EXPECT_EQ("old", (*due)[0].saga_id);
  RawDb raw(path);
  EXPECT_EQ("effects_by_time",
            raw.Text("SELECT name FROM sqlite_master WHERE name = 'effects_by_time'"));
}

TEST(SqliteStoreTest, DatabaseWithoutVersion15CountsItsSagasAtMigration) {
  TempDir dir;
  const std::string path = dir.File("v14.db");
  {
    std::unique_ptr<SqliteStore> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old1", "intent-old1")));
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old2", "intent-old2")));
    WriteBatch b;
    b.saga_id = "old2";
    b.saga_state = "succeeded";
    STORE_ASSERT_OK(store->Commit(b));
  }
  {
    RawDb raw(path);
    ASSERT_NO_FATAL_FAILURE(UndoVersion15(&raw));
  }
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(SqliteStore::LatestSchemaVersion(), store->SchemaVersion());
  RawDb raw(path);
  EXPECT_EQ("pending=1 succeeded=1",
            raw.Text("SELECT group_concat(state || '=' || sagas, ' ') FROM"
                     " (SELECT state, sagas FROM saga_state_counts ORDER BY state)"));
  // And they follow the writes from then on.
  WriteBatch b;
  b.saga_id = "old1";
  b.saga_state = "succeeded";
  STORE_ASSERT_OK(store->Commit(b));
  GaugeQuery q;
  q.detail_states = {"running"};
  Result<StoreGauges> g = store->ReadGauges(q);
  STORE_ASSERT_OK(g);
  EXPECT_EQ(1u, g->by_state.size());  // pending fell to 0: no row
  EXPECT_EQ(2, g->by_state["succeeded"].sagas);
}

TEST(SqliteStoreTest, Version2DatabaseIsMigratedToLeases) {
  TempDir dir;
  const std::string path = dir.File("v2.db");
  {
    std::unique_ptr<SqliteStore> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
  }
  {
    // Back to what version 2 left: no lease columns, no lease index.
    RawDb raw(path);
    ASSERT_NO_FATAL_FAILURE(UndoVersion15(&raw));
    ASSERT_NO_FATAL_FAILURE(UndoVersion14(&raw));
    ASSERT_NO_FATAL_FAILURE(UndoVersion9(&raw));
    ASSERT_EQ("", raw.Exec("DROP INDEX sagas_by_state_lease"));
    for (const char* column : {"lease_owner", "lease_expires_ms", "lease_epoch"}) {
      ASSERT_EQ("", raw.Exec(std::string("ALTER TABLE sagas DROP COLUMN ") + column));
    }
    ASSERT_EQ("", raw.Exec("CREATE INDEX sagas_by_state ON sagas (state)"));  // dropped by 4
    // Versions 7, 10 and 11 did not exist yet either.
    ASSERT_NO_FATAL_FAILURE(UndoVersion11(&raw));
    ASSERT_EQ("", raw.Exec("DROP TABLE open_calls"));
    ASSERT_EQ("", raw.Exec("DROP TABLE spec_owners"));
    ASSERT_EQ("", raw.Exec("ALTER TABLE sagas DROP COLUMN spec_version"));
    ASSERT_EQ("", raw.Exec("ALTER TABLE sagas DROP COLUMN spec_sha256"));
    ASSERT_EQ("", raw.Exec("DELETE FROM schema_migrations WHERE version >= 3"));
  }
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(SqliteStore::LatestSchemaVersion(), store->SchemaVersion());
  // The saga that existed before has a free lease at epoch 0.
  Result<std::vector<Lease>> claimed = store->ClaimSagas({"pending"}, "w", 1000, 10);
  STORE_ASSERT_OK(claimed);
  ASSERT_EQ(1u, claimed->size());
  EXPECT_EQ("old", (*claimed)[0].saga_id);
  EXPECT_EQ(1, (*claimed)[0].epoch);
}

TEST(SqliteStoreTest, LeasesFollowTheInjectedClock) {
  TempDir dir;
  ManualClock clock(1'000'000);
  SqliteOptions options;
  options.path = dir.File("clock.db");
  options.clock = &clock;
  std::unique_ptr<SqliteStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("s", "intent-s")));
  Result<std::vector<Lease>> w1 = store->ClaimSagas({"pending"}, "w1", 30'000, 1);
  STORE_ASSERT_OK(w1);
  ASSERT_EQ(1u, w1->size());
  EXPECT_EQ(1'030'000, (*w1)[0].expires_ms);
  clock.AdvanceMs(30'000);  // expiry is inclusive: still held at expires_ms
  Result<std::vector<Lease>> early = store->ClaimSagas({"pending"}, "w2", 30'000, 1);
  STORE_ASSERT_OK(early);
  EXPECT_TRUE(early->empty());
  clock.AdvanceMs(1);
  Result<std::vector<Lease>> w2 = store->ClaimSagas({"pending"}, "w2", 30'000, 1);
  STORE_ASSERT_OK(w2);
  ASSERT_EQ(1u, w2->size());
  EXPECT_EQ(2, (*w2)[0].epoch);
  EXPECT_EQ(1'060'001, (*w2)[0].expires_ms);
  EXPECT_EQ(Code::kAborted, store->RenewLease((*w1)[0], 30'000).code());
  STORE_EXPECT_OK(store->RenewLease((*w2)[0], 90'000));
  RawDb raw(options.path);
  EXPECT_EQ("1120001", raw.Text("SELECT lease_expires_ms FROM sagas"));
  EXPECT_EQ("w2", raw.Text("SELECT lease_owner FROM sagas"));
}

/// Runs `kThreads` threads that each commit `commits` batches to a saga of
/// their own; returns the wall time in ms.
double CommitFromThreads(Store* store, int threads, int commits, std::atomic<int>* failures) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const std::string id = "saga-" + std::to_string(t);
      for (int i = 0; i < commits; ++i) {
        WriteBatch w;
        w.saga_id = id;
        w.journal = {MakeEntry(id, "", "tick", i)};
        w.effects = {MakeEffect(id, "step0", id + "/" + std::to_string(i), i)};
        if (!store->Commit(w).ok()) failures->fetch_add(1);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(SqliteStoreTest, GroupCommitSharesTransactionsAndFailsBatchesAlone) {
  TempDir dir;
  const std::string path = dir.File("group.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  constexpr int kBatches = 32;
  for (int t = 0; t < kBatches; ++t) {
    STORE_ASSERT_OK(
        store->CreateIntent(MakeSaga("saga-" + std::to_string(t), "intent-" + std::to_string(t))));
  }
  WriteBatch taken;
  taken.saga_id = "saga-0";
  taken.effects = {MakeEffect("saga-0", "step0", "taken-key", 1)};
  STORE_ASSERT_OK(store->Commit(taken));
  Result<Lease> lease = store->ClaimSaga("saga-2", "w", 60'000);
  STORE_ASSERT_OK(lease);
  const SqliteStats before = store->Stats();

  // Hold the database lock from outside, so that every Commit queues up
  // behind the first one; then let go.
  RawDb raw(path);
  ASSERT_EQ("", raw.Exec("BEGIN IMMEDIATE"));
  std::vector<Status> results(kBatches);
  std::vector<std::thread> threads;
  threads.reserve(kBatches);
  for (int t = 0; t < kBatches; ++t) {
    threads.emplace_back([&, t] {
      const std::string id = t == 3 ? "ghost" : "saga-" + std::to_string(t);
      WriteBatch w;
      w.saga_id = id;
      w.saga_state = "running";
      w.journal = {MakeEntry(id, "step0", "group", 5000)};
      w.effects = {MakeEffect(id, "step0", t == 1 ? "taken-key" : id + "/group", 5000)};
      if (t == 2) w.fence_epoch = lease->epoch + 1;  // a lost lease
      results[t] = store->Commit(w);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ("", raw.Exec("COMMIT"));
  for (std::thread& th : threads) th.join();

  EXPECT_EQ(Code::kConflict, results[1].code()) << results[1].ToString();
  EXPECT_EQ(Code::kAborted, results[2].code()) << results[2].ToString();
  EXPECT_EQ(Code::kNotFound, results[3].code()) << results[3].ToString();
  for (int t = 0; t < kBatches; ++t) {
    if (t >= 1 && t <= 3) continue;
    EXPECT_TRUE(results[t].ok()) << t << ": " << results[t].ToString();
  }
  const SqliteStats after = store->Stats();
  const int64_t transactions = after.commit_transactions - before.commit_transactions;
  EXPECT_EQ(kBatches, after.commit_batches - before.commit_batches);
  EXPECT_LT(transactions, kBatches);
  EXPECT_GT(after.largest_group, 1);
  std::cout << "[ figures  ] SQLite: " << kBatches << " concurrent commits took " << transactions
            << " transactions (largest group " << after.largest_group << ")\n";
  // Every good batch landed once; the three bad ones wrote nothing.
  for (int t = 0; t < kBatches; ++t) {
    if (t == 3) continue;
    const std::string id = "saga-" + std::to_string(t);
    const bool good = t < 1 || t > 3;
    EXPECT_EQ(good ? "1" : "0", raw.Text("SELECT COUNT(*) FROM journal WHERE saga_id = '" + id +
                                         "' AND event = 'group'"))
        << id;
    EXPECT_EQ(good ? "running" : "pending",
              raw.Text("SELECT state FROM sagas WHERE saga_id = '" + id + "'"))
        << id;
  }
  EXPECT_EQ(std::to_string(kBatches - 3 + 1), raw.Text("SELECT COUNT(*) FROM effects"));
}

TEST(SqliteStoreTest, GroupCommitFiguresWithAndWithout) {
  constexpr int kThreads = 8;
  constexpr int kCommits = 25;
  for (bool group : {false, true}) {
    TempDir dir;
    SqliteOptions options;
    options.path = dir.File("figures.db");
    options.group_commit = group;
    std::unique_ptr<SqliteStore> store = MustOpen(options);
    ASSERT_NE(store, nullptr);
    for (int t = 0; t < kThreads; ++t) {
      STORE_ASSERT_OK(store->CreateIntent(
          MakeSaga("saga-" + std::to_string(t), "intent-" + std::to_string(t))));
    }
    const SqliteStats before = store->Stats();
    std::atomic<int> failures{0};
    const double ms = CommitFromThreads(store.get(), kThreads, kCommits, &failures);
    EXPECT_EQ(0, failures.load());
    const SqliteStats after = store->Stats();
    const int64_t tx = after.commit_transactions - before.commit_transactions;
    EXPECT_EQ(kThreads * kCommits, after.commit_batches - before.commit_batches);
    if (!group) {
      EXPECT_EQ(kThreads * kCommits, tx);
    }
    std::cout << "[ figures  ] SQLite group_commit=" << group << ": " << kThreads * kCommits
              << " commits from " << kThreads << " threads in " << tx << " transactions, "
              << static_cast<int>(ms) << " ms\n";
    for (int t = 0; t < kThreads; ++t) {
      Result<std::vector<EffectRecord>> f = store->ListEffects("saga-" + std::to_string(t));
      STORE_ASSERT_OK(f);
      EXPECT_EQ(static_cast<size_t>(kCommits), f->size());
    }
  }
}

TEST(SqliteStoreTest, FutureSchemaVersionIsRefused) {
  TempDir dir;
  const std::string path = dir.File("future.db");
  {
    std::unique_ptr<SqliteStore> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  }
  {
    RawDb raw(path);
    ASSERT_EQ("", raw.Exec("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 1)"));
  }
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(SqliteOptions{path});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(Code::kFailedPrecondition, store.status().code()) << store.status().ToString();
  EXPECT_NE(std::string::npos, store.status().message().find("999")) << store.status().message();
  Result<std::unique_ptr<Store>> via_locator = OpenStore("sqlite:" + path);
  EXPECT_EQ(Code::kFailedPrecondition, via_locator.status().code());
  // Refusing did not touch the data.
  RawDb raw(path);
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM sagas"));
}

TEST(SqliteStoreTest, JournalIsAppendOnly) {
  TempDir dir;
  const std::string path = dir.File("journal.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));

  RawDb raw(path);
  std::string update = raw.Exec("UPDATE journal SET event = 'forged'");
  EXPECT_NE(std::string::npos, update.find("append-only")) << update;
  std::string del = raw.Exec("DELETE FROM journal");
  EXPECT_NE(std::string::npos, del.find("append-only")) << del;
  EXPECT_EQ("", raw.Exec("INSERT INTO journal (saga_id, event, at_ms) VALUES ('saga-1', 'x', 1)"));

  Result<std::vector<JournalEntry>> journal = store->ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  ASSERT_EQ(2u, journal->size());
  EXPECT_EQ("saga_created", (*journal)[0].event);
}

TEST(SqliteStoreTest, EffectsAreAppendOnly) {
  TempDir dir;
  const std::string path = dir.File("effects.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  WriteBatch b;
  b.saga_id = "saga-1";
  b.effects = {MakeEffect("saga-1", "step0", "k", 5)};
  STORE_ASSERT_OK(store->Commit(b));
  RawDb raw(path);
  EXPECT_NE("", raw.Exec("UPDATE effects SET result = NULL"));
  EXPECT_NE("", raw.Exec("DELETE FROM effects"));
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM effects"));
}

TEST(SqliteStoreTest, ForeignKeysAreEnforced) {
  TempDir dir;
  const std::string path = dir.File("fk.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  RawDb raw(path);
  ASSERT_EQ("", raw.Exec("PRAGMA foreign_keys = ON"));
  EXPECT_NE("", raw.Exec("INSERT INTO journal (saga_id, event, at_ms) VALUES ('ghost', 'x', 1)"));
}

TEST(SqliteStoreTest, JsonNullIsStoredAsSqlNull) {
  TempDir dir;
  const std::string path = dir.File("null.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  NewSaga s = MakeSaga("saga-1", "intent-1");
  s.input = Json();
  STORE_ASSERT_OK(store->CreateIntent(s));
  RawDb raw(path);
  EXPECT_EQ("null", raw.Text("SELECT typeof(input) FROM sagas"));
  EXPECT_EQ("null", raw.Text("SELECT typeof(args) FROM steps WHERE idx = 0"));
  // Canonical text: sorted keys, no whitespace.
  EXPECT_EQ(CanonicalJson(s.spec), raw.Text("SELECT spec FROM sagas"));
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_TRUE(rec->input.is_null());
}

TEST(SqliteStoreTest, CorruptJsonIsInternalError) {
  TempDir dir;
  const std::string path = dir.File("corrupt.db");
  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  RawDb raw(path);
  ASSERT_EQ("", raw.Exec("UPDATE sagas SET spec = '{not json'"));
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(Code::kInternal, rec.status().code());
  EXPECT_NE(std::string::npos, rec.status().message().find("sagas.spec")) << rec.status().message();
}

TEST(SqliteStoreTest, LockedDatabaseIsUnavailable) {
  TempDir dir;
  const std::string path = dir.File("busy.db");
  SqliteOptions options;
  options.path = path;
  options.busy_timeout_ms = 50;
  std::unique_ptr<SqliteStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));

  RawDb raw(path);
  ASSERT_EQ("", raw.Exec("BEGIN IMMEDIATE"));  // another writer holds the lock
  WriteBatch b;
  b.saga_id = "saga-1";
  b.saga_state = "running";
  b.journal = {MakeEntry("saga-1", "", "started", 2000)};
  Status s = store->Commit(b);
  EXPECT_EQ(Code::kUnavailable, s.code()) << s.ToString();
  Result<CreateOutcome> c = store->CreateIntent(MakeSaga("saga-2", "intent-2"));
  EXPECT_EQ(Code::kUnavailable, c.status().code()) << c.status().ToString();
  // WAL: readers are not blocked by the writer.
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("pending", rec->summary.state);

  ASSERT_EQ("", raw.Exec("COMMIT"));
  STORE_ASSERT_OK(store->Commit(b));
  Result<std::vector<JournalEntry>> j = store->ReadJournal("saga-1");
  STORE_ASSERT_OK(j);
  EXPECT_EQ(2u, j->size());
}

// The store keeps its prepared statements; every call must leave them reset,
// including calls that stop at the first row of a SELECT or fail half-way.
// A statement left mid-step would keep the connection's read snapshot open:
// a checkpoint could not reset the WAL, and the store would neither see
// another connection's writes nor be able to write after them.
TEST(SqliteStoreTest, NoCallLeavesAReadSnapshotOpen) {
  TempDir dir;
  const std::string path = dir.File("snapshot.db");
  SqliteOptions options;
  options.path = path;
  options.busy_timeout_ms = 200;
  std::unique_ptr<SqliteStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  RawDb raw(path);
  ASSERT_EQ("", raw.Exec("PRAGMA busy_timeout = 200"));

  // Exercises every read and every way out of a write: first rows only,
  // early returns, constraint failures, grouped batches with savepoints.
  auto exercise = [&](int round) {
    const std::string id = "saga-" + std::to_string(round);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga(id, "intent-" + id)));
    Result<CreateOutcome> again = store->CreateIntent(MakeSaga(id, "intent-" + id));
    STORE_ASSERT_OK(again);
    EXPECT_FALSE(again->created);
    EXPECT_EQ(Code::kConflict,
              store->CreateIntent(MakeSaga(id, "intent-other-" + id)).status().code());
    STORE_ASSERT_OK(store->LoadSaga(id));
    EXPECT_EQ(Code::kNotFound, store->LoadSaga("ghost").status().code());
    Result<Lease> lease = store->ClaimSaga(id, "w1", 60'000);
    STORE_ASSERT_OK(lease);
    EXPECT_EQ(Code::kAborted, store->ClaimSaga(id, "w2", 60'000).status().code());
    STORE_ASSERT_OK(store->ClaimSagas({"pending", "running"}, "w3", 60'000, 1));
    WriteBatch ok;
    ok.saga_id = id;
    ok.fence_epoch = lease->epoch;
    ok.saga_state = "running";
    ok.journal = {MakeEntry(id, "", "started", 2000)};
    ok.effects = {MakeEffect(id, "step0", id + "/k", 2000)};
    STORE_ASSERT_OK(store->Commit(ok));
    WriteBatch stale = ok;
    stale.fence_epoch = lease->epoch + 1;
    EXPECT_EQ(Code::kAborted, store->Commit(stale).code());
    WriteBatch dup_effect;
    dup_effect.saga_id = id;
    dup_effect.effects = ok.effects;
    EXPECT_EQ(Code::kConflict, store->Commit(dup_effect).code());
    WriteBatch ghost;
    ghost.saga_id = "ghost";
    EXPECT_EQ(Code::kNotFound, store->Commit(ghost).code());
    STORE_ASSERT_OK(store->RenewLease(*lease, 60'000));
    EXPECT_EQ(Code::kAborted, store->RenewLease(Lease{id, "w2", 1, 0}, 60'000).code());
    STORE_ASSERT_OK(store->ReadJournal(id));
    STORE_ASSERT_OK(store->ListEffects(id));
    STORE_ASSERT_OK(store->ListSagas(SagaFilter{{"running"}, 1}));
    STORE_ASSERT_OK(store->ReleaseLease(*lease));
  };

  for (int round = 0; round < 2; ++round) {
    exercise(round);
    // Nothing of the store's reads the WAL any longer: it can be reset.
    EXPECT_EQ("0", raw.Text("PRAGMA wal_checkpoint(TRUNCATE)")) << "round " << round;
    // Another connection writes; the store sees it and writes after it.
    const std::string id = "saga-" + std::to_string(round);
    ASSERT_EQ("", raw.Exec("UPDATE sagas SET reason = 'raw' WHERE saga_id = '" + id + "'"));
    Result<SagaRecord> rec = store->LoadSaga(id);
    STORE_ASSERT_OK(rec);
    EXPECT_EQ("raw", rec->summary.reason);
    WriteBatch after;
    after.saga_id = id;
    after.journal = {MakeEntry(id, "", "tick", 3000)};
    STORE_EXPECT_OK(store->Commit(after));
  }
}

TEST(SqliteStoreTest, TwoStoresOnOneFileDoNotLoseWrites) {
  TempDir dir;
  const std::string path = dir.File("shared.db");
  std::unique_ptr<SqliteStore> a = MustOpen(path);
  std::unique_ptr<SqliteStore> b = MustOpen(path);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kThreads = 6;
  constexpr int kCommits = 20;
  for (int t = 0; t < kThreads; ++t) {
    STORE_ASSERT_OK(
        a->CreateIntent(MakeSaga("saga-" + std::to_string(t), "intent-" + std::to_string(t))));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    Store* store = (t % 2 == 0) ? a.get() : b.get();
    threads.emplace_back([store, t, &failures] {
      const std::string id = "saga-" + std::to_string(t);
      for (int i = 0; i < kCommits; ++i) {
        WriteBatch w;
        w.saga_id = id;
        w.journal = {MakeEntry(id, "", "tick", i)};
        w.effects = {MakeEffect(id, "step0", id + "/" + std::to_string(i), i)};
        if (!store->Commit(w).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(0, failures.load());
  for (int t = 0; t < kThreads; ++t) {
    const std::string id = "saga-" + std::to_string(t);
    Result<std::vector<JournalEntry>> j = b->ReadJournal(id);
    STORE_ASSERT_OK(j);
    EXPECT_EQ(static_cast<size_t>(kCommits + 1), j->size());
    Result<std::vector<EffectRecord>> f = a->ListEffects(id);
    STORE_ASSERT_OK(f);
    EXPECT_EQ(static_cast<size_t>(kCommits), f->size());
  }
}

TEST(SqliteStoreTest, CommittedBatchSurvivesSigkill) {
  TempDir dir;
  const std::string path = dir.File("kill.db");
  pid_t pid = fork();
  ASSERT_NE(-1, pid);
  if (pid == 0) {
    // Child: commit, then die at once without closing anything.
    Result<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(SqliteOptions{path});
    if (!store.ok()) _exit(2);
    if (!(*store)->CreateIntent(MakeSaga("saga-1", "intent-1")).ok()) _exit(3);
    WriteBatch w;
    w.saga_id = "saga-1";
    w.saga_state = "succeeded";
    w.journal = {MakeEntry("saga-1", "", "finished", 7000)};
    w.effects = {MakeEffect("saga-1", "step0", "k-kill", 7000)};
    if (!(*store)->Commit(w).ok()) _exit(4);
    raise(SIGKILL);
    _exit(5);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(SIGKILL, WTERMSIG(status));

  std::unique_ptr<SqliteStore> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("succeeded", rec->summary.state);
  EXPECT_EQ(7000, rec->summary.updated_ms);
  Result<std::vector<JournalEntry>> j = store->ReadJournal("saga-1");
  STORE_ASSERT_OK(j);
  ASSERT_EQ(2u, j->size());
  EXPECT_EQ("finished", (*j)[1].event);
  Result<std::vector<EffectRecord>> f = store->ListEffects("saga-1");
  STORE_ASSERT_OK(f);
  ASSERT_EQ(1u, f->size());
}

TEST(OpenStoreTest, Locators) {
  TempDir dir;
  const std::string path = dir.File("loc.db");
  {
    Result<std::unique_ptr<Store>> plain = OpenStore(path);
    STORE_ASSERT_OK(plain);
    STORE_ASSERT_OK((*plain)->CreateIntent(MakeSaga("saga-1", "intent-1")));
  }
  {
    Result<std::unique_ptr<Store>> prefixed = OpenStore("sqlite:" + path);
    STORE_ASSERT_OK(prefixed);
    STORE_EXPECT_OK((*prefixed)->LoadSaga("saga-1"));  // the same file
    EXPECT_GE((*prefixed)->SchemaVersion(), 1);
  }
  // PostgreSQL locators reach the PostgreSQL store: with nothing listening
  // on the port, that is an unavailable store, not a bad locator.
  for (const char* pg : {"postgresql://idem@127.0.0.1:1/idem", "postgres://127.0.0.1:1/idem"}) {
    Result<std::unique_ptr<Store>> r = OpenStore(pg);
    EXPECT_EQ(Code::kUnavailable, r.status().code()) << pg << ": " << r.status().ToString();
  }
  for (const char* bad : {"", "sqlite:", "sqlite::memory:", ":memory:"}) {
    Result<std::unique_ptr<Store>> r = OpenStore(bad);
    EXPECT_EQ(Code::kInvalidArgument, r.status().code()) << '"' << bad << '"';
  }
}

}  // namespace
}  // namespace idem::storage
