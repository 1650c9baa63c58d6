#include "compensation/undo.h"

#include "compensation/rollback.h"
#include "saga/hold.h"
#include "saga/park.h"

#include "common/failpoint.h"
#include "effect/call.h"
#include "effect/protocol.h"

namespace idem::compensation {
namespace {

enum class UndoEnd { kUndone, kParked };

// Parks the undo of `d` before any call: the compensation cannot be called
// (saga/park.h). Escalated like one that exhausted its retries: the step is
// compensation_failed and the earlier undos wait for a person.
Result<UndoEnd> ParkBlockedUndo(SagaRun* run, StepDrive* d, ParkCode code,
                                const std::string& message) {
  d->queue.clear();
  d->st.error = BlockedReason(code, message);
  IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kBlocked));
  IDEM_RETURN_IF_ERROR(run->CommitStep(
      *d, "compensation_failed",
      {{"attempt", d->st.comp_attempt}, {"reason", d->st.error}, {"code", ParkCodeName(code)}}));
  return UndoEnd::kParked;
}

// Why a compensation parks, for a person (the protocol's code, spelt out).
std::string UndoParkReason(const effect::Decision& dec, const effect::Situation& s,
                           const std::string& tool, const std::string& key, int attempt,
                           const std::string& error, const LookupOutcome& look) {
  const std::string code = dec.code;
  if (code == "no_lookup_no_keys") {
    return s.in_flight != effect::InFlight::kNo
               ? "compensation outcome unknown after a crash and " + tool +
                     " has neither a status lookup nor idempotency keys"
               : "compensation outcome unknown (" + error + ") and " + tool +
                     " cannot be retried safely";
  }
  if (code == "lookup_unanswered") {
    return "compensation outcome unknown; status lookup of " + tool + " kept failing: " +
           (s.answer == effect::Answer::kPending ? std::string("pending during a rollback")
                                                 : look.error);
  }
  if (code == "in_flight_not_proven") {
    return "compensation taken over from a worker whose call to " + tool +
           " may still land, and the tool does not deduplicate keys: check key " + key;
  }
  if (code == "compensation_refused") return error;
  return "gave up after " + std::to_string(attempt) + " attempts: " + error;
}

