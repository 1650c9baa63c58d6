// The Store conformance suite on PgStore, plus the PostgreSQL-specific tests:
// schema and triggers, migrations under concurrent open, a future schema,
// reconnection after pg_terminate_backend, and the unknown COMMIT outcome
// (RELIABILITY.md row 25) resolved through txid_status.
//
// Needs a live server: ctest starts one (fixture `postgres`, scripts/
// pg-test-server.sh) and this binary reads its URL from IDEM_PG_URL_FILE (or,
// when run by hand, from the environment variable IDEM_PG_TEST_URL): see
// test::PgServerUrl in tests/test_util.h.
// Every test gets a database of its own (CREATE DATABASE t_<random>, dropped
// afterwards). Without the URL file every test fails, saying so.

#include "storage/pg_store.h"

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include "storage/store.h"
#include "tests/store_conformance.h"
#include "tests/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

// LeakSanitizer (IDEM_SANITIZE builds): libpqxx 6.4 leaks the PGresult of a
// statement that fails on a broken connection (connection_base::make_result
// asks for the client encoding, which throws broken_connection before the
// result is owned; fixed in libpqxx 7). The lost-connection tests hit it on
// purpose. idem never holds a raw PGresult, so any leaked one is libpqxx's.
// NOLINTNEXTLINE(bugprone-reserved-identifier,readability-identifier-naming): the LSan hook
extern "C" const char* __lsan_default_suppressions() { return "leak:PQmakeEmptyPGresult\n"; }

namespace idem::storage {
namespace {

using conformance::MakeEffect;
using conformance::MakeEntry;
using conformance::MakeSaga;

using test::PgTestDatabase;
using test::PgUrlParts;
using test::UnusedPort;

/// The conformance suite's factory: a fresh database per test. (A class of
/// its own: ctest names the typed tests after it.)
class PgFactory : public test::PgTestStore {};

}  // namespace

namespace conformance {
using Backends = ::testing::Types<PgFactory>;
INSTANTIATE_TYPED_TEST_SUITE_P(Pg, StoreConformanceTest, Backends);
}  // namespace conformance

namespace {

// ---- Helpers ----------------------------------------------------------------

/// A raw connection to a test database, to look at what is really stored.
class RawDb {
 public:
  explicit RawDb(const std::string& url) : conn_(url) {}

  /// The first column of the first row of `sql` as text ("" if no row or NULL).
  std::string Text(const std::string& sql) {
    pqxx::nontransaction tx(conn_);
    pqxx::result r = tx.exec(sql);
    if (r.empty() || r[0][0].is_null()) return "";
    return r[0][0].c_str();
  }

  /// Runs `sql`; "" on success, else the error message.
  std::string Exec(const std::string& sql) {
    try {
      pqxx::nontransaction tx(conn_);
      tx.exec(sql);
      return "";
    } catch (const std::exception& e) {
      std::string what = e.what();
      return what.empty() ? "error" : what;
    }
  }

  /// Terminates the backend `pid` and waits until it is gone.
  void Terminate(int pid) {
    pqxx::nontransaction tx(conn_);
    tx.exec_params("SELECT pg_terminate_backend($1)", pid);
    for (int i = 0; i < 500; ++i) {
      if (tx.exec_params("SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid).empty()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "backend " << pid << " still runs after pg_terminate_backend";
  }

  /// Terminates every other session on `database`; returns how many.
  int TerminateAll(const std::string& database) {
    pqxx::nontransaction tx(conn_);
    pqxx::result r = tx.exec_params(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = $1 AND pid <> pg_backend_pid()",
        database);
    return static_cast<int>(r.size());
  }

 private:
  pqxx::connection conn_;
};

std::unique_ptr<PgStore> MustOpen(const PgOptions& options) {
  Result<std::unique_ptr<PgStore>> store = PgStore::Open(options);
  EXPECT_OK(store);
  return store.ok() ? std::move(store).value() : nullptr;
}

std::unique_ptr<PgStore> MustOpen(const std::string& url) {
  PgOptions options;
  options.url = url;
  return MustOpen(options);
}

#define ASSERT_DB_OK(db) ASSERT_OK((db).status())

/// A batch with `entries` journal lines and one effect, keyed by `tag`.
WriteBatch Batch(const std::string& saga_id, const std::string& tag, int entries) {
  WriteBatch b;
  b.saga_id = saga_id;
  b.saga_state = "running";
  b.saga_reason = tag;
  for (int i = 0; i < entries; ++i) {
    b.journal.push_back(MakeEntry(saga_id, "step0", tag + "-" + std::to_string(i), 2000 + i,
                                  Json{{"tag", tag}, {"i", i}}));
  }
  b.effects = {MakeEffect(saga_id, "step0", saga_id + "/" + tag, 2000)};
  return b;
}

/// How many journal rows of the saga have an event starting with `tag`-.
int CountEvents(PgStore& store, const std::string& saga_id, const std::string& tag) {
  Result<std::vector<JournalEntry>> j = store.ReadJournal(saga_id);
  EXPECT_OK(j);
  if (!j.ok()) return -1;
  int n = 0;
  for (const JournalEntry& e : *j) n += e.event.rfind(tag + "-", 0) == 0 ? 1 : 0;
  return n;
}

// ---- Schema -----------------------------------------------------------------

TEST(PgStoreTest, FreshDatabaseHasTheSchema) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(PgStore::LatestSchemaVersion(), store->SchemaVersion());
  RawDb raw(db.Url());
  const std::string latest = std::to_string(PgStore::LatestSchemaVersion());
  EXPECT_EQ(std::to_string(PgStore::KnownSchemaVersions()),
            raw.Text("SELECT COUNT(*) FROM schema_migrations"));
  EXPECT_EQ(latest, raw.Text("SELECT MAX(version) FROM schema_migrations"));
  EXPECT_EQ(std::to_string(PgStore::KnownSchemaVersions()),
            raw.Text("SELECT COUNT(*) FROM schema_migrations WHERE applied_at > 0"));
  for (const char* table : {"intents", "sagas", "steps", "journal", "effects", "consumed_tokens"}) {
    EXPECT_EQ(table, raw.Text(std::string("SELECT to_regclass('") + table + "')"));
  }
  for (const char* index : {"journal_by_saga", "effects_by_saga", "sagas_by_state"}) {
    EXPECT_EQ(index, raw.Text(std::string("SELECT to_regclass('") + index + "')"));
  }
  // Dropped by version 16 (no query needs them, and each cost an entry per
  // journal line or effect) and 17 (a lease column in an index rules out
  // HOT claims).
  for (const char* index : {"sagas_by_state_lease", "journal_pkey", "effects_seq_key"}) {
    EXPECT_EQ("", raw.Text(std::string("SELECT to_regclass('") + index + "')")) << index;
  }
  // Room on each page for the HOT versions of the rows updated in place.
  EXPECT_EQ("{fillfactor=85}", raw.Text("SELECT reloptions FROM pg_class WHERE relname = 'sagas'"));
  EXPECT_EQ("{fillfactor=70}", raw.Text("SELECT reloptions FROM pg_class WHERE relname = 'steps'"));
  // The server runs as the store's durability note assumes.
  EXPECT_EQ("on", raw.Text("SHOW synchronous_commit"));
  EXPECT_EQ("on", raw.Text("SHOW fsync"));
}

TEST(PgStoreTest, JournalAndEffectsAreAppendOnly) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  WriteBatch b;
  b.saga_id = "saga-1";
  b.effects = {MakeEffect("saga-1", "step0", "k", 5)};
  STORE_ASSERT_OK(store->Commit(b));

  RawDb raw(db.Url());
  for (const char* sql :
       {"UPDATE journal SET event = 'forged'", "DELETE FROM journal", "TRUNCATE journal CASCADE"}) {
    std::string err = raw.Exec(sql);
    EXPECT_NE(std::string::npos, err.find("journal is append-only")) << sql << ": " << err;
  }
  for (const char* sql :
       {"UPDATE effects SET result = NULL", "DELETE FROM effects", "TRUNCATE effects"}) {
    std::string err = raw.Exec(sql);
    EXPECT_NE(std::string::npos, err.find("effects are append-only")) << sql << ": " << err;
  }
  EXPECT_EQ("", raw.Exec("INSERT INTO journal (saga_id, event, at_ms) VALUES ('saga-1', 'x', 1)"));
  EXPECT_NE("", raw.Exec("INSERT INTO journal (saga_id, event, at_ms) VALUES ('ghost', 'x', 1)"));
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM effects"));
  Result<std::vector<JournalEntry>> journal = store->ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  ASSERT_EQ(2u, journal->size());
  EXPECT_EQ("saga_created", (*journal)[0].event);
}

TEST(PgStoreTest, JsonIsCanonicalTextAndNullIsSqlNull) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  NewSaga s = MakeSaga("saga-1", "intent-1");
  s.input = Json();
  STORE_ASSERT_OK(store->CreateIntent(s));
  RawDb raw(db.Url());
  EXPECT_EQ("t", raw.Text("SELECT input IS NULL FROM sagas"));
  EXPECT_EQ("t", raw.Text("SELECT args IS NULL FROM steps WHERE idx = 0"));
  EXPECT_EQ(CanonicalJson(s.spec), raw.Text("SELECT spec FROM sagas"));
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_TRUE(rec->input.is_null());
}

TEST(PgStoreTest, CorruptJsonIsInternalError) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  RawDb raw(db.Url());
  ASSERT_EQ("", raw.Exec("UPDATE sagas SET spec = '{not json'"));
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(Code::kInternal, rec.status().code());
  EXPECT_NE(std::string::npos, rec.status().message().find("sagas.spec")) << rec.status().message();
}

TEST(PgStoreTest, TextPostgresCannotHoldIsInvalidArgument) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  NewSaga nul = MakeSaga("saga-1", std::string("intent\0one", 10));
  Result<CreateOutcome> c = store->CreateIntent(nul);
  EXPECT_EQ(Code::kInvalidArgument, c.status().code()) << c.status().ToString();
  EXPECT_NE(std::string::npos, c.status().message().find("NUL")) << c.status().message();

