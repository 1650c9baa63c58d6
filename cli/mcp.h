#pragma once
// `idem mcp`: idem as an MCP server over stdio (mcp/stdio.h; docs/mcp.md),
// for an MCP client that starts it as a subprocess.
//
//   idem mcp --db journal.db [--tools tools.http.json] [--spec trip.json ...]
//            [--page-size N]
//
// stdout carries nothing but MCP's JSON-RPC messages, one a line; logs go to
// stderr (--log-level). The process serves one MCP session, whose tool calls
// are one open saga (or the open saga of the io.idem/intent a call names),
// and ends with exit 0 at EOF on stdin. On SQLite it holds the journal's
// driver lock for its life (another driving process: exit 8); on
// PostgreSQL any number of `idem mcp` and `idem serve` share the journal.
//
// Gateway mode (m-gateway's cli/mcp_gateway.h) plugs in here: its flags are
// added where this command's are (McpCommand's constructor) and its tools
// registered into the registry Run receives, before the server starts.
//
// Thread safety: called once, from RunCli.

#include <string>
#include <vector>

#include "cli/mcp_gateway.h"
#include "saga/options.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace idem::cli {

class McpCommand {
 public:
  /// Adds `mcp` and its flags to `app`.
  explicit McpCommand(CLI::App* app);
  bool parsed() const;
  /// The HTTP tools file to register before Run ("" for none).
  const std::string& tools_path() const { return tools_path_; }
  /// Serves stdin/stdout until EOF. `tools` may still be added to here
  /// (gateway mode) before the engine is made. `cli` names the command for
  /// approval hints ("idem --db journal.db").
  int Run(ToolRegistry* tools, storage::Store* store, const EngineOptions& engine_options,
          const std::string& cli, int (*fail)(const Status&));

 private:
  CLI::App* mcp_ = nullptr;
  std::string tools_path_;
  GatewayFlags gateway_;  ///< --upstream, --upstream-url, --gateway-config
  std::vector<std::string> spec_paths_;
  size_t page_size_ = 100;
};

}  // namespace idem::cli
