#pragma once
// Tools: the operations a saga step calls, their effect classes, retry
// policies, and the registry that names them.
//
// A Tool is called with a stable idempotency key that idem derives from
// (saga, step) and stores before the call. Its outcome is a value:
//   succeeded  the effect happened (result and external reference attached)
//   failed     a definite refusal: the effect did not happen
//   unknown    the call may or may not have taken effect (timeout, lost
//              response); idem resolves it, never turns it into a fresh call
//   accepted   the provider took the request and will finish it later (HTTP
//              202): the step is `processing` until its status lookup says
//              how it ended (ToolInfo::completion, saga/completion.h)
//
// Thread safety: a Tool may be called from several threads at once, each call
// for a different key. ToolRegistry is safe for concurrent lookups once all
// tools are registered.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// What calling a tool does to the world (in the spirit of MCP's tool
/// annotations). It sets the default retry policy and what the spec requires.
enum class EffectClass {
  kRead,          ///< no side effect: retried freely
  kIdempotent,    ///< natural PUT/SET: repeating it changes nothing
  kWrite,         ///< a side effect, deduplicated by key where the tool can
  kIrreversible,  ///< a side effect that cannot be undone (a sent email)
};
const char* EffectClassName(EffectClass c);
Result<EffectClass> ParseEffectClass(const std::string& name);

/// What a 2xx (a success answer) of the tool means, and how long idem waits
/// for an accepted call to finish (saga/completion.h polls its status).
struct CompletionPolicy {
  /// True: the tool may answer `accepted` (the provider finishes later; HTTP
  /// 202). False (the default): a success answer means done, and only a
  /// status lookup answering `pending` makes a step wait.
  bool accepts = false;
  /// How long after the accepted answer (or the first `pending`) idem keeps
  /// asking; past it the step parks (park code `completion_window`).
  int64_t window_ms = 3'600'000;
  /// The first check's delay when the provider suggests none, and the cap of
  /// the full-jitter exponential backoff between checks.
  int64_t first_check_ms = 1'000;
  int64_t max_check_ms = 300'000;
};

/// How an open saga (saga/open_saga.h) calls a tool outside a spec: what a
/// spec step would say, declared once in the registry (the in-process
/// ToolInfo, or the HTTP tools file's "compensate", "reason", "repeats",
/// "two_phase", "approval": tools/open_policy.h).
struct OpenCallPolicy {
  /// The compensation tool ("" when none is declared) and its arguments:
  /// templates over the action's arguments and result, `${args.<path>}` and
  /// `${result.<path>}` (whole-value or inside a string; `$${` is a literal).
  std::string compensate_tool;
  Json compensate_args = Json::object();
  /// `"compensate": null` with this reason: a write tool with nothing to
  /// undo. A write or irreversible tool with neither is refused in an open
  /// saga's tool list, as a spec refuses such a step.
  std::string no_compensation_reason;
  /// The same tool with the same argument fingerprint under a new call id in
  /// one saga (the model repeating itself): answered from the journal for
  /// write and irreversible tools (true), or called again (false, `"repeats":
  /// "allow"`). Read and idempotent tools are always called again.
  bool deduplicate_repeats = true;
  /// Preview, commit token, commit; with `human_approval`, the commit waits
  /// for a person (`"approval": "human"`).
  bool two_phase = false;
  bool human_approval = false;
  /// `"approval": "none"` said with a reason: why no person approves the
  /// tool's calls. An irreversible tool needs it, or two-phase with
  /// `human_approval`, to be listed in an open saga (a spec step's rule).
  std::string no_approval_reason;
};

/// What a registry knows of a tool.
struct ToolInfo {
  std::string name;  ///< "flights.reserve"
  EffectClass effect = EffectClass::kWrite;
  /// The tool applies a key at most once and answers a repeat with the first
  /// result (like an API honouring Idempotency-Key): a same-key retry is safe.
  bool honours_keys = false;
  /// The tool answers Lookup(key): was this key applied, and with what result.
  bool has_status = false;
  /// The tool answers Preview(call): what a commit would do, without doing it.
  bool has_preview = false;
  /// How long the provider remembers an idempotency key after its first
  /// use (Stripe: 24 h); 0 when not declared (not checked). The spec
  /// checker refuses a step whose waits can outlive it (saga/step_key.h).
  int64_t key_retention_ms = 0;
  /// What a success answer means (done, or accepted and finished later).
  CompletionPolicy completion;
  /// The tool can list the effects its provider holds (Tool::ListEffects),
  /// so the drift job (saga/reconcile.h) can find effects the journal lacks.
  bool has_list = false;
  std::string description;
  OpenCallPolicy open;  ///< how an open saga calls it
};

/// One call of a tool.
struct ToolCall {
  std::string tool;
  std::string key;  ///< the stable idempotency key; the same on every attempt
  Json args;
  int attempt = 1;
  std::string saga_id;
  std::string step_id;
  /// Two-phase commits: the resource version the preview saw. A tool that
  /// versions its resources must refuse the commit as stale (like HTTP
  /// If-Match) when the version has moved; empty for one-phase calls.
  std::string expected_version;
};

/// What a commit would do (a tool's Preview): no side effect.
struct PreviewOutcome {
  bool ok = false;
  std::string summary;            ///< one line for a person: "charge EUR 1,840.00 to card 4242"
  Json changes = Json::object();  ///< structured detail of the change
  std::string resource_version;   ///< where the provider versions the resource
  std::string error;              ///< when !ok
  bool retryable = false;         ///< when !ok: a transient failure
};

enum class OutcomeKind { kSucceeded, kFailed, kUnknown, kAccepted };
const char* OutcomeKindName(OutcomeKind k);