  NewSaga bad_utf8 = MakeSaga("saga-2", "intent-2");
  bad_utf8.spec_name = "\xff\xfe";
  Result<CreateOutcome> u = store->CreateIntent(bad_utf8);
  EXPECT_EQ(Code::kInvalidArgument, u.status().code()) << u.status().ToString();

  EXPECT_EQ(Code::kNotFound, store->LoadSaga(std::string("saga\0x", 6)).status().code());
  // Nothing was written, and the store still works.
  Result<std::vector<SagaSummary>> all = store->ListSagas(SagaFilter{});
  STORE_ASSERT_OK(all);
  EXPECT_TRUE(all->empty());
  STORE_EXPECT_OK(store->CreateIntent(MakeSaga("saga-3", "intent-3")));
}

// ---- Migrations -------------------------------------------------------------

TEST(PgStoreTest, MigrationsRunOnceUnderConcurrentOpen) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  constexpr int kOpeners = 8;
  std::atomic<int> ready{0};
  std::vector<Result<std::unique_ptr<PgStore>>> stores;
  stores.reserve(kOpeners);
  for (int i = 0; i < kOpeners; ++i) stores.emplace_back(Status::Internal("not run"));
  std::vector<std::thread> threads;
  threads.reserve(kOpeners);
  for (int i = 0; i < kOpeners; ++i) {
    threads.emplace_back([&, i] {
      PgOptions options;
      options.url = db.Url();
      options.pool_size = 1;
      ready.fetch_add(1);
      while (ready.load() < kOpeners) std::this_thread::yield();
      stores[i] = PgStore::Open(options);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kOpeners; ++i) {
    ASSERT_TRUE(stores[i].ok()) << i << ": " << stores[i].status().ToString();
    EXPECT_EQ(PgStore::LatestSchemaVersion(), (*stores[i])->SchemaVersion());
  }
  RawDb raw(db.Url());
  const std::string latest = std::to_string(PgStore::LatestSchemaVersion());
  EXPECT_EQ(std::to_string(PgStore::KnownSchemaVersions()),
            raw.Text("SELECT COUNT(*) FROM schema_migrations"));
  // Each version once, up to the latest; a version of another branch not
  // merged yet is a gap (storage/migrations/README.md).
  EXPECT_EQ(std::to_string(PgStore::KnownSchemaVersions()),
            raw.Text("SELECT COUNT(DISTINCT version) FROM schema_migrations"));
  EXPECT_EQ(latest, raw.Text("SELECT MAX(version) FROM schema_migrations"));
  // Every store works on the one schema.
  for (int i = 0; i < kOpeners; ++i) {
    STORE_EXPECT_OK(
        (*stores[i])
            ->CreateIntent(MakeSaga("saga-" + std::to_string(i), "intent-" + std::to_string(i))));
  }
  EXPECT_EQ(std::to_string(kOpeners), raw.Text("SELECT COUNT(*) FROM sagas"));
}

// Takes a database back from version 15 (the kept state counts) to 14.
void UndoVersion15(RawDb* raw) {
  for (const char* sql :
       {"DROP TRIGGER saga_state_counts_insert_delete ON sagas",
        "DROP TRIGGER saga_state_counts_update ON sagas", "DROP FUNCTION idem_count_saga_state()",
        "DROP TABLE saga_state_counts", "DROP TABLE saga_state_moves",
        "DELETE FROM schema_migrations WHERE version = 15"}) {
    ASSERT_EQ("", raw->Exec(sql)) << sql;
  }
}

// Takes a database back from version 17 (HOT lease updates) to 16.
void UndoVersion17(RawDb* raw) {
  for (const char* sql :
       {"DROP INDEX sagas_by_state",
        "CREATE INDEX sagas_by_state_lease ON sagas (state, lease_expires_ms)",
        "ALTER TABLE sagas RESET (fillfactor)", "ALTER TABLE steps RESET (fillfactor)",
        "DELETE FROM schema_migrations WHERE version = 17"}) {
    ASSERT_EQ("", raw->Exec(sql)) << sql;
  }
}

// A database at version 16 with a saga under lease opens at 17: the lease
// index is replaced by the state's, the fill factors are set, and the lease
// taken before still fences, the claims after it still exclude each other.
TEST(PgStoreTest, DatabaseAtVersion16TakesTheLeaseOutOfTheStateIndex) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  Lease before;
  {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
    Result<Lease> l = store->ClaimSaga("old", "w1", 600'000);
    STORE_ASSERT_OK(l);
    before = *l;
  }
  RawDb raw(db.Url());
  ASSERT_NO_FATAL_FAILURE(UndoVersion17(&raw));
  EXPECT_EQ("sagas_by_state_lease", raw.Text("SELECT to_regclass('sagas_by_state_lease')"));
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(PgStore::LatestSchemaVersion(), store->SchemaVersion());
  EXPECT_EQ("", raw.Text("SELECT to_regclass('sagas_by_state_lease')"));
  EXPECT_EQ("sagas_by_state", raw.Text("SELECT to_regclass('sagas_by_state')"));
  EXPECT_EQ("{fillfactor=85}", raw.Text("SELECT reloptions FROM pg_class WHERE relname = 'sagas'"));
  EXPECT_EQ("{fillfactor=70}", raw.Text("SELECT reloptions FROM pg_class WHERE relname = 'steps'"));
  EXPECT_EQ(Code::kAborted, store->ClaimSaga("old", "w2", 600'000).status().code());
  STORE_ASSERT_OK(store->RenewLease(before, 600'000));
  Result<ClaimedSaga> again = store->ClaimAndLoad("old", "w1", 600'000);
  STORE_ASSERT_OK(again);
  EXPECT_EQ(before.epoch + 1, again->lease.epoch);
  EXPECT_EQ(Code::kAborted, store->RenewLease(before, 600'000).code());
  Result<std::vector<Lease>> none = store->ClaimSagas({"pending"}, "w2", 600'000, 5);
  STORE_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
  STORE_ASSERT_OK(store->ReleaseLease(again->lease));
  Result<std::vector<Lease>> freed = store->ClaimSagas({"pending"}, "w2", 600'000, 5);
  STORE_ASSERT_OK(freed);
  ASSERT_EQ(1u, freed->size());
  EXPECT_EQ("old", (*freed)[0].saga_id);
}

// A database at version 15 (the three indexes of before, rows in every
// table) opens at 16: the indexes are gone, the rows are read back whole, and
// a batch commits on top of them.
TEST(PgStoreTest, DatabaseAtVersion15DropsTheIndexesNoQueryNeeds) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
    STORE_ASSERT_OK(store->Commit(Batch("old", "before", 2)));
  }
  RawDb raw(db.Url());
  ASSERT_NO_FATAL_FAILURE(UndoVersion17(&raw));
  for (const char* sql :
       {"CREATE INDEX sagas_by_state ON sagas (state)", "ALTER TABLE journal ADD PRIMARY KEY (seq)",
        "ALTER TABLE effects ADD CONSTRAINT effects_seq_key UNIQUE (seq)",
        "DELETE FROM schema_migrations WHERE version = 16"}) {
    ASSERT_EQ("", raw.Exec(sql)) << sql;
  }
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(PgStore::LatestSchemaVersion(), store->SchemaVersion());
  for (const char* index : {"sagas_by_state_lease", "journal_pkey", "effects_seq_key"}) {
    EXPECT_EQ("", raw.Text(std::string("SELECT to_regclass('") + index + "')")) << index;
  }
  // Dropped by 16, made again by 17 (on the state alone).
  EXPECT_EQ("sagas_by_state", raw.Text("SELECT to_regclass('sagas_by_state')"));
  EXPECT_EQ(CountEvents(*store, "old", "before"), 2);
  STORE_ASSERT_OK(store->Commit(Batch("old", "after", 1)));
  EXPECT_EQ(CountEvents(*store, "old", "after"), 1);
  auto effects = store->ListEffects("old");
  STORE_ASSERT_OK(effects);
  EXPECT_EQ(effects->size(), 2u);
  // Effects stay unique by their key.
  WriteBatch again = Batch("old", "after", 1);
  EXPECT_EQ(store->Commit(again).code(), Code::kConflict);
}

TEST(PgStoreTest, DatabaseWithoutVersion11GetsTheStepChecksAndDriftTables) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
  }
  RawDb raw(db.Url());
  // What a database of main at version 14 has: no version 11, which this
  // branch adds (applied as a gap when it is merged).
  ASSERT_EQ("", raw.Exec("DROP TABLE step_checks"));
  ASSERT_EQ("", raw.Exec("DROP TABLE drift_findings"));
  ASSERT_EQ("", raw.Exec("DROP INDEX effects_by_time"));
  ASSERT_EQ("", raw.Exec("DELETE FROM schema_migrations WHERE version = 11"));
  ASSERT_EQ("", raw.Text("SELECT to_regclass('step_checks')"));
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(PgStore::LatestSchemaVersion(), store->SchemaVersion());
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
  EXPECT_EQ("effects_by_time", raw.Text("SELECT to_regclass('effects_by_time')"));
}

TEST(PgStoreTest, DatabaseWithoutVersion15CountsItsSagasAtMigration) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old1", "intent-old1")));
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old2", "intent-old2")));
    WriteBatch b;
    b.saga_id = "old2";
    b.saga_state = "succeeded";
    STORE_ASSERT_OK(store->Commit(b));
  }
  RawDb raw(db.Url());
  ASSERT_NO_FATAL_FAILURE(UndoVersion15(&raw));
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(PgStore::LatestSchemaVersion(), store->SchemaVersion());
  EXPECT_EQ("pending=1 succeeded=1",
            raw.Text("SELECT string_agg(state || '=' || sagas, ' ' ORDER BY state)"
                     " FROM saga_state_counts"));
  // The writes append their moves; a read folds them into the counts.
  WriteBatch b;
  b.saga_id = "old1";
  b.saga_state = "succeeded";
  STORE_ASSERT_OK(store->Commit(b));
  EXPECT_EQ("2", raw.Text("SELECT count(*) FROM saga_state_moves"));
  GaugeQuery q;
  q.detail_states = {"running"};
  Result<StoreGauges> g = store->ReadGauges(q);
  STORE_ASSERT_OK(g);
  EXPECT_EQ(1u, g->by_state.size());  // pending fell to 0: no row
  EXPECT_EQ(2, g->by_state["succeeded"].sagas);
  EXPECT_EQ("0", raw.Text("SELECT count(*) FROM saga_state_moves"));
  EXPECT_EQ("pending=0 succeeded=2",
            raw.Text("SELECT string_agg(state || '=' || sagas, ' ' ORDER BY state)"
                     " FROM saga_state_counts"));
}

TEST(PgStoreTest, Version2DatabaseIsMigratedToLeases) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("old", "intent-old")));
  }
  RawDb raw(db.Url());
  // Back to what version 2 left (dropping the columns drops the index).
  ASSERT_EQ("", raw.Exec("ALTER TABLE sagas DROP COLUMN lease_owner,"
                         " DROP COLUMN lease_expires_ms, DROP COLUMN lease_epoch"));
  ASSERT_EQ("", raw.Exec("DROP TABLE step_checks"));  // nor did version 11
  ASSERT_EQ("", raw.Exec("DROP TABLE drift_findings"));
  ASSERT_EQ("", raw.Exec("DROP INDEX effects_by_time"));
  ASSERT_EQ("", raw.Exec("DROP TABLE open_calls"));   // nor did version 10
  ASSERT_EQ("", raw.Exec("DROP TABLE spec_owners"));  // version 7 did not exist yet either
  ASSERT_EQ("", raw.Exec("DROP INDEX sagas_by_created, sagas_by_owner"));  // nor 14
  ASSERT_NO_FATAL_FAILURE(UndoVersion15(&raw));                            // nor 15
  ASSERT_EQ("", raw.Exec("ALTER TABLE sagas DROP COLUMN spec_version, DROP COLUMN spec_sha256"));
  ASSERT_EQ("", raw.Exec("DELETE FROM schema_migrations WHERE version >= 3"));
  ASSERT_EQ("", raw.Text("SELECT to_regclass('sagas_by_state_lease')"));
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(PgStore::LatestSchemaVersion(), store->SchemaVersion());
  Result<std::vector<Lease>> claimed = store->ClaimSagas({"pending"}, "w", 1000, 10);
  STORE_ASSERT_OK(claimed);
  ASSERT_EQ(1u, claimed->size());
  EXPECT_EQ("old", (*claimed)[0].saga_id);
  EXPECT_EQ(1, (*claimed)[0].epoch);
}

