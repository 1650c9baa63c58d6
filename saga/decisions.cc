#include "saga/decisions.h"

namespace idem {

Result<Decision> ParseDecision(const std::string& name) {
  if (name == "applied") return Decision::kApplied;
  if (name == "not_applied") return Decision::kNotApplied;
  if (name == "retry") return Decision::kRetry;
  if (name == "undone") return Decision::kUndone;
  if (name == "retry_undo") return Decision::kRetryUndo;
  return Status::InvalidArgument("decision \"" + name +
                                 "\": expected applied, not_applied, retry, undone or retry_undo");
}

const char* DecisionName(Decision d) {
  switch (d) {
    case Decision::kApplied:
      return "applied";
    case Decision::kNotApplied:
      return "not_applied";
    case Decision::kRetry:
      return "retry";
    case Decision::kUndone:
      return "undone";
    case Decision::kRetryUndo:
      return "retry_undo";
  }
  return "?";
}

}  // namespace idem
