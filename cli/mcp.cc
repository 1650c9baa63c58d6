#include "cli/mcp.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/cli.h"
#include "saga/engine.h"

#include "mcp/catalog.h"
#include "mcp/session.h"
#include "mcp/stdio.h"
#include "observability/observability.h"
#include <CLI/CLI.hpp>

namespace idem::cli {

McpCommand::McpCommand(CLI::App* app) {
  mcp_ = app->add_subcommand(
      "mcp", "serve MCP over stdio: idem's tools and specs as journaled tools (docs/mcp.md)");
  mcp_->add_option("--tools", tools_path_, "an HTTP tools file to register");
  mcp_->add_option("--spec", spec_paths_, "a saga spec file offered as a tool (repeatable)");
  mcp_->add_option("--page-size", page_size_, "tools per tools/list page (100)")
      ->check(CLI::Range(1, 1000));
  AddGatewayFlags(mcp_, &gateway_);
}

bool McpCommand::parsed() const { return mcp_->parsed(); }

int McpCommand::Run(ToolRegistry* tools, storage::Store* store, const EngineOptions& engine_options,
                    const std::string& cli, int (*fail)(const Status&)) {
  // Gateway mode: the upstream's tools join the registry before the specs
  // are read (a spec may name them); the handle keeps the upstream open.
  std::shared_ptr<void> upstream;
  if (GatewayRequested(gateway_)) {
    auto connected = ConnectGateway(gateway_, tools);
    if (!connected.ok()) return fail(connected.status());
    upstream = std::move(connected).value();
  }
  std::vector<mcp::SpecSource> specs;
  for (const std::string& path : spec_paths_) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return fail(Status::InvalidArgument("--spec " + path + ": cannot read the file"));
    std::stringstream ss;
    ss << in.rdbuf();
    auto doc = ParseJson(ss.str(), "--spec " + path);
    if (!doc.ok()) return fail(doc.status());
    auto spec = ParseSpec(*doc, *tools);
    if (!spec.ok()) {
      return fail(Status::InvalidArgument("--spec " + path + ": " + spec.status().message()));
    }
    specs.push_back(mcp::SpecSource{spec->name, 0, *doc});
  }
  Engine engine(store, tools, engine_options);
  mcp::Backend backend;
  backend.engine = &engine;
  backend.store = store;
  backend.tools = tools;
  backend.specs = [specs] { return specs; };
  mcp::SessionOptions so;
  so.page_size = page_size_;
  so.cli = cli;
  so.who = "mcp";
  mcp::Session session(backend, so);
  observability::Log(observability::LogLevel::kInfo, "mcp stdio session",
                     {{"session", session.id()}, {"specs", specs.size()}});
  std::ios::sync_with_stdio(false);
  const size_t bad = mcp::RunStdio(&session, std::cin, stdout);
  observability::Log(observability::LogLevel::kInfo, "mcp stdio session ended",
                     {{"session", session.id()}, {"saga", session.saga_id()}, {"bad_lines", bad}});
  return kExitOk;
}

}  // namespace idem::cli
