// mcp-gateway-call: one open-saga call through the MCP gateway in a process
// of its own, for tests/mcp_gateway_test.cc's crash tests (a process that
// can be SIGKILLed while the upstream write is in flight, and a new one that
// retries the same call).
//
//   mcp-gateway-call DB UPSTREAM CONFIG INTENT TOOLS CALL_ID TOOL ARGS_JSON
//
// DB is a SQLite file or a postgresql:// URL; UPSTREAM the --upstream
// command line; CONFIG a gateway config file ("" for none); TOOLS the
// comma-separated tools of the begin. Begins (or finds) the open saga of
// INTENT, makes the call (retrying while the saga is busy, up to 20 s) and
// prints {"saga_id", "state", "saga_state", "error", "result",
// "refusal"} on stdout. Exit 0 when it printed an answer, 1 otherwise.

#include <chrono>
#include <iostream>
#include <sstream>
#include <thread>

#include "cli/mcp_gateway.h"
#include "saga/engine.h"
#include "saga/open_saga.h"
#include "storage/store.h"

int main(int argc, char** argv) {
  using namespace idem;
  if (argc != 9) {
    std::cerr << "usage: mcp-gateway-call DB UPSTREAM CONFIG INTENT TOOLS CALL_ID TOOL ARGS\n";
    return 1;
  }
  const std::string db = argv[1];
  cli::GatewayFlags flags;
  flags.upstream_command = argv[2];
  flags.config_path = argv[3];
  ToolRegistry registry;
  auto handle = cli::ConnectGateway(flags, &registry);
  if (!handle.ok()) {
    std::cerr << "gateway: " << handle.status().ToString() << "\n";
    return 1;
  }
  auto store = storage::OpenStore(db);
  if (!store.ok()) {
    std::cerr << "store: " << store.status().ToString() << "\n";
    return 1;
  }
  EngineOptions options;
  const bool pg = db.rfind("postgres", 0) == 0;
  options.use_leases = pg;  // SQLite: one process at a time, as the CLI
  options.lease_ms = 1'500;
  Engine engine(store->get(), &registry, options);
  BeginRequest br;
  br.intent_key = argv[4];
  std::stringstream tools(argv[5]);
  for (std::string t; std::getline(tools, t, ',');) br.tools.push_back(t);
  auto begun = engine.Begin(br);
  if (!begun.ok()) {
    std::cerr << "begin: " << begun.status().ToString() << "\n";
    return 1;
  }
  CallRequest cr;
  cr.call_id = argv[6];
  cr.tool = argv[7];
  cr.args = Json::parse(argv[8], nullptr, false);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto answer = engine.Call(begun->saga_id, cr);
    if (!answer.ok()) {
      std::cerr << "call: " << answer.status().ToString() << "\n";
      return 1;
    }
    if (answer->refusal == CallRefusal::kBusy && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    Json out = {{"saga_id", begun->saga_id},        {"state", answer->state},
                {"saga_state", answer->saga_state}, {"error", answer->error},
                {"result", answer->result},         {"refusal", CallRefusalName(answer->refusal)}};
    std::cout << out.dump() << std::endl;
    return 0;
  }
}
