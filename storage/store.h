#pragma once
// Store: the durable journal of intents, sagas, steps and effects.
//
// storage/ knows nothing of saga logic: states are opaque strings that the
// engine sets, and the store's one promise is atomicity and durability:
// everything in a WriteBatch commits together or not at all, and a Commit
// that returned OK survives a crash of the process (SQLite: WAL with
// synchronous=FULL; PostgreSQL: synchronous_commit=on).
//
// Implementations: SqliteStore (storage/sqlite_store.h), the embedded
// default, and PgStore (storage/pg_store.h); both pass the same conformance
// suite (tests/store_conformance.h).
//
// Thread safety: every method may be called from several threads at once.
//
// Errors: kNotFound for a missing saga; kConflict for an intent key reused
// with another fingerprint or an effect key recorded twice; kUnavailable when
// the database is busy or unreachable (retry later); kInternal otherwise.
// On any error nothing of the batch is written.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/control_store.h"
#include "storage/prune.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {
class Clock;  // common/clock.h
}  // namespace idem

namespace idem::storage {

class ControlStore;    // storage/control_store.h
class KeyRecordStore;  // storage/server_state.h
class SpecStore;       // storage/server_state.h

/// An append-only journal line. `seq` is assigned by the store.
struct JournalEntry {
  int64_t seq = 0;
  std::string saga_id;
  std::string step_id;  ///< empty for saga-level entries
  std::string event;    ///< "submitted", "succeeded", "compensated", ...
  Json data;
  int64_t at_ms = 0;
};

/// A step as planned when the saga is created.
struct NewStep {
  int index = 0;
  std::string step_id;
  std::string tool;
  std::string step_key;  ///< the idempotency key, derived from (saga, step)
  std::string state;     ///< initial state, e.g. "planned"
};

/// Everything recorded when an intent is first submitted.
struct NewSaga {
  std::string saga_id;
  std::string intent_key;
  std::string fingerprint;  ///< of the canonical (spec, input)
  std::string spec_name;
  int spec_version = 0;     ///< the spec registry's version; 0: a spec given inline
  std::string spec_sha256;  ///< Fingerprint(spec): "sha256:<hex>" of its canonical text
  Json spec;                ///< the frozen plan
  Json input;
  std::string state;  ///< initial state, e.g. "pending"
  int64_t created_ms = 0;
  std::vector<NewStep> steps;
  /// Journal entries written in the same transaction (e.g. "saga_created").
  std::vector<JournalEntry> journal;
  /// Set (with lease_ms > 0): the saga is created leased to this owner, at
  /// lease epoch 1, expiring lease_ms after the commit in the store's clock:
  /// what a ClaimSaga right after would leave, without its transaction.
  /// Only a WriteBatch's `create` takes it (CreateIntent: kInvalidArgument).
  std::string lease_owner;
  int64_t lease_ms = 0;
};

/// One step's current row. The engine reads it, changes it and writes it
/// back whole in a WriteBatch.
struct StepRecord {
  std::string saga_id;
  int index = 0;
  std::string step_id;
  std::string tool;
  std::string state;
  int attempt = 0;  ///< attempts of the action so far
  std::string step_key;
  Json args;  ///< resolved arguments (null until submitted)
  std::string args_fingerprint;
  Json result;  ///< the action's result (null until succeeded)
  std::string external_ref;
  std::string error;     ///< last error or reason
  int comp_attempt = 0;  ///< attempts of the compensation so far
  Json comp_result;
  int64_t updated_ms = 0;
  /// Two-phase steps: {"preview": ..., "token": ..., "nonce": ...,
  /// "expires_ms": ..., "approval": {...}}; null otherwise.
  Json phase;
};

struct SagaSummary {
  std::string saga_id;
  std::string intent_key;
  std::string spec_name;
  int spec_version = 0;     ///< the registry's version; 0: inline (or older than schema 7)
  std::string spec_sha256;  ///< "" for sagas recorded before schema version 7
  std::string state;
  std::string reason;  ///< why it failed or needs attention
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  /// When Store::Prune removed or redacted its data (storage/prune.h); 0: never.
  int64_t pruned_at_ms = 0;
};

struct SagaRecord {
  SagaSummary summary;
  std::string fingerprint;
  Json spec;
  Json input;
  std::vector<StepRecord> steps;  ///< by index
};

/// A record of something that happened in the world.
struct EffectRecord {
  std::string saga_id;
  std::string step_id;
  std::string kind;  ///< "action" or "compensation"
  std::string tool;
  std::string idempotency_key;  ///< unique across all effects
  Json result;
  std::string external_ref;
  int64_t at_ms = 0;
};

/// A step waiting for its provider to finish (saga/completion.h): when its
/// status is asked next, until when, and how often it was asked. The row
/// exists while the step is `processing` (migration 11, `step_checks`).
struct StepCheck {
  std::string step_id;
  int64_t next_check_ms = 0;  ///< in the engine's clock
  int64_t deadline_ms = 0;    ///< the completion window's end
  int checks = 0;             ///< status lookups made so far
  int64_t since_ms = 0;       ///< when the step began waiting
};

/// A saga whose earliest step check is due (Store::ListDueChecks).
struct DueCheck {
  std::string saga_id;
  int64_t next_check_ms = 0;
};

/// One finding of the drift job (saga/reconcile.h), recorded once
/// (Store::RecordDrift): `kind` "effect_missing" (the journal's effect the
/// provider does not know) or "orphan" (the provider's effect the journal
/// does not know), for the tool and the idempotency key.
struct DriftFinding {
  std::string kind;
  std::string tool;
  std::string key;
  std::string saga_id;  ///< the journal's saga, "" for an orphan of none
  std::string step_id;
  std::string detail;
  int64_t found_ms = 0;
};

/// What one Commit writes, atomically.
struct WriteBatch {
  std::string saga_id;
  std::optional<std::string> saga_state;  ///< set: the saga moves to it
  std::string saga_reason;                ///< stored with saga_state
  std::vector<StepRecord> steps;          ///< full rows to write back
  std::vector<JournalEntry> journal;
  std::vector<EffectRecord> effects;
  /// Set: a commit token's nonce consumed by this batch, for step
  /// `consume_token_step`. A nonce can be consumed once: a second batch with
  /// it fails with kConflict and writes nothing.
  std::string consume_token;
  std::string consume_token_step;
  /// Fencing: when non-zero, the batch commits only if the saga's lease
  /// epoch still equals it (the writer still holds the lease); otherwise
  /// kAborted ("lease lost") and nothing is written.
  int64_t fence_epoch = 0;
  /// Set (with fence_epoch): the batch also gives the lease up, in the same
  /// transaction, as ReleaseLease would after it (the epoch is kept; the
  /// next claim bumps it). A drive's last write carries it, saving a commit.
  /// Without fence_epoch: kInvalidArgument.
  bool release_lease = false;
  /// Set: the saga's frozen plan is replaced by this one (an open saga's
  /// plan grows by one step per call, saga/open_saga.h, written with the new
  /// step's row and `open_call`).
  std::optional<Json> spec;
  /// Set: call `open_call->call_id` of an open saga is step index
  /// `open_call->step_index` (table open_calls). A call id names one step of
  /// a saga once: a second batch with it fails with kConflict and writes
  /// nothing.
  struct OpenCall {
    std::string call_id;
    int step_index = 0;
    int64_t at_ms = 0;
  };
  std::optional<OpenCall> open_call;
  /// Step checks written (inserted or replaced) with the batch, and the
  /// steps whose check is removed (the step no longer waits).
  std::vector<StepCheck> checks;
  std::vector<std::string> checks_done;
  /// Set: the batch records this new intent first, in the same transaction
  /// (a synchronous caller's intent rides with its first step's
  /// `submitted`, saga/engine.h SubmitAndRun): the intent, the saga (in the
  /// batch's saga_state when it has one, else create->state, with the
  /// lease create names), its steps (the batch's rows where it has one,
  /// else the planned rows), create->journal, then the rest of the batch.
  /// The intent key must be new: if it was submitted before, whatever the
  /// fingerprint, kConflict and nothing is written (ask FindIntent what it
  /// is). create->saga_id must be the batch's saga_id; with a lease owner,
  /// fence_epoch must be 1.
  std::optional<NewSaga> create;
};

/// A saga claimed by a worker: it may drive the saga while its lease holds,
/// and every write it makes is fenced on `epoch`.
struct Lease {
  std::string saga_id;
  std::string owner;
  int64_t epoch = 0;
  int64_t expires_ms = 0;  ///< in the store's clock
};

/// What Store::CommitReadingControl read with the batch.
struct ControlReadback {
  bool read = false;  ///< false: nothing was read (ask PendingControl)
  std::optional<ControlRequest> pending;
};

/// What Store::ClaimAndLoad answers: the lease taken, the saga as LoadSaga
/// reads it with that lease held, and its pending control request.
struct ClaimedSaga {
  Lease lease;
  SagaRecord record;
  /// False for a store without control requests (Controls() is nullptr):
  /// nothing was read, and `control` says nothing.
  bool control_read = false;
  std::optional<ControlRequest> control;
};

/// Which sagas Store::ListSagas answers, newest first (created_ms, then the
/// id's bytes). Every filter is applied by the database, on an index where
/// one serves it (migration 14: sagas_by_created, sagas_by_owner), so a page
/// of a listing costs the same with a thousand sagas or a million.
struct SagaFilter {
  std::vector<std::string> states;  ///< empty: any state
  int limit = 1000;                 ///< at most this many; must be positive
  /// The sagas whose intent key's owner (the part before its first ':', ""
  /// without one) is this; unset: any owner.
  std::optional<std::string> owner;
  std::string spec_name;  ///< "": any spec
  /// The client's part of the intent key (after the first ':', all of it
  /// without one) contains this; "": any.
  std::string key_contains;
  int64_t created_from_ms = 0;  ///< created at or after; 0: no bound
  int64_t created_to_ms = 0;    ///< created at or before; 0: no bound
  int offset = 0;               ///< skip this many matching sagas; >= 0
};

/// What Store::ReadGauges counts (for metrics that any process reports the
/// same: the fleet's truth, not one process's).
struct GaugeQuery {
  /// Per state, the sagas created more than this long ago (in the store's
  /// clock) are counted in StateGauges::created_before; 0: none counted.
  int64_t age_ms = 0;
  /// Steps in this state whose saga is in this state too are counted in
  /// StoreGauges::waiting_steps (e.g. "awaiting_approval"); "": none counted.
  std::string waiting_state;
  /// The states whose details (oldest_updated_ms, created_before,
  /// leases_expired) are computed; empty: every state. The other states get
  /// their count only, which an index answers without reading the sagas
  /// (metrics asks details of the unfinished states only, so the reading
  /// does not visit the finished sagas' rows).
  std::vector<std::string> detail_states;
};

/// The sagas in one state.
struct StateGauges {
  int64_t sagas = 0;
  int64_t oldest_updated_ms = 0;  ///< the earliest updated_ms among them
  int64_t created_before = 0;     ///< created before now - GaugeQuery::age_ms
  int64_t leases_expired = 0;     ///< a lease taken and not given back, now expired
};

/// One consistent reading of the store for gauges.
struct StoreGauges {
  int64_t now_ms = 0;                           ///< the store's clock when read
  std::map<std::string, StateGauges> by_state;  ///< only states that have sagas
  int64_t waiting_steps = 0;
};

struct CreateOutcome {
  std::string saga_id;
  bool created = false;  ///< false: the intent existed with the same content
};

class Store {
 public:
  virtual ~Store() = default;

