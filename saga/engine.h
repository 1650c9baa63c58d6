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
// a person's decisions (Resolve, Decide) saga/operator.cc, and the durable
// control requests (Cancel, Pause, Resume) saga/control.cc.
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
#include "saga/open_saga.h"
#include "saga/options.h"
#include "saga/spec.h"
#include "saga/work_signal.h"
#include "storage/control_store.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/clock.h"

namespace idem {

class LeaseRenewer;
struct LoadedSaga;

struct WorkerOptions {
  int concurrency = 8;    ///< sagas driven at once
  int64_t poll_ms = 100;  ///< wait between empty claims
  /// Set: an idle worker waits on it (real time, at most poll_ms) instead of
  /// sleeping on the engine's clock, and claims as soon as it is notified
  /// (saga/work_signal.h). Not owned.
  WorkSignal* wake = nullptr;
  /// Called after each drive (from the driving thread).
  std::function<void(const std::string& saga_id, const Status& status)> on_done;
};

struct SubmitResult {
  std::string saga_id;
  bool created = false;  ///< false: the intent existed with the same content
};

/// What a recovery did with one saga.
struct RecoveredSaga {
  enum class Outcome {
    kMoved,    ///< driven on (finished, rolled back, waiting for a person, ...)
    kParked,   ///< left needs_attention by this drive: `reason` says why
    kWaiting,  ///< waits for an approval not yet decided: nothing was done
    kFailed,   ///< the drive failed and did not move it: `reason` is the error
    kSkipped,  ///< another worker holds its lease and drives it
  };
  std::string saga_id;
  Outcome outcome = Outcome::kMoved;
  std::string state;   ///< the saga's state after the drive ("" when unknown)
  std::string reason;  ///< the saga's reason, or the drive's error (kFailed)
};

/// "moved", "parked", "waiting", "failed", "skipped".
const char* RecoveryOutcomeName(RecoveredSaga::Outcome outcome);

struct RecoveryReport {
  int resumed = 0;  ///< moved by the drive (kMoved and kParked)
  int parked = 0;   ///< of those, left needs_attention here (kParked)
  int skipped = 0;  ///< driven by another worker (its lease holds)
  /// Left awaiting completion (saga/completion.h): not due, or checked and
  /// still waiting for the provider (kWaiting).
  int waiting_completion = 0;
  std::vector<std::string> saga_ids;  ///< every saga driven (not skipped), in the order done
  std::vector<std::string> errors;    ///< sagas that could not be driven, with why (kFailed)
  std::vector<RecoveredSaga> sagas;   ///< per saga, in the order done (skipped ones too)
};

/// A caller's or a person's request to cancel, pause or resume a saga
/// (Engine::Cancel, Pause, Resume). It is durable: recorded in the store
/// (storage/control_store.h) and honoured by whichever process drives the
/// saga, before a drive and between steps (saga/control_drive.h).
struct ControlRequest {
  std::string who;     ///< required: who asks
  std::string reason;  ///< why; a cancel without one says "cancelled by <who>"
  /// True: once recorded, the request is carried out in this call when no
  /// other process drives the saga (a cancel rolls back, a resume drives the
  /// saga on). False: recorded only; the process that drives the saga, or
  /// the next drive anywhere (a server's sweeper, `recover`), carries it out.
  bool drive = true;
};
using CancelRequest = ControlRequest;

/// What Engine::Cancel, Pause or Resume did.
struct ControlResult {
  storage::SagaRecord saga;  ///< as it stands after the call
  /// False: nothing new was written (the same request, or a cancel, was
  /// pending already, or the saga already is where the request would take
  /// it).
  bool recorded = false;
  /// True: the request is recorded and not carried out yet: the process
  /// driving the saga does it after the step in progress (an API answers
  /// 202), or, for a cancel of a saga that needs attention, the drive that
  /// follows a person's resolve.
  bool pending = false;
  std::string note;  ///< for a person: what happened, what happens next
};
using CancelResult = ControlResult;

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
  /// `decision`: the model decision that led to the submission, journaled
  /// with `saga_created` (saga/open_saga.h).
  Result<SubmitResult> Submit(const SagaSpec& spec, const Json& input,
                              const std::string& intent_key,
                              const std::optional<ModelDecision>& decision = std::nullopt);

  /// Drives the saga until it is terminal, parked (needs_attention) or
  /// waiting; returns its final record. A store error stops the drive and is
  /// returned; the journal then says where to resume. An exception during
  /// the drive parks the saga and is kInternal (see "Faults" above).
  Result<storage::SagaRecord> Run(const std::string& saga_id);

  /// Submit, then Run, for a caller that waits for the outcome (`idem
  /// run`): the intent is recorded in the same transaction as the drive's
  /// first write (with the first step's `submitted`, so before any tool is
  /// called), and with leases the saga is created leased to this engine, so
  /// a three-step saga commits 4 times instead of 5 and needs no claim. A
  /// crash before that write leaves nothing in the store: the caller, who
  /// got no answer, submits again and the saga starts afresh (no tool was
  /// called). An intent key submitted before is answered as Submit and Run
  /// would (the same saga driven on; kConflict with other content).
  /// `on_recorded`, when set, is told the saga once its intent is durable
  /// (or found), before the drive goes on. Errors: those of Submit and Run.
  Result<storage::SagaRecord> SubmitAndRun(
      const SagaSpec& spec, const Json& input, const std::string& intent_key,
      const std::optional<ModelDecision>& decision = std::nullopt,
      const std::function<void(const SubmitResult&)>& on_recorded = nullptr);

