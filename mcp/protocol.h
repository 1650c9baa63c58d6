#pragma once
// MCP protocol revisions and their negotiation (MCP "Lifecycle",
// revision 2025-11-25): the client's initialize names the revision it
// wants; a server that supports it answers the same, else it answers the
// latest revision it supports, and the client decides whether to go on.
//
// idem's server speaks 2025-11-25 (preferred) and accepts 2025-06-18 and
// 2025-03-26. Over Streamable HTTP the client repeats the negotiated
// revision in the MCP-Protocol-Version header of every later request; a
// request without it is taken as 2025-03-26 (the spec's fallback).
//
// The same revisions are what idem's MCP client (mcp/client.h, the
// gateway's upstream side) offers and accepts.
//
// Thread safety: constants and pure functions.

#include <string>
#include <vector>

namespace idem::mcp {

inline constexpr const char* kLatestProtocolVersion = "2025-11-25";
/// The revision assumed for an HTTP request without MCP-Protocol-Version.
inline constexpr const char* kFallbackProtocolVersion = "2025-03-26";

/// Every revision the server speaks, newest first.
const std::vector<std::string>& SupportedProtocolVersions();

bool IsSupportedProtocolVersion(const std::string& version);

/// The revision to answer an initialize that asked for `requested`: the
/// same when supported, else kLatestProtocolVersion.
std::string NegotiateProtocolVersion(const std::string& requested);

/// The server's name and version for serverInfo.
inline constexpr const char* kServerName = "idem";
const char* ServerVersion();

}  // namespace idem::mcp