  /// Records the intent, its saga and planned steps in one transaction.
  /// Same intent key and fingerprint: returns the existing saga (created =
  /// false) and writes nothing. Same key, other fingerprint: kConflict.
  virtual Result<CreateOutcome> CreateIntent(const NewSaga& saga) = 0;

  /// What CreateIntent would answer for an intent submitted before, by a
  /// read (no write, no flush): the existing saga (created = false) for the
  /// same key and fingerprint, kConflict for the same key with another;
  /// nullopt when the key is new.
  virtual Result<std::optional<CreateOutcome>> FindIntent(const NewSaga& saga) = 0;

  /// The saga with its steps. kNotFound if absent.
  virtual Result<SagaRecord> LoadSaga(const std::string& saga_id) = 0;

  /// Writes the batch in one transaction. kNotFound if the saga is absent;
  /// kConflict if an effect key is already recorded (nothing is written).
  virtual Status Commit(const WriteBatch& batch) = 0;

  /// Commit, and where the store can do it in the same round trip, the
  /// saga's pending control request (ControlStore::PendingControl) read in
  /// the batch's transaction after its writes: `out->read` says whether it
  /// was (set only when the commit succeeded). For a drive whose next step
  /// is the control check (saga/run.h, PrefetchControl). The default
  /// commits and reads nothing; PgStore reads in the batch's pipeline.
  virtual Status CommitReadingControl(const WriteBatch& batch, ControlReadback* out);