TEST(PgStoreTest, ReopenAppliesNothing) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
  }
  RawDb raw(db.Url());
  EXPECT_EQ(std::to_string(PgStore::KnownSchemaVersions()),
            raw.Text("SELECT COUNT(*) FROM schema_migrations"));
}

TEST(PgStoreTest, FutureSchemaVersionIsRefused) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  {
    std::unique_ptr<PgStore> store = MustOpen(db.Url());
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  }
  RawDb raw(db.Url());
  ASSERT_EQ("", raw.Exec("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 1)"));
  PgOptions options;
  options.url = db.Url();
  Result<std::unique_ptr<PgStore>> store = PgStore::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(Code::kFailedPrecondition, store.status().code()) << store.status().ToString();
  EXPECT_NE(std::string::npos, store.status().message().find("999")) << store.status().message();
  Result<std::unique_ptr<Store>> via_locator = OpenStore(db.Url());
  EXPECT_EQ(Code::kFailedPrecondition, via_locator.status().code())
      << via_locator.status().ToString();
  // Refusing did not touch the data.
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM sagas"));
  EXPECT_EQ(std::to_string(PgStore::KnownSchemaVersions() + 1),
            raw.Text("SELECT COUNT(*) FROM schema_migrations"));
}

// ---- Options, locators, an unreachable server ----------------------------------

TEST(PgStoreTest, RejectsBadOptions) {
  EXPECT_EQ(Code::kInvalidArgument, PgStore::Open(PgOptions{}).status().code());
  PgOptions pool;
  pool.url = "postgresql://localhost/idem";
  pool.pool_size = 0;
  EXPECT_EQ(Code::kInvalidArgument, PgStore::Open(pool).status().code());
  PgOptions timeout;
  timeout.url = "postgresql://localhost/idem";
  timeout.connect_timeout_s = 0;
  EXPECT_EQ(Code::kInvalidArgument, PgStore::Open(timeout).status().code());
}

TEST(PgStoreTest, UnreachableServerIsUnavailable) {
  PgOptions options;
  options.url = "postgresql://idem:secret@127.0.0.1:" + std::to_string(UnusedPort()) + "/idem";
  options.connect_timeout_s = 2;
  auto start = std::chrono::steady_clock::now();
  Result<std::unique_ptr<PgStore>> store = PgStore::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(Code::kUnavailable, store.status().code()) << store.status().ToString();
  EXPECT_EQ(std::string::npos, store.status().message().find("secret")) << "password leaked";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  Result<std::unique_ptr<Store>> via_locator = OpenStore(options.url);
  EXPECT_EQ(Code::kUnavailable, via_locator.status().code());
}

TEST(OpenStorePgTest, PostgresLocatorsOpenPgStore) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  {
    Result<std::unique_ptr<Store>> store = OpenStore(db.Url());
    STORE_ASSERT_OK(store);
    EXPECT_NE(nullptr, dynamic_cast<PgStore*>(store->get()));
    EXPECT_EQ(PgStore::LatestSchemaVersion(), (*store)->SchemaVersion());
    STORE_ASSERT_OK((*store)->CreateIntent(MakeSaga("saga-1", "intent-1")));
  }
  // postgres:// is the same thing.
  std::string url = db.Url();
  url.replace(0, std::string("postgresql://").size(), "postgres://");
  Result<std::unique_ptr<Store>> store = OpenStore(url);
  STORE_ASSERT_OK(store);
  STORE_EXPECT_OK((*store)->LoadSaga("saga-1"));
}

// ---- Transaction ids -----------------------------------------------------------
//
// A call that takes a transaction id makes the server write and flush a commit
// record. The next id to be assigned (the snapshot's xmax) shows whether one was.