  /// Records a person's decision about a parked step of a saga that needs
  /// attention (journal: who, when, what, why), then drives the saga on.
  /// kFailedPrecondition if the saga or step is not parked, or the decision
  /// does not fit the step's state; kInvalidArgument without `who`, and for
  /// kApplied with a result that is not a JSON object or that leaves a later
  /// step or a compensation without a value it references (the message
  /// names the template and the path; saga/park.h CheckResolvedValues).
  Result<storage::SagaRecord> Resolve(const std::string& saga_id, const Resolution& resolution);

  /// Approves or rejects the commit that `token` stands for, journals who,
  /// when and why, and drives the saga on (an approval commits the step).
  /// A forged, tampered or unknown token fails with one uniform error and
  /// changes nothing; an expired one with kFailedPrecondition. Deciding again
  /// after the decision (a replay, or a second process racing) returns the
  /// saga as recorded and calls nothing. Who may decide is checked first,
  /// the same for every surface (saga/approval_rights.h): kFailedPrecondition
  /// for an unauthenticated decision under a policy that asks a role, a
  /// person without the role, and whoever asked for the commit.
  Result<storage::SagaRecord> Decide(const std::string& token, const ApprovalDecision& decision);

  /// Takes back the undecided commit token of a two-phase step (signed by
  /// `token_key`, which is being retired), previews the step again with the
  /// active key and drives the saga on, so that the person is asked again
  /// (preview_commit::SupersedeToken; saga/re_preview.cc). Under the saga's
  /// lease, like Decide: kUnavailable "busy" if another holds it.
  Result<storage::SagaRecord> RePreview(const std::string& saga_id, const std::string& step_id,
                                        const std::string& token_key, const std::string& who,
                                        const std::string& reason);

  /// Claims runnable sagas (pending, running, compensating) with leases and
  /// drives them, `concurrency` at a time, until options.stop turns true;
  /// then the current steps finish and the leases are released. Sagas whose
  /// owner died are taken over once their lease expires.
  Status Work(const WorkerOptions& worker);

  /// Resumes every pending, running or compensating saga, and every saga
  /// waiting for an approval that was decided or has expired, `concurrency`
  /// at a time. The report says per saga what came of it: a saga that a
  /// drive cannot get past is parked (saga/park.h) and reported kParked
  /// with the reason; a parked saga is not driven again (NeedsDrive).
  Result<RecoveryReport> Recover(int concurrency = 4);

  /// Cancels a saga: records the request (journal `cancel_requested`
  /// {by, reason, request}), then, with request.drive and no other driver,
  /// carries it out: a pending saga is cancelled, a running or paused one
  /// rolls back (completed steps compensated in reverse), one awaiting
  /// approval has its commit rejected (the token is void) and rolls back.
  /// A saga another process drives (or this engine, right now) rolls back
  /// after the step in progress (pending). A saga that needs attention keeps
  /// the request until a person resolves the uncertain step (pending), then
  /// rolls back. Twice is once: a saga cancelled, or rolled back after a
  /// cancel, or rolling back, answers as it stands. kFailedPrecondition for
  /// a saga that finished otherwise; kInvalidArgument without `who`;
  /// kNotFound for no such saga.
  Result<ControlResult> Cancel(const std::string& saga_id, const ControlRequest& request);

  /// Pauses a pending, running or compensating saga between steps: the step
  /// in progress finishes its journal protocol, then the saga is `paused`,
  /// holds no lease and no driver moves it (NeedsDrive is false) until a
  /// Resume or a Cancel. A paused saga answers as it stands (recorded
  /// false). kFailedPrecondition for a finished saga or one that waits for a
  /// person (awaiting approval, needs attention).
  Result<ControlResult> Pause(const std::string& saga_id, const ControlRequest& request);

  /// Resumes a paused saga the way it was going (running, or compensating),
  /// driven on here with request.drive, else by any driver. A pause still
  /// pending is withdrawn. A saga that is not paused answers as it stands.
  /// kFailedPrecondition for a finished saga.
  Result<ControlResult> Resume(const std::string& saga_id, const ControlRequest& request);

  // ---- open sagas (saga/open_saga.h): steps appended one call at a time

  /// Records the intent as an open saga (state `open`, no steps). Every
  /// tool must pass CheckOpenTool (kInvalidArgument naming `tools[i]`). The
  /// same key and content answer the same saga (created false); the same
  /// key with other content is kConflict.
  Result<BeginResult> Begin(const BeginRequest& request);

