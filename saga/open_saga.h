#pragma once
// Open sagas: a saga whose steps arrive one at a time, for agents that run
// a ReAct loop (the model picks a tool call, sees the result, picks the
// next).
//
// Engine::Begin records the intent (its key, the tools it may use, metadata,
// the idle policy) as a saga in state `open` with no steps. Each
// Engine::Call appends one step (id `c<n>`, n = 1, 2, ...) for the model's
// tool call: in one transaction the frozen plan grows by the step (its tool,
// its arguments as literals, the compensation and two-phase policy the tool
// registry declares: ToolInfo::open), the step's row is written, the call id
// is bound to the step (table open_calls: once per saga), and the journal
// gets `call_appended` {call_id, step, tool, args_fingerprint, repeat, by,
// decision}. The saga is then driven like any other: the step runs through
// the journal protocol (key `<saga id>/c<n>`, `submitted` before the call,
// keyed retry, unknown outcomes resolved, two-phase and human approval,
// parking) and its end (succeeded or failed) leaves the saga `open` again.
// Engine::Commit ends it `succeeded`; Engine::Rollback is a cancel: every
// completed call is compensated in reverse order, as for spec sagas. Pause,
// resume and cancel work as for any saga.
//
// Duplicates: a call id seen before with the same tool and argument
// fingerprint answers what is recorded and calls nothing; with another tool
// or other arguments it is refused (CallRefusal::kCallIdReused), never
// answered with the earlier call's result: a call id names one intent, as an
// Idempotency-Key does. The same tool with the same argument fingerprint
// under a new call id (the model repeating itself) answers the earlier
// call's outcome for write and irreversible tools whose policy deduplicates
// (the default), unless the call says `repeat`; reads are called again.
//
// Idle timeout: a saga `open` longer than its idle timeout (since it became
// open: the saga's updated_ms, durable) rolls back, or with `on_idle: park`
// is paused for a person. Whatever drives sagas (Recover, Work, the server's
// sweeper: AddIdleDue) carries it out; no timer lives in memory.
//
// The plan of an open saga is a spec document with an extra "open" member
// ({"tools", "metadata", "idle_timeout_ms", "on_idle", "calls": [{"call_id",
// "step"}]}); ParseOpenPlan reads it.
//
// Thread safety: the Engine's methods may be called from several threads at
// once; a call holds the saga's lease while it appends and drives, so
// concurrent calls of one saga are served one at a time (the others answer
// busy: CallRefusal::kBusy).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "saga/spec.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// What a model decided, recorded in the journal with the call it led to
/// (`call_appended`), with an open saga's begin or commit, or with a spec
/// saga's submission (`saga_created`), so that a replay shows what the model
/// saw and decided without asking it again.
struct ModelDecision {
  std::string model;          ///< "gpt-4.1"
  std::string message_id;     ///< the model's message
  std::string call_id;        ///< the model's tool-call id
  std::string prompt_sha256;  ///< SHA-256 of the prompt as sent: 64 hex digits
  std::string prompt;         ///< optional: the prompt text
  std::string reasoning;      ///< optional: the model's reasoning text
  Json ToJson() const;
};

/// Parses {"model", "message_id", "call_id", "prompt_sha256", "prompt",
/// "reasoning"} (all strings; model and prompt_sha256 required, the hash
/// lower-case hex); prompt and reasoning at most `max_text_bytes` each
/// (SagaLimits::max_decision_text_bytes). kInvalidArgument naming
/// `where`.field.
Result<ModelDecision> ParseModelDecision(const Json& doc, const std::string& where,
                                         size_t max_text_bytes);

/// What an open saga does when it idles past its timeout.
enum class OnIdle { kRollback, kPark };

struct BeginRequest {
  std::string intent_key;          ///< required; the same key and content answer the same saga
  std::vector<std::string> tools;  ///< the tools its calls may use (at least one)
  Json metadata = Json::object();
  int64_t idle_timeout_ms = 0;  ///< 0: no timeout
  OnIdle on_idle = OnIdle::kRollback;
  std::optional<ModelDecision> decision;  ///< journaled with `saga_created`
};

struct BeginResult {
  std::string saga_id;
  bool created = false;  ///< false: the intent existed with the same content
};

struct CallRequest {
  std::string call_id;  ///< the model's tool-call id: 1..200 printable characters
  std::string tool;
  Json args = Json::object();
  /// The caller means a second effect: no deduplication by arguments.
  bool repeat = false;
  /// Who makes the call: the calling principal (the server's caller, an
  /// MCP session's). Recorded with the call (the plan's `open.calls[].by`,
  /// `call_appended`'s `by`): whoever asked for a call never approves it.
  std::string who;
  std::optional<ModelDecision> decision;  ///< journaled with `call_appended`
};

