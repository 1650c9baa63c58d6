#include "saga/guard.h"

#include <string>

#include "saga/park.h"

#include "common/failpoint.h"
#include "effect/call.h"
#include "effect/protocol.h"

namespace idem {
namespace {

// One ask's answer, as the effect protocol reads a guard's: kApplied (the
// effect exists; `result` is the step's), kNotApplied (absent), anything
// else no answer (`error` says what came back).
struct GuardAnswer {
  effect::Answer answer = effect::Answer::kNone;
  Json result;
  std::string external_ref;  ///< from a status lookup
  std::string error;
};

bool Present(const Json& v) { return !v.is_null() && !(v.is_boolean() && !v.get<bool>()); }

/// Reads a read tool's result under the guard's pointers.
GuardAnswer Judge(const GuardSpec& g, const Json& result) {
  GuardAnswer a;
  a.answer = effect::Answer::kLookupError;  // until judged
  const Json::json_pointer exists(g.exists_when);
  if (!result.is_structured() && !g.exists_when.empty()) {
    a.error = "the read answered " + std::string(result.type_name()) +
              ", where \"exists_when\" must look into an object";
    return a;
  }
  if (!result.contains(exists) || !Present(result.at(exists))) {
    a.answer = effect::Answer::kNotApplied;
    return a;
  }
  const Json::json_pointer pick(g.result_at);
  if (!result.contains(pick)) {
    a.error = "the effect exists but its answer has nothing at \"result\" " + g.result_at;
    return a;
  }
  a.answer = effect::Answer::kApplied;
  a.result = result.at(pick);
  return a;
}

/// One ask: the read tool, or the step tool's status lookup.
GuardAnswer AskOnce(SagaRun* run, StepDrive* d, const Json& args, int attempt) {
  const GuardSpec& g = *d->spec->guard;
  SagaRun::CallBoundary boundary(run);  // branches overlap it (saga/branches.h)
  if (g.status_lookup) {
    LookupOutcome look = effect::Lookup(effect::CallKind::kGuardRead, d->tool, d->key, &boundary);
    GuardAnswer a;
    a.answer = effect::AnswerOf(look);
    if (a.answer == effect::Answer::kApplied) {
      a.result = look.result;
      a.external_ref = look.external_ref;
    } else if (a.answer == effect::Answer::kPending) {
      a.error = "status lookup: the provider holds the key and has not finished it";
    } else if (a.answer != effect::Answer::kNotApplied) {
      a.error = "status lookup failed: " + look.error;
    }
    return a;
  }
  Tool* tool = run->tools().Find(g.tool);
  if (tool == nullptr) {
    return {
        effect::Answer::kLookupError, {}, "", "guard tool \"" + g.tool + "\" is not registered"};
  }
  ToolCall call{g.tool, d->key + ":guard", args, attempt, run->saga_id(), d->st.step_id, ""};
  ToolOutcome out = effect::Invoke(effect::CallKind::kGuardRead, tool, call, &boundary);
  const effect::Answer answer = effect::AnswerOf(out);
  switch (answer) {
    case effect::Answer::kSucceeded:
      return Judge(g, out.result);
    case effect::Answer::kAccepted:
      return {answer,
              {},
              "",
              "the read answered accepted (it finishes later), not whether the effect exists"};
    case effect::Answer::kUnknown:
      return {answer, {}, "", "the read's outcome is unknown: " + out.error};
    default:
      return {answer, {}, "", "the read failed: " + out.error};
  }
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
  // The protocol decides after each ask: the write goes on (absent), the
  // effect is recorded (exists), ask again, or park. Never a write on no
  // answer.
  effect::Situation s;
  s.kind = effect::CallKind::kGuardRead;
  s.max_attempts = g.retry.max_attempts;
  GuardAnswer a;
  effect::Decision dec;
  for (int attempt = 1;; ++attempt) {
    IDEM_RETURN_IF_ERROR(run->CheckLease());
    if (attempt > 1) {
      SagaRun::CallBoundary boundary(run);
      effect::Sleep(run->clock(), g.retry.BackoffMs(attempt, *run->rng()), &boundary);
    }
    a = AskOnce(run, d, args, attempt);
    s.attempt = attempt;
    s.call = s.answer = a.answer;
    dec = effect::Decide(s);
    if (dec.action != effect::Action::kRetryAfterBackoff) break;
  }
  IDEM_FAILPOINT("guard.after_answer");
  Json guard = {{"tool", g.status_lookup ? d->spec->tool : g.tool},
                {"status_lookup", g.status_lookup},
                {"attempts", s.attempt}};
  switch (dec.action) {
    case effect::Action::kRecordSucceeded:
      break;
    case effect::Action::kCall:
      guard["answer"] = "absent";
      // Durable with the step's `submitted` (or preview), which follows.
      IDEM_RETURN_IF_ERROR(
          run->CommitStep(*d, "guard_checked", guard, {}, SagaRun::Durable::kWithNextFlush));
      return std::optional<StepEnd>();
    default:
      return Park(run, d,
                  BlockedReason(ParkCode::kGuardUnanswered,
                                "step " + d->st.step_id + ": guard " + what +
                                    " gave no answer in " + std::to_string(s.attempt) +
                                    " attempt(s), so the write was not made: " + a.error));
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
