#pragma once
// The Streamable HTTP transport of an MCP client (MCP "Transports",
// Streamable HTTP, revision 2025-11-25), on cpp-httplib.
//
// Every message is one POST to the endpoint URL (http://host[:port]/path or
// https://...) with `Accept: application/json, text/event-stream`. The
// server answers a request with one JSON message (application/json) or with
// an SSE stream (text/event-stream) whose `message` events carry the answer
// and any requests or notifications before it; the stream is read until the
// answer arrives. Notifications and responses are answered 202. The
// `Mcp-Session-Id` the server gives with the initialize answer is sent on
// every later request, and so is `MCP-Protocol-Version` once negotiated;
// Close DELETEs the session. The GET stream for server-initiated messages
// is not opened: idem's gateway asks the server nothing it would answer
// there.
//
// HTTPS goes through tools/http_tls.h, as HTTP tools do: the server's
// certificate is always verified (chain and host name), against `ca_file`
// or the system store, with optional mutual TLS.
//
// What a send comes to (the exactly-once rule of tools/http_tool.h):
//   no connection (refused, connect timeout), a TLS refusal  kNotSent
//   404 on a session the server ended, other 4xx              kNotSent (a JSON-RPC
//                                                             error body is delivered)
//   5xx, a read timeout, a reset after the request left,     kMaybeSent
//   a stream that ends without the answer, a body over 8 MiB
//
// Thread safety: as ClientTransport; each send opens its own connection.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/json_util.h"
#include "common/status.h"
#include "mcp/client_transport.h"

namespace idem::mcp {

struct HttpTransportOptions {
  std::string url;                             ///< http://127.0.0.1:8090/mcp
  std::string ca_file;                         ///< https: PEM CAs to trust; "": the system store
  std::string client_cert;                     ///< https: mutual TLS certificate (PEM), or ""
  std::string client_key;                      ///< https: its key (PEM, 0600), or ""
  std::map<std::string, std::string> headers;  ///< extra request headers (Authorization)
  int64_t connect_timeout_ms = 2'000;
};

/// A transport to `options.url`; kInvalidArgument naming `place` for a bad
/// URL ("--upstream-url: ...").
Result<std::unique_ptr<ClientTransport>> NewHttpTransport(HttpTransportOptions options,
                                                          const std::string& place);

}  // namespace idem::mcp