/// Why a call was not taken (CallAnswer::refusal).
enum class CallRefusal {
  kNone,
  kSagaNotOpen,     ///< committed, rolled back, rolling back, cancelled, or not an open saga
  kToolNotAllowed,  ///< the tool is not in the begin's list
  kCallPending,     ///< an earlier call waits (approval, a person): settle it first
  kBusy,            ///< another call of this saga is being driven right now: retry
  /// The call id was recorded with another tool or other arguments: a new
  /// intent needs a new call id (CallAnswer::args_fingerprint and
  /// request_fingerprint name both).
  kCallIdReused,
};
const char* CallRefusalName(CallRefusal r);  ///< "saga-not-open", "tool-not-allowed", ...

/// What a call came to, as recorded (the same for a repeat of it).
struct CallAnswer {
  CallRefusal refusal = CallRefusal::kNone;
  std::string message;  ///< for a refusal: why, for a person
  std::string call_id;
  std::string step_id;
  std::string tool;
  /// succeeded, failed, awaiting_approval, processing (not called yet, or a
  /// preview pending), unknown (submitted, outcome not known yet),
  /// needs_attention, compensated (rolled back since).
  std::string state;
  Json result;  ///< succeeded: the tool's result
  std::string error;
  bool retryable = false;
  bool deduplicated = false;
  std::string duplicate_of;      ///< the call id that answered
  std::string duplicate_reason;  ///< "same call_id" or "same tool and arguments"
  std::string saga_state;        ///< the saga's state after the call
  /// The Fingerprint of the call's arguments as recorded (for kCallIdReused:
  /// of the call the id was first given to).
  std::string args_fingerprint;
  std::string request_fingerprint;  ///< kCallIdReused: the refused call's arguments
  std::string request_tool;         ///< kCallIdReused: the refused call's tool
  storage::StepRecord step;         ///< the step's row (for the approval view)
  /// The outcome is known (succeeded, failed, compensated): a waiter stops.
  bool settled() const;
};

/// The "open" member of an open saga's plan.
struct OpenPlan {
  std::vector<std::string> tools;
  Json metadata = Json::object();
  int64_t idle_timeout_ms = 0;
  OnIdle on_idle = OnIdle::kRollback;
  struct Call {
    std::string call_id;
    std::string step_id;
    /// Who made the call (CallRequest::who; "" when not said): a requester
    /// of its effect, who never approves it (saga/approval_rights.h).
    std::string by;
  };
  std::vector<Call> calls;  ///< in order: calls[i] is step i
  /// Call ids answered as a repeat of an earlier call (the same write under
  /// a new call id): each names the step it was answered from, so GetCall and
  /// a later repeat of that id answer as the first time. Kept in the plan
  /// ("open.aliases"), written with the `call_deduplicated` entry.
  std::vector<Call> aliases;
};

/// True for the plan of an open saga (a spec document with "open").
bool IsOpenPlan(const Json& spec);
/// The "open" member; kInvalidArgument when malformed.
Result<OpenPlan> ReadOpenPlan(const Json& spec);
/// The plan as a SagaSpec: its steps checked as a spec's (ParseSpec without
/// "open"; none at all before the first call). `raw` is the whole plan.
Result<SagaSpec> ParseOpenPlan(const Json& doc, const ToolRegistry& tools);
/// ParseOpenPlan for an open saga's plan, ParseSpec for any other.
Result<SagaSpec> ParseStoredPlan(const Json& doc, const ToolRegistry& tools);

/// May an open saga use `tool`? Known, and for a write or irreversible tool
/// a compensation or an explicit `"compensate": null` with a reason in the
/// registry (ToolInfo::open); an irreversible tool also two-phase with a
/// person's approval, or `"approval": "none"` with a reason, as a spec step
/// must be. kInvalidArgument naming `where`.
Status CheckOpenTool(const ToolRegistry& tools, const std::string& tool, const std::string& where);

/// An open saga in state `open` whose idle timeout has passed at `now_ms`.
bool OpenIdleDue(const storage::SagaRecord& saga, int64_t now_ms);

/// Appends to `list` the open sagas whose idle timeout is due (what Recover,
/// Work and the server's sweeper drive besides NeedsDrive's).
Status AddIdleDue(storage::Store* store, int64_t now_ms, std::vector<storage::SagaSummary>* list);

/// The answer for call `call_id` of `saga` (NotFound when no step has it).
Result<CallAnswer> AnswerCall(const storage::SagaRecord& saga, const std::string& call_id);

/// The calls of an open saga in order, for views: call id, step, tool,
/// state, result, error and the decision journaled with it (from `journal`).
Json OpenCallsView(const storage::SagaRecord& saga,
                   const std::vector<storage::JournalEntry>& journal);
/// The decision journaled with the saga's creation (a spec saga's
/// submission, an open saga's begin), or null.
Json SubmissionDecision(const std::vector<storage::JournalEntry>& journal);

}  // namespace idem
