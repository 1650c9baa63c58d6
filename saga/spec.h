#pragma once
// Saga specs: parsing, validation and argument templates.
//
// A spec is JSON checked against schema/saga.schema.json (valijson) and then
// by semantic checks: unique step ids, references only to the input and to
// earlier steps, known tools, a compensation (or `"compensate": null` with a
// `reason`) for every write step, retry policies within bounds. Errors name
// the place: `steps[2].compensate.tool: unknown tool "flights.cancle"`.
//
// Two-phase steps: "two_phase": true runs preview, then commit with a
// token; "approval": "human" makes the commit wait for a person, for
// "approval_ttl" (seconds, or "30s", "15m", "24h", "7d"; default 24h, at most
// 30 days), after which "on_expiry" ("rollback" or "re_preview") applies. A
// commit refused because the previewed resource changed follows "on_stale"
// (default "re_preview"). "approval" may also be a policy object (rules by
// condition, role and quorum: saga/approval_policy.h); a top-level
// "approval" is the default of every two-phase step that says none.
//
// Templates: a string that is exactly "${path}" is replaced by the JSON value
// at path (any type); "${path}" inside a longer string is replaced by the
// value's text. Paths: input.a.b, steps.<id>.args.x, steps.<id>.result.x.
// A step's args may reference the input and the steps that run before it
// (earlier steps; in a spec that says "after", the steps it runs after,
// directly or through others: saga/schedule.h); its compensation may also
// reference the step itself.
//
// Thread safety: functions are pure.

#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "saga/approval_policy.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

struct CompensationSpec {
  std::string tool;
  Json args = Json::object();
  RetryPolicy retry = RetryPolicy::DefaultCompensation();
};

/// A step's guard (saga/guard.h): a read run before the write. When its
/// answer says the effect already exists, the step succeeds with that answer
/// and its tool is not called.
struct GuardSpec {
  /// A read tool of the registry, called with `args`; empty when
  /// `status_lookup` asks the step tool's own status lookup under the step key.
  std::string tool;
  bool status_lookup = false;
  Json args = Json::object();
  /// A JSON pointer into the read tool's result: the effect exists when the
  /// value there is present and neither null nor false ("/booking_id").
  std::string exists_when;
  /// A JSON pointer to the part of the guard's result that becomes the
  /// step's result; "" (the default) takes the whole result.
  std::string result_at;
  RetryPolicy retry = RetryPolicy::DefaultFor(EffectClass::kRead);
};

/// A hold (saga/hold.h): the authorization step and the capture step it
/// expands into (indices in SagaSpec::steps), and the hold's lifetime.
struct HoldLink {
  int authorize = -1;
  int capture = -1;
  int64_t lifetime_ms = 0;
};

/// Who must approve a two-phase step before its commit.
/// kHuman: one person with the role `approver`; kPolicy: StepSpec::policy.
enum class Approval { kNone, kHuman, kPolicy };
/// What happens when an approval's token expires, or a commit finds the
/// preview stale.
enum class Fallback { kRollback, kRePreview };

struct StepSpec {
  std::string id;
  std::string tool;
  Json args = Json::object();
  EffectClass effect = EffectClass::kWrite;  ///< from the registry
  RetryPolicy retry;                         ///< class default or the spec's override
  std::optional<CompensationSpec> compensate;
  std::string no_compensation_reason;  ///< when "compensate": null
  /// An irreversible step that says "approval": "none": why no person
  /// approves it (its "reason"). An irreversible step is otherwise
  /// two-phase with an approval by a person or a policy.
  std::string no_approval_reason;
  /// "key": the idempotency key's template over the input
  /// ("charge:${input.order_id}", saga/step_key.h); empty: `<saga id>/<step id>`.
  std::string key_template;
  std::optional<GuardSpec> guard;  ///< "guard"

  /// preview -> commit token -> commit. Set by "two_phase": true, and always
  /// for an irreversible tool that offers a preview.
  bool two_phase = false;
  Approval approval = Approval::kNone;           ///< "approval": "human" or a policy
  std::optional<ApprovalPolicy> policy;          ///< kPolicy: the rules
  int64_t approval_ttl_ms = 24LL * 3600 * 1000;  ///< "approval_ttl": 900 or "15m"
  Fallback on_expiry = Fallback::kRollback;      ///< "on_expiry"
  Fallback on_stale = Fallback::kRePreview;      ///< "on_stale"
  /// The steps this one runs after (indices; saga/schedule.h): its "after"
  /// list, or the previous step in a spec where no step says "after".
  std::vector<int> after;
  /// Set on both steps a "hold" expands into (saga/hold.h).
  std::optional<HoldLink> hold;
  static constexpr int64_t kMaxApprovalTtlMs = 30LL * 24 * 3600 * 1000;
};

struct SagaSpec {
  std::string name;
  int version = 1;
  std::string description;
  std::vector<StepSpec> steps;
  /// Some step says "after": steps may run at once (saga/schedule.h).
  bool parallel = false;
  Json raw;  ///< the document as given
  /// The version of a spec registry (the server's) this came from; 0 for a
  /// spec given inline. Recorded on the saga with Fingerprint(raw).
  int registered_version = 0;
};

/// Validates and parses a spec document against the tools in `tools`.
Result<SagaSpec> ParseSpec(const Json& doc, const ToolRegistry& tools);

/// Parses JSON text, then ParseSpec. `where` names the source in errors.
Result<SagaSpec> ParseSpecText(const std::string& text, const ToolRegistry& tools,
                               const std::string& where = "spec");

/// A duration as specs write it: "30s", "15m", "24h", "7d", or an integer
/// of seconds; at most 30 days. -1 when malformed or longer.
int64_t ParseDurationMs(const Json& v);

/// The JSON Schema text (schema/saga.schema.json, compiled in).
const std::string& SagaSchemaText();

/// A bound on what templates expand to (saga/limits.h). Resolution stops with
/// kInvalidArgument at the place where the resolved size (JsonBytes) passes
/// max_bytes, before the oversized value is built.
struct TemplateBudget {
  size_t max_bytes = std::numeric_limits<size_t>::max();
  std::string limit = "the limit";  ///< named in the error: "max_arg_bytes (1048576 bytes)"
  /// References to steps, and references without a value, resolve to
  /// nothing (null, or "" inside a string): the submit-time check, before
  /// any step has run (a missing value is the step's error when it runs).
  bool skip_step_refs = false;
  size_t used = 0;  ///< out: bytes resolved so far
};

/// Resolves templates in `templ` against `context`, a document of the shape
/// {"input": ..., "steps": {"<id>": {"args": ..., "result": ...}}}.
/// `where` prefixes errors ("steps[1].args"). With a `budget`, within it.
Result<Json> ResolveTemplates(const Json& templ, const Json& context, const std::string& where,
                              TemplateBudget* budget = nullptr);

/// A template string in pieces: literal text (`$${` read as `${`) and
/// references (`is_ref`, the text without `${ }`), in order. kInvalidArgument
/// naming `where` for an unterminated `${`.
struct TemplatePiece {
  bool is_ref = false;
  std::string text;
};
Result<std::vector<TemplatePiece>> SplitTemplateText(const std::string& s,
                                                     const std::string& where);

/// The references in every template string of `templ` (values only, at any
/// depth), as written without `${ }` ("steps.pay.result.id"), in document
/// order; a malformed template contributes none.
std::vector<std::string> TemplateReferences(const Json& templ);

}  // namespace idem
