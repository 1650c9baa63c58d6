#include "compensation/rollback.h"

namespace idem::compensation {
namespace {

bool Compensable(const std::vector<bool>& compensable, int i) {
  return i < static_cast<int>(compensable.size()) && compensable[i];
}

// The steps a rollback passes, in its order: from the last to complete to
// the first (`completed`, then any succeeded step it misses), or from the
// last step to the first when `completed` is empty.
std::vector<int> RollbackOrder(const std::vector<storage::StepRecord>& steps,
                               const std::vector<int>& completed) {
  const int n = static_cast<int>(steps.size());
  std::vector<int> out;
  std::vector<bool> listed(n, false);
  for (auto it = completed.rbegin(); it != completed.rend(); ++it) {
    if (*it >= 0 && *it < n && !listed[*it]) {
      listed[*it] = true;
      out.push_back(*it);
    }
  }
  for (int i = n - 1; i >= 0; --i) {
    if (!listed[i]) out.push_back(i);
  }
  return out;
}

}  // namespace

std::optional<UndoItem> NextUndo(const std::vector<storage::StepRecord>& steps,
                                 const std::vector<bool>& compensable,
                                 const std::vector<int>& completed) {
  if (!completed.empty()) {
    // Several steps may have been in flight: whatever is uncertain, parked
    // or half undone is settled before anything else is undone.
    for (int i = static_cast<int>(steps.size()) - 1; i >= 0; --i) {
      const std::string& s = steps[i].state;
      if (s == "submitted" || s == "unknown") return UndoItem{i, UndoAction::kResolveFirst};
      if (s == "needs_attention" || s == "compensation_failed")
        return UndoItem{i, UndoAction::kParked};
      if (s == "compensating") return UndoItem{i, UndoAction::kCompensate};
    }
  }
  for (int i : RollbackOrder(steps, completed)) {
    const std::string& s = steps[i].state;
    if (s == "submitted" || s == "unknown") return UndoItem{i, UndoAction::kResolveFirst};
    if (s == "needs_attention" || s == "compensation_failed")
      return UndoItem{i, UndoAction::kParked};
    if (s == "compensating") return UndoItem{i, UndoAction::kCompensate};
    if (s == "succeeded" && Compensable(compensable, i)) {
      return UndoItem{i, UndoAction::kCompensate};
    }
  }
  return std::nullopt;
}

bool HasEffectsToUndo(const std::vector<storage::StepRecord>& steps,
                      const std::vector<bool>& compensable) {
  return NextUndo(steps, compensable).has_value();
}

std::vector<int> SkippedByRollback(const std::vector<storage::StepRecord>& steps,
                                   const std::vector<bool>& compensable,
                                   const std::vector<int>& completed) {
  std::vector<int> out;
  for (int i : RollbackOrder(steps, completed)) {
    if (steps[i].state == "succeeded" && !Compensable(compensable, i)) out.push_back(i);
  }
  return out;
}

std::string CompensationKey(const std::string& step_key) { return step_key + ":compensate"; }

}  // namespace idem::compensation