  /// Summaries, newest first.
  virtual Result<std::vector<SagaSummary>> ListSagas(const SagaFilter& filter) = 0;

  /// The saga's journal in commit order.
  virtual Result<std::vector<JournalEntry>> ReadJournal(const std::string& saga_id) = 0;

  /// The saga's effects in commit order.
  virtual Result<std::vector<EffectRecord>> ListEffects(const std::string& saga_id) = 0;

  /// Counts for gauges, computed by the database (one statement on
  /// PostgreSQL, one read transaction on SQLite): sagas by state, their
  /// oldest update, those older than `query.age_ms`, expired leases (expiry
  /// in the store's clock), and the steps waiting in `query.waiting_state`.
  /// A full read of the sagas table: callers cache it (observability::Metrics
  /// reads it at most once a second). The default (a test double):
  /// kFailedPrecondition.
  virtual Result<StoreGauges> ReadGauges(const GaugeQuery& query);

  /// The version of the schema the database is at after migrations.
  virtual int SchemaVersion() = 0;

  // ---- asynchronous completion and drift (saga/completion.h, saga/reconcile.h)
  //
  // The defaults (a test double) answer kFailedPrecondition.

  /// The saga's step checks (its steps that wait for a provider), by step id.
  virtual Result<std::vector<StepCheck>> ListStepChecks(const std::string& saga_id);
  /// Up to `limit` sagas in `saga_state` with a step check due at `now_ms`
  /// (next_check_ms <= now_ms), earliest first: what a sweep drives. One
  /// indexed read; a saga whose check is not due costs nothing.
  virtual Result<std::vector<DueCheck>> ListDueChecks(const std::string& saga_state, int64_t now_ms,
                                                      int limit);
  /// The effects of kind "action" recorded at or after `since_ms`, oldest
  /// first, up to `limit`, across sagas.
  virtual Result<std::vector<EffectRecord>> ListEffectsSince(int64_t since_ms, int limit);
  /// Records `finding` once per (kind, tool, key): true when it is new, and
  /// then, when `finding.saga_id` names a saga, its `drift` journal entry in
  /// the same transaction. false (nothing written) when it was recorded.
  virtual Result<bool> RecordDrift(const DriftFinding& finding);

