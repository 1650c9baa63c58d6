#pragma once
// Upstream tools: each tool an upstream MCP server lists becomes an idem
// Tool (tools/tool.h) in gateway mode, so that every call an MCP client
// makes through idem runs through an open saga's journal (exactly-once side
// effects, keyed retry, approval, rollback). It lives in mcp/, not tools/,
// because it is made of the MCP client: tools/ knows no MCP, and the
// dependency runs one way (mcp client -> tools).
//
// Effect class: the gateway config's "effect" if given, else from the
// tool's annotations, which are untrusted hints read conservatively with the
// spec's defaults (readOnlyHint false, destructiveHint true, idempotentHint
// false):
//   readOnlyHint: true                                 read
//   idempotentHint: true and destructiveHint: false    idempotent
//   anything else (no annotations at all included)     write
// A tool honours keys, or has a status lookup, only when the config says
// so: an unannotated tool is a write without keys, journaled and never
// blindly retried: an uncertain outcome is resolved by the config's status
// tool, or parks the call for a person; it is never called a second time.
// A write the config gives no compensation is listed with `"compensate":
// null` and the reason "no compensation mapped in the gateway config"
// (open sagas refuse a write with neither: saga/open_saga.h).
//
// Every tools/call carries `_meta["io.idem/idempotency-key"]` = the call's
// stable key (the same on every attempt). What a call comes to:
//   a result                                 succeeded; result = {"content",
//                                            "structuredContent"?}, external_ref
//                                            = structuredContent.id (a string)
//   a result with isError: true              failed (the tool ran and refused)
//   JSON-RPC error -32602 (invalid params),  failed: the server refused the call
//     -32601 (method not found), -32600,     before the tool ran
//     -32700
//   any other JSON-RPC error                 unknown (the tool may have run)
//   not sent (no connection, the upstream    failed, retryable: it never left
//     process already gone)
//   sent, then the deadline, the connection  unknown
//     closed or the upstream exited
//
// The status tool is called with {"<key_arg>": KEY} and answers, in its
// structuredContent or as JSON in its first text content, {"status":
// "applied", "result": ...} (applied), {"status": "not_applied"} (not
// applied); anything else, isError included, is a lookup error (asked again,
// then parked).
//
// A two-phase tool (config "two_phase"/"approval") previews without calling
// the upstream: the summary names the tool and its arguments, which is what
// a person approves.
//
// Thread safety: Invoke, Lookup and Preview may run on several threads at once.

#include <memory>
#include <string>
#include <vector>

#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"
#include "mcp/client.h"
#include "mcp/gateway_config.h"

namespace idem::mcp {

/// The `_meta` key of the idempotency key sent upstream.
inline constexpr const char* kIdempotencyKeyMeta = "io.idem/idempotency-key";

/// The class an annotations object (or null) gives.
EffectClass EffectFromAnnotations(const Json& annotations);

/// One upstream tool as idem registers it.
struct UpstreamToolSpec {
  ToolInfo info;  ///< name = the upstream name
  std::string status_tool;
  std::string status_key_arg = "key";
  int64_t timeout_ms = 30'000;
  Json listed;  ///< the tools/list entry
};

/// The specs of `listed` (tools/list entries) with `config` applied; checks
/// the config against the list (CheckAgainstUpstream) and every name
/// (kInvalidArgument `tools/list[3].name: ...`).
Result<std::vector<UpstreamToolSpec>> PlanUpstreamTools(const std::vector<Json>& listed,
                                                        const GatewayConfig& config);

/// What a tools/call came to, as a tool outcome (the table above).
ToolOutcome MapCallResult(const CallResult& r);

/// The tool for `spec`, calling through `client` (shared by all of them).
std::unique_ptr<Tool> NewUpstreamTool(std::shared_ptr<Client> client, UpstreamToolSpec spec);

/// The tools/list entry an upstream tool was made of (its inputSchema,
/// outputSchema, title and annotations as the upstream gave them), for an
/// MCP server that lists it again; nullptr for any other tool.
const Json* UpstreamListing(const Tool& tool);

}  // namespace idem::mcp
