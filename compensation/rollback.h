#pragma once
// Rollback planning: which completed effect to undo next, and the keys
// compensations carry.
//
// A rollback undoes completed effects in reverse order of completion: the
// order of the steps' `succeeded` in the journal (SagaRun::CompletionOrder);
// for a saga whose steps run one after another, the reverse of the spec's
// order, which is the same. A step
// whose outcome is uncertain (submitted or unknown) must be resolved before
// anything earlier is undone: it is never compensated, nor skipped, blind.
// Steps that failed for certain, never ran, or have no compensation (reads,
// or `"compensate": null` with a reason) are passed over.
//
// Thread safety: pure functions.

#include <optional>
#include <string>
#include <vector>

#include "storage/store.h"

namespace idem::compensation {

enum class UndoAction {
  kResolveFirst,  ///< outcome uncertain: resolve it, then decide
  kCompensate,    ///< succeeded (or compensating): call its compensation
  kParked,        ///< needs a person already (needs_attention, compensation_failed)
};

struct UndoItem {
  int index = 0;
  UndoAction action = UndoAction::kCompensate;
};

/// The next step to visit in a rollback, or nullopt when nothing is left.
/// `compensable[i]` says whether step i has a compensation. `completed`
/// lists step indices in the order they completed; empty: the spec's order
/// (steps one after another). With it, the steps still uncertain, parked or
/// being undone come first (from last to first), then the completed ones
/// from the last completed to the first.
std::optional<UndoItem> NextUndo(const std::vector<storage::StepRecord>& steps,
                                 const std::vector<bool>& compensable,
                                 const std::vector<int>& completed = {});

/// True when the steps hold at least one effect a rollback must visit.
bool HasEffectsToUndo(const std::vector<storage::StepRecord>& steps,
                      const std::vector<bool>& compensable);

/// Steps that succeeded but will not be undone (no compensation), in the
/// order a rollback passes them: for the journal, so nothing is dropped
/// silently.
std::vector<int> SkippedByRollback(const std::vector<storage::StepRecord>& steps,
                                   const std::vector<bool>& compensable,
                                   const std::vector<int>& completed = {});

/// The compensation's own idempotency key, derived from the step key.
std::string CompensationKey(const std::string& step_key);

}  // namespace idem::compensation
