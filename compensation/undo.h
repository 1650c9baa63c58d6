#pragma once
// The undo driver: how a rollback runs, one step at a time.
//
// A saga in `compensating` asks UndoNextStep for its next move until the
// planner (compensation/rollback.h, NextUndo) finds nothing left:
//   - an uncertain step (submitted, unknown) is resolved first through the
//     step core (saga/run.h), never compensated blind; one resolved as never
//     applied gets a `null_compensation` journal entry and no undo call;
//   - a succeeded step with a compensation is undone with its own key
//     (CompensationKey) and the spec's compensation retry policy (bounded,
//     backed-off); every answer, and a compensation found `compensating`
//     after a crash or a takeover, is read by the effect protocol
//     (effect/protocol.h): a status lookup, a resend only where it cannot
//     make a second undo, or a person;
//   - a compensation that keeps failing, or whose outcome cannot be learnt,
//     parks the step `compensation_failed` and the saga needs_attention with
//     the reason; the earlier undos wait for a person, whose decisions
//     (Decision::kUndone, kRetryUndo) ApplyUndoDecision records.
//
// Thread safety: none; the run belongs to the driving thread.

#include <optional>
#include <string>

#include "saga/decisions.h"
#include "saga/machines.h"
#include "saga/run.h"
#include "storage/store.h"

#include "common/status.h"

namespace idem::compensation {

/// What a move of a rollback came to, for the saga machine.
struct UndoMove {
  SagaEvent event;  ///< kUndoCompleted (facts: more_steps) or kUndoParked
  SagaFacts facts;
};

/// One move of a rollback on `run`. Returns the saga event it came to (for
/// kUndoParked the park reason is set on the run), or nullopt when an
/// uncertain step was resolved and the planner must look again. A store
/// error or a missing tool is returned.
Result<std::optional<UndoMove>> UndoNextStep(SagaRun* run);

/// Records a person's decision about a failed compensation of step `st`
/// (whose machine already accepted it) into `st` and `batch`:
/// kUndone records the compensation's effect as carried out by hand (tool
/// `compensation_tool`), kRetryUndo starts a new round of attempts with the
/// same key. Other decisions are not the undo driver's: kInvalidArgument.
Status ApplyUndoDecision(const Resolution& resolution, const std::string& compensation_tool,
                         int64_t now_ms, storage::StepRecord* st, storage::WriteBatch* batch);

}  // namespace idem::compensation
