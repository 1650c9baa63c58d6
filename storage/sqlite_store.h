#pragma once
// SqliteStore: the embedded Store, one SQLite database file.
//
// Durability: the database runs in WAL journal mode with synchronous=FULL
// (by default), so a Commit that returned OK has been fsync'ed to the WAL and
// survives a crash of the process or of the machine. Nothing is cached in
// memory: every read goes to the database, every write is a transaction.
// Open refuses a database that cannot run in WAL mode (":memory:" included).
//
// Schema: versioned migrations (storage/migrations/sqlite/, embedded in the
// build), each applied in its own transaction and recorded in
// `schema_migrations`. Open applies the pending ones; a database whose version
// is newer than this build knows is refused (kFailedPrecondition) rather than
// written to by older code. The journal and effects tables are append-only:
// triggers abort any UPDATE or DELETE of their rows.
//
// Leases: expiry is judged by `SqliteOptions::clock` (the process clock by
// default); see Store for the contract. ClaimSagas and ClaimSaga:
// kInvalidArgument for no states, an empty owner, lease_ms <= 0 or limit <= 0.
// Release keeps the owner and epoch and sets the expiry to 0, so that the saga
// is claimable at once. Fencing: a batch with a fence_epoch commits only
// while the saga's lease epoch still equals it. Only the epoch decides: a
// lease that expired but was not claimed again still lets its holder write
// (and renew), since nobody else can have written in between.
//
// Group commit (`group_commit`, on by default; storage/group_commit.h): Commit
// calls and CreateIntent calls for a new intent key that arrive while another
// is writing queue up, and the next writer runs up to `max_group_batches` of
// them in one transaction, each batch inside its own SAVEPOINT, so that one
// batch's failure (kConflict, kAborted, kNotFound) rolls back that batch
// alone. One COMMIT, so one WAL fsync, for the group; every caller returns
// only after that COMMIT, with its own batch's status. A failure of the
// transaction itself (a busy or broken database, any SQLite error other than
// a constraint violation) fails every batch of the group, and nothing of any
// of them is written.
//
// Thread safety: every method may be called from several threads at once.
// Two connections: writes (Commit, CreateIntent of a new key, the lease
// calls) go through one, guarded by a mutex, so they run one at a time; reads
// (LoadSaga, ListSagas, ReadJournal, ListEffects, and the look-up that
// answers a known intent key) through a second, query_only one with its own
// mutex, so that they run beside the writer's fsync (WAL gives each read its
// snapshot; a read after a commit sees it). Each connection's prepared
// statements are kept (keyed by their SQL text) and reused under its mutex;
// each is reset, its bindings cleared, as soon as a call is done with it, so
// that no statement keeps a read snapshot open between calls. Several
// processes (or several SqliteStore objects) may open the same file: writes
// take the database write lock at BEGIN (BEGIN IMMEDIATE) and wait up to
// `busy_timeout_ms` for it, then fail with kUnavailable.
//
// High-water mark (`high_water_mark`, on by default;
// storage/high_water_mark.h): `<db>.hwm` records the highest journal seq
// committed; Open checks the journal against it, and a journal found behind
// it (a WAL lost or truncated, an earlier copy restored) refuses every write
// with kFailedPrecondition: a regression (JournalIntegrity) until AcceptRegression. Each commit
// rewrites the mark without an fsync; it is synced every
// HighWaterMark::kSyncEvery commits and at close.
//
// Errors: as in store.h. SQLITE_BUSY / SQLITE_LOCKED map to kUnavailable, other
// SQLite failures to kInternal carrying SQLite's message. No exception leaves
// a method of this class.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/control_store.h"
#include "storage/group_commit.h"
#include "storage/server_state.h"
#include "storage/store.h"

#include "common/clock.h"

namespace SQLite {  // NOLINT(readability-identifier-naming): SQLiteCpp's name
class Database;
}  // namespace SQLite

