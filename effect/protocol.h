#pragma once
// The effect protocol's decision table: what to do next about one call to
// the outside world, decided from data alone.
//
// idem promises one effect per intent. Every call that can reach a provider
// (a forward action, a two-phase preview and commit, a compensation, a
// guard's read, a status lookup, a completion check, an open saga's call, a
// gateway's upstream call) follows one protocol: the key is durable before
// the call; the answer decides what comes next; an uncertain outcome is
// resolved by a status lookup, a resend with the same key where that cannot
// make a second effect, or a person, and never turned into a fresh call.
//
// Decide() is that protocol, written once. Its input is a Situation (the
// kind of call, the tool's capabilities, the attempt, whether an earlier
// attempt may still be in flight, the latest answer); its output a Decision
// (call, resend with the same key, look up, wait, record the outcome, retry
// after a backoff, park with a reason code). Kinds of call differ only in
// their data: a compensation has its own retry budget and cannot wait for
// its provider, a guard's read and a preview have no effect, a drift check
// only reports. The drivers (saga/run.cc, compensation/undo.cc,
// saga/guard.cc, preview_commit/two_phase.cc, saga/reconcile.cc) carry out
// decisions and make their calls through effect/call.h; none of them decides
// on its own. The table is docs/architecture.md, "The effect protocol", and
// tests/effect_protocol_test.cc checks it row by row.
//
// Thread safety: Decide is a pure function.

#include <string>

#include "tools/tool.h"

namespace idem::effect {

/// What the call is for. The table treats kAction, kCommit and kOpenCall
/// alike (a call that may have an effect, forward); the kind is kept for the
/// logs. The gateway's call of an upstream MCP tool is an open saga's call
/// of that tool (mcp/upstream_tool.h): kOpenCall.
enum class CallKind {
  kAction,           ///< a spec step's one-phase call
  kCommit,           ///< a two-phase step's commit (after its token is spent)
  kOpenCall,         ///< a call in an open saga (saga/open_saga.h), the gateway's too
  kCompensation,     ///< the undo of a completed step
  kGuardRead,        ///< a guard's read (saga/guard.h): no effect
  kPreview,          ///< a two-phase preview: no effect
  kCompletionCheck,  ///< the status lookup of a step waiting for its provider
  kDriftCheck,       ///< the drift job's status lookup of a recorded effect
};
const char* CallKindName(CallKind k);

/// What the tool declares about itself (ToolInfo).
struct Capabilities {
  bool honours_keys = false;   ///< the provider applies a key once, replays after
  bool idempotent = false;     ///< repeating the call changes nothing (read, idempotent)
  bool status_lookup = false;  ///< Lookup(key): applied, not applied, pending
  bool asynchronous = false;   ///< may answer accepted and finish later

  static Capabilities Of(const ToolInfo& info);
  /// A same-key resend cannot make a second effect.
  bool same_key_safe() const { return honours_keys || idempotent; }
};

/// Whether the attempt being resolved was made by someone who may still be
/// sending it.
enum class InFlight {
  kNo,         ///< this drive made it and holds its answer (or made none)
  kCrashed,    ///< found after its driver died: nobody sends it any more
  kTakenOver,  ///< found after a lease takeover: its driver may be alive and
               ///< its request may still land, at any time
};

/// The latest answer about the call: the call's own, or a status lookup's.
enum class Answer {
  kNone,             ///< nothing asked yet
  kSucceeded,        ///< the call took effect (result attached)
  kFailedRetryable,  ///< a definite, transient refusal (503, busy)
  kFailedPermanent,  ///< a definite refusal
  kUnknown,          ///< the call may or may not have taken effect
  kAccepted,         ///< the provider took it and finishes later
  kApplied,          ///< lookup: the key took effect
  kNotApplied,       ///< lookup: the provider holds no effect under the key
  kPending,          ///< lookup: the provider holds the key, not finished yet
  kFailed,           ///< lookup: the provider finished the key with a failure
  kLookupError,      ///< lookup: the lookup itself failed
};
const char* AnswerName(Answer a);
Answer AnswerOf(const ToolOutcome& outcome);
Answer AnswerOf(const LookupOutcome& lookup);

struct Situation {
  CallKind kind = CallKind::kAction;
  Capabilities caps;
  /// The answer that made the call uncertain or refused (the call's own
  /// answer: kUnknown, kAccepted, kFailedRetryable; kUnknown for an attempt
  /// found without an outcome), kept while lookups are made about it.
  Answer call = Answer::kNone;
  /// The latest answer (== call until a lookup answers).
  Answer answer = Answer::kNone;
  int attempt = 0;       ///< attempts sent under the key so far
  int max_attempts = 1;  ///< the step's (or the compensation's) retry policy
  InFlight in_flight = InFlight::kNo;
  int lookups = 0;      ///< lookups answered about the current uncertainty
  int max_lookups = 3;  ///< EngineOptions::lookup_attempts
  /// No further forward attempt: a rollback began, or a parallel branch
  /// failed (SagaRun::HaltForward).
  bool halted = false;
  /// The driver can leave the step waiting for its provider (`processing`,
  /// saga/completion.h): false during a rollback and for compensations.
  bool can_wait = true;
  /// kCompletionCheck: the tool's completion window has passed.
  bool past_window = false;
};

enum class Action {
  kCall,               ///< make the call (the first attempt under the key)
  kResend,             ///< the same key again at once: settles an uncertain outcome
  kLookUp,             ///< ask the status lookup (after a backoff when lookups > 0)
  kWait,               ///< the provider holds it: wait without a thread (processing)
  kRecordSucceeded,    ///< record the effect (durability says when)
  kRecordFailed,       ///< record a definite failure: the step (the undo) ends
  kRetryAfterBackoff,  ///< the same key again, after the retry policy's backoff
  kPark,               ///< a person decides; `code` says why
};
const char* ActionName(Action a);

/// When a recorded outcome must be durable.
enum class Durability {
  kNow,            ///< before anything else happens
  kWithNextFlush,  ///< with the run's next write: a lost record is re-learnt
                   ///< without a person (a keyed resend or a status lookup)
};

struct Decision {
  Action action = Action::kPark;
  Durability durability = Durability::kNow;  ///< for kRecordSucceeded
  /// Why, as a stable code: "permanent", "retries_exhausted", "not_applied",
  /// "in_flight_not_proven", "lookup_unanswered", "no_lookup_no_keys", ...
  const char* code = "";
};

/// Total attempts allowed when each resend follows a status lookup that
/// confirmed the key was not applied: attempts burnt by crashes between
/// `submitted` and the call must not end a step whose provider never saw it.
constexpr int kMaxConfirmedAbsentAttempts = 5;

/// The protocol: what to do next in `s`.
Decision Decide(const Situation& s);

/// When an `unknown` record must be durable: it changes nothing a recovery
/// would do differently from the `submitted` before it, where a recovery
/// settles the call without a person (keys or a status lookup).
Durability UnknownDurability(const Capabilities& caps);

}  // namespace idem::effect
