#pragma once
// SagaRun: one drive of one saga, and the step-execution core that the
// three drivers share: the forward driver (saga/drive.h), the two-phase
// driver (preview_commit/two_phase.h) and the undo driver
// (compensation/undo.h).
//
// The core owns what every driver needs the same way:
//   - the saga as loaded (LoadedSaga: its states converted from the store's
//     strings once, back to strings only in the batches it writes);
//   - journal staging (docs/architecture.md, "Staged writes"): a write is
//     staged or committed at once; Flush writes what is staged in one
//     transaction, fenced on the drive's lease, and reports the journal to
//     the observer once it is durable;
//   - argument templates and their context;
//   - a step's command loop: calling the tool with the step key and carrying
//     out what the effect protocol (effect/protocol.h) decides about each
//     answer: record it, a keyed retry, a status lookup, a same-key resend, a
//     wait for the provider, or a person; never a fresh call for an
//     uncertain outcome. Every call goes through effect/call.h.
//
// Thread safety: one run belongs to one driving thread, except while the
// forward driver runs several steps at once (saga/branches.h): then every
// thread that uses the run holds branch_mutex(), and lets it go only around
// calls to the outside world (CallBoundary). The run keeps pointers to the
// store, the tools and the options, which must outlive it.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "saga/machines.h"
#include "saga/options.h"
#include "saga/spec.h"
#include "saga/states.h"
#include "storage/control_store.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/status.h"
#include "effect/call.h"
#include "effect/protocol.h"

namespace idem {

/// A saga as loaded from the store, with its states typed.
struct LoadedSaga {
  storage::SagaRecord record;  ///< as stored (state strings included)
  SagaState state = SagaState::kPending;
  std::vector<StepState> steps;  ///< by index, the states of record.steps

  /// Converts the stored state names once. kInternal for a name that is not
  /// a state (a journal this build cannot read).
  static Result<LoadedSaga> From(storage::SagaRecord record);
};

/// How a step's drive ended.
enum class StepEnd {
  kSucceeded,
  kFailed,
  kParked,      ///< needs_attention
  kWaiting,     ///< a two-phase commit waits for a person
  kStale,       ///< a two-phase commit found its preview stale: drive it again
  kProcessing,  ///< the provider finishes later: the saga waits (saga/completion.h)
};

/// One step being driven: the working copy of its row, its machine and the
/// commands the machine emitted that are still to be carried out. The row's
/// `state` string is stale: the machine holds the state, written to the row
/// only in a batch.
struct StepDrive {
  StepDrive(int index, const StepSpec* spec, Tool* tool, storage::StepRecord row, StepState state)
      : index(index), spec(spec), tool(tool), st(std::move(row)), m(state) {}

  int index;
  const StepSpec* spec;
  Tool* tool;
  storage::StepRecord st;
  /// The key the step's calls carry (saga/step_key.h): st.step_key, or the
  /// step's rendered "key" template; empty when it does not render (then
  /// `key_error` says why and the step parks before any call).
  std::string key;
  std::string key_error;
  StepMachine m;
  std::deque<StepCommand> queue;
  ToolOutcome outcome;
  /// The uncertain call was made by a previous driver that may still be
  /// alive (SagaRun::MarkTakenOver), not by this drive.
  bool inherited = false;
  /// The step was found uncertain (submitted, unknown) by this drive: the
  /// call was made by a driver that died or lost its lease.
  bool found_uncertain = false;
  /// When the success the protocol decided to record must be durable.
  effect::Durability durability = effect::Durability::kNow;
  bool rolling_back = false;
  /// The step's check while it waits for its provider (processing), as
  /// stored; written with the step's batches (removed once it stops waiting).
  std::optional<storage::StepCheck> check;

  StepState state() const { return m.state(); }
  /// Moves the machine on `e` in the situation `facts` and queues the
  /// commands it emits. kIllegalTransition (nothing changed) if the table
  /// refuses it.
  Status Fire(StepEvent e, const StepFacts& facts = {});
};

class SagaRun {
 public:
  SagaRun(storage::Store* store, const ToolRegistry* tools, const EngineOptions& options,
          LoadedSaga saga, SagaSpec spec);
  SagaRun(const SagaRun&) = delete;
  SagaRun& operator=(const SagaRun&) = delete;

