#pragma once
// Step keys: the idempotency key a step's calls carry, and how long the
// provider must keep it.
//
// A step's key is `<saga id>/<step id>` unless the spec gives a template
// over the input, `"key": "charge:${input.order_id}"` (a business key): then
// two intents (two sagas) for the same business action send the provider the
// same key and it applies the action once. The compensation's key is
// `<key>:compensate` either way. A key template may reference only the input
// (`${input...}`) and constants: a key must be known before any call and be
// the same on every attempt, process and restart.
//
// Collisions: within one saga no two keys may render equal. A reference may
// render any text, so two templates are accepted only when their constant
// text tells them apart: their leading constants (before the first
// reference) differ where both have a character, or their trailing
// constants (after the last reference) do. "charge:${input.id}" and
// "refund:${input.id}" pass; "charge:${input.a}" and "charge:${input.b}" are
// refused (a and b may be equal), as are identical templates. A template
// without references is compared as the text it is. Compensation keys
// (`<key>:compensate`) take part as templates of their own.
//
// Retention: a tool may declare how long its provider keeps keys
// (ToolInfo::key_retention_ms, "key_retention" in a tools file). A step whose
// key may be reused later than that (its approval TTL, its retry horizon,
// its completion window where the tool declares one) is refused, naming the
// place: past the retention a reused key is a new call to the provider.
//
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "saga/spec.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// The longest rendered key, in bytes (its compensation key, 11 more, stays
/// under 255).
constexpr size_t kMaxStepKeyBytes = 200;

/// `<saga id>/<step id>`: the key of a step without a key template (also
/// declared in saga/engine.h, the public header).
std::string StepKey(const std::string& saga_id, const std::string& step_id);

/// Reads a step's "key" at `where`: a template string referencing only
/// `${input...}`; sets step->key_template. Its syntax is checked like any
/// template's (saga/spec.cc) before this is called.
Status ParseStepKey(const Json& key, const std::string& where, StepSpec* step);

/// Refuses two key templates of `spec` that may render the same key (see
/// above), naming both places.
Status CheckKeyCollisions(const SagaSpec& spec);

/// Step `index`'s key for saga `saga_id` with `input`: the rendered template,
/// or StepKey(saga_id, step id). kInvalidArgument naming `steps[i].key` when the
/// template renders something other than text or a number, an empty key, a
/// key longer than kMaxStepKeyBytes, or bytes outside printable ASCII
/// (0x21-0x7e: the key travels in an HTTP header).
Result<std::string> RenderStepKey(const SagaSpec& spec, size_t index, const std::string& saga_id,
                                  const Json& input);

/// At submit: every key template of `spec` renders against `input`
/// (RenderStepKey), so that no saga starts with a key it cannot send.
Status CheckStepKeys(const SagaSpec& spec, const Json& input);

/// One part of the longest wait between a key's first use and its reuse.
struct KeyWait {
  std::string place;  ///< "steps[2].approval_ttl"
  std::string what;   ///< "approval_ttl 30d"
  int64_t ms = 0;
};

/// The hook every wait of a step's forward key goes through: the approval
/// TTL of a step with human approval, the retry horizon of its policy
/// (RetryPolicy::HorizonMs) and, once tools declare one, their completion
/// window. The sum of the parts is what the provider must outlast.
std::vector<KeyWait> MaxWaitBeforeKeyReuse(const StepSpec& step, const ToolInfo& tool,
                                           const std::string& path);

/// Refuses step `step` (at `path`, "steps[2]") when a tool it calls with a
/// key (its own, its compensation) declares a key retention shorter than
/// MaxWaitBeforeKeyReuse, naming the largest part's place.
Status CheckKeyRetention(const StepSpec& step, const ToolRegistry& tools, const std::string& path);

}  // namespace idem
