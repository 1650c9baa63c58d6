#pragma once
// SqliteStore: the embedded Store, one SQLite database file.
//
// Durability: the database runs in WAL journal mode with synchronous=FULL
// (by default), so a Commit that returned OK has been fsync'ed to the WAL and
// survives a crash of the process or of the machine. Nothing is cached in
// memory: every read goes to the database, every write is a transaction.
// Open refuses a database that cannot run in WAL mode (":memory:" included).
//
// Schema: versioned migrations, each applied in its own transaction and
// recorded in `schema_migrations`. Open applies the pending ones; a database
// whose version is newer than this build knows is refused (kFailedPrecondition)
// rather than written to by older code. The journal table is append-only:
// triggers abort any UPDATE or DELETE of its rows.
//
// Thread safety: one connection guarded by a mutex; every method may be called
// from several threads at once, and they run one at a time. Several processes
// (or several SqliteStore objects) may open the same file: writes take the
// database write lock at BEGIN (BEGIN IMMEDIATE) and wait up to
// `busy_timeout_ms` for it, then fail with kUnavailable.
//
// Errors: as in store.h. SQLITE_BUSY / SQLITE_LOCKED map to kUnavailable, other
// SQLite failures to kInternal carrying SQLite's message. No exception leaves
// a method of this class.

#include <memory>
#include <mutex>
#include <string>

#include "storage/store.h"

namespace SQLite {  // NOLINT(readability-identifier-naming): SQLiteCpp's name
class Database;
}  // namespace SQLite

namespace idem::storage {

struct SqliteOptions {
  /// The database file; created if absent. ":memory:" and "" are refused.
  std::string path;
  /// PRAGMA synchronous: "OFF", "NORMAL", "FULL" or "EXTRA" (any case).
  /// Only FULL and EXTRA keep a commit through a power loss.
  std::string synchronous = "FULL";
  /// How long a write waits for another connection's lock before kUnavailable.
  int busy_timeout_ms = 5000;
};

/// The settings a connection actually runs with, read back from SQLite.
struct SqliteSettings {
  std::string journal_mode;  ///< "wal"
  std::string synchronous;   ///< "OFF", "NORMAL", "FULL" or "EXTRA"
  bool foreign_keys = false;
  int busy_timeout_ms = 0;
};

class SqliteStore : public Store {
 public:
  /// Opens (creating if needed) the database at `options.path`, checks that it
  /// runs in WAL mode and applies pending migrations.
  /// kInvalidArgument: bad options. kFailedPrecondition: not in WAL mode, or
  /// the schema is newer than this build. kUnavailable: the database is locked
  /// by another connection for longer than the busy timeout.
  static Result<std::unique_ptr<SqliteStore>> Open(const SqliteOptions& options);

  /// The schema version this build migrates databases to.
  static int LatestSchemaVersion();

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;
  SqliteStore(SqliteStore&&) = delete;
  SqliteStore& operator=(SqliteStore&&) = delete;

  Result<CreateOutcome> CreateIntent(const NewSaga& saga) override;
  Result<SagaRecord> LoadSaga(const std::string& saga_id) override;
  Status Commit(const WriteBatch& batch) override;
  Result<std::vector<SagaSummary>> ListSagas(const SagaFilter& filter) override;
  Result<std::vector<JournalEntry>> ReadJournal(const std::string& saga_id) override;
  Result<std::vector<EffectRecord>> ListEffects(const std::string& saga_id) override;
  int SchemaVersion() override;

  /// The PRAGMA values of this store's connection (for diagnostics and tests).
  Result<SqliteSettings> EffectiveSettings();

 private:
  SqliteStore(std::unique_ptr<SQLite::Database> db, int schema_version);

  std::mutex mu_;
  std::unique_ptr<SQLite::Database> db_;  // GUARDED_BY(mu_)
  const int schema_version_;
};

}  // namespace idem::storage
