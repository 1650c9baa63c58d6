#pragma once
// The saga and step state machines: the single authority over transitions.
//
// Each machine is a Boost.MSM functor table (saga_machine.cc,
// step_machine.cc); no MSM type appears here. The machines are pure: an
// event either moves the machine and yields commands for the executor to
// carry out (journal writes, tool calls), or is refused with
// kIllegalTransition and leaves the state unchanged. They perform no I/O.
//
// An event says what happened; the facts fired with it (StepFacts,
// SagaFacts) say what the situation is (may it retry, do more steps remain),
// and guarded rows of the table choose the target from them.
//
// Every enum here is one X-macro list, X(Name, "name") for kName (see
// saga/enum_list.h): the enum, its names and the machine's dispatch follow
// from it, so an event is added with one edit plus its rows.
//
// A machine is restored from a persisted state with its constructor, so
// recovery continues exactly where the journal says the saga stood.
//
// Thread safety: none; one machine belongs to one executor thread.

#include <memory>
#include <string>
#include <vector>

#include "saga/enum_list.h"
#include "saga/states.h"

#include "common/status.h"

namespace idem {

// ---- step machine

// clang-format off
/// Events of a step (past tense: what happened).
#define IDEM_STEP_EVENTS(X)                                                                      \
  X(Submitted,          "submitted")            /* `submitted` is journaled; call the tool */    \
  X(Succeeded,          "succeeded")            /* the tool answered success */                  \
  X(Failed,             "failed")               /* definite failure; facts: retry_allowed */     \
  X(OutcomeUnknown,     "outcome_unknown")      /* the call may or may not have happened */      \
  X(ResolvedApplied,    "resolved_applied")     /* status lookup: the key took effect */         \
  X(ResolvedRetry,      "resolved_retry")       /* not applied, or keys honoured: resend */      \
  X(ResolvedNotApplied, "resolved_not_applied") /* not applied and no retry is allowed */        \
  X(Unresolvable,       "unresolvable")         /* no way to learn the outcome: a person */      \
  X(RollbackStarted,    "rollback_started")     /* rollback; this step has an effect to undo */  \
  X(Undone,             "undone")               /* the compensation succeeded */                 \
  X(UndoFailed,         "undo_failed")          /* the compensation failed; facts: retry_allowed */ \
  X(OperatorApplied,    "operator_applied")     /* a person: the parked action took effect */    \
  X(OperatorNotApplied, "operator_not_applied") /* a person: it did not */                       \
  X(OperatorRetry,      "operator_retry")       /* a person: another attempt, same key */        \
  X(OperatorUndone,     "operator_undone")      /* a person: the failed undo is done */          \
  X(OperatorRetryUndo,  "operator_retry_undo")  /* a person: another round of undo attempts */   \
  X(PreviewRecorded,    "preview_recorded")     /* two-phase: preview and token journaled */     \
  X(ApprovalRequested,  "approval_requested")   /* the commit waits for a person */              \
  X(TokenConsumed,      "token_consumed")       /* the token is spent with `submitted` */        \
  X(Approved,           "approved")             /* approved; the token is spent with `submitted` */ \
  X(Rejected,           "rejected")             /* a person rejected the commit */               \
  X(Expired,            "expired")              /* the token expired; facts: re_preview */       \
  X(StaleRePreview,     "stale_re_preview")     /* the commit found the preview stale */       \
  X(Blocked,            "blocked")              /* the drive cannot go on (saga/park.h): a person */ \
  X(GuardSatisfied,     "guard_satisfied")      /* the step's guard found the effect (saga/guard.h) */ \
  X(Accepted,           "accepted")             /* the provider took the call, finishes later */ \
  X(ResolvedPending,    "resolved_pending")     /* status lookup: pending (or failed to answer) */

/// What the executor must do after a step transition.
#define IDEM_STEP_COMMANDS(X)                                                                    \
  X(CallTool,          "call_tool")           /* call the tool with the step key */              \
  X(RecordSucceeded,   "record_succeeded")    /* journal the result and the effect */            \
  X(RecordFailed,      "record_failed")       /* journal the refusal */                          \
  X(ScheduleRetry,     "schedule_retry")      /* back off, journal the attempt, same key */      \
  X(ResolveOutcome,    "resolve_outcome")     /* status lookup or same-key retry, per the tool */ \
  X(ParkStep,          "park_step")           /* journal needs_attention with the reason */      \
  X(CallCompensation,  "call_compensation")   /* call the compensation with its own key */       \
  X(ScheduleUndoRetry, "schedule_undo_retry") /* back off, call the compensation again */        \
  X(RecordUndone,      "record_undone")       /* journal the compensation and its effect */ \
  X(AwaitCompletion,   "await_completion")    /* journal `processing` and the next check */
// clang-format on

IDEM_DECLARE_ENUM(StepEvent, IDEM_STEP_EVENTS);
IDEM_DECLARE_ENUM(StepCommand, IDEM_STEP_COMMANDS);
const char* StepEventName(StepEvent e);
const char* StepCommandName(StepCommand c);

/// The situation a step event happened in. Guards of the step table read
/// it; an event ignores the fields it does not name.
struct StepFacts {
  /// kFailed (from submitted), kUndoFailed: policy allows another attempt
  /// with the same key.
  bool retry_allowed = false;
  /// kExpired while awaiting approval: the spec's on_expiry is re_preview,
  /// else rollback. An expired token without approval always previews again.
  bool re_preview = false;

