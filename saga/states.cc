#include "saga/states.h"

namespace idem {

const char* SagaStateName(SagaState s) {
  switch (s) {
    case SagaState::kPending:
      return "pending";
    case SagaState::kRunning:
      return "running";
    case SagaState::kAwaitingApproval:
      return "awaiting_approval";
    case SagaState::kSucceeded:
      return "succeeded";
    case SagaState::kCompensating:
      return "compensating";
    case SagaState::kCompensated:
      return "compensated";
    case SagaState::kFailed:
      return "failed";
    case SagaState::kCancelled:
      return "cancelled";
    case SagaState::kNeedsAttention:
      return "needs_attention";
  }
  return "needs_attention";
}

const char* StepStateName(StepState s) {
  switch (s) {
    case StepState::kPlanned:
      return "planned";
    case StepState::kPreviewed:
      return "previewed";
    case StepState::kAwaitingApproval:
      return "awaiting_approval";
    case StepState::kSubmitted:
      return "submitted";
    case StepState::kUnknown:
      return "unknown";
    case StepState::kSucceeded:
      return "succeeded";
    case StepState::kFailed:
      return "failed";
    case StepState::kCompensating:
      return "compensating";
    case StepState::kCompensated:
      return "compensated";
    case StepState::kCompensationFailed:
      return "compensation_failed";
    case StepState::kNeedsAttention:
      return "needs_attention";
  }
  return "needs_attention";
}

std::optional<SagaState> ParseSagaState(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(SagaState::kNeedsAttention); ++i) {
    auto s = static_cast<SagaState>(i);
    if (name == SagaStateName(s)) return s;
  }
  return std::nullopt;
}

std::optional<StepState> ParseStepState(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(StepState::kNeedsAttention); ++i) {
    auto s = static_cast<StepState>(i);
    if (name == StepStateName(s)) return s;
  }
  return std::nullopt;
}

bool IsTerminal(SagaState s) {
  return s == SagaState::kSucceeded || s == SagaState::kCompensated || s == SagaState::kFailed ||
         s == SagaState::kCancelled;
}

bool IsResumable(SagaState s) {
  return s == SagaState::kPending || s == SagaState::kRunning || s == SagaState::kCompensating;
}

}  // namespace idem