TEST(PgStoreTest, RepeatedSubmissionsAndReadsTakeNoTransactionId) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> store = MustOpen(db.Url());
  ASSERT_NE(store, nullptr);
  RawDb raw(db.Url());
  auto next_xid = [&]() -> int64_t {
    return std::stoll(raw.Text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"));
  };
  // Transaction ids are cluster-wide and other tests share the server: they
  // can only add to a delta, so the least of several tries is the store's.
  auto xids_taken = [&](const std::function<void(int)>& fn) {
    int64_t least = std::numeric_limits<int64_t>::max();
    for (int attempt = 0; attempt < 8 && least > 0; ++attempt) {
      int64_t before = next_xid();
      fn(attempt);
      least = std::min<int64_t>(least, next_xid() - before);
    }
    return least;
  };
  EXPECT_EQ(1, xids_taken([&](int n) {  // a creation: one write transaction
              Result<CreateOutcome> first = store->CreateIntent(
                  MakeSaga("saga-" + std::to_string(n), "intent-" + std::to_string(n)));
              STORE_ASSERT_OK(first);
              EXPECT_TRUE(first->created);
            }));

  EXPECT_EQ(0, xids_taken([&](int) {
              for (int i = 0; i < 3; ++i) {
                Result<CreateOutcome> again = store->CreateIntent(MakeSaga("saga-0b", "intent-0"));
                STORE_ASSERT_OK(again);
                EXPECT_FALSE(again->created);
                EXPECT_EQ("saga-0", again->saga_id);
              }
              NewSaga other = MakeSaga("saga-0c", "intent-0");
              other.fingerprint = "other";
              EXPECT_EQ(Code::kConflict, store->CreateIntent(other).status().code());
              STORE_EXPECT_OK(store->LoadSaga("saga-0"));
              STORE_EXPECT_OK(store->ReadJournal("saga-0"));
              STORE_EXPECT_OK(store->ListEffects("saga-0"));
              STORE_EXPECT_OK(store->ListSagas(SagaFilter{}));
              EXPECT_EQ(Code::kNotFound, store->LoadSaga("nope").status().code());
              Result<std::vector<Lease>> none = store->ClaimSagas({"no-such-state"}, "w1", 1000, 4);
              STORE_ASSERT_OK(none);
              EXPECT_TRUE(none->empty());
            }));

  // A commit: one transaction id, no matter how many rows.
  EXPECT_EQ(1, xids_taken([&](int n) {
              STORE_ASSERT_OK(store->Commit(Batch("saga-0", "b" + std::to_string(n), 3)));
              EXPECT_EQ(3, CountEvents(*store, "saga-0", "b" + std::to_string(n)));
            }));
}

// ---- Several stores on one database --------------------------------------------

TEST(PgStoreTest, TwoStoresRaceForOneIntentAndMakeOneSaga) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::unique_ptr<PgStore> a = MustOpen(db.Url());
  std::unique_ptr<PgStore> b = MustOpen(db.Url());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int round = 0; round < 5; ++round) {
    const std::string intent = "intent-" + std::to_string(round);
    constexpr int kThreads = 8;
    std::vector<Result<CreateOutcome>> out(kThreads, Status::Internal("not run"));
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    std::atomic<int> ready{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        NewSaga s = MakeSaga(intent + "/saga-" + std::to_string(t), intent);
        for (NewStep& step : s.steps) step.step_key = intent + "/" + step.step_id;
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        out[t] = (t % 2 == 0 ? a.get() : b.get())->CreateIntent(s);
      });
    }
    for (std::thread& th : threads) th.join();
    int created = 0;
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(out[t].ok()) << out[t].status().ToString();
      created += out[t]->created ? 1 : 0;
      EXPECT_EQ(out[0]->saga_id, out[t]->saga_id);
    }
    EXPECT_EQ(1, created) << intent;
  }
  RawDb raw(db.Url());
  EXPECT_EQ("5", raw.Text("SELECT COUNT(*) FROM sagas"));
  EXPECT_EQ("5", raw.Text("SELECT COUNT(*) FROM journal"));
}

// ---- Lost connections --------------------------------------------------------

TEST(PgStoreTest, ReconnectsAfterBackendsAreTerminated) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  PgOptions options;
  options.url = db.Url();
  options.pool_size = 4;
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4;
  for (int t = 0; t < kThreads; ++t) {
    STORE_ASSERT_OK(
        store->CreateIntent(MakeSaga("saga-" + std::to_string(t), "intent-" + std::to_string(t))));
  }
  RawDb raw(db.Url());

  // Fills the pool, kills every connection in it, and commits again: each call
  // may meet a dead connection once and must then succeed on a new one.
  auto commit_all = [&](const std::string& tag) {
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    std::vector<Status> results(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back(
          [&, t] { results[t] = store->Commit(Batch("saga-" + std::to_string(t), tag, 2)); });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t].ok()) << results[t].ToString();
  };
  commit_all("before");
  for (int round = 0; round < 3; ++round) {
    const int killed = raw.TerminateAll(db.Parts().database);
    EXPECT_GE(killed, 1);
    // Wait until they are gone, so that the store surely meets dead connections.
    for (int i = 0; i < 500; ++i) {
      if (raw.Text("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
                   " AND pid <> pg_backend_pid()") == "0") {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::string tag = "after" + std::to_string(round);
    commit_all(tag);
    Result<std::vector<SagaSummary>> list = store->ListSagas(SagaFilter{});
    STORE_ASSERT_OK(list);
    EXPECT_EQ(static_cast<size_t>(kThreads), list->size());
  }
  PgStats stats = store->Stats();
  EXPECT_GE(stats.connections_discarded, 3);
  EXPECT_GE(stats.retries, 3);
  EXPECT_EQ(0, stats.commits_in_doubt);
  // Every batch is there exactly once.
  for (int t = 0; t < kThreads; ++t) {
    const std::string id = "saga-" + std::to_string(t);
    for (const char* tag : {"before", "after0", "after1", "after2"}) {
      EXPECT_EQ(2, CountEvents(*store, id, tag)) << id << " " << tag;
    }
    Result<std::vector<EffectRecord>> f = store->ListEffects(id);
    STORE_ASSERT_OK(f);
    EXPECT_EQ(4u, f->size());
  }
}

// ---- Unknown COMMIT outcome (RELIABILITY.md row 25) ---------------------------------
//
// Two ways to lose the connection while COMMIT is in flight:
//  - before the server ran it: the hook terminates the backend right before
//    COMMIT is sent; txid_status says "aborted" and the store runs the
//    transaction again, once;
//  - after the server ran it: a proxy forwards COMMIT, swallows the server's
//    answer and cuts the connection; txid_status says "committed" and the store
//    reports success without running anything again.
// Either way the batch is in the journal exactly once.

TEST(PgStoreTest, UnknownCommitThatAbortedIsRetriedOnce) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  RawDb killer(db.Url());
  std::atomic<int> kills_left{0};
  std::atomic<int> hook_calls{0};
  PgOptions options;
  options.url = db.Url();
  options.before_commit_hook = [&](int pid) {
    hook_calls.fetch_add(1);
    if (kills_left.fetch_sub(1) > 0) killer.Terminate(pid);
  };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  hook_calls = 0;

  kills_left = 1;
  STORE_ASSERT_OK(store->Commit(Batch("saga-1", "b1", 3)));
  EXPECT_EQ(2, hook_calls.load());  // the first run, then its one retry
  PgStats stats = store->Stats();
  EXPECT_EQ(1, stats.commits_in_doubt);
  EXPECT_EQ(1, stats.resolved_aborted);
  EXPECT_EQ(0, stats.resolved_committed);
  EXPECT_EQ(1, stats.retries);

  EXPECT_EQ(3, CountEvents(*store, "saga-1", "b1"));
  Result<std::vector<EffectRecord>> f = store->ListEffects("saga-1");
  STORE_ASSERT_OK(f);
  EXPECT_EQ(1u, f->size());
  Result<SagaRecord> rec = store->LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("b1", rec->summary.reason);

  // CreateIntent goes through the same path.
  kills_left = 1;
  Result<CreateOutcome> c = store->CreateIntent(MakeSaga("saga-2", "intent-2"));
  STORE_ASSERT_OK(c);
  EXPECT_TRUE(c->created);
  EXPECT_EQ(2, store->Stats().resolved_aborted);
  RawDb raw(db.Url());
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM journal WHERE saga_id = 'saga-2'"));
  EXPECT_EQ("2", raw.Text("SELECT COUNT(*) FROM steps WHERE saga_id = 'saga-2'"));
}

TEST(PgStoreTest, UnknownCommitThatAbortsTwiceIsUnavailableAndWritesNothing) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  RawDb killer(db.Url());
  std::atomic<bool> kill{false};
  std::atomic<int> hook_calls{0};
  PgOptions options;
  options.url = db.Url();
  options.before_commit_hook = [&](int pid) {
    if (!kill.load()) return;
    hook_calls.fetch_add(1);
    killer.Terminate(pid);
  };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));

  kill = true;
  Status s = store->Commit(Batch("saga-1", "b1", 2));
  kill = false;
  EXPECT_EQ(Code::kUnavailable, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("nothing was written")) << s.message();
  EXPECT_EQ(2, hook_calls.load());  // run once, retried once, then given up
  EXPECT_EQ(2, store->Stats().resolved_aborted);

  EXPECT_EQ(0, CountEvents(*store, "saga-1", "b1"));
  Result<std::vector<EffectRecord>> f = store->ListEffects("saga-1");
  STORE_ASSERT_OK(f);
  EXPECT_TRUE(f->empty());
  // The caller's retry goes through, once.
  STORE_ASSERT_OK(store->Commit(Batch("saga-1", "b1", 2)));
  EXPECT_EQ(2, CountEvents(*store, "saga-1", "b1"));
}

