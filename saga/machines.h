#pragma once
// The saga and step state machines: the single authority over transitions.
//
// Each machine is a Boost.MSM functor table (saga_machine.cc,
// step_machine.cc); no MSM type appears here. The machines are pure: an
// event either moves the machine and yields commands for the executor to
// carry out (journal writes, tool calls), or is refused with
// kIllegalTransition and leaves the state unchanged. They perform no I/O.
//
// A machine is restored from a persisted state with its constructor, so
// recovery continues exactly where the journal says the saga stood.
//
// Thread safety: none; one machine belongs to one executor thread.

#include <memory>
#include <string>
#include <vector>

#include "saga/states.h"

#include "common/status.h"

namespace idem {

// ---- step machine

/// Events of a step (past tense: what happened).
enum class StepEvent {
  kSubmitted,            ///< `submitted` is journaled; call the tool
  kSucceeded,            ///< the tool answered success
  kFailedRetryable,      ///< definite failure, policy allows a keyed retry
  kFailedFinal,          ///< definite failure, no retry left
  kOutcomeUnknown,       ///< the call may or may not have happened
  kResolvedApplied,      ///< status lookup: the key took effect
  kResolvedRetry,        ///< lookup says not applied, or the tool honours keys: resend
  kResolvedNotApplied,   ///< lookup says not applied and no retry is allowed
  kUnresolvable,         ///< no way to learn the outcome: a person must look
  kRollbackStarted,      ///< the saga rolls back and this step has an effect to undo
  kUndone,               ///< the compensation succeeded
  kUndoFailedRetryable,  ///< the compensation failed; try again with backoff
  kUndoFailedFinal,      ///< the compensation failed for good
  kOperatorApplied,      ///< a person confirmed the parked action took effect
  kOperatorNotApplied,   ///< a person confirmed it did not
  kOperatorRetry,        ///< a person asks for another attempt, same key
  kOperatorUndone,       ///< a person confirmed the failed undo is done
  kOperatorRetryUndo,    ///< a person asks for another round of undo attempts
  kPreviewRecorded,      ///< two-phase: preview and commit token journaled
  kApprovalRequested,    ///< the commit waits for a person
  kTokenConsumed,        ///< the token is spent with `submitted`: commit now
  kApproved,             ///< a person approved; the token is spent with `submitted`
  kRejected,             ///< a person rejected the commit
  kExpiredRePreview,     ///< the token expired; policy: preview again
  kExpiredRollback,      ///< the token expired; policy: roll back
  kStaleRePreview,       ///< the commit found the preview stale; preview again
};
const char* StepEventName(StepEvent e);

/// What the executor must do after a step transition.
enum class StepCommand {
  kCallTool,           ///< call the tool with the step key
  kRecordSucceeded,    ///< journal the result and the effect
  kRecordFailed,       ///< journal the refusal
  kScheduleRetry,      ///< back off, journal the next attempt, call with the same key
  kResolveOutcome,     ///< status lookup or same-key retry, per the tool
  kParkStep,           ///< journal needs_attention with the reason
  kCallCompensation,   ///< call the compensation with its own key
  kScheduleUndoRetry,  ///< back off, call the compensation again, same key
  kRecordUndone,       ///< journal the compensation and its effect
};
const char* StepCommandName(StepCommand c);

class StepMachine {
 public:
  /// A machine standing in `state` (kPlanned for a new step).
  explicit StepMachine(StepState state);
  ~StepMachine();
  StepMachine(StepMachine&&) noexcept;
  StepMachine& operator=(StepMachine&&) noexcept;

  StepState state() const;
  /// Moves on `event`. kIllegalTransition (state unchanged) if no row of the
  /// table accepts it in the current state.
  Result<std::vector<StepCommand>> Fire(StepEvent event);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- saga machine

enum class SagaEvent {
  kStarted,               ///< the executor took the saga up
  kStepCompletedMore,     ///< a step succeeded and more remain
  kStepCompletedLast,     ///< the last step succeeded
  kStepFailedUndo,        ///< a step failed for good; completed effects exist
  kStepFailedNothing,     ///< a step failed for good; nothing to undo
  kStepParked,            ///< a step needs a person
  kCancelRequested,       ///< a caller cancelled
  kUndoCompletedMore,     ///< a compensation finished; more remain
  kUndoCompletedLast,     ///< the last compensation finished
  kUndoParked,            ///< a compensation gave up: a person must look
  kOperatorResumed,       ///< a person resolved the parked step; go on forward
  kOperatorResumedUndo,   ///< a person resolved the parked step; go on undoing
  kStepAwaitingApproval,  ///< a step waits for a person's approval
  kApprovalSettled,       ///< approved, rejected or expired: go on
};
const char* SagaEventName(SagaEvent e);

enum class SagaCommand {
  kRunNextStep,
  kUndoNextStep,
  kRecordTerminal,
  kRecordParked,
  kRecordWaiting,  ///< commit awaiting_approval; the drive ends
};
const char* SagaCommandName(SagaCommand c);

class SagaMachine {
 public:
  explicit SagaMachine(SagaState state);
  ~SagaMachine();
  SagaMachine(SagaMachine&&) noexcept;
  SagaMachine& operator=(SagaMachine&&) noexcept;

  SagaState state() const;
  Result<std::vector<SagaCommand>> Fire(SagaEvent event);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