  static StepFacts WithRetryAllowed(bool v) {
    StepFacts f;
    f.retry_allowed = v;
    return f;
  }
  static StepFacts WithRePreview(bool v) {
    StepFacts f;
    f.re_preview = v;
    return f;
  }
};

class StepMachine {
 public:
  /// A machine standing in `state` (kPlanned for a new step).
  explicit StepMachine(StepState state);
  ~StepMachine();
  StepMachine(StepMachine&&) noexcept;
  StepMachine& operator=(StepMachine&&) noexcept;

  StepState state() const;
  /// Moves on `event` in the situation `facts`. kIllegalTransition (state
  /// unchanged) if no row of the table accepts it in the current state.
  Result<std::vector<StepCommand>> Fire(StepEvent event, const StepFacts& facts = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- saga machine

// clang-format off
#define IDEM_SAGA_EVENTS(X)                                                                      \
  X(Started,              "started")                /* the executor took the saga up */          \
  X(StepCompleted,        "step_completed")         /* a step succeeded; facts: more_steps */    \
  X(StepFailed,           "step_failed")            /* a step failed for good; facts: effects_to_undo */ \
  X(StepParked,           "step_parked")            /* a step needs a person */                  \
  X(CancelRequested,      "cancel_requested")       /* a caller cancelled */                     \
  X(UndoCompleted,        "undo_completed")         /* a compensation finished; facts: more_steps */ \
  X(UndoParked,           "undo_parked")            /* a compensation gave up: a person must look */ \
  X(OperatorResumed,      "operator_resumed")       /* a person resolved the parked step; facts: rolling_back */ \
  X(StepAwaitingApproval, "step_awaiting_approval") /* a step waits for a person's approval */   \
  X(ApprovalSettled,      "approval_settled")       /* approved, rejected or expired: go on */ \
  X(PauseRequested,       "pause_requested")        /* a person paused it: stop between steps */ \
  X(Resumed,              "resumed")                /* a person resumed it; facts: rolling_back */ \
  X(CallAppended,         "call_appended")          /* an open saga took a call: drive it */     \
  X(CommitRequested,      "commit_requested")       /* the agent committed an open saga */       \
  X(IdleTimedOut,         "idle_timed_out")         /* an open saga idled past its timeout; facts: park_on_idle */ \
  X(StepProcessing,       "step_processing")        /* a step waits for its provider to finish */ \
  X(CompletionDue,        "completion_due")         /* a waiting step's next check is due */

#define IDEM_SAGA_COMMANDS(X)                                                                    \
  X(RunNextStep,    "run_next_step")                                                             \
  X(UndoNextStep,   "undo_next_step")                                                            \
  X(RecordTerminal, "record_terminal")                                                           \
  X(RecordParked,   "record_parked")                                                             \
  X(RecordWaiting,  "record_waiting")  /* commit the waiting state; the drive ends */
// clang-format on

IDEM_DECLARE_ENUM(SagaEvent, IDEM_SAGA_EVENTS);
IDEM_DECLARE_ENUM(SagaCommand, IDEM_SAGA_COMMANDS);
const char* SagaEventName(SagaEvent e);
const char* SagaCommandName(SagaCommand c);

/// The situation a saga event happened in. Guards of the saga table read
/// it; an event ignores the fields it does not name.
struct SagaFacts {
  /// kStepCompleted: steps remain to run; kUndoCompleted: steps remain to undo.
  bool more_steps = false;
  /// kStepFailed, kCancelRequested (of a paused saga): completed effects
  /// exist that a rollback must undo.
  bool effects_to_undo = false;
  /// kOperatorResumed, kResumed: a rollback had begun before the saga was
  /// parked or paused. kCancelRequested of a paused saga: see effects_to_undo.
  bool rolling_back = false;
  /// An open saga (saga/open_saga.h): a call that ends (succeeded or failed)
  /// leaves it open for the next call instead of ending the saga.
  bool open_saga = false;
  /// kIdleTimedOut: the open saga's policy is `park` (pause it for a
  /// person), else it rolls back.
  bool park_on_idle = false;

  static SagaFacts WithMoreSteps(bool v) {
    SagaFacts f;
    f.more_steps = v;
    return f;
  }
  static SagaFacts WithEffectsToUndo(bool v) {
    SagaFacts f;
    f.effects_to_undo = v;
    return f;
  }
  static SagaFacts WithRollingBack(bool v) {
    SagaFacts f;
    f.rolling_back = v;
    return f;
  }
};

class SagaMachine {
 public:
  /// A machine standing in `state` (kPending for a new saga).
  explicit SagaMachine(SagaState state);
  ~SagaMachine();
  SagaMachine(SagaMachine&&) noexcept;
  SagaMachine& operator=(SagaMachine&&) noexcept;

  SagaState state() const;
  /// Moves on `event` in the situation `facts`; kIllegalTransition (state
  /// unchanged) if no row accepts it.
  Result<std::vector<SagaCommand>> Fire(SagaEvent event, const SagaFacts& facts = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