// Undoes step `index` (succeeded, or compensating after a crash) with its
// compensation: its own key, the compensation's retry policy and backoff,
// every answer read by the effect protocol (effect/protocol.h).
Result<UndoEnd> DriveUndo(SagaRun* run, int index) {
  const StepSpec& spec = run->spec().steps[index];
  const CompensationSpec& comp = *spec.compensate;
  Tool* tool = run->tools().Find(comp.tool);
  StepDrive d(index, &spec, tool, run->record().steps[index], run->step_state(index));
  if (tool == nullptr &&
      (d.state() == StepState::kSucceeded || d.state() == StepState::kCompensating)) {
    return ParkBlockedUndo(
        run, &d, ParkCode::kUnknownTool,
        "compensation of " + spec.id + ": tool \"" + comp.tool + "\" is not registered");
  }
  if (tool == nullptr)
    return d.state() == StepState::kCompensated ? UndoEnd::kUndone : UndoEnd::kParked;
  storage::StepRecord& st = d.st;
  ToolOutcome& outcome = d.outcome;
  const std::string key = CompensationKey(run->CallKey(index));  // the provider's
  const ToolInfo& info = tool->info();

  effect::Situation s;
  s.kind = effect::CallKind::kCompensation;
  s.caps = effect::Capabilities::Of(info);
  s.max_attempts = comp.retry.max_attempts;
  s.max_lookups = run->options().lookup_attempts;
  s.can_wait = false;
  bool resend_now = false;  // the next attempt settles an uncertain one: no backoff
  bool lookup_not_applied = false;

  // Carries out the protocol's decision about the latest answer: lookups
  // until it decides something else, then the undo's event.
  auto act = [&]() -> Status {
    LookupOutcome look;
    effect::Decision dec = effect::Decide(s);
    while (dec.action == effect::Action::kLookUp) {
      if (s.lookups > 0) {
        SagaRun::CallBoundary boundary(run);
        effect::Sleep(run->clock(),
                      run->options().lookup_backoff.BackoffMs(s.lookups + 1, *run->rng()),
                      &boundary);
      }
      {
        SagaRun::CallBoundary boundary(run);
        look = effect::Lookup(effect::CallKind::kCompensation, tool, key, &boundary);
      }
      s.answer = effect::AnswerOf(look);
      ++s.lookups;
      dec = effect::Decide(s);
    }
    switch (dec.action) {
      case effect::Action::kRecordSucceeded:
        if (s.answer == effect::Answer::kApplied) {
          outcome = ToolOutcome::Succeeded(look.result, look.external_ref);
        }
        d.durability = dec.durability;
        return d.Fire(StepEvent::kUndone);
      case effect::Action::kResend:
      case effect::Action::kRetryAfterBackoff:
        resend_now = dec.action == effect::Action::kResend;
        lookup_not_applied = s.answer == effect::Answer::kNotApplied;
        st.error =
            lookup_not_applied ? "status lookup: key " + key + " was not applied" : outcome.error;
        return d.Fire(StepEvent::kUndoFailed, StepFacts::WithRetryAllowed(true));
      default:
        st.error = UndoParkReason(dec, s, comp.tool, key, st.comp_attempt, outcome.error, look);
        return d.Fire(StepEvent::kUndoFailed, StepFacts::WithRetryAllowed(false));
    }
  };

  auto args = run->ResolveArgs(comp.args, "steps[" + std::to_string(index) + "].compensate.args");
  // A compensation whose arguments do not resolve is never called: a person
  // settles it (resolve --decision undone, or retry_undo once fixed).
  auto blocked = [&]() {
    return ParkBlockedUndo(run, &d, TemplateParkCode(args.status()),
                           "compensation of " + spec.id + ": " + args.status().message());
  };

  switch (d.state()) {
    case StepState::kSucceeded: {
      if (HoldCaptured(run->spec(), index, run->step_states())) {
        // The capture took this hold: its refund undoes the payment, and a
        // captured hold has nothing left to void (saga/hold.h).
        IDEM_RETURN_IF_ERROR(d.Fire(StepEvent::kRollbackStarted));
        IDEM_RETURN_IF_ERROR(d.Fire(StepEvent::kUndone));
        d.queue.clear();
        IDEM_RETURN_IF_ERROR(run->CommitStep(
            d, "compensated",
            {{"attempt", 0},
             {"skipped", "the hold was captured; the capture's refund undoes it"}}));
        return UndoEnd::kUndone;
      }
      if (!args.ok()) return blocked();
      IDEM_FAILPOINT("compensation.before_submitted");
      IDEM_RETURN_IF_ERROR(d.Fire(StepEvent::kRollbackStarted));
      st.comp_attempt = 1;
      IDEM_RETURN_IF_ERROR(
          run->CommitStep(d, "compensation_submitted",
                          {{"attempt", st.comp_attempt}, {"key", key}, {"tool", comp.tool}}));
      IDEM_FAILPOINT("compensation.after_submitted");
      break;
    }
    case StepState::kCompensating:
      // Found after a crash or a takeover: the undo may have happened, and
      // with a takeover its request may still be on the way.
      s.attempt = st.comp_attempt;
      s.call = s.answer = effect::Answer::kUnknown;
      s.in_flight = run->taken_over() ? effect::InFlight::kTakenOver : effect::InFlight::kCrashed;
      outcome =
          ToolOutcome::Unknown("recovered: compensation submitted without a recorded outcome");
      IDEM_RETURN_IF_ERROR(act());
      break;
    case StepState::kCompensated:
      return UndoEnd::kUndone;
    default:
      return UndoEnd::kParked;
  }
  while (!d.queue.empty()) {
    StepCommand cmd = d.queue.front();
    d.queue.pop_front();
    switch (cmd) {
      case StepCommand::kCallCompensation: {
        if (!args.ok()) return blocked();
        ToolCall call{comp.tool, key, *args, st.comp_attempt, run->saga_id(), st.step_id, ""};
        IDEM_RETURN_IF_ERROR(run->Flush());
        IDEM_RETURN_IF_ERROR(run->CheckLease());
        {
          SagaRun::CallBoundary boundary(run);
          outcome = effect::Invoke(effect::CallKind::kCompensation, tool, call, &boundary);
        }
        IDEM_FAILPOINT("compensation.after_call");
        s.attempt = st.comp_attempt;
        s.call = s.answer = effect::AnswerOf(outcome);
        s.lookups = 0;
        s.in_flight = effect::InFlight::kNo;  // this drive's own call
        IDEM_RETURN_IF_ERROR(act());
        break;
      }
      case StepCommand::kScheduleUndoRetry: {
        const int64_t wait =
            resend_now ? 0 : comp.retry.BackoffMs(st.comp_attempt + 1, *run->rng());
        {
          SagaRun::CallBoundary boundary(run);
          effect::Sleep(run->clock(), wait, &boundary);
        }
        ++st.comp_attempt;
        Json data = {{"attempt", st.comp_attempt},
                     {"key", key},
                     {"retry_after_ms", wait},
                     {"previous_error", st.error}};
        if (lookup_not_applied) data["lookup"] = "not_applied";
        IDEM_RETURN_IF_ERROR(run->CommitStep(d, "compensation_submitted", data));
        IDEM_FAILPOINT("compensation.after_submitted");
        d.queue.push_back(StepCommand::kCallCompensation);
        break;
      }
      case StepCommand::kRecordUndone: {
        st.comp_result = outcome.result;
        st.error.clear();
        storage::EffectRecord eff;
        eff.saga_id = run->saga_id();
        eff.step_id = st.step_id;
        eff.kind = "compensation";
        eff.tool = comp.tool;
        eff.idempotency_key = CompensationKey(st.step_key);  // unique per (saga, step)
        eff.result = outcome.result;
        eff.external_ref = outcome.external_ref;
        eff.at_ms = run->clock()->NowMs();
        IDEM_RETURN_IF_ERROR(run->CommitStep(
            d, "compensated", {{"attempt", st.comp_attempt}, {"result", outcome.result}}, {eff},
            SagaRun::DurabilityOf(d.durability)));
        IDEM_FAILPOINT("compensation.after_outcome");
        return UndoEnd::kUndone;
      }
      case StepCommand::kParkStep: {
        IDEM_RETURN_IF_ERROR(run->CommitStep(d, "compensation_failed",
                                             {{"attempt", st.comp_attempt}, {"reason", st.error}}));
        return UndoEnd::kParked;
      }
      default:
        return Status::Internal(std::string("unexpected undo command ") + StepCommandName(cmd));
    }
  }
  return Status::Internal("undo drive ended without an outcome");
}

}  // namespace

