#pragma once
// Gateway mode of `idem mcp` (issue 15): idem in front of an upstream MCP
// server, listing the upstream's tools as its own and running every call
// through an open saga's journal (mcp/upstream_tool.h).
//
//   idem mcp --db journal.db --upstream 'npx -y some-mcp-server --flag'
//   idem mcp --db journal.db --upstream-url https://tools.example/mcp
//       --gateway-config gateway.json
//
// --upstream is split into words without a shell (mcp::SplitCommandLine:
// blanks separate words, '...' and "..." quote, \ escapes; no $, ~ or globs)
// and spawned with posix_spawnp; --upstream-url speaks Streamable HTTP;
// exactly one of the two. --gateway-config names the JSON file of
// mcp/gateway_config.h. Bad flags are kInvalidArgument naming the flag.
//
// Thread safety: called from the CLI's main thread before serving.

#include <memory>
#include <string>

#include "tools/tool.h"

#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace idem::cli {

struct GatewayFlags {
  std::string upstream_command;
  std::string upstream_url;
  std::string config_path;
};

/// Adds --upstream, --upstream-url and --gateway-config to `mcp_command`.
void AddGatewayFlags(CLI::App* mcp_command, GatewayFlags* flags);

/// True when --upstream or --upstream-url was given (--gateway-config alone
/// is an error ConnectGateway reports).
bool GatewayRequested(const GatewayFlags& flags);

/// Connects to the upstream, lists its tools and registers one upstream
/// tool per listed tool in `registry` (effect classes from annotations,
/// overridden by the config; compensations mapped). The handle keeps the
/// connection open; dropping it closes the connection (stdio: ends the
/// child). All or nothing: on error nothing is registered.
Result<std::shared_ptr<void>> ConnectGateway(const GatewayFlags& flags, ToolRegistry* registry);

}  // namespace idem::cli
