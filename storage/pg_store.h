#pragma once
// PgStore: the Store on a PostgreSQL server (libpqxx 6.4).
//
// Semantics: those of SqliteStore, table for table (intents, sagas, steps,
// journal, effects) and error for error, checked by the same conformance suite
// (tests/store_conformance.h). JSON columns hold canonical text (CanonicalJson)
// or SQL NULL for a JSON null, so values round-trip exactly. The journal and
// effects tables are append-only: triggers reject UPDATE, DELETE and TRUNCATE.
//
// Durability: a Commit that returned OK was committed by the server, which the
// deployment runs with synchronous_commit = on.
//
// Schema: versioned migrations (storage/migrations/postgresql/, embedded in the
// build) recorded in `schema_migrations`, each applied in its own transaction
// under pg_advisory_xact_lock, so that processes opening a fresh database at
// once apply each script exactly once. A database whose version is newer than
// this build knows is refused (kFailedPrecondition).
//
// Transactions: every Store method is one transaction on one pooled connection,
// with bound parameters only. Writes run at READ COMMITTED and lock the saga's
// row (commits to one saga are serialised, so its journal `seq` order is its
// commit order); reads are one statement on its own (one snapshot, no
// transaction id, one round trip). CreateIntent first looks the intent key up
// that way: a repeated submission writes nothing and makes the server flush
// nothing; only an absent key takes the INSERT ... ON CONFLICT path (which
// still settles the race with a concurrent submitter).
// Round trips: write transactions go through libpq's pipeline mode (libpqxx
// 6.4 has none for bound parameters): BEGIN and a batch's statements are sent
// together and answered in one round trip, then COMMIT (a simple query of
// its own, sent once txid_current() is known). A Commit is two round trips
// whatever the batch holds; a batch the fence refuses ran its statements for
// nothing and is rolled back (or back to its savepoint) before its status is
// read. Reads stay on libpqxx.
// Serialization failures and deadlocks are retried (bounded), then kAborted.
//
// Lost connections: a connection that broke is discarded together with the
// idle ones (after a server restart they are all dead) and the transaction is
// retried once on a new connection; it had not committed, so nothing is
// written twice. If the connection breaks while COMMIT is in flight the outcome
// is unknown: the store had read txid_current() before COMMIT and asks a new
// connection txid_status(txid). "committed": the call succeeds. "aborted": the
// transaction is retried once. Still "in progress" (the old backend has not
// noticed yet): that backend is terminated, guarded by its xid, and the status
// asked again. Unresolvable: kUnavailable, and the caller must treat the write
// as possibly done (it is safe to repeat: intents are idempotent and effect
// keys unique).
//
// Leases: expiry is judged by the server's clock (clock_timestamp()), never by
// this process's. ClaimSagas is one UPDATE over a SELECT ... FOR UPDATE SKIP
// LOCKED, so concurrent claimers (threads or processes) never get the same
// saga; a saga whose row is locked by a commit in flight is skipped this time.
// ClaimSagas and ClaimSaga: kInvalidArgument for no states, an empty owner,
// lease_ms <= 0 or limit <= 0. Release keeps the owner and epoch and sets the
// expiry to 0, so that the saga is claimable at once. A batch with
// release_lease does the same in the fenced UPDATE of its saga row (no extra
// statement), inside its savepoint under group commit.
// Fencing: a batch with a fence_epoch locks the saga's row and commits only if
// its lease epoch still equals it. Only the epoch decides: a lease that
// expired but was not claimed again still lets its holder write (and renew),
// since nobody else can have written in between.
//
// Group commit (`group_commit`, on by default; storage/group_commit.h): Commit
// calls that arrive while another is writing queue up, and the next writer
// (the leader) runs up to `max_group_batches` of them in one transaction,
// ordered by saga id (a lock order, so that groups of several stores cannot
// deadlock), each inside its own SAVEPOINT: one batch's failure (kConflict,
// fence kAborted, kNotFound, kInvalidArgument) rolls back that batch alone and
// the others still commit. The group goes out first in one round trip
// without savepoints, betting that every batch goes through; only when one
// is refused or fails is that transaction rolled back and the group written
// again batch by batch, each in its savepoint (PgStats::group_fallbacks).
// Up to `group_commit_leaders` groups are in flight at once, each its own
// transaction on its own connection; they take their saga rows in the same
// order, and a saga's batches in two groups commit in the order its row lock
// grants.
// Every caller gets its own status only after the shared COMMIT returned, or
// after an unknown outcome was resolved (as above) for the whole group.
// Contention or a lost connection runs the whole group again. With one caller
// at a time nothing changes: a group of one is the plain transaction.
//
// Thread safety: every method may be called from several threads at once; each
// call holds one connection of the pool (at most `pool_size`, made lazily) and
// waits up to `acquire_timeout_ms` for one, then kUnavailable.
//
// Errors: as in store.h. Unreachable server, lost connection, unknown commit
// outcome, pool exhausted, disk full: kUnavailable. Serialization failure or
// deadlock after the retries: kAborted. Text PostgreSQL cannot store (a NUL
// byte, invalid UTF-8): kInvalidArgument. Other server errors: kInternal with
// the SQLSTATE. No exception leaves a method of this class.
//
// @warning Never build SQL text from values: every value is a bound parameter.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "storage/control_store.h"
#include "storage/group_commit.h"
#include "storage/server_state.h"
#include "storage/store.h"

