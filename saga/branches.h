#pragma once
// The forward driver's scheduler: runs the steps that are ready (every step
// they run after has succeeded, saga/schedule.h), several at once when the
// step graph lets them.
//
// One round (RunReadySteps):
//   - the ready steps are those ReadySteps names, and the `processing`
//     steps whose check is due (their status is asked once); a processing
//     step whose check is not due is in flight: its dependants wait, the
//     other branches run, and the round ends kProcessing once nothing else
//     runs (the saga waits in awaiting_completion);
//   - nothing starts once a step has failed or parked (this drive or a
//     previous one), or while a control request is pending, or the engine is
//     stopping: what is in flight finishes its protocol, then the round ends;
//   - a single ready step is driven on the calling thread, exactly as a
//     sequential saga always was;
//   - several ready steps start together: each is planned and its
//     `submitted` staged, then all of them are flushed in one transaction
//     before any of their tools is called; then each runs on a thread of its
//     own (at most EngineOptions::max_parallel_steps at once), its outcome
//     journaled as it comes. A step that becomes ready while others are in
//     flight starts the same way;
//   - a branch that fails for certain halts the others' retries
//     (SagaRun::HaltForward) and nothing new starts; the rollback begins
//     once every branch has ended. A branch at its provider (processing)
//     has not: the round ends kProcessing and the saga waits for its
//     check (later drives start nothing new); once it settles, the
//     rollback undoes it too if its provider finished it.
//
// The run's lock (SagaRun::branch_mutex) is held by whichever thread uses the
// run; branches let it go only around calls to the outside world, so the
// journal, the staged batch and the step rows are touched by one thread at a
// time, in the order the outcomes come.
//
// Thread safety: called from the driving thread; starts and joins its own.

#include <functional>
#include <optional>

#include "saga/run.h"

#include "common/status.h"

namespace idem {

/// How the forward driver (saga/drive.cc) drives one step.
struct StepDrivers {
  /// Drives step `index` until it ends: the whole protocol.
  std::function<Result<StepEnd>(int index)> drive;
  /// For a planned one-phase step: resolves its arguments and stages its
  /// `submitted` (flushed with the others that start with it), leaving the
  /// drive ready to call its tool; or decides it without a call (its queue
  /// holds the record). nullopt: drive this step whole (two-phase, or found
  /// uncertain after a crash).
  std::function<Result<std::optional<StepDrive>>(int index)> stage;
};

/// What a round of ready steps came to.
struct ForwardRound {
  enum End {
    kAllSucceeded,  ///< every step succeeded
    kFailed,        ///< a step failed for certain: roll back
    kParked,        ///< a step needs a person
    kWaiting,       ///< a two-phase commit waits for an approval
    kProcessing,    ///< a step waits for its provider (saga/completion.h)
    kMore,          ///< progress; more steps to run
  };
  End end = kMore;
  int step = -1;  ///< the failed or parked step
};

/// Runs one round of the saga's ready steps (above).
Result<ForwardRound> RunReadySteps(SagaRun* run, const StepDrivers& drivers);

}  // namespace idem