  // ---- the drive's lease

  /// Fences every write on `epoch`; `lost` turns true when the lease keeper
  /// fails to renew (no tool is called after that).
  void Fence(int64_t epoch, const std::atomic<bool>* lost) {
    fence_epoch_ = epoch;
    lease_lost_ = lost;
  }
  bool leased() const { return fence_epoch_ != 0; }
  /// The saga is not in the store yet (Engine::SubmitAndRun): the first
  /// Flush records `create` together with what is staged
  /// (WriteBatch::create), then calls `on_created`. If that write is
  /// refused, nothing of the saga is ever in the store: every later write
  /// is refused the same way, without a store call.
  void CreateWithFirstFlush(storage::NewSaga create, std::function<void()> on_created);
  /// True while the saga is not in the store (CreateWithFirstFlush).
  bool unborn() const { return unborn_; }
  /// True once the drive's last write gave the lease up with it (a
  /// terminal, parked or waiting saga state under a lease).
  bool released() const { return released_; }
  /// The saga's previous driver may still be alive (a shared store with
  /// leases): a step it left `submitted` may have a call still in flight.
  void MarkTakenOver() { taken_over_ = true; }
  bool taken_over() const { return taken_over_; }
  /// The saga's pending control request (cancel, pause, resume) as the
  /// store holds it (storage/control_store.h; nullopt for a store without
  /// them, and without a read while the saga is unborn: no request can
  /// name it yet): asked before the drive and between steps
  /// (saga/run_control.cc).
  Result<std::optional<storage::ControlRequest>> PendingControl() const;
  /// What the next PendingControl answers without a read: the request as
  /// read with the drive's claim (Store::ClaimAndLoad) or with its last
  /// write (Store::CommitReadingControl, asked by Flush for a write that
  /// carries no `submitted` and does not end the drive). Used once, only
  /// within kPrefetchFreshMs of the read, and dropped by the next write, by
  /// a call to the outside world (CallBoundary) and by SettleControl: the
  /// check it answers sees every request filed before the drive's last
  /// write, and nothing outside happened since.
  void PrefetchControl(std::optional<storage::ControlRequest> pending);
  static constexpr int64_t kPrefetchFreshMs = 50;
  /// Removes the request once carried out (its state change durable), and
  /// drops a prefetched answer (it may name the request just removed).
  Status SettleControl(const std::string& request_id) const;
  /// For a resume: whether the saga was rolling back when it was paused
  /// (the journal's last `saga_paused` entry says where it came from).
  Result<bool> PausedWhileRollingBack() const;
  /// The earliest next check of the saga's steps that wait for their
  /// provider (saga/completion.h); nullopt when none waits.
  Result<std::optional<int64_t>> EarliestCheck() const;
  /// The indices of the `processing` steps whose check is due now (or that
  /// have none: their lookup says where they stand), in index order.
  Result<std::vector<int>> DueProcessingSteps() const;
  /// Before any call to the outside world: kAborted once the lease is lost.
  Status CheckLease() const;
  /// True when the engine is asked to stop between steps.
  bool Stopping() const { return options_.stop != nullptr && options_.stop->load(); }

  // ---- the saga

  /// The record as durable or staged (state strings included).
  const storage::SagaRecord& record() const { return rec_; }
  const std::string& saga_id() const { return rec_.summary.saga_id; }
  SagaState state() const { return state_; }
  StepState step_state(int index) const { return step_states_[index]; }
  const std::vector<StepState>& step_states() const { return step_states_; }
  int step_count() const { return static_cast<int>(rec_.steps.size()); }
  const SagaSpec& spec() const { return spec_; }
  /// compensable()[i]: step i has a compensation.
  const std::vector<bool>& compensable() const { return compensable_; }
  const EngineOptions& options() const { return options_; }
  const ToolRegistry& tools() const { return *tools_; }
  Clock* clock() const { return options_.clock; }
  /// Backoff jitter, seeded per saga.
  std::mt19937_64* rng() { return &rng_; }
  /// Why the saga rolls back, parks or fails (kept on the saga's record).
  const std::string& park_reason() const { return park_reason_; }
  void set_park_reason(std::string reason) { park_reason_ = std::move(reason); }

