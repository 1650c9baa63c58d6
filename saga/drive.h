#pragma once
// The saga driver: runs the saga machine's commands on one SagaRun until the
// saga is terminal, parked, waiting for a person, or the engine stops.
//
// kRunNextStep is the forward driver (here): the next step that has not
// succeeded is planned, submitted and called through the step core
// (saga/run.h), or handed to the two-phase driver (preview_commit/
// two_phase.h); kUndoNextStep is the undo driver's (compensation/undo.h).
// Each reports what it came to as a saga event, which this driver fires
// and journals (terminal and parked states at once, a rollback's start
// staged with the list of steps it will not undo).
//
// Thread safety: none; the run belongs to the driving thread.

#include "saga/run.h"

#include "common/status.h"

namespace idem {

/// Drives `run` as far as it goes, then flushes what was staged (valid
/// progress even when the drive stopped early: stopping, a lost lease).
/// A condition no drive can get past parks the saga (saga/park.h): a
/// template without a value, a compensation tool not registered, and a
/// write the store refuses for another reason than a lost lease or a busy
/// store (the saga parks from its durable state; the drive is then OK).
/// Returns the first error.
Status DriveSaga(SagaRun* run);

}  // namespace idem
