#include "effect/protocol.h"

#include <algorithm>

#include "effect/mutation.h"

namespace idem::effect {
namespace {

Decision Do(Action a, const char* code, Durability d = Durability::kNow) { return {a, d, code}; }

bool IsLookupAnswer(Answer a) {
  return a == Answer::kApplied || a == Answer::kNotApplied || a == Answer::kPending ||
         a == Answer::kFailed || a == Answer::kLookupError;
}

// A lookup after another one: while lookups remain, ask again (after a
// backoff); then a person.
Decision AskAgainOrPark(const Situation& s, const char* code) {
  return s.lookups < s.max_lookups ? Do(Action::kLookUp, code)
                                   : Do(Action::kPark, "lookup_unanswered");
}

// ---- forward calls: actions, commits, open-saga and upstream calls, and
// the completion checks of those that wait for their provider

// A forward success may ride with the run's next write when losing its
// record leaves what the `submitted` before it left: a state a keyed resend
// or a status lookup settles without a person. Only on the first attempt: a
// lost record of a later one could spend the attempt that ends the step.
Durability ForwardSuccess(const Situation& s) {
  return s.attempt <= 1 && (s.caps.honours_keys || s.caps.status_lookup)
             ? Durability::kWithNextFlush
             : Durability::kNow;
}

// An outcome that may or may not have happened, before any lookup.
Decision ForwardUncertain(const Situation& s) {
  if (s.caps.status_lookup) return Do(Action::kLookUp, "unknown");
  if (s.caps.same_key_safe()) {
    return s.attempt < std::max(s.max_attempts, 2) ? Do(Action::kResend, "same_key_safe")
                                                   : Do(Action::kPark, "unknown_after_resends");
  }
  return Do(Action::kPark, "no_lookup_no_keys");
}

Decision ForwardLookup(const Situation& s) {
  const bool refused = s.call == Answer::kFailedRetryable;  // confirming a refusal
  switch (s.answer) {
    case Answer::kApplied:
      return Do(Action::kRecordSucceeded, "resolved_by_status", ForwardSuccess(s));
    case Answer::kFailed:
      return Do(Action::kRecordFailed, "failed_by_provider");
    case Answer::kNotApplied:
      // A request whose sender may be alive can land after this answer:
      // only a resend the provider absorbs is safe.
      if (s.in_flight == InFlight::kTakenOver && !s.caps.same_key_safe()) {
        return Do(Action::kPark, "in_flight_not_proven");
      }
      if (s.halted) return Do(Action::kRecordFailed, "not_applied");
      if (refused) {
        return s.attempt < s.max_attempts ? Do(Action::kRetryAfterBackoff, "confirmed_not_applied")
                                          : Do(Action::kRecordFailed, "retries_exhausted");
      }
      return s.attempt < std::max(s.max_attempts, kMaxConfirmedAbsentAttempts)
                 ? Do(Action::kResend, "not_applied")
                 : Do(Action::kRecordFailed, "not_applied");
    case Answer::kPending:
      if (s.kind == CallKind::kCompletionCheck) {
        return s.past_window ? Do(Action::kPark, "completion_window")
                             : Do(Action::kWait, "pending");
      }
      if (s.can_wait) return Do(Action::kWait, "pending");
      return AskAgainOrPark(s, "pending_during_rollback");  // a rollback cannot wait
    case Answer::kLookupError:
      if (s.kind == CallKind::kCompletionCheck) {
        return s.past_window ? Do(Action::kPark, "completion_window")
                             : Do(Action::kWait, "lookup_error");
      }
      // A refusal the lookup could not confirm is not retried.
      if (refused) return Do(Action::kRecordFailed, "refusal_not_confirmed");
      return AskAgainOrPark(s, "lookup_error");
    default:
      return Do(Action::kPark, "unexpected_answer");
  }
}

Decision Forward(const Situation& s) {
  switch (s.answer) {
    case Answer::kNone:
      return Do(Action::kCall, "first_call");
    case Answer::kSucceeded:
      return Do(Action::kRecordSucceeded, "succeeded", ForwardSuccess(s));
    case Answer::kFailedPermanent:
      return Do(Action::kRecordFailed, "permanent");
    case Answer::kFailedRetryable:
      if (s.halted) return Do(Action::kRecordFailed, "halted");
      if (s.attempt >= s.max_attempts) return Do(Action::kRecordFailed, "retries_exhausted");
      if (s.caps.same_key_safe()) return Do(Action::kRetryAfterBackoff, "retryable");
      // A write the provider does not deduplicate is retried only once a
      // lookup confirms the refused call left nothing behind.
      if (s.caps.status_lookup) return Do(Action::kLookUp, "confirm_not_applied");
      return Do(Action::kRecordFailed, "write_not_retried");
    case Answer::kAccepted:
      // A check that is due asks the provider how the accepted call ended.
      if (s.kind == CallKind::kCompletionCheck) return Do(Action::kLookUp, "check_due");
      if (s.caps.status_lookup && s.can_wait) return Do(Action::kWait, "accepted");
      // Nothing to ask how it ends, or a rollback that cannot wait: as
      // uncertain as a lost answer.
      return ForwardUncertain(s);
    case Answer::kUnknown:
      return ForwardUncertain(s);
    default:
      return ForwardLookup(s);
  }
}

// ---- compensations: their own key and retry budget; a rollback does not
// wait for a provider, so `pending` is asked again, then a person

Decision Compensation(const Situation& s) {
  if (Mutated(Mutation::kUndoResendsAfterAnyLookup) && s.in_flight != InFlight::kNo &&
      IsLookupAnswer(s.answer) && s.answer != Answer::kApplied) {
    return Do(Action::kResend, "mutation");
  }
  const bool left = s.attempt < s.max_attempts;
  switch (s.answer) {
    case Answer::kNone:
      return Do(Action::kCall, "first_call");
    case Answer::kSucceeded:
    case Answer::kApplied: {
      // Only a keyed resend re-learns a lost record without a person at no
      // risk; a status lookup may fail and park the rollback, so a
      // compensation it would have to settle is recorded at once.
      const bool lazy = s.attempt <= 1 &&
                        (s.caps.honours_keys ||
                         (Mutated(Mutation::kUndoResendsAfterAnyLookup) && s.caps.status_lookup));
      return Do(Action::kRecordSucceeded,
                s.answer == Answer::kApplied ? "resolved_by_status" : "succeeded",
                lazy ? Durability::kWithNextFlush : Durability::kNow);
    }
    case Answer::kFailedRetryable:
    case Answer::kFailed:
      // A definite refusal left nothing behind: another attempt is safe.
      return left ? Do(Action::kRetryAfterBackoff, "retryable")
                  : Do(Action::kPark, "retries_exhausted");
    case Answer::kFailedPermanent:
      return Do(Action::kPark, "compensation_refused");
    case Answer::kUnknown:
    case Answer::kAccepted:
      if (s.caps.status_lookup) return Do(Action::kLookUp, "unknown");
      if (s.caps.same_key_safe()) {
        return left ? Do(Action::kRetryAfterBackoff, "same_key_safe")
                    : Do(Action::kPark, "unknown_after_resends");
      }
      return Do(Action::kPark, "no_lookup_no_keys");
    case Answer::kNotApplied:
      if (s.in_flight == InFlight::kTakenOver && !s.caps.same_key_safe()) {
        return Do(Action::kPark, "in_flight_not_proven");
      }
      return s.attempt < std::max(s.max_attempts, kMaxConfirmedAbsentAttempts)
                 ? Do(Action::kResend, "not_applied")
                 : Do(Action::kPark, "retries_exhausted");
    case Answer::kPending:
      return AskAgainOrPark(s, "pending_during_rollback");
    case Answer::kLookupError:
      return AskAgainOrPark(s, "lookup_error");
  }
  return Do(Action::kPark, "unexpected_answer");
}

// ---- reads that have no effect: a guard's read, a preview

// The guard's answer: the read's result judged (kApplied: the effect exists;
// kNotApplied: it does not), or no answer, which is asked again under the
// guard's read policy and then parks. Never a write on no answer.
Decision GuardRead(const Situation& s) {
  switch (s.answer) {
    case Answer::kNone:
      return Do(Action::kCall, "first_call");
    case Answer::kApplied:
    case Answer::kSucceeded:
      return Do(Action::kRecordSucceeded, "exists", Durability::kWithNextFlush);
    case Answer::kNotApplied:
      return Do(Action::kCall, "absent");  // the guarded write goes on
    case Answer::kAccepted:
      if (Mutated(Mutation::kGuardReadsAcceptedAsAbsent)) return Do(Action::kCall, "mutation");
      break;
    default:
      break;
  }
  return s.attempt < s.max_attempts ? Do(Action::kRetryAfterBackoff, "no_answer")
                                    : Do(Action::kPark, "guard_unanswered");
}

Decision Preview(const Situation& s) {
  switch (s.answer) {
    case Answer::kNone:
      return Do(Action::kCall, "first_call");
    case Answer::kSucceeded:
      return Do(Action::kRecordSucceeded, "previewed");
    case Answer::kFailedRetryable:
    case Answer::kUnknown:
      // A preview has no effect: asking again is safe.
      return s.attempt < s.max_attempts ? Do(Action::kRetryAfterBackoff, "retryable")
                                        : Do(Action::kRecordFailed, "retries_exhausted");
    default:
      return Do(Action::kRecordFailed, "permanent");
  }
}

// The drift job only reports: held, missing, not settled yet, or no answer.
Decision DriftCheck(const Situation& s) {
  switch (s.answer) {
    case Answer::kNone:
      return Do(Action::kLookUp, "first_lookup");
    case Answer::kApplied:
      return Do(Action::kRecordSucceeded, "held");
    case Answer::kNotApplied:
    case Answer::kFailed:
      return Do(Action::kRecordFailed, "effect_missing");
    case Answer::kPending:
      return Do(Action::kWait, "pending");
    default:
      return Do(Action::kPark, "lookup_unanswered");
  }
}

}  // namespace

Decision Decide(const Situation& s) {
  switch (s.kind) {
    case CallKind::kAction:
    case CallKind::kCommit:
    case CallKind::kOpenCall:
    case CallKind::kCompletionCheck:
      return Forward(s);
    case CallKind::kCompensation:
      return Compensation(s);
    case CallKind::kGuardRead:
      return GuardRead(s);
    case CallKind::kPreview:
      return Preview(s);
    case CallKind::kDriftCheck:
      return DriftCheck(s);
  }
  return Do(Action::kPark, "unexpected_kind");
}

Durability UnknownDurability(const Capabilities& caps) {
  return caps.honours_keys || caps.status_lookup ? Durability::kWithNextFlush : Durability::kNow;
}

Capabilities Capabilities::Of(const ToolInfo& info) {
  Capabilities c;
  c.honours_keys = info.honours_keys;
  c.idempotent = info.effect == EffectClass::kRead || info.effect == EffectClass::kIdempotent;
  c.status_lookup = info.has_status;
  c.asynchronous = info.completion.accepts;
  return c;
}

Answer AnswerOf(const ToolOutcome& o) {
  switch (o.kind) {
    case OutcomeKind::kSucceeded:
      return Answer::kSucceeded;
    case OutcomeKind::kFailed:
      return o.retryable ? Answer::kFailedRetryable : Answer::kFailedPermanent;
    case OutcomeKind::kUnknown:
      return Answer::kUnknown;
    case OutcomeKind::kAccepted:
      return Answer::kAccepted;
  }
  return Answer::kUnknown;
}

Answer AnswerOf(const LookupOutcome& l) {
  switch (l.kind) {
    case LookupKind::kApplied:
      return Answer::kApplied;
    case LookupKind::kNotApplied:
      return Answer::kNotApplied;
    case LookupKind::kPending:
      return Answer::kPending;
    case LookupKind::kFailed:
      return Answer::kFailed;
    case LookupKind::kError:
      return Answer::kLookupError;
  }
  return Answer::kLookupError;
}

const char* CallKindName(CallKind k) {
  switch (k) {
    case CallKind::kAction:
      return "action";
    case CallKind::kCommit:
      return "commit";
    case CallKind::kOpenCall:
      return "open_call";
    case CallKind::kCompensation:
      return "compensation";
    case CallKind::kGuardRead:
      return "guard_read";
    case CallKind::kPreview:
      return "preview";
    case CallKind::kCompletionCheck:
      return "completion_check";
    case CallKind::kDriftCheck:
      return "drift_check";
  }
  return "unknown";
}

const char* AnswerName(Answer a) {
  switch (a) {
    case Answer::kNone:
      return "none";
    case Answer::kSucceeded:
      return "succeeded";
    case Answer::kFailedRetryable:
      return "failed_retryable";
    case Answer::kFailedPermanent:
      return "failed_permanent";
    case Answer::kUnknown:
      return "unknown";
    case Answer::kAccepted:
      return "accepted";
    case Answer::kApplied:
      return "applied";
    case Answer::kNotApplied:
      return "not_applied";
    case Answer::kPending:
      return "pending";
    case Answer::kFailed:
      return "failed";
    case Answer::kLookupError:
      return "lookup_error";
  }
  return "unknown";
}

const char* ActionName(Action a) {
  switch (a) {
    case Action::kCall:
      return "call";
    case Action::kResend:
      return "resend";
    case Action::kLookUp:
      return "look_up";
    case Action::kWait:
      return "wait";
    case Action::kRecordSucceeded:
      return "record_succeeded";
    case Action::kRecordFailed:
      return "record_failed";
    case Action::kRetryAfterBackoff:
      return "retry_after_backoff";
    case Action::kPark:
      return "park";
  }
  return "unknown";
}

}  // namespace idem::effect