/// A TCP proxy in front of the test server that cuts the client's connection
/// at its next COMMIT, when armed:
///  - kAfterCommit: forwards COMMIT, waits for the server's answer (the commit
///    has happened), drops the answer and closes both sides;
///  - kBeforeCommit: drops COMMIT and closes only the client's side; the
///    server's side stays open, so its backend idles "in progress" as after a
///    network partition, until the proxy goes.
class CommitSwallowingProxy {
 public:
  CommitSwallowingProxy(std::string host, int target_port)
      : host_(std::move(host)), target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listen_fd_, 64) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        pipe(stop_pipe_.data()) != 0) {
      ADD_FAILURE() << "proxy: cannot listen";
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~CommitSwallowingProxy() {
    stop_ = true;
    if (write(stop_pipe_[1], "x", 1) < 0) ADD_FAILURE() << "proxy: cannot stop";
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> relays;
    {
      std::lock_guard<std::mutex> lock(mu_);
      relays.swap(relays_);
    }
    for (std::thread& t : relays) t.join();
    for (int fd : held_) close(fd);
    close(listen_fd_);
    close(stop_pipe_[0]);
    close(stop_pipe_[1]);
  }
  CommitSwallowingProxy(const CommitSwallowingProxy&) = delete;
  CommitSwallowingProxy& operator=(const CommitSwallowingProxy&) = delete;
  CommitSwallowingProxy(CommitSwallowingProxy&&) = delete;
  CommitSwallowingProxy& operator=(CommitSwallowingProxy&&) = delete;

  int Port() const { return port_; }
  /// The URL of `server`'s database through this proxy (no TLS: the proxy
  /// reads the protocol).
  std::string Url(PgUrlParts server) const {
    server.port = port_;
    return server.Url() + "?sslmode=disable";
  }
  enum class Cut { kAfterCommit, kBeforeCommit };
  void Arm(Cut cut = Cut::kAfterCommit) {
    cut_ = cut;
    armed_ = true;
  }
  int Swallowed() const { return swallowed_.load(); }
  /// New connections are closed at once, as by a server that is down.
  void StopAccepting() { accepting_ = false; }

 private:
  void AcceptLoop() {
    while (!stop_) {
      std::array<pollfd, 2> fds = {{{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}}};
      if (poll(fds.data(), fds.size(), -1) <= 0) continue;
      if (fds[1].revents != 0) return;
      int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      if (!accepting_) {
        close(client);
        continue;
      }
      int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      inet_pton(AF_INET, host_.c_str(), &addr.sin_addr);
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        close(client);
        close(server);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      relays_.emplace_back([this, client, server] { Relay(client, server); });
    }
  }

  void Relay(int client, int server) {
    const std::string commit_query("COMMIT\0", 7);  // a simple-query COMMIT
    std::vector<char> buffer(65536);
    char* buf = buffer.data();
    for (;;) {
      std::array<pollfd, 3> fds = {
          {{client, POLLIN, 0}, {server, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}}};
      if (poll(fds.data(), fds.size(), -1) <= 0) continue;
      if (fds[2].revents != 0) break;
      if (fds[0].revents != 0) {
        ssize_t n = read(client, buf, buffer.size());
        if (n <= 0) break;
        const bool swallow = armed_.load() &&
                             std::string(buf, n).find(commit_query) != std::string::npos &&
                             armed_.exchange(false);
        if (swallow && cut_ == Cut::kBeforeCommit) {
          swallowed_.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu_);
          held_.push_back(server);
          close(client);
          return;
        }
        if (!WriteAll(server, buf, n)) break;
        if (swallow) {
          // Wait for the server's answer to COMMIT: the commit is done. Drop it.
          pollfd answer = {server, POLLIN, 0};
          if (poll(&answer, 1, 10000) == 1) (void)read(server, buf, buffer.size());
          swallowed_.fetch_add(1);
          break;
        }
      }
      if (fds[1].revents != 0) {
        ssize_t n = read(server, buf, buffer.size());
        if (n <= 0 || !WriteAll(client, buf, n)) break;
      }
    }
    close(client);
    close(server);
  }

  static bool WriteAll(int fd, const char* data, ssize_t n) {
    while (n > 0) {
      ssize_t w = write(fd, data, n);
      if (w <= 0) return false;
      data += w;
      n -= w;
    }
    return true;
  }

  const std::string host_;
  const int target_port_;
  int listen_fd_ = -1;
  std::array<int, 2> stop_pipe_ = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> armed_{false};
  std::atomic<bool> accepting_{true};
  std::atomic<Cut> cut_{Cut::kAfterCommit};
  std::atomic<int> swallowed_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> relays_;  // GUARDED_BY(mu_)
  std::vector<int> held_;            // GUARDED_BY(mu_): server sides kept open
};

TEST(PgStoreTest, UnknownCommitThatCommittedIsNotRepeated) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  PgUrlParts parts = db.Parts();
  CommitSwallowingProxy proxy(parts.host, parts.port);
  ASSERT_NE(0, proxy.Port());
  std::atomic<int> hook_calls{0};
  PgOptions options;
  options.url = proxy.Url(parts);
  options.before_commit_hook = [&](int) { hook_calls.fetch_add(1); };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  hook_calls = 0;

  proxy.Arm();
  STORE_ASSERT_OK(store->Commit(Batch("saga-1", "b1", 3)));
  EXPECT_EQ(1, proxy.Swallowed());
  EXPECT_EQ(1, hook_calls.load());  // ran once: not repeated
  PgStats stats = store->Stats();
  EXPECT_EQ(1, stats.commits_in_doubt);
  EXPECT_EQ(1, stats.resolved_committed);
  EXPECT_EQ(0, stats.resolved_aborted);
  EXPECT_EQ(0, stats.retries);

  EXPECT_EQ(3, CountEvents(*store, "saga-1", "b1"));
  Result<std::vector<EffectRecord>> f = store->ListEffects("saga-1");
  STORE_ASSERT_OK(f);
  EXPECT_EQ(1u, f->size());
  RawDb raw(db.Url());
  EXPECT_EQ("4", raw.Text("SELECT COUNT(*) FROM journal"));

  // The same for CreateIntent: created once, reported as created. A repeated
  // submission before it is answered by a read that sends no COMMIT, so the
  // armed proxy lets it through and cuts the new intent's COMMIT.
  proxy.Arm();
  Result<CreateOutcome> again = store->CreateIntent(MakeSaga("saga-1", "intent-1"));
  STORE_ASSERT_OK(again);
  EXPECT_FALSE(again->created);
  EXPECT_EQ(1, proxy.Swallowed());
  Result<CreateOutcome> c = store->CreateIntent(MakeSaga("saga-2", "intent-2"));
  STORE_ASSERT_OK(c);
  EXPECT_TRUE(c->created);
  EXPECT_EQ(2, proxy.Swallowed());
  EXPECT_EQ(2, store->Stats().resolved_committed);
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM journal WHERE saga_id = 'saga-2'"));
  EXPECT_EQ("2", raw.Text("SELECT COUNT(*) FROM sagas"));
}

TEST(PgStoreTest, UnknownCommitStillInProgressIsSettledByEndingTheOldBackend) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  PgUrlParts parts = db.Parts();
  CommitSwallowingProxy proxy(parts.host, parts.port);
  ASSERT_NE(0, proxy.Port());
  std::atomic<int> hook_calls{0};
  PgOptions options;
  options.url = proxy.Url(parts);
  options.before_commit_hook = [&](int) { hook_calls.fetch_add(1); };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  hook_calls = 0;

  // COMMIT never reaches the server and the old backend stays in its
  // transaction: txid_status says "in progress" until the store ends that
  // backend (it still runs that xid), which rolls the transaction back.
  proxy.Arm(CommitSwallowingProxy::Cut::kBeforeCommit);
  STORE_ASSERT_OK(store->Commit(Batch("saga-1", "b1", 3)));
  EXPECT_EQ(1, proxy.Swallowed());
  EXPECT_EQ(2, hook_calls.load());  // the first run, then its one retry
  PgStats stats = store->Stats();
  EXPECT_EQ(1, stats.commits_in_doubt);
  EXPECT_EQ(1, stats.resolved_aborted);
  EXPECT_EQ(0, stats.unresolved);
  EXPECT_EQ(1, stats.retries);
  EXPECT_EQ(3, CountEvents(*store, "saga-1", "b1"));
  Result<std::vector<EffectRecord>> f = store->ListEffects("saga-1");
  STORE_ASSERT_OK(f);
  EXPECT_EQ(1u, f->size());
}

TEST(PgStoreTest, UnknownCommitThatCannotBeResolvedIsUnavailable) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  PgUrlParts parts = db.Parts();
  auto proxy = std::make_unique<CommitSwallowingProxy>(parts.host, parts.port);
  ASSERT_NE(0, proxy->Port());
  PgOptions options;
  options.url = proxy->Url(parts);
  options.resolve_timeout_ms = 1000;
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("saga-1", "intent-1")));
  // The connection breaks after the server committed, and the server stays
  // unreachable: the proxy turns every new connection away.
  proxy->Arm(CommitSwallowingProxy::Cut::kAfterCommit);
  proxy->StopAccepting();
  Status s = store->Commit(Batch("saga-1", "b1", 1));
  EXPECT_EQ(Code::kUnavailable, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("may or may not have happened")) << s.message();
  EXPECT_EQ(1, store->Stats().unresolved);
  // It had committed; a direct look shows it once.
  RawDb raw(db.Url());
  EXPECT_EQ("1", raw.Text("SELECT COUNT(*) FROM journal WHERE event = 'b1-0'"));
}

// ---- Leases -------------------------------------------------------------------

