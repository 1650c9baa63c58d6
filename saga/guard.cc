#include "saga/guard.h"

#include <string>

#include "saga/park.h"

#include "common/failpoint.h"

namespace idem {
namespace {

enum class Answer { kExists, kAbsent, kNone };

struct GuardAnswer {
  Answer answer = Answer::kNone;
  Json result;               ///< the step's result when kExists
  std::string external_ref;  ///< from a status lookup
  std::string error;         ///< the last problem when kNone
  int attempts = 0;
};

bool Present(const Json& v) { return !v.is_null() && !(v.is_boolean() && !v.get<bool>()); }

/// Reads a read tool's result under the guard's pointers.
GuardAnswer Judge(const GuardSpec& g, const Json& result) {
  GuardAnswer a;
  const Json::json_pointer exists(g.exists_when);
  if (!result.is_structured() && !g.exists_when.empty()) {
    a.error = "the read answered " + std::string(result.type_name()) +
              ", where \"exists_when\" must look into an object";
    return a;
  }
  if (!result.contains(exists) || !Present(result.at(exists))) {
    a.answer = Answer::kAbsent;
    return a;
  }
  const Json::json_pointer pick(g.result_at);
  if (!result.contains(pick)) {
    a.error = "the effect exists but its answer has nothing at \"result\" " + g.result_at;
    return a;
  }
  a.answer = Answer::kExists;
  a.result = result.at(pick);
  return a;
}

/// One ask: the read tool, or the step tool's status lookup.
GuardAnswer AskOnce(SagaRun* run, StepDrive* d, const Json& args, int attempt) {
  const GuardSpec& g = *d->spec->guard;
  if (g.status_lookup) {
    LookupOutcome look;
    {
      SagaRun::OutsideCall outside(run);  // branches overlap it (saga/branches.h)
      look = d->tool->Lookup(d->key);
    }
    GuardAnswer a;
    if (look.kind == LookupKind::kApplied) {
      a.answer = Answer::kExists;
      a.result = look.result;
      a.external_ref = look.external_ref;
    } else if (look.kind == LookupKind::kNotApplied) {
      a.answer = Answer::kAbsent;
    } else {
      a.error = "status lookup failed: " + look.error;
    }
    return a;
  }
  Tool* tool = run->tools().Find(g.tool);
  if (tool == nullptr)
    return {Answer::kNone, {}, "", "guard tool \"" + g.tool + "\" is not registered"};
  ToolCall call{g.tool, d->key + ":guard", args, attempt, run->saga_id(), d->st.step_id, ""};
  ToolOutcome out;
  {
    SagaRun::OutsideCall outside(run);
    out = tool->Invoke(call);
  }
  switch (out.kind) {
    case OutcomeKind::kSucceeded:
      return Judge(g, out.result);
    case OutcomeKind::kFailed:
      return {Answer::kNone, {}, "", "the read failed: " + out.error};
    case OutcomeKind::kUnknown:
      return {Answer::kNone, {}, "", "the read's outcome is unknown: " + out.error};
  }
  return {};
}

/// Parks the planned step with `reason` (through the machine's kBlocked).
Result<std::optional<StepEnd>> Park(SagaRun* run, StepDrive* d, std::string reason) {
  d->st.error = std::move(reason);
  IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kBlocked));
  auto end = run->RunCommands(d);  // the queue holds kParkStep
  if (!end.ok()) return end.status();
  return std::optional<StepEnd>(*end);
}

}  // namespace

Result<std::optional<StepEnd>> BeforeWrite(SagaRun* run, StepDrive* d) {
  if (d->key.empty()) {
    return Park(run, d, BlockedReason(ParkCode::kInvalidSpec, d->key_error));
  }
  if (!d->spec->guard) return std::optional<StepEnd>();
  const GuardSpec& g = *d->spec->guard;
  const std::string where = "steps[" + std::to_string(d->index) + "].guard";
  const std::string what = g.status_lookup ? "the status lookup of " + d->spec->tool : g.tool;

  Json args = Json::object();
  if (!g.status_lookup) {
    auto resolved = run->ResolveArgs(g.args, where + ".args");
    if (!resolved.ok()) {
      return Park(run, d,
                  BlockedReason(TemplateParkCode(resolved.status()), resolved.status().message()));
    }
    args = *resolved;
  }
  GuardAnswer a;
  for (int attempt = 1; attempt <= g.retry.max_attempts; ++attempt) {
    IDEM_RETURN_IF_ERROR(run->CheckLease());
    if (attempt > 1) {
      SagaRun::OutsideCall outside(run);
      run->clock()->SleepMs(g.retry.BackoffMs(attempt, *run->rng()));
    }
    a = AskOnce(run, d, args, attempt);
    a.attempts = attempt;
    if (a.answer != Answer::kNone) break;
  }
  IDEM_FAILPOINT("guard.after_answer");
  Json guard = {{"tool", g.status_lookup ? d->spec->tool : g.tool},
                {"status_lookup", g.status_lookup},
                {"attempts", a.attempts}};
  switch (a.answer) {
    case Answer::kNone:
      return Park(run, d,
                  BlockedReason(ParkCode::kGuardUnanswered,
                                "step " + d->st.step_id + ": guard " + what +
                                    " gave no answer in " + std::to_string(a.attempts) +
                                    " attempt(s), so the write was not made: " + a.error));
    case Answer::kAbsent:
      guard["answer"] = "absent";
      // Durable with the step's `submitted` (or preview), which follows.
      IDEM_RETURN_IF_ERROR(
          run->CommitStep(*d, "guard_checked", guard, {}, SagaRun::Durable::kWithNextFlush));
      return std::optional<StepEnd>();
    case Answer::kExists:
      break;
  }
  guard["answer"] = "exists";
  IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kGuardSatisfied));
  storage::StepRecord& st = d->st;
  st.result = a.result;
  st.external_ref = a.external_ref;
  st.error.clear();
  storage::EffectRecord eff = run->ActionEffect(*d);
  Json data = {{"attempt", st.attempt},
               {"key", d->key},
               {"result", st.result},
               {"satisfied_by", "guard"},
               {"guard", guard}};
  if (!st.external_ref.empty()) data["external_ref"] = st.external_ref;
  // A lost entry leaves the step planned: the next drive asks the guard again.
  IDEM_RETURN_IF_ERROR(
      run->CommitStep(*d, "succeeded", data, {eff}, SagaRun::Durable::kWithNextFlush));
  IDEM_FAILPOINT("step.after_outcome");
  return std::optional<StepEnd>(StepEnd::kSucceeded);
}

}  // namespace idem
