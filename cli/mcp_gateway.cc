#include "cli/mcp_gateway.h"

#include <utility>
#include <vector>

#include "mcp/client.h"
#include "mcp/client_http.h"
#include "mcp/client_stdio.h"
#include "mcp/gateway_config.h"
#include "mcp/upstream_tool.h"
#include <CLI/CLI.hpp>

namespace idem::cli {
namespace {

// What ConnectGateway hands back: closing the upstream when dropped (the
// tools share the client, and answer kNotSent after).
struct GatewayHandle {
  std::shared_ptr<mcp::Client> client;
  ~GatewayHandle() {
    if (client) client->Close();
  }
};

}  // namespace

void AddGatewayFlags(CLI::App* mcp_command, GatewayFlags* flags) {
  mcp_command->add_option("--upstream", flags->upstream_command,
                          "gateway mode: spawn this MCP server (COMMAND ARGS, split without a "
                          "shell) and serve its tools through idem's journal");
  mcp_command->add_option("--upstream-url", flags->upstream_url,
                          "gateway mode: the upstream MCP server's Streamable HTTP endpoint");
  mcp_command->add_option("--gateway-config", flags->config_path,
                          "gateway mode: a JSON file of effect classes, keys, status and "
                          "compensation tools for the upstream's tools");
}

bool GatewayRequested(const GatewayFlags& flags) {
  return !flags.upstream_command.empty() || !flags.upstream_url.empty();
}

Result<std::shared_ptr<void>> ConnectGateway(const GatewayFlags& flags, ToolRegistry* registry) {
  if (!flags.upstream_command.empty() && !flags.upstream_url.empty()) {
    return Status::InvalidArgument("--upstream-url: give --upstream or --upstream-url, not both");
  }
  if (!GatewayRequested(flags)) {
    return Status::InvalidArgument(
        "--gateway-config: needs --upstream 'COMMAND ARGS' or --upstream-url URL");
  }
  mcp::GatewayConfig config;
  if (!flags.config_path.empty()) {
    auto c = mcp::LoadGatewayConfig(flags.config_path);
    if (!c.ok()) {
      return Status(c.status().code(), "--gateway-config: " + c.status().message());
    }
    config = std::move(*c);
  }
  std::unique_ptr<mcp::ClientTransport> transport;
  if (!flags.upstream_command.empty()) {
    auto argv = mcp::SplitCommandLine(flags.upstream_command);
    if (!argv.ok()) return Status::InvalidArgument("--upstream: " + argv.status().message());
    transport = mcp::NewStdioTransport(std::move(*argv));
  } else {
    mcp::HttpTransportOptions o;
    o.url = flags.upstream_url;
    o.headers = config.headers;
    o.ca_file = config.ca_file;
    o.client_cert = config.client_cert;
    o.client_key = config.client_key;
    auto t = mcp::NewHttpTransport(std::move(o), "--upstream-url");
    if (!t.ok()) return t.status();
    transport = std::move(*t);
  }
  auto client = mcp::Client::Connect(std::move(transport), {});
  if (!client.ok()) return client.status();
  std::shared_ptr<mcp::Client> shared(std::move(*client));
  auto listed = shared->ListTools();
  if (!listed.ok()) return listed.status();
  auto specs = mcp::PlanUpstreamTools(*listed, config);
  if (!specs.ok()) {
    const std::string where = flags.config_path.empty() ? shared->Describe() : flags.config_path;
    return Status(specs.status().code(), where + ": " + specs.status().message());
  }
  for (const auto& s : *specs) {
    if (registry->Find(s.info.name) != nullptr) {
      return Status::Conflict(shared->Describe() + ": tool \"" + s.info.name +
                              "\" is already registered");
    }
  }
  for (auto& s : *specs) {
    IDEM_RETURN_IF_ERROR(registry->Register(mcp::NewUpstreamTool(shared, std::move(s))));
  }
  auto handle = std::make_shared<GatewayHandle>();
  handle->client = std::move(shared);
  return std::shared_ptr<void>(std::move(handle));
}

}  // namespace idem::cli
