#pragma once
// One MCP session of idem's server mode: the lifecycle (initialize and its
// version negotiation, notifications/initialized, ping), the dispatch of
// tools/list and tools/call, cancellation and progress. Transports
// (mcp/stdio.h, mcp/http.h) read messages, hand them to Handle and write
// what it returns; the session knows no transport.
//
// Sessions and open sagas (docs/mcp.md): the session's tool calls belong
// to one open saga (saga/open_saga.h), begun at the first call (or at
// initialize when SessionOptions::begin_at_initialize) with intent key
// `<scope>mcp-session:<session id>`. A call whose `_meta` carries
// `io.idem/intent` belongs instead to the open saga of that intent (key
// `<scope>mcp:<intent>`), shared by every session, process and server that
// names it. Each call is Engine::Call with the call id of `_meta`
// `io.idem/call-id`, or a fresh one: the open saga's repeat rule (same tool,
// same argument fingerprint) then answers a repeated model call from the
// journal, and a call id given again with another tool or other arguments
// is an isError result (`call-id-reused`), never the earlier call's answer.
// The call records SessionOptions::who as its requester. A spec tool
// submits its saga under intent key
// `<scope>mcp-spec:<owner>:<call id or spec name and argument fingerprint>`.
//
// Errors (MCP "Tools"): an unknown tool, a missing name, arguments that are
// not an object: JSON-RPC -32602; arguments that fail the tool's input
// schema, a failed call, a refused call: a result with isError true (MCP
// 2025-11-25, SEP-1303: the model can read and correct them). Requests
// other than initialize and ping before initialize: -32600.
//
// Cancellation: notifications/cancelled for a tools/call in flight makes
// the session send no response to it. The call itself goes on to the end of
// its journal protocol: an effect already journaled `submitted` is resolved
// as always (never lost, never made twice), and a repeat of the call answers
// its outcome from the journal.
//
// Progress: a request whose `_meta.progressToken` is set gets
// notifications/progress (through `notify`) every progress_interval_ms while
// the call runs (waiting for a provider, or for another call of the saga).
//
// Thread safety: Handle may be called from several threads at once (a
// transport runs each tools/call on its own thread, so that ping and
// cancellation are served meanwhile).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mcp/catalog.h"
#include "mcp/jsonrpc.h"

namespace idem {
class Engine;
class ToolRegistry;
namespace storage {
class Store;
}  // namespace storage
}  // namespace idem

namespace idem::mcp {

/// What a session works with; none of the pointers is owned.
struct Backend {
  Engine* engine = nullptr;
  storage::Store* store = nullptr;
  const ToolRegistry* tools = nullptr;
  /// The specs offered as tools, read at every tools/list and tools/call
  /// (the server's registry may change). Optional.
  std::function<std::vector<SpecSource>()> specs;
};

struct SessionOptions {
  std::string session_id;  ///< "" : a fresh one
  /// Prefix of every intent key the session writes: "" on stdio,
  /// "<principal>:" on HTTP (so the REST API shows the caller its sagas).
  std::string key_scope;
  /// Who makes the calls, commits and rolls back, in the journal: the
  /// caller's principal on HTTP. It never approves a call it made.
  std::string who = "mcp";
  /// Begin the session's open saga at initialize (HTTP: the session can be
  /// found again by another server on the same store).
  bool begin_at_initialize = false;
  size_t page_size = 100;  ///< tools per tools/list page
  int64_t progress_interval_ms = 1000;
  int64_t busy_wait_ms = 30'000;  ///< how long a call waits while another call of its saga runs
  /// How the approval answer names the CLI: "idem --db journal.db".
  std::string cli = "idem";
};

class Session {
 public:
  using Notify = std::function<void(const Message&)>;

  Session(Backend backend, SessionOptions options);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// The answer to `message`: a response to a request; nullopt for a
  /// notification, a client's response, and a request cancelled while it
  /// ran. `notify` sends progress notifications; it may be empty.
  std::optional<Message> Handle(const Message& message, const Notify& notify);

  const std::string& id() const { return options_.session_id; }
  bool initialized() const;
  /// The negotiated revision ("" before initialize).
  std::string protocol_version() const;
  /// The session's open saga ("" until begun).
  std::string saga_id() const;
  /// The intent key of the session's open saga.
  std::string session_intent_key() const;
  /// Takes up a session another server began (HTTP): initialized, with
  /// `version` and the open saga `saga_id`.
  void Adopt(const std::string& version, const std::string& saga_id);

 private:
  Message Initialize(const Message& m);
  Message ToolsList(const Message& m);
  Message ToolsCall(const Message& m, const Notify& notify);
  /// The open saga for `intent` ("" : the session's); begins it when new.
  Result<std::string> SagaFor(const std::string& intent, const ToolCatalog& catalog);
  Json CallRegistryTool(const CatalogEntry& e, const Json& args, const std::string& saga_id,
                        const std::string& call_id);
  Json CallSpecTool(const CatalogEntry& e, const Json& args, const std::string& owner,
                    const std::string& call_id);
  Json EndSaga(const CatalogEntry& e, const Json& args, const std::string& intent,
               const ToolCatalog& catalog);
  ToolCatalog Catalog() const;

  Backend backend_;
  SessionOptions options_;
  mutable std::mutex mu_;
  bool initialized_ = false;                         // GUARDED_BY(mu_)
  std::string version_;                              // GUARDED_BY(mu_)
  std::string saga_id_;                              // GUARDED_BY(mu_)
  std::map<std::string, std::string> intent_sagas_;  // GUARDED_BY(mu_)
  std::set<std::string> in_flight_;                  // GUARDED_BY(mu_): RequestIdText
  std::set<std::string> cancelled_;                  // GUARDED_BY(mu_)
};

/// A tools/call result: text content, structuredContent, isError, and
/// `_meta["io.idem/saga"]` when `saga` is an object.
Json ToolResult(const std::string& text, Json structured, bool is_error, Json saga = Json());

}  // namespace idem::mcp
