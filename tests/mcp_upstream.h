#pragma once
// The test upstream MCP server (tests/mcp_upstream/upstream.mjs) as the C++
// tests start it, and its ledger as they read it.
//
// Thread safety: free functions; safe from any thread.

#include <string>
#include <vector>

#include "common/json_util.h"

namespace idem::test {

/// `node .../upstream.mjs --ledger LEDGER` plus `extra` (e.g. "--delay-ms 3000"),
/// as one --upstream command line.
inline std::string UpstreamCommand(const std::string& ledger, const std::string& extra = "") {
  std::string cmd = std::string("'") + IDEM_NODE + "' '" + IDEM_SOURCE_DIR +
                    "/tests/mcp_upstream/upstream.mjs' --ledger '" + ledger + "'";
  if (!extra.empty()) cmd += " " + extra;
  return cmd;
}

/// The ledger's records (one JSON object a line); [] when there is no file.
std::vector<Json> ReadLedger(const std::string& path);

/// How many records of `kind` ("effect", "begin", "undo") for `tool` ("" any).
int LedgerCount(const std::string& path, const std::string& kind, const std::string& tool = "");

/// Waits up to `ms` for LedgerCount(path, kind, tool) >= n; true when it got there.
bool WaitForLedger(const std::string& path, const std::string& kind, const std::string& tool, int n,
                   int ms);

}  // namespace idem::test

// ---- inline definitions (header-only: each test binary includes it once) ---

#include <chrono>
#include <fstream>
#include <thread>

namespace idem::test {

inline std::vector<Json> ReadLedger(const std::string& path) {
  std::vector<Json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

inline int LedgerCount(const std::string& path, const std::string& kind, const std::string& tool) {
  int n = 0;
  for (const Json& r : ReadLedger(path)) {
    if (r.value("kind", "") == kind && (tool.empty() || r.value("tool", "") == tool)) ++n;
  }
  return n;
}

inline bool WaitForLedger(const std::string& path, const std::string& kind, const std::string& tool,
                          int n, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (LedgerCount(path, kind, tool) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return LedgerCount(path, kind, tool) >= n;
}

}  // namespace idem::test
