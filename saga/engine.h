#pragma once
// Engine: submits intents and drives sagas to a terminal or parked state.
//
// The journal-first protocol (docs/architecture.md): before a tool is called,
// the step's key, argument fingerprint and attempt are committed as
// `submitted`; the outcome is committed after. An `unknown` outcome (or a
// `submitted` step found after a crash) is resolved through the tool's
// status lookup or a same-key retry where the tool honours keys; otherwise
// the step is parked `needs_attention`. It is never turned into a fresh call.
// A definite failure gets a keyed retry where policy allows, else the saga
// rolls back: completed effects are compensated in reverse order, each
// compensation with its own key and bounded, backed-off retries; one that
// keeps failing parks the saga with its reason.
//
// Every state change goes through the saga and step machines
// (saga/machines.h); the engine carries out the commands they emit.
//
// Module map (docs/architecture.md): this facade wires the parts. The drive
// of one saga and the step core are saga/run.h; the saga and forward-step
// driver saga/drive.h; two-phase steps preview_commit/two_phase.h; rollback
// compensation/undo.h; lease keeping saga/lease_renewer.h; the worker pool
// (Work) saga/worker.cc, recovery (Recover, NeedsDrive) saga/recovery.cc, and
// a person's decisions and requests (Resolve, Decide, Cancel) saga/operator.cc.
//
// Thread safety: every method may be called from several threads at once.
// With leases (EngineOptions::use_leases, the default), every drive holds
// the saga's lease and every write is fenced on it, so engines in several
// processes (or threads) may share one store: a saga is driven by one of
// them at a time, the others get kAborted ("being driven by another
// worker") or, for a decision, kUnavailable ("busy; try again"). Without
// leases, the caller guarantees one driver per saga (the CLI holds a file
// lock on the embedded store).
//
// Faults: an exception thrown while a saga is driven (by a tool, an
// observer, the store) does not escape the worker and recovery threads: the
// saga is parked needs_attention with the exception's text as the reason,
// through the journal like any other park, and the drive returns kInternal.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "preview_commit/token.h"
#include "saga/decisions.h"
#include "saga/options.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/clock.h"

namespace idem {

class LeaseRenewer;

struct WorkerOptions {
  int concurrency = 8;    ///< sagas driven at once
  int64_t poll_ms = 100;  ///< wait between empty claims
  /// Called after each drive (from the driving thread).
  std::function<void(const std::string& saga_id, const Status& status)> on_done;
};

struct SubmitResult {
  std::string saga_id;
  bool created = false;  ///< false: the intent existed with the same content
};

struct RecoveryReport {
  int resumed = 0;
  int skipped = 0;  ///< driven by another worker (its lease holds)
  std::vector<std::string> saga_ids;
  std::vector<std::string> errors;  ///< sagas that could not be driven, with why
};

/// A caller's request to stop a saga and undo what it did.
struct CancelRequest {
  std::string who;     ///< required: who cancels
  std::string reason;  ///< why; "" means "cancelled by <who>"
};

/// What Engine::Cancel did.
struct CancelResult {
  storage::SagaRecord saga;  ///< as it stands after the request
  /// True: the request is recorded and the saga's driver rolls it back after the
  /// step in progress (an API answers 202); false: the saga is already settled
  /// by this call (cancelled, or rejected for a saga awaiting approval) or was
  /// already rolling back / cancelled.
  bool rollback_pending = false;
};

class Engine {
 public:
  /// Neither pointer is owned; both must outlive the engine.
  Engine(storage::Store* store, const ToolRegistry* tools, EngineOptions options = {});
  ~Engine();  ///< stops the lease renewer's thread
  const EngineOptions& options() const { return options_; }
  /// Neither copyable nor movable: it owns the lease renewer's thread, and
  /// drives in progress refer to it.
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&&) = delete;
  Engine& operator=(Engine&&) = delete;

  /// Records the intent and its saga (pending). The same intent key with the
  /// same spec and input returns the existing saga; with other content,
  /// kConflict. An empty key is kInvalidArgument, and so is a saga past
  /// options.limits (CheckSubmitLimits: nothing is written).
  Result<SubmitResult> Submit(const SagaSpec& spec, const Json& input,
                              const std::string& intent_key);

  /// Drives the saga until it is terminal, parked (needs_attention) or
  /// waiting; returns its final record. A store error stops the drive and is
  /// returned; the journal then says where to resume. An exception during
  /// the drive parks the saga and is kInternal (see "Faults" above).
  Result<storage::SagaRecord> Run(const std::string& saga_id);

  /// Records a person's decision about a parked step of a saga that needs
  /// attention (journal: who, when, what, why), then drives the saga on.
  /// kFailedPrecondition if the saga or step is not parked, or the decision
  /// does not fit the step's state; kInvalidArgument without `who`.
  Result<storage::SagaRecord> Resolve(const std::string& saga_id, const Resolution& resolution);

