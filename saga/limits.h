#pragma once
// SagaLimits: how large a saga may grow, and the checks that keep it there
// (issue 12, item 7: a 372 KB submission whose templates expanded to a
// 190 MB argument).
//
// Three bounds, all on sizes of JSON text (JsonBytes):
//   - max_steps: steps per spec;
//   - max_arg_bytes: the resolved arguments of one tool call (a step's args,
//     or a compensation's);
//   - max_saga_bytes: the input plus every step's resolved arguments.
// CheckSubmitLimits runs at Engine::Submit, before anything is written: it
// resolves every template the input can resolve (a reference to a step's
// result or args counts as nothing there). What depends on a step's result
// is checked again when the step is about to be journaled, before its
// `submitted` write and before any call (saga/run.cc, ResolveForwardArgs):
// a breach there is a definite refusal, so the step fails (and the saga rolls
// back what it did), with the error naming the step and the place.
//
// Templates are resolved under a budget (TemplateBudget, saga/spec.h), so a
// template that expands past a bound stops as soon as it crosses it: the
// oversized value is never built.
//
// Errors: kInvalidArgument, the place first:
// `steps[3].args.body: resolved arguments exceed max_arg_bytes (1048576 bytes)`.
//
// Thread safety: pure functions over values.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

struct SagaSpec;

struct SagaLimits {
  /// The schema's own cap (schema/saga.schema.json: at most 100 steps); a
  /// deployment may set less.
  static constexpr int kDefaultMaxSteps = 100;
  static constexpr size_t kDefaultMaxArgBytes = size_t{1} << 20;   // 1 MiB
  static constexpr size_t kDefaultMaxSagaBytes = size_t{8} << 20;  // 8 MiB

  int max_steps = kDefaultMaxSteps;
  size_t max_arg_bytes = kDefaultMaxArgBytes;
  size_t max_saga_bytes = kDefaultMaxSagaBytes;
  /// A recorded model decision's prompt and reasoning text, each
  /// (saga/open_saga.h, ModelDecision).
  static constexpr size_t kDefaultMaxDecisionTextBytes = size_t{64} << 10;  // 64 KiB
  size_t max_decision_text_bytes = kDefaultMaxDecisionTextBytes;
};

/// The length of `v` as compact JSON text (string escapes not counted);
/// counting stops once past `stop`, so a huge value costs little to refuse.
size_t JsonBytes(const Json& v, size_t stop = std::numeric_limits<size_t>::max());

/// Whether `s` is a bound's refusal (a template expanded past max_arg_bytes
/// or max_saga_bytes): a definite refusal before any call, which fails the
/// step, unlike a missing value, which parks it (saga/park.h).
bool IsLimitRefusal(const Status& s);

/// The submit-time check: step count, each step's and compensation's
/// arguments as far as the input resolves them, and the saga's total.
/// kInvalidArgument naming the place; OK when within every bound.
Status CheckSubmitLimits(const SagaSpec& spec, const Json& input, const SagaLimits& limits);

/// Resolves `templ` against `context` (ResolveTemplates) within
/// max_arg_bytes, and within `saga_room` bytes (what the saga's total has
/// left; max() for none). `where` prefixes errors ("steps[1].args").
Result<Json> ResolveWithinLimits(const Json& templ, const Json& context, const std::string& where,
                                 const SagaLimits& limits,
                                 size_t saga_room = std::numeric_limits<size_t>::max());

}  // namespace idem
