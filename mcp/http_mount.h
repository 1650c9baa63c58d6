#pragma once
// Mounts MCP's Streamable HTTP transport (mcp/http.h) on `idem serve`: the
// backend of a session is the server's engine, store and tool registry, and
// the latest version of each registered spec the caller may use
// (server/spec_registry.h). Internal to the server.

#include <memory>

#include "mcp/http.h"

namespace idem::server {
struct ServerContext;
}  // namespace idem::server

namespace idem::mcp {

/// The transport over `ctx` (not owned; it must outlive the transport),
/// with the server's MCP options (ServerOptions::mcp).
std::unique_ptr<HttpTransport> MountOnServer(server::ServerContext* ctx);

}  // namespace idem::mcp
