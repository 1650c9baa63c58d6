#pragma once
// An MCP client (MCP revision 2025-11-25, "Lifecycle", "Tools", "Utilities"):
// the upstream side of idem's gateway mode (mcp/upstream_tool.h). It speaks
// over a ClientTransport (stdio or Streamable HTTP, mcp/client_transport.h).
//
//   auto client = mcp::Client::Connect(mcp::NewStdioTransport(argv), {});
//   auto tools = (*client)->ListTools();          // every page
//   mcp::CallResult r = (*client)->CallTool("send", args, meta, 30'000);
//
// Lifecycle: Connect sends `initialize` offering 2025-11-25 and accepts the
// version the server answers if it is one of 2025-11-25, 2025-06-18 or
// 2025-03-26; any other answer closes the connection and fails with
// kFailedPrecondition naming the version. It then sends
// `notifications/initialized`.
//
// Requests carry integer ids 1, 2, ... and are matched to responses by id.
// A request from the server is answered: `ping` with an empty result, any
// other method with -32601 (method not found): idem offers the server no
// sampling, roots or elicitation. Notifications from the server are logged at
// debug level and otherwise ignored.
//
// What a request comes to (CallResult): the server's result, its JSON-RPC
// error, kNotSent (it provably never reached the server: the connection was
// already gone, or none could be made), or kUnknown (it was sent and no
// answer came: the deadline passed, the connection closed, the child
// exited). A request that passes its deadline is also cancelled
// (`notifications/cancelled` with its id), as the spec asks; its outcome
// stays unknown, since the server may have acted on it already.
//
// Thread safety: all methods may be called from several threads at once;
// several requests may be in flight together.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"
#include "mcp/client_transport.h"
#include "mcp/jsonrpc.h"
#include "mcp/protocol.h"  // the revisions a client offers and accepts

namespace idem::mcp {

struct ClientOptions {
  std::string client_name = "idem";
  std::string client_version = "0.1.0";
  int64_t initialize_timeout_ms = 10'000;
  int64_t request_timeout_ms = 30'000;  ///< ListTools, Ping
};

/// What one request came to.
struct CallResult {
  enum class Kind {
    kResult,    ///< `result` holds the server's result object
    kRpcError,  ///< `error` holds the server's JSON-RPC error
    kNotSent,   ///< it never reached the server (`reason`)
    kUnknown,   ///< sent, no answer (`reason`): the server may have acted on it
  };
  Kind kind = Kind::kUnknown;
  Json result;
  RpcError error;
  std::string reason;
};

class Client {
 public:
  /// Starts `transport` and runs the initialize handshake.
  static Result<std::unique_ptr<Client>> Connect(std::unique_ptr<ClientTransport> transport,
                                                 ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& protocol_version() const { return protocol_version_; }
  const Json& server_info() const { return server_info_; }
  const Json& server_capabilities() const { return server_capabilities_; }
  std::string Describe() const { return transport_->Describe(); }

  /// Every tool of every page of tools/list (following nextCursor, at most
  /// 1000 pages). Errors name the upstream and the page.
  Result<std::vector<Json>> ListTools();
  /// tools/call {name, arguments, _meta}; `timeout_ms` is the deadline.
  CallResult CallTool(const std::string& name, const Json& arguments, const Json& meta,
                      int64_t timeout_ms);
  /// ping; OK when the server answered.
  Status Ping();
  /// One request and its answer (the methods above are made of it).
  CallResult Request(const std::string& method, Json params, int64_t timeout_ms);
  /// Closes the transport; pending and later requests come to kUnknown or
  /// kNotSent. Idempotent.
  void Close();
  /// The connection is gone (closed, the child exited).
  bool closed() const;

 private:
  struct Pending {
    bool done = false;
    CallResult result;
  };
  Client(std::unique_ptr<ClientTransport> transport, ClientOptions options);
  Status Initialize();
  void OnMessage(const Message& message);
  void OnClosed(const std::string& reason);

  std::unique_ptr<ClientTransport> transport_;
  ClientOptions options_;
  std::string protocol_version_;
  Json server_info_ = Json::object();
  Json server_capabilities_ = Json::object();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_id_ = 1;
  std::map<int64_t, std::shared_ptr<Pending>> pending_;
  bool closed_ = false;
  std::string closed_reason_;
};

}  // namespace idem::mcp
