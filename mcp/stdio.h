#pragma once
// The stdio transport of MCP (MCP "Transports", stdio): newline-delimited
// JSON-RPC messages on stdin and stdout, one message a line. Nothing but
// protocol messages is written to `out` (logs go to stderr); a line that is
// not a message is answered with a JSON-RPC error (parse error, invalid
// request) and the transport goes on; EOF on `in` ends it once the calls in
// flight have answered.
//
// tools/call requests run on threads of their own, so that ping and
// notifications/cancelled are served while a call waits for a provider or
// a person; everything else is answered in order.
//
// Thread safety: RunStdio blocks its caller; it writes `out` under a lock.

#include <cstddef>
#include <cstdio>
#include <istream>

#include "mcp/session.h"

namespace idem::mcp {

struct StdioOptions {
  size_t max_line_bytes = 4 << 20;  ///< longer: answered as a parse error, and skipped
};

/// Serves `session` over `in` and `out` until EOF. Returns the number of
/// lines answered with a decode error (for logs).
size_t RunStdio(Session* session, std::istream& in, std::FILE* out, StdioOptions options = {});

}  // namespace idem::mcp
