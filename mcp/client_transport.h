#pragma once
// The client side of an MCP transport (MCP "Transports", revision
// 2025-11-25): how mcp::Client (mcp/client.h) sends JSON-RPC messages to an
// upstream MCP server and receives its messages. Two implementations:
// stdio (mcp/client_stdio.h: a child process, one message per line) and
// Streamable HTTP (mcp/client_http.h: POST per message, JSON or SSE answers).
//
// What a send tells the caller matters for exactly-once: a message that
// provably never left (no connection, the child already gone) is `kNotSent`
// and a tool call it carried had no effect; a message that may have reached
// the server and whose answer did not come back is `kMaybeSent`, and a tool
// call it carried has an unknown outcome.
//
// Thread safety: Send may be called from several threads at once; the
// transport delivers incoming messages and the close from its own thread
// (stdio) or from the sending thread (HTTP), never two at once.

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "mcp/jsonrpc.h"

namespace idem::mcp {

/// Where a transport hands what it receives.
struct TransportSinks {
  /// One decoded message from the server (a response, a request, a notification).
  std::function<void(const Message&)> on_message;
  /// The connection is gone for good (the child exited, EOF, a protocol
  /// error); `reason` says why, for a person. Called at most once.
  std::function<void(const std::string& reason)> on_closed;
};

/// The result of one send.
struct SendResult {
  enum class Kind {
    kOk,         ///< handed over (stdio: written; HTTP: the server answered 2xx)
    kNotSent,    ///< provably not delivered: the server cannot have acted on it
    kMaybeSent,  ///< it may have been delivered; its answer is lost
  };
  Kind kind = Kind::kOk;
  std::string error;  ///< when not kOk
  bool ok() const { return kind == Kind::kOk; }
};

class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  /// Opens the connection (stdio: spawns the child). Called once, before Send.
  virtual Status Start(TransportSinks sinks) = 0;
  /// Sends one message. `timeout_ms` bounds the wait for the server to take
  /// it (HTTP: the whole exchange, whose answers are delivered through
  /// on_message before Send returns).
  virtual SendResult Send(const Message& message, int64_t timeout_ms) = 0;
  /// The protocol version negotiated (HTTP sends it as MCP-Protocol-Version).
  virtual void SetProtocolVersion(const std::string& version) { (void)version; }
  /// Closes the connection (stdio: closes the child's stdin, then ends it;
  /// HTTP: DELETEs the session). Idempotent; on_closed is not called after.
  virtual void Close() = 0;
  /// For messages: "stdio upstream `node server.mjs`", "http upstream http://...".
  virtual std::string Describe() const = 0;
};

}  // namespace idem::mcp