#include "common/clock.h"

namespace idem::storage {

struct PgOptions {
  /// libpq connection URI, e.g. postgresql://user@host:5432/dbname.
  std::string url;
  /// Most connections the store opens at once (made lazily).
  int pool_size = 8;
  /// libpq connect_timeout, unless the URL sets one.
  int connect_timeout_s = 5;
  /// How long a call waits for a free connection before kUnavailable.
  int acquire_timeout_ms = 30000;
  /// How long an unknown COMMIT outcome is looked up before kUnavailable.
  int resolve_timeout_ms = 10000;
  /// The clock that stamps times the caller did not give (a batch's
  /// updated_ms without journal entries, a consumed token's at_ms, a
  /// migration's applied_at); nullptr: SystemClock::Get(). Leases are judged
  /// by the server's clock, never by this one. Not owned; must outlive the
  /// store.
  Clock* clock = nullptr;
  /// Tests only: called in every write transaction after txid_current() was
  /// read (a transaction that wrote nothing takes none) and right before
  /// COMMIT is sent, with the backend pid of the transaction's connection
  /// (e.g. to pg_terminate_backend it). Reads and the look-up of a repeated
  /// CreateIntent are no write transactions.
  std::function<void(int backend_pid)> before_commit_hook;
  /// Concurrent Commit calls share transactions (see above). On by default
  /// since write transactions are pipelined (a batch in a group costs one
  /// round trip): at pool_size 8 on a 2-core machine, idem-bench measured
  /// 2646 vs 2133 steps/s at 16 concurrent sagas and 2668 vs 2205 at 64
  /// (step p99 47 vs 133 ms); medians of 3 runs. Off, every Commit is its own
  /// transaction (the older measurement that kept it off, 185 vs 96 steps/s
  /// at 64, predates the pipelines).
  bool group_commit = true;
  /// Most batches in one group transaction (>= 1).
  int max_group_batches = 64;
  /// Most group transactions in flight at once, each on its own pooled
  /// connection (>= 1; more than pool_size counts as pool_size). With one, a group's statements
  /// run on one backend while the next group waits, and that backend's
  /// core bounds the rate; with two, one group runs while the other's
  /// COMMIT flushes: idem-bench on 2 cores, interleaved, medians of 3,
  /// 2,061 -> 2,515 steps/s at 16 concurrent sagas and 2,289 -> 2,512 at
  /// 64. Four split the groups too finely (p99 up by half).
  int group_commit_leaders = 2;
};

/// Counters of the recovery paths, for tests and diagnostics.
struct PgStats {
  int64_t connections_opened = 0;
  int64_t connections_discarded = 0;  ///< broken ones, and idle ones dropped with them
  int64_t retries = 0;                ///< transactions run again
  int64_t commits_in_doubt = 0;       ///< the connection broke during COMMIT
  int64_t resolved_committed = 0;
  int64_t resolved_aborted = 0;
  int64_t unresolved = 0;           ///< still unknown after resolve_timeout_ms
  int64_t commit_batches = 0;       ///< WriteBatches Commit ran in a transaction
  int64_t commit_transactions = 0;  ///< transactions Commit ran, retries included
  int64_t largest_group = 0;        ///< most batches in one transaction
  /// Groups whose one-round-trip write refused or failed a batch, written
  /// again batch by batch (each in its savepoint) in a new transaction.
  int64_t group_fallbacks = 0;
  int64_t commits_queued = 0;  ///< Commit calls waiting for a leader now
};

class PgStore : public Store, public KeyRecordStore, public SpecStore, public ControlStore {
 public:
  /// Connects, checks the server and applies pending migrations.
  /// kInvalidArgument: bad options. kUnavailable: the server cannot be reached.
  /// kFailedPrecondition: the schema is newer than this build.
  static Result<std::unique_ptr<PgStore>> Open(const PgOptions& options);

  /// The schema version this build migrates databases to.
  static int LatestSchemaVersion();
  /// How many versions up to it this build has (less while a parallel
  /// branch's migration is not merged): the rows of schema_migrations.
  static int KnownSchemaVersions();

  ~PgStore() override;
  PgStore(const PgStore&) = delete;
  PgStore& operator=(const PgStore&) = delete;
  PgStore(PgStore&&) = delete;
  PgStore& operator=(PgStore&&) = delete;