  // ---- leases: several workers sharing one store
  //
  // A lease is (owner, expiry, epoch) on a saga. Claiming bumps the epoch,
  // so a worker that lost its lease (expired, then claimed by another) finds
  // every fenced write refused. Expiry is judged by the store's clock (the
  // database server's for PostgreSQL), never by the worker's.

  /// Claims up to `limit` sagas in one of `states` whose lease is free or
  /// expired, for `owner`, for `lease_ms`; oldest first. Concurrent claimers
  /// never get the same saga (PostgreSQL: FOR UPDATE SKIP LOCKED).
  virtual Result<std::vector<Lease>> ClaimSagas(const std::vector<std::string>& states,
                                                const std::string& owner, int64_t lease_ms,
                                                int limit) = 0;

  /// Claims one saga by id, whatever its state, if its lease is free or
  /// expired. kAborted if another owner holds it; kNotFound if absent.
  virtual Result<Lease> ClaimSaga(const std::string& saga_id, const std::string& owner,
                                  int64_t lease_ms) = 0;

  /// ClaimSaga, then the saga's record and its pending control request
  /// (ControlStore::PendingControl) read under the lease: what a drive
  /// starts from. Errors as ClaimSaga's, and nothing is held after one. The
  /// default runs the three calls in turn (and releases the lease if a read
  /// fails); PgStore runs them as one transaction in one round trip.
  virtual Result<ClaimedSaga> ClaimAndLoad(const std::string& saga_id, const std::string& owner,
                                           int64_t lease_ms);

