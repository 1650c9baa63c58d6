#include "compensation/rollback.h"

namespace idem::compensation {

std::optional<UndoItem> NextUndo(const std::vector<storage::StepRecord>& steps,
                                 const std::vector<bool>& compensable) {
  for (int i = static_cast<int>(steps.size()) - 1; i >= 0; --i) {
    const std::string& s = steps[i].state;
    bool comp = i < static_cast<int>(compensable.size()) && compensable[i];
    if (s == "submitted" || s == "unknown") return UndoItem{i, UndoAction::kResolveFirst};
    if (s == "needs_attention" || s == "compensation_failed")
      return UndoItem{i, UndoAction::kParked};
    if (s == "compensating") return UndoItem{i, UndoAction::kCompensate};
    if (s == "succeeded" && comp) return UndoItem{i, UndoAction::kCompensate};
  }
  return std::nullopt;
}

bool HasEffectsToUndo(const std::vector<storage::StepRecord>& steps,
                      const std::vector<bool>& compensable) {
  return NextUndo(steps, compensable).has_value();
}

std::vector<int> SkippedByRollback(const std::vector<storage::StepRecord>& steps,
                                   const std::vector<bool>& compensable) {
  std::vector<int> out;
  for (int i = static_cast<int>(steps.size()) - 1; i >= 0; --i) {
    bool comp = i < static_cast<int>(compensable.size()) && compensable[i];
    if (steps[i].state == "succeeded" && !comp) out.push_back(i);
  }
  return out;
}

std::string CompensationKey(const std::string& step_key) { return step_key + ":compensate"; }

}  // namespace idem::compensation