// A fenced commit holds the saga's row until its COMMIT: a claim in the
// meantime skips the saga (ClaimSagas) or waits for the commit (ClaimSaga),
// so the epoch the commit checked stays the saga's epoch until it is durable.
TEST(PgStoreTest, ClaimsDoNotOvertakeAFencedCommitInFlight) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::atomic<bool> hold{false};
  std::mutex mu;
  std::condition_variable cv;
  bool in_commit = false;
  bool release = false;
  PgOptions options;
  options.url = db.Url();
  options.before_commit_hook = [&](int) {
    if (!hold.exchange(false)) return;
    std::unique_lock<std::mutex> lock(mu);
    in_commit = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("s", "intent-s")));
  Result<std::vector<Lease>> mine = store->ClaimSagas({"pending"}, "w1", 1, 1);
  STORE_ASSERT_OK(mine);
  ASSERT_EQ(1u, mine->size());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // expired

  hold = true;
  WriteBatch fenced = Batch("s", "w1", 1);
  fenced.fence_epoch = (*mine)[0].epoch;
  Status committed;
  std::thread writer([&] { committed = store->Commit(fenced); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_commit; });
  }
  // The commit checked the epoch and holds the row: the expired lease cannot
  // be taken over under it.
  Result<std::vector<Lease>> skipped = store->ClaimSagas({"pending", "running"}, "w2", 60'000, 5);
  STORE_ASSERT_OK(skipped);
  EXPECT_TRUE(skipped->empty());
  Result<Lease> waited = Status::Internal("not run");
  std::thread claimer([&] { waited = store->ClaimSaga("s", "w2", 60'000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  writer.join();
  claimer.join();
  STORE_EXPECT_OK(committed);
  STORE_ASSERT_OK(waited);
  EXPECT_EQ((*mine)[0].epoch + 1, waited->epoch);
  EXPECT_EQ(1, CountEvents(*store, "s", "w1"));
  // From now on w1 is fenced.
  EXPECT_EQ(Code::kAborted, store->Commit(fenced).code());
  EXPECT_EQ(1, CountEvents(*store, "s", "w1"));
}

// ---- Group commit ---------------------------------------------------------------

/// The group commit scenario: `kBatches` sagas, and one Commit per saga from
/// as many threads at once. Three of the batches are bad, each in its own
/// way: batch 1 reuses an effect key already recorded (kConflict), batch 2 is
/// fenced on a lost lease (kAborted), batch 3 names a missing saga
/// (kNotFound). A lead commit (to saga "lead") goes first and its hook waits
/// until the others are queued up behind it, so that they form one group.
class GroupCommitScenario {
 public:
  static constexpr int kBatches = 32;

  /// `on_hook(n, pid)` is called for the n-th write transaction (from 1) of
  /// the concurrent phase, right before its COMMIT.
  /// One group in flight at a time, so that the 32 queue behind the lead
  /// batch (PgStoreTest.TwoGroupsAreInFlightAtOnce has two).
  explicit GroupCommitScenario(
      std::string url, const std::function<void(int, int)>& on_hook = [](int, int) {},
      bool group_commit = true) {
    PgOptions options;
    options.url = std::move(url);
    options.group_commit = group_commit;
    options.group_commit_leaders = 1;
    options.before_commit_hook = [this, on_hook, group_commit](int pid) {
      if (!armed_.load()) return;
      const int n = hook_calls_.fetch_add(1) + 1;
      if (n == 1 && group_commit) {
        // The lead batch's transaction: wait until all the others queued.
        for (int i = 0; i < 10'000 && store_->Stats().commits_queued < kBatches; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      on_hook(n, pid);
    };
    store_ = MustOpen(options);
    if (store_ == nullptr) return;
    EXPECT_TRUE(store_->CreateIntent(MakeSaga("lead", "intent-lead")).ok());
    for (int t = 0; t < kBatches; ++t) {
      if (t == 3) continue;
      const std::string id = Id(t);
      EXPECT_TRUE(store_->CreateIntent(MakeSaga(id, "intent-" + id)).ok());
    }
    WriteBatch taken;
    taken.saga_id = Id(0);
    taken.effects = {MakeEffect(Id(0), "step0", "taken-key", 1)};
    EXPECT_OK(store_->Commit(taken));
    Result<Lease> lease = store_->ClaimSaga(Id(2), "w", 60'000);
    EXPECT_OK(lease);
    if (lease.ok()) lost_epoch_ = lease->epoch + 1;
  }

  static std::string Id(int t) { return t == 3 ? "ghost" : "saga-" + std::to_string(t); }

  PgStore* Store() { return store_.get(); }

  /// Runs the concurrent phase; returns each batch's status.
  std::vector<Status> Run() {
    before_ = store_->Stats();
    armed_ = true;
    Status lead;
    std::thread leader([this, &lead] { lead = store_->Commit(Batch("lead", "lead", 1)); });
    while (hook_calls_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<Status> results(kBatches);
    std::vector<std::thread> threads;
    threads.reserve(kBatches);
    for (int t = 0; t < kBatches; ++t) {
      threads.emplace_back([this, t, &results] {
        WriteBatch w = Batch(Id(t), "group", 2);
        if (t == 1) w.effects = {MakeEffect(Id(t), "step0", "taken-key", 2000)};
        if (t == 2) w.fence_epoch = lost_epoch_;
        results[t] = store_->Commit(w);
      });
    }
    for (std::thread& th : threads) th.join();
    leader.join();
    EXPECT_OK(lead);
    armed_ = false;
    return results;
  }

  int HookCalls() const { return hook_calls_.load(); }
  /// The Stats() counters of the concurrent phase alone.
  int64_t Transactions() const {
    return store_->Stats().commit_transactions - before_.commit_transactions;
  }
  int64_t Batches() const { return store_->Stats().commit_batches - before_.commit_batches; }

  /// Every good batch landed exactly once; the bad ones wrote nothing.
  void ExpectLandedOnce(const std::vector<Status>& results, const std::string& url) {
    EXPECT_EQ(Code::kConflict, results[1].code()) << results[1].ToString();
    EXPECT_EQ(Code::kAborted, results[2].code()) << results[2].ToString();
    EXPECT_NE(std::string::npos, results[2].message().find("lease lost")) << results[2].message();
    EXPECT_EQ(Code::kNotFound, results[3].code()) << results[3].ToString();
    RawDb raw(url);
    for (int t = 0; t < kBatches; ++t) {
      if (t == 3) continue;
      SCOPED_TRACE(Id(t));
      const bool good = t < 1 || t > 3;
      if (good) {
        EXPECT_TRUE(results[t].ok()) << results[t].ToString();
      }
      EXPECT_EQ(good ? 2 : 0, CountEvents(*store_, Id(t), "group"));
      Result<SagaRecord> rec = store_->LoadSaga(Id(t));
      ASSERT_OK(rec);
      EXPECT_EQ(good ? "running" : "pending", rec->summary.state);
    }
    // The good ones, "taken-key" and the lead batch's.
    EXPECT_EQ(std::to_string(kBatches - 3 + 2), raw.Text("SELECT COUNT(*) FROM effects"));
    EXPECT_EQ(std::to_string(2 * (kBatches - 3)),
              raw.Text("SELECT COUNT(*) FROM journal WHERE event LIKE 'group-%'"));
  }

 private:
  std::unique_ptr<PgStore> store_;
  std::atomic<bool> armed_{false};
  std::atomic<int> hook_calls_{0};
  int64_t lost_epoch_ = 0;
  PgStats before_;
};

TEST(PgStoreTest, GroupCommitSharesTransactionsAndFailsBatchesAlone) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  GroupCommitScenario scenario(db.Url());
  ASSERT_NE(scenario.Store(), nullptr);
  std::vector<Status> results = scenario.Run();
  ASSERT_NO_FATAL_FAILURE(scenario.ExpectLandedOnce(results, db.Url()));
  // The lead batch alone, then the 32 others together.
  EXPECT_EQ(GroupCommitScenario::kBatches + 1, scenario.Batches());
  EXPECT_EQ(2, scenario.Transactions());
  EXPECT_EQ(GroupCommitScenario::kBatches, scenario.Store()->Stats().largest_group);
  EXPECT_EQ(0, scenario.Store()->Stats().retries);
  // The one-round-trip write met the refused batches, and the group was
  // written again batch by batch.
  EXPECT_EQ(1, scenario.Store()->Stats().group_fallbacks);
  std::cout << "[ figures  ] PostgreSQL: " << GroupCommitScenario::kBatches + 1
            << " concurrent commits took " << scenario.Transactions()
            << " transactions (largest group " << scenario.Store()->Stats().largest_group << ")\n";
}

// With two leaders (the default), a group commits while another group's
// transaction is still open: the lead batch's COMMIT is held until a second
// batch has committed beside it, and both land.
TEST(PgStoreTest, TwoGroupsAreInFlightAtOnce) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::atomic<bool> armed{false};
  std::atomic<bool> second_done{false};
  std::atomic<bool> lead_waited{false};
  PgOptions options;
  options.url = db.Url();
  ASSERT_EQ(options.group_commit_leaders, 2);
  options.before_commit_hook = [&](int) {
    if (!armed.exchange(false)) return;  // the lead batch's transaction only
    for (int i = 0; i < 10'000 && !second_done.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    lead_waited = second_done.load();
  };
  auto store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateIntent(MakeSaga("s-lead", "intent-s-lead")));
  ASSERT_OK(store->CreateIntent(MakeSaga("s-other", "intent-s-other")));
  armed = true;
  Status lead;
  std::thread leader([&] { lead = store->Commit(Batch("s-lead", "lead", 1)); });
  while (armed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The lead's transaction is open and waits in its hook: this one is a
  // second group.
  ASSERT_OK(store->Commit(Batch("s-other", "other", 1)));
  second_done = true;
  leader.join();
  ASSERT_OK(lead);
  EXPECT_TRUE(lead_waited.load()) << "the second group committed only after the first";
  EXPECT_EQ(CountEvents(*store, "s-lead", "lead"), 1);
  EXPECT_EQ(CountEvents(*store, "s-other", "other"), 1);
  EXPECT_EQ(store->Stats().largest_group, 1);
}

// A group where every batch goes through is written in one round trip and
// never falls back; each batch lands once, with its state and effect.
TEST(PgStoreTest, ACleanGroupIsWrittenInOneRoundTrip) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  constexpr int kSagas = 12;
  std::atomic<bool> armed{false};
  std::atomic<int> hook_calls{0};
  PgStore* raw_store = nullptr;
  PgOptions options;
  options.url = db.Url();
  options.group_commit_leaders = 1;  // every batch queues behind the lead one
  options.before_commit_hook = [&](int) {
    if (!armed.load() || hook_calls.fetch_add(1) != 0) return;
    for (int i = 0; i < 10'000 && raw_store->Stats().commits_queued < kSagas; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  raw_store = store.get();
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("lead", "intent-lead")));
  for (int t = 0; t < kSagas; ++t) {
    const std::string id = "saga-" + std::to_string(t);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga(id, "intent-" + id)));
  }
  armed = true;
  Status lead;
  std::thread leader([&] { lead = store->Commit(Batch("lead", "lead", 1)); });
  while (hook_calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const PgStats before = store->Stats();
  std::vector<Status> results(kSagas);
  std::vector<std::thread> threads;
  for (int t = 0; t < kSagas; ++t) {
    threads.emplace_back(
        [&, t] { results[t] = store->Commit(Batch("saga-" + std::to_string(t), "clean", 2)); });
  }
  for (std::thread& th : threads) th.join();
  leader.join();
  STORE_ASSERT_OK(lead);
  EXPECT_EQ(kSagas, store->Stats().largest_group);
  EXPECT_EQ(0, store->Stats().group_fallbacks);
  EXPECT_EQ(1, store->Stats().commit_transactions - before.commit_transactions)
      << "the group's one transaction (the lead's had begun before)";
  for (int t = 0; t < kSagas; ++t) {
    const std::string id = "saga-" + std::to_string(t);
    STORE_EXPECT_OK(results[t]);
    EXPECT_EQ(2, CountEvents(*store, id, "clean")) << id;
    auto rec = store->LoadSaga(id);
    STORE_ASSERT_OK(rec);
    EXPECT_EQ("running", rec->summary.state);
    auto effects = store->ListEffects(id);
    STORE_ASSERT_OK(effects);
    EXPECT_EQ(1u, effects->size()) << id;
  }
}

// CommitReadingControl on PostgreSQL: the control request is read by one more
// statement of the write's own pipeline, alone or in a clean group (one
// transaction for the group, no fallback), after the writes; a group that
// falls back to a savepoint per batch reads nothing, and a refused batch
// reads nothing.
TEST(PgStoreTest, CommitReadingControlReadsInTheWritesPipeline) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  constexpr int kSagas = 12;
  std::atomic<bool> armed{false};
  std::atomic<int> hook_calls{0};
  PgStore* raw_store = nullptr;
  PgOptions options;
  options.url = db.Url();
  options.group_commit_leaders = 1;  // every batch queues behind the lead one
  options.before_commit_hook = [&](int) {
    if (!armed.load() || hook_calls.fetch_add(1) != 0) return;
    for (int i = 0; i < 10'000 && raw_store->Stats().commits_queued < kSagas; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  raw_store = store.get();
  auto id = [](int t) { return "saga-" + std::to_string(t); };
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("lead", "intent-lead")));
  for (int t = 0; t < kSagas; ++t) {
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga(id(t), "intent-" + id(t))));
    if (t % 2 == 0) {
      STORE_ASSERT_OK(store->RequestControl(
          conformance::MakeControl(id(t), "pause", "rq-" + std::to_string(t), 100 + t)));
    }
  }

  // Alone: the lead batch's saga has no request; saga-0's is read.
  ControlReadback alone;
  STORE_ASSERT_OK(store->CommitReadingControl(Batch("lead", "alone", 1), &alone));
  EXPECT_TRUE(alone.read);
  EXPECT_FALSE(alone.pending.has_value());
  STORE_ASSERT_OK(store->CommitReadingControl(Batch(id(0), "alone", 1), &alone));
  EXPECT_TRUE(alone.read);
  ASSERT_TRUE(alone.pending.has_value());
  EXPECT_EQ("rq-0", alone.pending->request_id);

  // A clean group: every batch's request read with it.
  auto run_group = [&](const std::string& tag, int refused, std::vector<Status>* results,
                       std::vector<ControlReadback>* backs) {
    hook_calls = 0;
    armed = true;
    Status lead;
    std::thread leader([&] { lead = store->Commit(Batch("lead", tag, 1)); });
    while (hook_calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<std::thread> threads;
    for (int t = 0; t < kSagas; ++t) {
      threads.emplace_back([&, t] {
        WriteBatch b = Batch(id(t), tag, 2);
        if (t == refused) b.fence_epoch = 99;  // no lease was ever taken: refused
        (*backs)[t].read = true;               // stale: the call sets it
        (*results)[t] = store->CommitReadingControl(b, &(*backs)[t]);
      });
    }
    for (std::thread& th : threads) th.join();
    leader.join();
    armed = false;
    STORE_EXPECT_OK(lead);
  };
  PgStats before = store->Stats();
  std::vector<Status> results(kSagas);
  std::vector<ControlReadback> backs(kSagas);
  run_group("clean", -1, &results, &backs);
  EXPECT_EQ(kSagas, store->Stats().largest_group);
  EXPECT_EQ(0, store->Stats().group_fallbacks - before.group_fallbacks);
  // The lead batch's transaction, then the group's.
  EXPECT_EQ(2, store->Stats().commit_transactions - before.commit_transactions);
  for (int t = 0; t < kSagas; ++t) {
    SCOPED_TRACE(id(t));
    STORE_EXPECT_OK(results[t]);
    EXPECT_EQ(2, CountEvents(*store, id(t), "clean"));
    EXPECT_TRUE(backs[t].read);
    ASSERT_EQ(t % 2 == 0, backs[t].pending.has_value());
    if (t % 2 == 0) {
      EXPECT_EQ("rq-" + std::to_string(t), backs[t].pending->request_id);
      EXPECT_EQ("pause", backs[t].pending->kind);
      EXPECT_EQ(100 + t, backs[t].pending->requested_ms);
    }
  }

  // A group with a refused batch falls back: each batch is told its own
  // status, and nothing is read.
  before = store->Stats();
  run_group("mixed", 5, &results, &backs);
  EXPECT_EQ(1, store->Stats().group_fallbacks - before.group_fallbacks);
  for (int t = 0; t < kSagas; ++t) {
    SCOPED_TRACE(id(t));
    if (t == 5) {
      EXPECT_EQ(Code::kAborted, results[t].code()) << results[t].ToString();
      EXPECT_EQ(0, CountEvents(*store, id(t), "mixed"));
    } else {
      STORE_EXPECT_OK(results[t]);
      EXPECT_EQ(2, CountEvents(*store, id(t), "mixed"));
    }
    EXPECT_FALSE(backs[t].read);
    EXPECT_FALSE(backs[t].pending.has_value());
  }
}

TEST(PgStoreTest, GroupCommitCanBeSwitchedOff) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  GroupCommitScenario scenario(
      db.Url(), [](int, int) {}, /*group_commit=*/false);
  ASSERT_NE(scenario.Store(), nullptr);
  std::vector<Status> results = scenario.Run();
  ASSERT_NO_FATAL_FAILURE(scenario.ExpectLandedOnce(results, db.Url()));
  EXPECT_EQ(GroupCommitScenario::kBatches + 1, scenario.Transactions());
  EXPECT_EQ(1, scenario.Store()->Stats().largest_group);
}

// The group's COMMIT is lost on the wire after the server ran it: the
// outcome is resolved once for the whole group, nothing runs again, and each
// caller gets the status its batch had in the committed transaction.
TEST(PgStoreTest, GroupCommitInDoubtThatCommittedIsNotRepeated) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  PgUrlParts parts = db.Parts();
  CommitSwallowingProxy proxy(parts.host, parts.port);
  ASSERT_NE(0, proxy.Port());
  GroupCommitScenario scenario(proxy.Url(parts), [&](int n, int) {
    if (n == 2) proxy.Arm(CommitSwallowingProxy::Cut::kAfterCommit);  // the group's
  });
  ASSERT_NE(scenario.Store(), nullptr);
  std::vector<Status> results = scenario.Run();
  EXPECT_EQ(1, proxy.Swallowed());
  EXPECT_EQ(2, scenario.HookCalls());  // the lead batch, then the group, once
  PgStats stats = scenario.Store()->Stats();
  EXPECT_EQ(1, stats.commits_in_doubt);
  EXPECT_EQ(1, stats.resolved_committed);
  EXPECT_EQ(0, stats.resolved_aborted);
  EXPECT_EQ(GroupCommitScenario::kBatches, stats.largest_group);
  ASSERT_NO_FATAL_FAILURE(scenario.ExpectLandedOnce(results, db.Url()));
}

