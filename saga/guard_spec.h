#pragma once
// A step's "guard" as a spec writes it (the run is saga/guard.h):
//
//   "guard": {"tool": "flights.find_booking",
//             "args": {"order": "${input.order_id}"},
//             "exists_when": "/booking_id",
//             "result": "/booking"}
//   "guard": {"status_lookup": true}
//
// `tool` names a read tool of the registry, called with `args` (templates
// checked like the step's own args: the input and earlier steps).
// `exists_when` (required with `tool`) is a JSON pointer into the read's
// result: the effect already exists when the value there is present and
// neither null nor false. `result` (optional, a JSON pointer) picks the part
// of the read's result that becomes the step's result; the whole result
// when absent. `retry` overrides the read's retry policy (read caps).
// `status_lookup: true` instead asks the step tool's own status lookup
// under the step key (the tool must have one): applied means it exists.
//
// Thread safety: pure functions.

#include <string>

#include "saga/spec.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// Reads `guard` (at `where`, "steps[1].guard") into step->guard, checking
/// the tool (a registered read tool) and the pointers. The args' templates
/// and the retry policy are checked by the caller (saga/spec.cc).
Status ParseGuard(const Json& guard, const ToolRegistry& tools, const std::string& where,
                  StepSpec* step);

}  // namespace idem