  /// Extends a held lease by `lease_ms` from now. kAborted if the saga's
  /// epoch or owner changed (the lease was lost), kNotFound if absent.
  virtual Status RenewLease(const Lease& lease, int64_t lease_ms) = 0;

  /// Gives a held lease up (expiry now). kAborted if it was already lost.
  virtual Status ReleaseLease(const Lease& lease) = 0;

  // ---- server state beside the journal (storage/server_state.h)

  /// The Idempotency-Key records in this store's database; nullptr for a
  /// store without them (a test double). Owned by the store.
  virtual KeyRecordStore* KeyRecords() { return nullptr; }

  /// The spec registry's table in this store's database; nullptr for a
  /// store without it. Owned by the store.
  virtual SpecStore* Specs() { return nullptr; }

  /// The saga control requests (cancel, pause, resume) in this store's
  /// database; nullptr for a store without them. Owned by the store.
  virtual ControlStore* Controls() { return nullptr; }

  // ---- retention (storage/prune.h)

  /// Removes or redacts finished sagas' inputs and results, batch by batch
  /// (see storage/prune.h). The default (a test double): kFailedPrecondition.
  virtual Result<PruneReport> Prune(const PruneRequest& request);

  // ---- a journal that went back in time

  /// OK, or kFailedPrecondition with kJournalRegressionMessage
  /// (storage/high_water_mark.h) when the store found at open that its journal is
  /// behind a commit it had made (SqliteStore: the high-water mark,
  /// storage/high_water_mark.h): every write (commits, new intents, claims,
  /// server state) is then refused with this status, reads still answer.
  /// PgStore: always OK (a server's regression is PostgreSQL's business,
  /// docs/architecture.md).
  virtual Status JournalIntegrity() { return Status::Ok(); }

  /// An operator (`who`) accepts the journal as it stands, for `reason`:
  /// the decision is recorded and writes are allowed again.
  /// kFailedPrecondition when there is no regression (or no mark) to accept.
  virtual Status AcceptRegression(const std::string& who, const std::string& reason) {
    (void)who;
    (void)reason;
    return Status::FailedPrecondition("this store keeps no high-water mark: nothing to accept");
  }
};

/// Opens a store from a locator: a file path or "sqlite:PATH" for SQLite;
/// "postgresql://..." or "postgres://..." for PostgreSQL.
/// Creates the database and runs pending migrations. `clock` (nullptr:
/// SystemClock::Get(); not owned, must outlive the store) is the store's
/// (SqliteOptions::clock, PgOptions::clock).
Result<std::unique_ptr<Store>> OpenStore(const std::string& locator, Clock* clock = nullptr);

}  // namespace idem::storage
