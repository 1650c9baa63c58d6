#pragma once
// The open-call policy of a tool in the HTTP tools file (tools/http_tool.h):
// the fields that say how an open saga (saga/open_saga.h) calls the tool
// outside a spec, parsed into ToolInfo::open (tools/tool.h, OpenCallPolicy).
//
//   "compensate": {"tool": "flights.cancel",
//                  "args": {"booking": "${result.booking_id}", "why": "${args.note}"}}
//   "compensate": null, "reason": "a quote has nothing to undo"
//   "repeats": "deduplicate" (default) | "allow"
//   "two_phase": true, "approval": "none" | "human"
//   "approval": "none", "reason": "a receipt is sent whatever happens"
//     (an irreversible tool that nobody approves says so, and why)
//
// Errors are kInvalidArgument naming the place: `tools[2].compensate.tool:
// is required`.
//
// Thread safety: a pure function.

#include <string>

#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// The fields of a tools-file entry that ParseOpenCallPolicy reads.
const char* const* OpenPolicyFields();

/// Reads the open-call fields of `entry` (a JSON object) into `out`; the
/// other fields are the caller's. `place` prefixes errors ("tools[2]").
Status ParseOpenCallPolicy(const Json& entry, const std::string& place, OpenCallPolicy* out);

}  // namespace idem