  /// Approves or rejects the commit that `token` stands for, journals who,
  /// when and why, and drives the saga on (an approval commits the step).
  /// A forged, tampered or unknown token fails with one uniform error and
  /// changes nothing; an expired one with kFailedPrecondition. Deciding again
  /// after the decision (a replay, or a second process racing) returns the
  /// saga as recorded and calls nothing.
  Result<storage::SagaRecord> Decide(const std::string& token, const ApprovalDecision& decision);

  /// Claims runnable sagas (pending, running, compensating) with leases and
  /// drives them, `concurrency` at a time, until options.stop turns true;
  /// then the current steps finish and the leases are released. Sagas whose
  /// owner died are taken over once their lease expires.
  Status Work(const WorkerOptions& worker);

  /// Resumes every pending, running or compensating saga, and every saga
  /// waiting for an approval that was decided or has expired, `concurrency`
  /// at a time.
  Result<RecoveryReport> Recover(int concurrency = 4);

  /// Stops a saga and undoes what it did, by its state:
  ///   pending            cancelled at once (journal `saga_cancelled` {reason, by});
  ///   awaiting approval  its commit is rejected (Decide), which rolls it back;
  ///   running            the request is recorded: the drive of this engine
  ///                      rolls it back after the step in progress (the next
  ///                      drive, when none is under way: the caller drives it);
  ///   compensating, cancelled   answered as it stands.
  /// A saga this engine is driving right now gets the request recorded
  /// (rollback_pending), whatever the state its record shows. Requests live in
  /// this engine's memory: another process's drive does not see them.
  /// kFailedPrecondition if the saga's state cannot be cancelled (finished,
  /// failed, parked); kUnavailable "busy" if another worker holds its lease;
  /// kInvalidArgument without `who`; kNotFound for no such saga.
  Result<CancelResult> Cancel(const std::string& saga_id, const CancelRequest& request);

 private:
  /// Run without the read that answers a finished saga without a lease.
  Result<storage::SagaRecord> Drive(const std::string& saga_id);
  /// Loads the saga and drives it under `lease` (claimed; released on every
  /// way out). An exception parks the saga (see "Faults").
  Result<storage::SagaRecord> RunLeased(const storage::Lease& lease);
  /// The saga's lease (an unfenced one, epoch 0, without leases).
  Result<storage::Lease> Claim(const std::string& saga_id);
  /// Claim for a person's decision, which reads the saga, checks it and
  /// writes it all under the lease: kUnavailable "busy" if another holds it.
  Result<storage::Lease> ClaimForDecision(const std::string& saga_id);
  /// Commits `b` fenced on `lease` and reports its journal to the observer.
  Status CommitClaimed(const storage::Lease& lease, storage::WriteBatch* b);
  /// ParseSpec, memoized by the spec's text: a saga's plan is frozen, and
  /// schema validation is the largest CPU cost of a drive.
  Result<SagaSpec> CachedSpec(const Json& spec);
  struct SpecCache;
  /// Cancel requests, and the sagas this engine drives right now
  /// (saga/operator.cc).
  struct CancelBook;
  static std::shared_ptr<CancelBook> NewCancelBook();
  /// Registers a drive of `saga_id` for Cancel (waits while a Cancel of it
  /// writes); every BeginDrive is followed by one EndDrive.
  void BeginDrive(const std::string& saga_id);
  void EndDrive(const std::string& saga_id);
  /// The reason of a cancel request for `saga_id`, taken (or nullopt).
  std::optional<std::string> TakeCancelRequest(const std::string& saga_id);
  /// BeginDrive ... EndDrive for a scope.
  class DriveMark {
   public:
    DriveMark(Engine* engine, std::string saga_id) : engine_(engine), saga_id_(std::move(saga_id)) {
      engine_->BeginDrive(saga_id_);
    }
    ~DriveMark() { engine_->EndDrive(saga_id_); }
    DriveMark(const DriveMark&) = delete;
    DriveMark& operator=(const DriveMark&) = delete;

   private:
    Engine* engine_;
    std::string saga_id_;
  };

  storage::Store* store_;
  const ToolRegistry* tools_;
  EngineOptions options_;
  std::unique_ptr<SpecCache> spec_cache_;
  std::unique_ptr<LeaseRenewer> renewer_;
  std::shared_ptr<CancelBook> cancels_;
};

/// The idempotency key of a step: stable across attempts, processes and
/// restarts, unique per (saga, step).
std::string StepKey(const std::string& saga_id, const std::string& step_id);

/// True if a drive now would move the saga: pending, running, compensating, or
/// awaiting an approval that was decided or has expired (the sweeper and Recover).
bool NeedsDrive(const storage::SagaRecord& saga, int64_t now_ms);

}  // namespace idem
