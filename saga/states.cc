#include "saga/states.h"

namespace idem {

const char* SagaStateName(SagaState s) {
  IDEM_ENUM_NAME(SagaState, IDEM_SAGA_STATES, s);
  return "needs_attention";
}

const char* StepStateName(StepState s) {
  IDEM_ENUM_NAME(StepState, IDEM_STEP_STATES, s);
  return "needs_attention";
}

std::optional<SagaState> ParseSagaState(const std::string& name) {
  IDEM_ENUM_PARSE(SagaState, IDEM_SAGA_STATES, name);
  return std::nullopt;
}

std::optional<StepState> ParseStepState(const std::string& name) {
  IDEM_ENUM_PARSE(StepState, IDEM_STEP_STATES, name);
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