/// The outcome of a call.
struct ToolOutcome {
  OutcomeKind kind = OutcomeKind::kUnknown;
  Json result;               ///< on success
  std::string external_ref;  ///< charge id, reservation id... on success
  std::string error;         ///< on failure or unknown
  bool retryable = false;    ///< failed only: a transient refusal (503, busy)
  bool stale = false;        ///< failed only: the previewed resource version moved
  /// Succeeded only: the provider answered with what it had stored for this
  /// key (an earlier call had applied it; HTTP: `Idempotent-Replayed: true`).
  bool replayed = false;
  /// Accepted only: when the provider suggests asking again (HTTP
  /// Retry-After); 0: the tool's CompletionPolicy::first_check_ms.
  int64_t check_after_ms = 0;

  static ToolOutcome Succeeded(Json result, std::string external_ref = "");
  /// The provider took the call and finishes it later; `provider_ref` is its
  /// reference for the work (kept as the step's external_ref meanwhile).
  static ToolOutcome Accepted(std::string provider_ref = "", int64_t check_after_ms = 0);
  static ToolOutcome Failed(std::string error, bool retryable);
  static ToolOutcome Unknown(std::string error);
  static ToolOutcome Stale(std::string error);
};

/// The answer of a status lookup.
enum class LookupKind {
  kApplied,     ///< the key took effect; result attached
  kNotApplied,  ///< the provider has no effect under this key
  kError,       ///< the lookup itself failed; ask again later
  kPending,     ///< the provider holds the key and has not finished it yet
  kFailed,      ///< the provider finished the key with a definite failure
};
const char* LookupKindName(LookupKind k);
struct LookupOutcome {
  LookupKind kind = LookupKind::kError;
  Json result;
  std::string external_ref;
  std::string error;
  /// kPending: when the provider suggests asking again; 0: no suggestion.
  int64_t check_after_ms = 0;
};

/// One effect a provider holds (Tool::ListEffects): its idempotency key and
/// the provider's reference.
struct ProviderEffect {
  std::string key;
  std::string external_ref;
};

/// A named operation. Implementations translate their own exceptions into
/// outcomes; Invoke and Lookup must not throw.
class Tool {
 public:
  virtual ~Tool() = default;
  virtual const ToolInfo& info() const = 0;
  virtual ToolOutcome Invoke(const ToolCall& call) = 0;
  /// Only called when info().has_status. The default answers kError.
  virtual LookupOutcome Lookup(const std::string& key);
  /// Only called when info().has_preview. The default answers !ok.
  virtual PreviewOutcome Preview(const ToolCall& call);
  /// Only called when info().has_list: the keys of the effects the provider
  /// holds that were applied at or after `since_ms`. The default answers
  /// kFailedPrecondition.
  virtual Result<std::vector<ProviderEffect>> ListEffects(int64_t since_ms);
};

/// A tool made of functions, for programs that embed idem.
class FunctionTool : public Tool {
 public:
  using InvokeFn = std::function<ToolOutcome(const ToolCall&)>;
  using LookupFn = std::function<LookupOutcome(const std::string& key)>;
  using PreviewFn = std::function<PreviewOutcome(const ToolCall&)>;
  using ListFn = std::function<Result<std::vector<ProviderEffect>>(int64_t since_ms)>;
  /// info.has_status, info.has_preview and info.has_list follow whether
  /// `lookup`, `preview` and `list` are set.
  FunctionTool(ToolInfo info, InvokeFn invoke, LookupFn lookup = nullptr,
               PreviewFn preview = nullptr, ListFn list = nullptr);
  const ToolInfo& info() const override { return info_; }
  ToolOutcome Invoke(const ToolCall& call) override;
  LookupOutcome Lookup(const std::string& key) override;
  PreviewOutcome Preview(const ToolCall& call) override;
  Result<std::vector<ProviderEffect>> ListEffects(int64_t since_ms) override;

 private:
  ToolInfo info_;
  InvokeFn invoke_;
  LookupFn lookup_;
  PreviewFn preview_;
  ListFn list_;
};

/// Names tools. Owns them.
class ToolRegistry {
 public:
  /// InvalidArgument for an empty or malformed name, Conflict for a duplicate.
  Status Register(std::unique_ptr<Tool> tool);
  /// nullptr when no tool has that name.
  Tool* Find(const std::string& name) const;
  std::vector<ToolInfo> List() const;

 private:
  std::map<std::string, std::unique_ptr<Tool>> tools_;
};

/// Bounded exponential backoff with full jitter (AWS architecture blog,
/// "Exponential Backoff and Jitter"): sleep = uniform(0, min(cap, base*2^n)).
struct RetryPolicy {
  int max_attempts = 1;  ///< total attempts, the first included
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 5'000;

  /// Defaults by effect class: read and idempotent up to 5 attempts; write
  /// and irreversible 2 (one retry, taken only after a status check or when
  /// the tool honours keys).
  static RetryPolicy DefaultFor(EffectClass c);
  /// Default for compensations: 5 attempts, 100 ms doubling up to 5 s.
  static RetryPolicy DefaultCompensation();
  /// The largest max_attempts a spec may set for the class (read/idempotent
  /// 10, write/irreversible 2, compensation 20).
  static int MaxAttemptsCap(EffectClass c);
  static constexpr int kCompensationMaxAttemptsCap = 20;
  static constexpr int64_t kMaxBackoffCapMs = 300'000;

  /// The sleep before attempt `next_attempt` (2 for the first retry).
  int64_t BackoffMs(int next_attempt, std::mt19937_64& rng) const;
  /// The longest time the retries may span: the sum of the largest sleep
  /// BackoffMs can draw before each attempt after the first.
  int64_t HorizonMs() const;
};

}  // namespace idem