  // ---- journal

  enum class Durable { kNow, kWithNextFlush };
  /// The protocol's durability (effect::Durability, decided by
  /// effect/protocol.h) as the run's.
  static Durable DurabilityOf(effect::Durability d) {
    return d == effect::Durability::kNow ? Durable::kNow : Durable::kWithNextFlush;
  }

  storage::JournalEntry Entry(const std::string& step_id, const std::string& event,
                              Json data) const;
  /// Writes the step's row (its state from the machine) with one journal
  /// entry and `effects`.
  Status CommitStep(const StepDrive& d, const std::string& event, Json data,
                    std::vector<storage::EffectRecord> effects = {},
                    Durable durable = Durable::kNow);
  /// The effects row of step `d`'s action with its result (st.result,
  /// st.external_ref), under the step's stored key (unique per saga and
  /// step; the provider's key is in the journal).
  storage::EffectRecord ActionEffect(const StepDrive& d) const;
  /// Writes the step's row with `entries`, at once; spends the commit token
  /// nonce `consume_nonce` in the same transaction when given.
  Status CommitEntries(const StepDrive& d, std::vector<storage::JournalEntry> entries,
                       const std::string& consume_nonce = "");
  /// Journal entries alone, at once.
  Status CommitJournal(std::vector<storage::JournalEntry> entries);
  /// Moves the saga to `next` with `reason` and its journal entry.
  /// `ends_drive`: the drive's last write, which gives a held lease up in
  /// the same transaction.
  Status CommitSagaState(SagaState next, const std::string& reason, storage::JournalEntry entry,
                         bool ends_drive, Durable durable);
  /// Writes whatever is staged, in one transaction.
  Status Flush();

  // ---- steps

  /// The key step `index`'s calls carry (StepDrive::key); empty when its
  /// template does not render, with the error in *error.
  std::string CallKey(int index, std::string* error = nullptr) const;
  /// Step `index` ready to drive: its tool, its machine in its state.
  /// kFailedPrecondition if the tool is not registered.
  Result<StepDrive> BeginStep(int index, bool rolling_back);
  /// Resolves `templ` against the saga's input and the steps so far, within
  /// options().limits.max_arg_bytes (saga/limits.h).
  Result<Json> ResolveArgs(const Json& templ, const std::string& where) const;
  /// A forward step's arguments: ResolveArgs, also within what
  /// max_saga_bytes leaves beside the input and the arguments of the steps
  /// already submitted. A breach is kInvalidArgument naming the place.
  Result<Json> ResolveStepArgs(int index) const;
  /// What the effect protocol needs to know of step `d` (effect::Situation):
  /// its tool's capabilities, attempts, whether its call may be in flight,
  /// whether forward attempts are over. The answers are the caller's to set.
  effect::Situation SituationOf(const StepDrive& d, effect::CallKind kind) const;
  /// The kind of step `d`'s call: an action, a two-phase commit, an open
  /// saga's call.
  effect::CallKind CallKindOf(const StepDrive& d) const;
  /// Asks step `d`'s status lookup (with the lookup backoff between asks)
  /// while the protocol decides to look up, and returns its decision;
  /// `look` gets the last answer.
  effect::Decision LookUpUntilDecided(StepDrive* d, effect::Situation* s, LookupOutcome* look);
  /// A step found `submitted` or `unknown` (after a crash, a lost lease, or
  /// a rollback reaching it): resolves the outcome, then runs the commands.
  Result<StepEnd> SettleUncertain(StepDrive* d);
  /// Carries out the queued commands until the step ends: call, outcome,
  /// keyed retry, resolution, park.
  Result<StepEnd> RunCommands(StepDrive* d);

  /// Parks the saga needs_attention with `reason` after a fault of the drive
  /// itself (an exception), through the saga machine and the journal like
  /// any other park, with what was staged. Writes nothing when the drive had
  /// already ended (its last write made: terminal, parked or waiting);
  /// kIllegalTransition, nothing written, where the machine refuses (a saga
  /// still pending).
  /// `rewind`: the drive's last write was refused, so the park starts from
  /// the saga state that is durable, not from the one the refused batch
  /// carried (which may have been terminal).
  Status ParkAfterFault(const std::string& reason, bool rewind = false);
  /// The error of the last write the store refused in this drive (OK when
  /// none was refused).
  const Status& store_refusal() const { return store_refusal_; }

