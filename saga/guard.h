#pragma once
// Guards (conditional execution): before a planned step's write, ask
// whether its effect already exists (the spec's shape: saga/guard_spec.h).
//
//   - exists: the step is recorded succeeded with the guard's answer as its
//     result (journal `succeeded` with `satisfied_by: "guard"` and the
//     guard's tool and attempts, and an effects row); its tool is not called.
//     The step is then like any succeeded step: later steps read its result,
//     a rollback compensates it.
//   - absent: `guard_checked {answer: "absent"}` is journaled with the
//     step's `submitted`, and the write runs under the normal protocol.
//   - no answer (the read failed, was uncertain, or answered a result that is
//     not an object where a pointer must look): the guard is retried under
//     its read retry policy, then the step parks needs_attention with code
//     `guard_unanswered`. An unknown answer never leads to a blind write.
//
// A guard is a read: a crash between its answer and the journal entry only
// means the next drive asks again (the step is still planned).
//
// Before the guard, a step whose key template does not render parks with
// code `invalid_spec` (the submit-time check makes this a frozen spec or
// input that changed; saga/step_key.h).
//
// Thread safety: as SagaRun, one driving thread.

#include <optional>

#include "saga/run.h"

#include "common/status.h"

namespace idem {

/// Called by the forward driver for a planned step whose arguments are
/// resolved, before its `submitted` or preview. The step's end when this
/// ended it (kSucceeded by the guard, kParked); nullopt when the write goes
/// on. Errors are the store's or the lease's.
Result<std::optional<StepEnd>> BeforeWrite(SagaRun* run, StepDrive* d);

}  // namespace idem
