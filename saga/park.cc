#include "saga/park.h"

#include <vector>

#include "saga/machines.h"
#include "saga/states.h"

namespace idem {
namespace {

constexpr ParkCode kAllCodes[] = {ParkCode::kMissingValue,    ParkCode::kUnknownTool,
                                  ParkCode::kInvalidSpec,     ParkCode::kStoreError,
                                  ParkCode::kGuardUnanswered, ParkCode::kCompletionWindow};

bool Contains(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

// The saga events that take `state` to needs_attention, in order: a saga
// that has not started is started first (its drive never ran a step).
std::vector<SagaEvent> ParkEvents(SagaState state) {
  switch (state) {
    case SagaState::kPending:
      return {SagaEvent::kStarted, SagaEvent::kStepParked};
    case SagaState::kRunning:
      return {SagaEvent::kStepParked};
    case SagaState::kAwaitingApproval:
      return {SagaEvent::kApprovalSettled, SagaEvent::kStepParked};
    case SagaState::kAwaitingCompletion:
      return {SagaEvent::kCompletionDue, SagaEvent::kStepParked};
    case SagaState::kCompensating:
      return {SagaEvent::kUndoParked};
    default:
      return {};
  }
}

// The step a drive of `saga` would take up next, judged from the states
// alone (the plan cannot be read): in a rollback the last one with an
// effect or an uncertain outcome, else the first that has not succeeded.
// -1 when none can be parked.
int BlockedStep(const LoadedSaga& saga) {
  const int n = static_cast<int>(saga.steps.size());
  if (saga.state == SagaState::kCompensating) {
    for (int i = n - 1; i >= 0; --i) {
      StepState s = saga.steps[i];
      if (s == StepState::kSubmitted || s == StepState::kUnknown || s == StepState::kCompensating ||
          s == StepState::kSucceeded) {
        return i;
      }
    }
    return -1;
  }
  for (int i = 0; i < n; ++i) {
    if (saga.steps[i] != StepState::kSucceeded) return i;
  }
  return -1;
}

}  // namespace

const char* ParkCodeName(ParkCode code) {
  switch (code) {
    case ParkCode::kMissingValue:
      return "missing_value";
    case ParkCode::kUnknownTool:
      return "unknown_tool";
    case ParkCode::kInvalidSpec:
      return "invalid_spec";
    case ParkCode::kStoreError:
      return "store_error";
    case ParkCode::kGuardUnanswered:
      return "guard_unanswered";
    case ParkCode::kCompletionWindow:
      return "completion_window";
  }
  return "?";
}

std::string BlockedReason(ParkCode code, const std::string& message) {
  return std::string(ParkCodeName(code)) + ": " + message;
}

std::optional<ParkCode> FindParkCode(const std::string& reason) {
  size_t best = std::string::npos;
  std::optional<ParkCode> found;
  for (ParkCode code : kAllCodes) {
    size_t at = reason.find(std::string(ParkCodeName(code)) + ": ");
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      found = code;
    }
  }
  return found;
}

Json ParkEntryData(const std::string& reason) {
  Json data = {{"reason", reason}};
  if (auto code = FindParkCode(reason)) data["code"] = ParkCodeName(*code);
  return data;
}

ParkCode TemplateParkCode(const Status& error) {
  return Contains(error.message(), "has no value") ? ParkCode::kMissingValue
                                                   : ParkCode::kInvalidSpec;
}

ParkCode SpecParkCode(const Status& error) {
  return Contains(error.message(), "unknown tool") ? ParkCode::kUnknownTool
                                                   : ParkCode::kInvalidSpec;
}

Result<storage::WriteBatch> ParkUnloadableBatch(const LoadedSaga& saga, ParkCode code,
                                                const std::string& message, int64_t now_ms,
                                                int64_t fence_epoch) {
  std::vector<SagaEvent> events = ParkEvents(saga.state);
  if (events.empty()) {
    return Status::FailedPrecondition("saga " + saga.record.summary.saga_id + " is " +
                                      saga.record.summary.state + ": nothing to park");
  }
  // Through the saga machine like any park.
  SagaMachine machine(saga.state);
  for (SagaEvent e : events) {
    auto cmds = machine.Fire(e);
    if (!cmds.ok()) return cmds.status();
  }
  const std::string reason = BlockedReason(code, message);
  storage::WriteBatch b;
  b.saga_id = saga.record.summary.saga_id;
  // The step the drive would have taken up is parked too, so that a
  // person's resolve (retry, retry_undo, undone...) can resume the saga once
  // the process can read the plan again.
  if (int i = BlockedStep(saga); i >= 0) {
    StepMachine m(saga.steps[i]);
    if (m.Fire(StepEvent::kBlocked).ok()) {
      storage::StepRecord st = saga.record.steps[i];
      st.state = StepStateName(m.state());
      st.error = reason;
      st.updated_ms = now_ms;
      storage::JournalEntry se;
      se.saga_id = b.saga_id;
      se.step_id = st.step_id;
      se.event =
          m.state() == StepState::kNeedsAttention ? "needs_attention" : "compensation_failed";
      se.data = {{"reason", reason}, {"code", ParkCodeName(code)}};
      se.at_ms = now_ms;
      b.journal.push_back(std::move(se));
      b.steps.push_back(std::move(st));
    }
  }
  b.fence_epoch = fence_epoch;
  b.release_lease = fence_epoch != 0;
  b.saga_state = SagaStateName(machine.state());
  b.saga_reason = reason;
  storage::JournalEntry je;
  je.saga_id = b.saga_id;
  je.event = std::string("saga_") + SagaStateName(machine.state());
  je.data = {{"reason", reason}, {"code", ParkCodeName(code)}};
  je.at_ms = now_ms;
  b.journal.push_back(std::move(je));
  return b;
}

Status CheckResolvedValues(const SagaSpec& spec, const storage::SagaRecord& record, int index,
                           const Json& result) {
  const StepSpec& step = spec.steps[index];
  if (!result.is_object()) {
    return Status::InvalidArgument("resolve " + step.id +
                                   " as applied: --result must be a JSON object");
  }
  // Only the resolved step's own values are looked up: later steps have not
  // run yet, and the input and earlier steps are what the journal holds.
  const Json context = {
      {"steps", {{step.id, {{"args", record.steps[index].args}, {"result", result}}}}}};
  auto check = [&](const Json& templ, const std::string& where) -> Status {
    for (const std::string& ref : TemplateReferences(templ)) {
      const std::string mine = "steps." + step.id + ".";
      if (ref.compare(0, mine.size(), mine) != 0) continue;
      if (ResolveTemplates(Json("${" + ref + "}"), context, where).ok()) continue;
      std::string field = ref.substr(mine.size());
      std::string hint;
      if (field.compare(0, 7, "result.") == 0) {
        hint = "; pass --result with a JSON object that has " + field.substr(7);
      }
      return Status::InvalidArgument("resolve " + step.id + " as applied: " + where +
                                     " references ${" + ref + "}" + hint);
    }
    return Status::Ok();
  };
  for (size_t j = index; j < spec.steps.size(); ++j) {
    const StepSpec& s = spec.steps[j];
    if (j > static_cast<size_t>(index)) {
      IDEM_RETURN_IF_ERROR(check(s.args, "step " + s.id));
    }
    if (s.compensate) {
      IDEM_RETURN_IF_ERROR(check(s.compensate->args, "compensation of " + s.id));
    }
  }
  return Status::Ok();
}

}  // namespace idem