  // ---- several forward steps in flight (saga/branches.h)

  /// Held by every thread that uses the run while branches run.
  std::mutex& branch_mutex() { return branch_mu_; }
  /// Set, under branch_mutex(), while branches run.
  void set_parallel(bool on) { parallel_ = on; }
  /// The boundary of one call to the outside world made for this run (a
  /// tool's call, preview or status lookup; a backoff sleep), handed to
  /// effect/call.h: entering it drops a prefetched control request (read
  /// before the call, it is stale after it), and while branches run lets
  /// branch_mutex() go, so the other branches' calls overlap it. One per
  /// call, on the calling thread.
  class CallBoundary final : public effect::Boundary {
   public:
    explicit CallBoundary(SagaRun* run) : run_(run) {}
    void Enter() override {
      run_->DropPrefetchedControl();
      unlocked_ = run_->parallel_;
      if (unlocked_) run_->branch_mu_.unlock();
    }
    void Leave() override {
      if (unlocked_) run_->branch_mu_.lock();
      unlocked_ = false;
    }

   private:
    SagaRun* run_;
    bool unlocked_ = false;
  };
  /// A branch failed for certain: the forward steps still in flight make no
  /// further retry, and no resend after a status lookup said "not applied"
  /// (they end failed), so that the rollback can begin.
  void HaltForward() { forward_halted_ = true; }
  /// The steps in the order they completed (the journal's order of their
  /// `succeeded`, or of a person's `applied`, staged ones last), for a
  /// rollback in reverse order of completion (compensation::NextUndo).
  /// Empty for a spec without "after": its order is the spec's.
  Result<std::vector<int>> CompletionOrder() const;

 private:
  void Stage(storage::WriteBatch batch);
  void DropPrefetchedControl() const;
  Status Commit(storage::WriteBatch batch);
  /// A batch with the step's row, its state from the machine (now also the
  /// run's).
  storage::WriteBatch StepBatch(const StepDrive& d);
  /// Carries out the protocol's decision about the call's own answer
  /// (d->outcome): the step event to fire, an `unknown` journaled first for
  /// an uncertain one.
  Status OnCallAnswer(StepDrive* d);
  /// Resolves an uncertain outcome, or a waiting step's due check
  /// (saga/completion.h), by the protocol: the step event it came to.
  StepEvent ResolveUnknown(StepDrive* d);
  /// The step event for decision `dec` after lookups about an uncertain
  /// call, with the step's error or outcome set from `look`.
  StepEvent ResolvedEvent(StepDrive* d, const effect::Situation& s, const effect::Decision& dec,
                          const LookupOutcome& look);

  storage::Store* store_;
  const ToolRegistry* tools_;
  const EngineOptions& options_;
  storage::SagaRecord rec_;
  SagaState state_;
  SagaState durable_state_;  // the saga's state as the store holds it
  Status store_refusal_;
  std::vector<StepState> step_states_;
  SagaSpec spec_;
  std::vector<bool> compensable_;
  std::mt19937_64 rng_;
  std::string park_reason_;
  int64_t fence_epoch_ = 0;
  const std::atomic<bool>* lease_lost_ = nullptr;
  bool taken_over_ = false;
  storage::WriteBatch staged_;  // written to rec_ already, not yet to the store
  bool has_staged_ = false;
  bool staged_ends_drive_ = false;  // a staged state change ends the drive
  bool released_ = false;
  std::optional<storage::NewSaga> create_;  // recorded by the first Flush
  std::function<void()> on_created_;
  bool unborn_ = false;
  mutable std::mutex prefetch_mu_;
  // GUARDED_BY(prefetch_mu_): set: PendingControl's next answer.
  mutable std::optional<std::optional<storage::ControlRequest>> prefetched_control_;
  int64_t prefetched_ms_ = 0;  // GUARDED_BY(prefetch_mu_): when it was set
  std::mutex branch_mu_;
  bool parallel_ = false;        // GUARDED_BY(branch_mu_) while branches run
  bool forward_halted_ = false;  // GUARDED_BY(branch_mu_) while branches run
};

}  // namespace idem