namespace idem::storage {

namespace sqlite_internal {
class StatementCache;  // sqlite_store.cc
}  // namespace sqlite_internal

class HighWaterMark;  // storage/high_water_mark.h

struct SqliteOptions {
  /// The database file; created if absent. ":memory:" and "" are refused.
  std::string path;
  /// PRAGMA synchronous: "OFF", "NORMAL", "FULL" or "EXTRA" (any case).
  /// Only FULL and EXTRA keep a commit through a power loss.
  std::string synchronous = "FULL";
  /// How long a write waits for another connection's lock before kUnavailable.
  int busy_timeout_ms = 5000;
  /// The clock that judges leases and stamps times the caller did not give;
  /// nullptr: SystemClock::Get(). Not owned; must outlive the store.
  Clock* clock = nullptr;
  /// Concurrent Commit (and new-intent CreateIntent) calls share
  /// transactions (see above).
  bool group_commit = true;
  /// Most batches in one group transaction (>= 1).
  int max_group_batches = 64;
  /// Keep and check `<path>.hwm` (see above).
  bool high_water_mark = true;
  /// With synchronous FULL or EXTRA, a commit's WAL frames go to the file in
  /// one write (storage/sqlite_wal_vfs.h); false: SQLite's two per frame
  /// (for comparison: make bench measures both).
  bool gather_wal_writes = true;
  /// The page size of a database this open creates (a power of two from
  /// 512 to 65536; 0: SQLite's default, 4096). A file that exists keeps the
  /// size it was made with. 1024 by default: a commit writes every page it
  /// touches whole to the WAL, and a step's commit touches a page or two of
  /// each of a dozen tables and indexes for a few hundred bytes of rows, so
  /// smaller pages write 2.7x fewer WAL bytes per step (make bench,
  /// docs/bench.md) for B-trees one level deeper.
  int page_size = 1024;
};

/// Counters of Commit, for tests and diagnostics.
struct SqliteStats {
  int64_t commit_batches = 0;       ///< WriteBatches run in a transaction
  int64_t commit_transactions = 0;  ///< transactions Commit began
  int64_t largest_group = 0;        ///< most batches in one transaction
};

/// The settings a connection actually runs with, read back from SQLite.
struct SqliteSettings {
  std::string journal_mode;  ///< "wal"
  std::string synchronous;   ///< "OFF", "NORMAL", "FULL" or "EXTRA"
  bool foreign_keys = false;
  int busy_timeout_ms = 0;
};

class SqliteStore : public Store, public KeyRecordStore, public SpecStore, public ControlStore {
 public:
  /// Opens (creating if needed) the database at `options.path`, checks that it
  /// runs in WAL mode and applies pending migrations.
  /// kInvalidArgument: bad options. kFailedPrecondition: not in WAL mode, or
  /// the schema is newer than this build. kUnavailable: the database is locked
  /// by another connection for longer than the busy timeout.
  static Result<std::unique_ptr<SqliteStore>> Open(const SqliteOptions& options);

  /// The schema version this build migrates databases to.
  static int LatestSchemaVersion();
  /// How many versions up to it this build has (less while a parallel
  /// branch's migration is not merged): the rows of schema_migrations.
  static int KnownSchemaVersions();

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;
  SqliteStore(SqliteStore&&) = delete;
  SqliteStore& operator=(SqliteStore&&) = delete;

  Result<CreateOutcome> CreateIntent(const NewSaga& saga) override;
  Result<std::optional<CreateOutcome>> FindIntent(const NewSaga& saga) override;
  Result<SagaRecord> LoadSaga(const std::string& saga_id) override;
  Status Commit(const WriteBatch& batch) override;
  Result<std::vector<SagaSummary>> ListSagas(const SagaFilter& filter) override;
  Result<std::vector<JournalEntry>> ReadJournal(const std::string& saga_id) override;
  Result<std::vector<EffectRecord>> ListEffects(const std::string& saga_id) override;
  Result<StoreGauges> ReadGauges(const GaugeQuery& query) override;
  int SchemaVersion() override;
  Result<std::vector<Lease>> ClaimSagas(const std::vector<std::string>& states,
                                        const std::string& owner, int64_t lease_ms,
                                        int limit) override;
  /// Also claims a saga whose live lease `owner` itself holds, with a new
  /// epoch (an owner restarted under the same name fences its old writes).
  Result<Lease> ClaimSaga(const std::string& saga_id, const std::string& owner,
                          int64_t lease_ms) override;
  Status RenewLease(const Lease& lease, int64_t lease_ms) override;
  Status ReleaseLease(const Lease& lease) override;

  KeyRecordStore* KeyRecords() override { return this; }
  SpecStore* Specs() override { return this; }
  ControlStore* Controls() override { return this; }

  Status JournalIntegrity() override;
  Status AcceptRegression(const std::string& who, const std::string& reason) override;
  /// The high-water mark's file, or "" without one.
  std::string HighWaterMarkPath() const;

