#pragma once
// The closed sets of saga and step states, persisted as strings.

#include <optional>
#include <string>

namespace idem {

enum class SagaState {
  kPending,
  kRunning,
  kAwaitingApproval,
  kSucceeded,
  kCompensating,
  kCompensated,
  kFailed,
  kCancelled,
  kNeedsAttention,
};

enum class StepState {
  kPlanned,
  kPreviewed,
  kAwaitingApproval,
  kSubmitted,
  kUnknown,
  kSucceeded,
  kFailed,
  kCompensating,
  kCompensated,
  kCompensationFailed,
  kNeedsAttention,
};

const char* SagaStateName(SagaState s);
const char* StepStateName(StepState s);
std::optional<SagaState> ParseSagaState(const std::string& name);
std::optional<StepState> ParseStepState(const std::string& name);

/// Terminal: succeeded, compensated, failed, cancelled. needs_attention is
/// parked, not terminal: an operator may resolve it.
bool IsTerminal(SagaState s);
/// Recovery resumes these: pending, running, compensating.
bool IsResumable(SagaState s);

}  // namespace idem