// The connection of the group's transaction dies right before COMMIT: the
// outcome is resolved as aborted and the whole group runs again, once.
TEST(PgStoreTest, GroupCommitInDoubtThatAbortedRunsTheGroupAgain) {
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  RawDb killer(db.Url());
  GroupCommitScenario scenario(db.Url(), [&](int n, int pid) {
    if (n == 2) killer.Terminate(pid);
  });
  ASSERT_NE(scenario.Store(), nullptr);
  std::vector<Status> results = scenario.Run();
  EXPECT_EQ(3, scenario.HookCalls());  // the lead batch, the group, its one retry
  EXPECT_EQ(3, scenario.Transactions());
  PgStats stats = scenario.Store()->Stats();
  EXPECT_EQ(GroupCommitScenario::kBatches, stats.largest_group);
  EXPECT_EQ(1, stats.commits_in_doubt);
  EXPECT_EQ(1, stats.resolved_aborted);
  EXPECT_EQ(1, stats.retries);
  ASSERT_NO_FATAL_FAILURE(scenario.ExpectLandedOnce(results, db.Url()));
}

// A batch's statements go out together, so those after a refused fence ran
// (and were rolled back): their own errors must not mask why the batch was
// refused, and the connection must come back clean. With and without group
// commit (savepoint or whole transaction undone).
TEST(PgStoreTest, FencedOutBatchReportsTheFenceNotTheErrorsAfterIt) {
  for (bool group : {false, true}) {
    SCOPED_TRACE(group ? "group commit" : "plain");
    PgTestDatabase db;
    ASSERT_DB_OK(db);
    PgOptions options;
    options.url = db.Url();
    options.group_commit = group;
    options.pool_size = 1;  // the next call reuses the connection
    std::unique_ptr<PgStore> store = MustOpen(options);
    ASSERT_NE(store, nullptr);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga("s", "intent-s")));
    Result<Lease> lease = store->ClaimSaga("s", "w1", 60'000);
    STORE_ASSERT_OK(lease);
    WriteBatch first = Batch("s", "first", 1);
    first.fence_epoch = lease->epoch;
    STORE_ASSERT_OK(store->Commit(first));

    // Stale epoch, and an effect key already taken after the fenced UPDATE.
    WriteBatch stale = Batch("s", "stale", 2);
    stale.effects = first.effects;
    stale.fence_epoch = lease->epoch + 1;
    Status st = store->Commit(stale);
    EXPECT_EQ(Code::kAborted, st.code()) << st.ToString();
    EXPECT_NE(std::string::npos, st.message().find("lease lost")) << st.message();
    // Without a new state: the row lock's epoch decides, same answer.
    stale.saga_state.reset();
    st = store->Commit(stale);
    EXPECT_EQ(Code::kAborted, st.code()) << st.ToString();
    // A missing saga whose steps break a foreign key: kNotFound.
    WriteBatch ghost = Batch("ghost", "ghost", 1);
    ghost.steps = {StepRecord{}};
    ghost.steps[0].saga_id = "ghost";
    ghost.steps[0].step_id = "x";
    ghost.steps[0].step_key = "ghost-key";
    ghost.steps[0].state = "pending";
    ghost.steps[0].tool = "t";
    st = store->Commit(ghost);
    EXPECT_EQ(Code::kNotFound, st.code()) << st.ToString();

    EXPECT_EQ(0, CountEvents(*store, "s", "stale"));
    // The connection is clean: the holder writes on.
    WriteBatch next = Batch("s", "next", 1);
    next.effects = {MakeEffect("s", "step0", "s/next-key", 3000)};
    next.fence_epoch = lease->epoch;
    STORE_EXPECT_OK(store->Commit(next));
    EXPECT_EQ(1, CountEvents(*store, "s", "next"));
    EXPECT_EQ(0, store->Stats().connections_discarded);
  }
}