  Result<CreateOutcome> CreateIntent(const NewSaga& saga) override;
  Result<std::optional<CreateOutcome>> FindIntent(const NewSaga& saga) override;
  Result<SagaRecord> LoadSaga(const std::string& saga_id) override;
  Status Commit(const WriteBatch& batch) override;
  Result<std::vector<SagaSummary>> ListSagas(const SagaFilter& filter) override;
  Result<std::vector<JournalEntry>> ReadJournal(const std::string& saga_id) override;
  Result<std::vector<EffectRecord>> ListEffects(const std::string& saga_id) override;
  Result<StoreGauges> ReadGauges(const GaugeQuery& query) override;
  /// Folds saga_state_moves into saga_state_counts (migration 15); a failure
  /// is left for the next call (the counts stay right, reading the moves).
  void FoldStateMoves();
  int SchemaVersion() override;
  Result<std::vector<Lease>> ClaimSagas(const std::vector<std::string>& states,
                                        const std::string& owner, int64_t lease_ms,
                                        int limit) override;
  /// Also claims a saga whose live lease `owner` itself holds, with a new
  /// epoch (an owner restarted under the same name fences its old writes).
  Result<Lease> ClaimSaga(const std::string& saga_id, const std::string& owner,
                          int64_t lease_ms) override;
  /// One round trip: the claim, the saga's read and its control request's,
  /// pipelined in one implicit transaction (committed by the pipeline's
  /// Sync). A lost answer is retried once on a new connection: the claim by
  /// the same owner is taken again at a higher epoch.
  /// The control request is read by one more statement in the batch's
  /// pipeline (its group's, under group commit); not read when the group
  /// falls back to a savepoint per batch.
  Status CommitReadingControl(const WriteBatch& batch, ControlReadback* out) override;
  Result<ClaimedSaga> ClaimAndLoad(const std::string& saga_id, const std::string& owner,
                                   int64_t lease_ms) override;
  Status RenewLease(const Lease& lease, int64_t lease_ms) override;
  Status ReleaseLease(const Lease& lease) override;

  KeyRecordStore* KeyRecords() override { return this; }
  SpecStore* Specs() override { return this; }
  ControlStore* Controls() override { return this; }

  // Server state (storage/server_state.h): each write is one READ COMMITTED
  // transaction; a claim INSERTs ... ON CONFLICT DO NOTHING and, when the key
  // was taken, locks its row (FOR UPDATE) before judging it, so that of
  // concurrent claimers (any process) one wins. Times are the caller's
  // (KeyClaimPolicy::now_ms, StoredSpec::created_ms), not the server's.
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

  // Asynchronous completion and drift: reads are one statement; a drift
  // finding and its journal entry are one transaction.
  Result<std::vector<StepCheck>> ListStepChecks(const std::string& saga_id) override;
  Result<std::vector<DueCheck>> ListDueChecks(const std::string& saga_state, int64_t now_ms,
                                              int limit) override;
  Result<std::vector<EffectRecord>> ListEffectsSince(int64_t since_ms, int limit) override;
  Result<bool> RecordDrift(const DriftFinding& finding) override;

  // Control requests (storage/control_store.h): each write is one
  // transaction with its journal entry; reads run on their own.
  Result<ControlOutcome> RequestControl(const ControlRequest& request) override;
  Result<std::optional<ControlRequest>> PendingControl(const std::string& saga_id) override;
  Status SettleControl(const std::string& saga_id, const std::string& request_id) override;
  Result<std::vector<ControlRequest>> ListControls(int limit) override;

  // Retention (storage/prune.h): one write transaction per batch; the
  // rewrites run in the database (migration 9's idem_redact).
  Result<PruneReport> Prune(const PruneRequest& request) override;

  /// A snapshot of the recovery and Commit counters.
  PgStats Stats() const;

  class Pool;  ///< internal: the connection pool, defined in pg_store.cc

 private:
  struct PendingCommit;

  PgStore(PgOptions options, std::unique_ptr<Pool> pool, int schema_version);

  // How Run runs a body: a READ COMMITTED write transaction (its outcome
  // resolved through txid_status if COMMIT is lost), or one statement on its
  // own (autocommit: no BEGIN, no COMMIT, no transaction id), which is its
  // own snapshot.
  enum class Access { kWrite, kOneStatement };

  template <typename T, typename Body>
  Result<T> Run(const std::string& op, Access access, Body&& body);

  // Runs `group` (one batch or several) in one transaction and sets each
  // one's status: group_commit_'s writer.
  void CommitGroup(std::vector<PendingCommit*> group);
  // Extends (`release` false: to now + lease_ms) or gives up (expiry 0) the
  // lease if it is still held: kAborted if lost, kNotFound if no such saga.
  Status UpdateLease(const char* what, const Lease& lease, int64_t lease_ms, bool release);

  const PgOptions options_;  // clock resolved (never nullptr)
  std::unique_ptr<Pool> pool_;
  const int schema_version_;
  Clock* const clock_;

  // Commit: callers wait here while a leader writes (through CommitGroup).
  // Last, so that it goes first.
  GroupCommit<PendingCommit> group_commit_;
};

}  // namespace idem::storage