  // Server state (storage/server_state.h; storage/sqlite_server_state.cc):
  // each call is one transaction on the write connection (a claim and a put
  // BEGIN IMMEDIATE, so that of concurrent claimers one wins).
  Result<KeyClaim> ClaimKey(const std::string& scope, const std::string& key,
                            const std::string& fingerprint, const KeyClaimPolicy& policy) override;
  Status CompleteKey(const std::string& scope, const std::string& key, const std::string& token,
                     int status, const std::string& content_type, const std::string& body) override;
  Status ReleaseKey(const std::string& scope, const std::string& key,
                    const std::string& token) override;
  Result<std::vector<size_t>> RenewKeys(const std::vector<KeyLease>& claims,
                                        int64_t now_ms) override;
  Result<KeyRecord> FindKey(const std::string& scope, const std::string& key) override;
  Result<int64_t> PurgeKeys(int64_t created_at_or_before_ms) override;
  Result<SpecPutOutcome> PutSpec(const StoredSpec& spec) override;
  Result<StoredSpec> GetSpec(const std::string& name, int version) override;
  Result<std::vector<StoredSpec>> ListSpecs() override;
  Result<SpecOwner> ClaimSpecName(const SpecOwner& wanted) override;
  Result<SpecOwner> GetSpecOwner(const std::string& name) override;
  Result<std::vector<SpecOwner>> ListSpecOwners() override;
  Status SetSpecShared(const std::string& name, bool shared) override;

  // Control requests (storage/control_store.h): each write is one
  // transaction with its journal entry; reads run on their own.
  Result<ControlOutcome> RequestControl(const ControlRequest& request) override;
  Result<std::optional<ControlRequest>> PendingControl(const std::string& saga_id) override;
  Status SettleControl(const std::string& saga_id, const std::string& request_id) override;
  Result<std::vector<ControlRequest>> ListControls(int limit) override;

  // Asynchronous completion and drift (storage/sqlite_completion.cc).
  Result<std::vector<StepCheck>> ListStepChecks(const std::string& saga_id) override;
  Result<std::vector<DueCheck>> ListDueChecks(const std::string& saga_state, int64_t now_ms,
                                              int limit) override;
  Result<std::vector<EffectRecord>> ListEffectsSince(int64_t since_ms, int limit) override;
  Result<bool> RecordDrift(const DriftFinding& finding) override;

  /// A snapshot of the Commit counters.
  // Retention (storage/prune.h; storage/sqlite_prune.cc): one BEGIN
  // IMMEDIATE transaction per batch on the write connection.
  Result<PruneReport> Prune(const PruneRequest& request) override;

  SqliteStats Stats() const;

  /// The PRAGMA values of this store's connection (for diagnostics and tests).
  Result<SqliteSettings> EffectiveSettings();

 private:
  // One attempt of Open; kUnavailable when another process holds the file.
  static Result<std::unique_ptr<SqliteStore>> OpenOnce(const SqliteOptions& options,
                                                       const std::string& op);
  struct PendingCommit;

  SqliteStore(std::unique_ptr<SQLite::Database> db, std::unique_ptr<SQLite::Database> reader,
              int schema_version, const SqliteOptions& options, std::unique_ptr<HighWaterMark> hwm);

  // OK, or the regression that refuses every write.
  Status WritesAllowed() const;
  // After a commit on the write connection (mu_ held): moves the mark.
  void AdvanceMark();

  // Runs `group` (one batch or several) in one transaction and sets each
  // one's status: group_commit_'s writer.
  void CommitGroup(const std::vector<PendingCommit*>& group);
  // Extends (`release` false: to now + lease_ms) or gives up (expiry 0) the
  // lease if it is still held: kAborted if lost, kNotFound if no such saga.
  Status UpdateLease(const char* what, const Lease& lease, int64_t lease_ms, bool release);

  std::mutex mu_;
  std::unique_ptr<SQLite::Database> db_;  // GUARDED_BY(mu_)
  // db_'s prepared statements; declared after db_, so finalized before it
  // is closed.
  std::unique_ptr<sqlite_internal::StatementCache> stmts_;  // GUARDED_BY(mu_)
  // The connection for reads (LoadSaga, ListSagas, ReadJournal, ListEffects,
  // known intents), with its own statements.
  std::mutex read_mu_;
  std::unique_ptr<SQLite::Database> read_db_;                    // GUARDED_BY(read_mu_)
  std::unique_ptr<sqlite_internal::StatementCache> read_stmts_;  // GUARDED_BY(read_mu_)
  const int schema_version_;
  Clock* const clock_;
  // The journal's high-water mark; nullptr when disabled.
  std::unique_ptr<HighWaterMark> hwm_;
  std::string identity_;  // GUARDED_BY(mu_) the journal's, "-" while empty

  std::atomic<int64_t> commit_batches_{0};
  std::atomic<int64_t> commit_transactions_{0};
  std::atomic<int64_t> largest_group_{0};

  // Commit and new intents: callers wait here while a leader writes (through
  // CommitGroup). Last, so that it goes first.
  GroupCommit<PendingCommit> group_commit_;
};

}  // namespace idem::storage