// Batches that give their leases up, in one group: each release is its own
// batch's (rolled back with it), the stale one releases nothing, and a batch
// without a new state releases too.
TEST(PgStoreTest, GroupCommitReleasesEachBatchsLeaseAlone) {
  constexpr int kSagas = 4;
  PgTestDatabase db;
  ASSERT_DB_OK(db);
  std::atomic<bool> armed{false};
  std::atomic<int> hook_calls{0};
  PgStore* raw_store = nullptr;
  PgOptions options;
  options.url = db.Url();
  options.group_commit = true;
  options.group_commit_leaders = 1;  // every batch queues behind the lead one
  options.before_commit_hook = [&](int) {
    if (!armed.load() || hook_calls.fetch_add(1) != 0) return;
    for (int i = 0; i < 10'000 && raw_store->Stats().commits_queued < kSagas; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::unique_ptr<PgStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  raw_store = store.get();
  STORE_ASSERT_OK(store->CreateIntent(MakeSaga("lead", "intent-lead")));
  std::vector<Lease> leases;
  for (int t = 0; t < kSagas; ++t) {
    const std::string id = "saga-" + std::to_string(t);
    STORE_ASSERT_OK(store->CreateIntent(MakeSaga(id, "intent-" + id)));
    Result<Lease> lease = store->ClaimSaga(id, "w1", 60'000);
    STORE_ASSERT_OK(lease);
    leases.push_back(*lease);
  }
  armed = true;
  Status lead;
  std::thread leader([&] { lead = store->Commit(Batch("lead", "lead", 1)); });
  while (hook_calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<Status> results(kSagas);
  std::vector<std::thread> threads;
  for (int t = 0; t < kSagas; ++t) {
    threads.emplace_back([&, t] {
      WriteBatch w = Batch(leases[t].saga_id, "rel", 1);
      w.effects.clear();
      if (t == 3) w.saga_state.reset();  // no new state: the release stands alone
      w.fence_epoch = t == 1 ? leases[t].epoch + 5 : leases[t].epoch;  // 1: stale
      w.release_lease = true;
      results[t] = store->Commit(w);
    });
  }
  for (std::thread& th : threads) th.join();
  leader.join();
  armed = false;
  STORE_EXPECT_OK(lead);
  EXPECT_EQ(kSagas, store->Stats().largest_group);
  for (int t = 0; t < kSagas; ++t) {
    SCOPED_TRACE(leases[t].saga_id);
    const bool good = t != 1;
    EXPECT_EQ(good ? Code::kOk : Code::kAborted, results[t].code()) << results[t].ToString();
    EXPECT_EQ(good ? 1 : 0, CountEvents(*store, leases[t].saga_id, "rel"));
    Result<Lease> next = store->ClaimSaga(leases[t].saga_id, "w2", 60'000);
    if (good) {
      STORE_ASSERT_OK(next);
      EXPECT_EQ(leases[t].epoch + 1, next->epoch);
    } else {
      EXPECT_EQ(Code::kAborted, next.status().code()) << next.status().ToString();
    }
  }
}

TEST(PgStoreTest, GroupCommitFiguresWithAndWithout) {
  constexpr int kThreads = 16;
  constexpr int kCommits = 20;
  for (bool group : {false, true}) {
    PgTestDatabase db;
    ASSERT_DB_OK(db);
    PgOptions options;
    options.url = db.Url();
    options.group_commit = group;
    std::unique_ptr<PgStore> store = MustOpen(options);
    ASSERT_NE(store, nullptr);
    for (int t = 0; t < kThreads; ++t) {
      STORE_ASSERT_OK(store->CreateIntent(
          MakeSaga("saga-" + std::to_string(t), "intent-" + std::to_string(t))));
    }
    const PgStats before = store->Stats();
    std::atomic<int> failures{0};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string id = "saga-" + std::to_string(t);
        for (int i = 0; i < kCommits; ++i) {
          if (!store->Commit(Batch(id, "c" + std::to_string(i), 1)).ok()) failures.fetch_add(1);
        }
      });
    }
    for (std::thread& th : threads) th.join();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(0, failures.load());
    const PgStats after = store->Stats();
    const int64_t tx = after.commit_transactions - before.commit_transactions;
    EXPECT_EQ(kThreads * kCommits, after.commit_batches - before.commit_batches);
    if (!group) {
      EXPECT_EQ(kThreads * kCommits, tx);
    }
    std::cout << "[ figures  ] PostgreSQL group_commit=" << group << ": " << kThreads * kCommits
              << " commits from " << kThreads << " threads in " << tx
              << " transactions (largest group " << after.largest_group << "), "
              << static_cast<int>(ms) << " ms\n";
    RawDb raw(db.Url());
    EXPECT_EQ(std::to_string(kThreads * kCommits), raw.Text("SELECT COUNT(*) FROM effects"));
  }
}

}  // namespace
}  // namespace idem::storage