  /// One tool call of an open saga: appends it as the plan's next step
  /// (journal `call_appended`, with the decision, in the step's
  /// transaction) and drives it under the saga's lease until it succeeds,
  /// fails, waits for an approval or parks; the saga is `open` again after
  /// a success or a failure. A known call id with the same tool and
  /// argument fingerprint answers what is recorded and calls nothing
  /// (deduplicated, "same call_id"); with another tool or other arguments
  /// it is refused (CallRefusal::kCallIdReused); a write or irreversible
  /// tool with the same argument fingerprint as an earlier call (not
  /// failed) answers that call's outcome unless `repeat` (deduplicated,
  /// "same tool and arguments"; journal `call_deduplicated`). A refusal
  /// (not open, tool not allowed, an earlier call waiting, busy, a reused
  /// call id) is an OK
  /// answer with `refusal` set; bad input is kInvalidArgument naming the
  /// field; kNotFound for no such saga.
  Result<CallAnswer> Call(const std::string& saga_id, const CallRequest& request);

  /// The recorded answer of a call, calling nothing. kNotFound for no such
  /// saga or call.
  Result<CallAnswer> GetCall(const std::string& saga_id, const std::string& call_id);

  /// Ends an open saga `succeeded` (journal `saga_succeeded` {by,
  /// committed, decision}). kFailedPrecondition while a call is unsettled
  /// (awaiting approval, in flight, parked: the message names them) and
  /// for a saga that is not open; a committed saga answers as it stands.
  Result<storage::SagaRecord> Commit(const std::string& saga_id, const std::string& who,
                                     const std::optional<ModelDecision>& decision = std::nullopt);

  /// Rolls an open saga back: a Cancel (every completed call compensated in
  /// reverse order). kFailedPrecondition for a saga that is not open.
  Result<ControlResult> Rollback(const std::string& saga_id, const ControlRequest& request);

 private:
  /// Run without the read that answers a finished saga without a lease.
  Result<storage::SagaRecord> Drive(const std::string& saga_id);
  /// Loads the saga and drives it under `lease` (claimed; released on every
  /// way out). An exception parks the saga (see "Faults").
  /// Without leases (epoch 0), the drive holds the saga in this process
  /// (TryHold) unless the caller does already (`held`): kAborted when another
  /// thread of this engine drives it.
  Result<storage::SagaRecord> RunLeased(const storage::Lease& lease, bool held = false);
  /// RunLeased, and for SubmitAndRun a saga not in the store yet (`create`,
  /// recorded by the drive's first write, which then calls `on_created`).
  /// `claimed` (from Store::ClaimAndLoad, for `lease`): the saga and its
  /// control request as read with the claim, not read again.
  Result<storage::SagaRecord> DriveOne(const storage::Lease& lease, bool held,
                                       std::optional<storage::NewSaga> create,
                                       const std::function<void()>& on_created,
                                       storage::ClaimedSaga* claimed = nullptr);
  /// Submit's checks, and the intent, saga and planned steps it records.
  Result<storage::NewSaga> NewIntent(const SagaSpec& spec, const Json& input,
                                     const std::string& intent_key,
                                     const std::optional<ModelDecision>& decision);
  /// Without leases: one driver per saga in this process (an open saga's
  /// call, a worker, the server's pool). False when another holds it.
  bool TryHold(const std::string& saga_id);
  void Unhold(const std::string& saga_id);
  /// TryHold ... Unhold for a scope, when `want` (saga/open_saga.cc).
  class ProcessHold;
  /// Parks a saga whose frozen spec does not load (`spec_error`; OK when it
  /// loads but disagrees with the journal on the steps): saga/park.h.
  Result<storage::SagaRecord> ParkUnloadable(const LoadedSaga& saga, const Status& spec_error,
                                             int64_t fence_epoch);
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
  /// The sagas this engine drives right now (a hint for the control
  /// requests, saga/control.cc: the store holds the requests).
  struct DriveBook;
  void BeginDrive(const std::string& saga_id);
  void EndDrive(const std::string& saga_id);
  bool DrivenHere(const std::string& saga_id);
  /// Records a control request of `kind` (saga/control.cc).
  Result<storage::ControlOutcome> Record(const std::string& saga_id, const char* kind,
                                         const ControlRequest& request);
  /// Carries a recorded request out here if nobody else drives the saga:
  /// false when another drive holds it.
  Result<bool> DriveIfFree(const std::string& saga_id, storage::SagaRecord* out);
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
  std::unique_ptr<DriveBook> drives_;
};

/// The idempotency key of a step: stable across attempts, processes and
/// restarts, unique per (saga, step).
std::string StepKey(const std::string& saga_id, const std::string& step_id);

/// True if a drive now would move the saga: pending, running, compensating, or
/// awaiting an approval that was decided or has expired (the sweeper and Recover).
/// False for a paused saga: only a resume or cancel request moves it (the
/// sweeper and Recover also drive sagas with such a request pending).
bool NeedsDrive(const storage::SagaRecord& saga, int64_t now_ms);

/// Appends to `list` the sagas that a pending control request moves: paused
/// and open ones with any request, ones awaiting approval with a cancel. What
/// Recover, Work and the server's sweeper drive besides what NeedsDrive names.
Status AddControlled(storage::Store* store, std::vector<storage::SagaSummary>* list);

}  // namespace idem