Result<std::optional<UndoMove>> UndoNextStep(SagaRun* run) {
  const std::vector<storage::StepRecord>& steps = run->record().steps;
  auto completed = run->CompletionOrder();  // reverse order of completion
  if (!completed.ok()) return completed.status();
  auto item = NextUndo(steps, run->compensable(), *completed);
  if (!item)
    return std::optional<UndoMove>({SagaEvent::kUndoCompleted, SagaFacts::WithMoreSteps(false)});
  int i = item->index;
  if (item->action == UndoAction::kResolveFirst) {
    auto d = run->BeginStep(i, /*rolling_back=*/true);
    if (!d.ok()) return d.status();
    auto end = run->SettleUncertain(&*d);
    if (!end.ok()) return end.status();
    if (*end == StepEnd::kParked) {
      run->set_park_reason("rollback: step " + steps[i].step_id + ": " + steps[i].error);
      return std::optional<UndoMove>({SagaEvent::kUndoParked, {}});
    }
    if (*end == StepEnd::kFailed) {
      // Resolved as never applied: a null compensation, no undo call.
      IDEM_RETURN_IF_ERROR(run->CommitJournal({run->Entry(
          steps[i].step_id, "null_compensation", {{"reason", "the action never took effect"}})}));
    }
    // Succeeded or failed: look again (it may now need its compensation).
    return std::optional<UndoMove>();
  }
  if (item->action == UndoAction::kParked) {
    run->set_park_reason("rollback: step " + steps[i].step_id + ": " + steps[i].error);
    return std::optional<UndoMove>({SagaEvent::kUndoParked, {}});
  }
  auto end = DriveUndo(run, i);
  if (!end.ok()) return end.status();
  if (*end == UndoEnd::kParked) {
    const bool blocked = FindParkCode(steps[i].error).has_value();
    run->set_park_reason("compensation of step " + steps[i].step_id +
                         (blocked ? " cannot run: " : " failed: ") + steps[i].error);
    return std::optional<UndoMove>({SagaEvent::kUndoParked, {}});
  }
  bool more = NextUndo(steps, run->compensable(), *completed).has_value();
  return std::optional<UndoMove>({SagaEvent::kUndoCompleted, SagaFacts::WithMoreSteps(more)});
}

Status ApplyUndoDecision(const Resolution& r, const std::string& compensation_tool, int64_t now_ms,
                         storage::StepRecord* st, storage::WriteBatch* batch) {
  const std::string key = CompensationKey(st->step_key);
  switch (r.decision) {
    case Decision::kUndone: {
      st->error.clear();
      storage::EffectRecord eff{
          batch->saga_id,           st->step_id, "compensation", compensation_tool, key,
          {{"resolved_by", r.who}}, "",          now_ms};
      batch->effects.push_back(eff);
      return Status::Ok();
    }
    case Decision::kRetryUndo: {
      st->error.clear();
      st->comp_attempt = 1;
      storage::JournalEntry sub;
      sub.saga_id = batch->saga_id;
      sub.step_id = st->step_id;
      sub.event = "compensation_submitted";
      sub.data = {{"attempt", 1}, {"key", key}, {"by", r.who}};
      sub.at_ms = now_ms;
      batch->journal.push_back(sub);
      return Status::Ok();
    }
    default:
      return Status::InvalidArgument(std::string("decision \"") + DecisionName(r.decision) +
                                     "\" is not about a compensation");
  }
}

}  // namespace idem::compensation
