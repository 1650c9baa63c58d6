#pragma once
// The closed sets of saga and step states, persisted as strings.
//
// Each set is one X-macro list, X(Name, "stored name") for kName
// (saga/enum_list.h): the enum, its names and its parsing follow from it, so
// a state is added with one edit. The stored names are what journals and
// rows on disk hold: never rename one.

#include <optional>
#include <string>

#include "saga/enum_list.h"

namespace idem {

// clang-format off
#define IDEM_SAGA_STATES(X)                  \
  X(Pending,           "pending")            \
  X(Running,           "running")            \
  X(AwaitingApproval,  "awaiting_approval")  \
  X(AwaitingCompletion, "awaiting_completion") \
  X(Succeeded,         "succeeded")          \
  X(Compensating,      "compensating")       \
  X(Compensated,       "compensated")        \
  X(Failed,            "failed")             \
  X(Cancelled,         "cancelled")          \
  X(NeedsAttention,    "needs_attention")    \
  X(Paused,            "paused")             \
  X(Open,              "open")

#define IDEM_STEP_STATES(X)                      \
  X(Planned,             "planned")              \
  X(Previewed,           "previewed")            \
  X(AwaitingApproval,    "awaiting_approval")    \
  X(Submitted,           "submitted")            \
  X(Unknown,             "unknown")              \
  X(Processing,          "processing")           \
  X(Succeeded,           "succeeded")            \
  X(Failed,              "failed")               \
  X(Compensating,        "compensating")         \
  X(Compensated,         "compensated")          \
  X(CompensationFailed,  "compensation_failed")  \
  X(NeedsAttention,      "needs_attention")
// clang-format on

IDEM_DECLARE_ENUM(SagaState, IDEM_SAGA_STATES);
IDEM_DECLARE_ENUM(StepState, IDEM_STEP_STATES);

/// The stored name ("needs_attention" for a value outside the enum).
const char* SagaStateName(SagaState s);
const char* StepStateName(StepState s);
/// The state stored as `name`; nullopt for a name no state has.
std::optional<SagaState> ParseSagaState(const std::string& name);
std::optional<StepState> ParseStepState(const std::string& name);

/// Terminal: succeeded, compensated, failed, cancelled. needs_attention is
/// parked, not terminal: an operator may resolve it.
bool IsTerminal(SagaState s);
/// Recovery resumes these: pending, running, compensating. A paused saga
/// waits for a resume (or a cancel) request: no drive moves it before.
bool IsResumable(SagaState s);

}  // namespace idem
