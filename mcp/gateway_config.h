#pragma once
// The gateway config file (`idem mcp --gateway-config FILE`): what idem
// must know of an upstream MCP server's tools that their annotations cannot
// be trusted to say (MCP tells clients to treat annotations as untrusted
// hints). Every field is optional; a tool the file does not name keeps the
// class its annotations give (mcp/upstream_tool.h) and no keys.
//
//   {"timeout_ms": 30000,                        the deadline of a tools/call
//    "headers": {"Authorization": "Bearer ..."}, --upstream-url only
//    "ca_file": "ca.pem", "client_cert": "c.pem", "client_key": "c.key",
//                                                https --upstream-url only
//    "tools": {
//      "send_email": {
//        "effect": "write",             read|idempotent|write|irreversible
//        "honours_keys": true,          the upstream applies _meta
//                                       ["io.idem/idempotency-key"] at most once
//        "status": {"tool": "email_status", "key_arg": "key"},
//                                       an upstream tool that answers whether
//                                       a key was applied (called with
//                                       {"<key_arg>": KEY}; key_arg "key")
//        "compensate": {"tool": "recall_email",
//                       "args": {"id": "${result.structuredContent.id}"}},
//        "compensate": null, "reason": "...",
//        "repeats": "deduplicate"|"allow", "two_phase": true,
//        "approval": "none"|"human",    as in the HTTP tools file
//                                       (tools/open_policy.h)
//        "timeout_ms": 60000, "description": "..."}}}
//
// Unknown fields are errors. Errors are kInvalidArgument naming the place:
// `tools["send_email"].effect: "wrte" is not one of read, idempotent,
// write, irreversible`; CheckAgainstUpstream adds the ones only the
// upstream's tool list can show: `tools["send_email"].compensate.tool: no
// upstream tool "x"`.
//
// Thread safety: values and pure functions.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::mcp {

/// What the file says of one upstream tool.
struct UpstreamToolConfig {
  std::optional<EffectClass> effect;  ///< overrides the annotations
  bool honours_keys = false;
  std::string status_tool;  ///< "" when none
  std::string status_key_arg = "key";
  OpenCallPolicy open;      ///< compensate, reason, repeats, two_phase, approval
  int64_t timeout_ms = 0;   ///< 0: the file's timeout_ms
  std::string description;  ///< "" keeps the upstream's
};

struct GatewayConfig {
  int64_t timeout_ms = 30'000;
  std::map<std::string, std::string> headers;
  std::string ca_file, client_cert, client_key;  ///< paths resolved against the file's folder
  std::map<std::string, UpstreamToolConfig> tools;
};

/// Parses a config document; relative file paths are taken from `base_dir`.
Result<GatewayConfig> ParseGatewayConfig(const Json& doc, const std::string& base_dir);
/// Reads and parses the file at `path`; errors start with the path.
Result<GatewayConfig> LoadGatewayConfig(const std::string& path);
/// Every tool the config names, and every status and compensation tool,
/// is one of `upstream_tools`.
Status CheckAgainstUpstream(const GatewayConfig& config,
                            const std::vector<std::string>& upstream_tools);

}  // namespace idem::mcp
