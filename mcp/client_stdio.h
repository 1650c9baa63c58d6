#pragma once
// The stdio transport of an MCP client (MCP "Transports": stdio): idem
// spawns the upstream server as a child process and speaks to it over its
// stdin and stdout, one JSON-RPC message per line.
//
// The child is started with posix_spawnp (the first word is looked up in
// PATH), never through a shell, with the argument vector as given; its
// stderr is idem's stderr (the spec lets servers log there). A reader thread
// reads stdout line by line (at most 16 MiB a line) and hands each message
// to the client. A line that is not a JSON-RPC message is skipped. EOF on
// stdout or the child's exit closes the transport: requests in flight come
// to *unknown* (the child may have acted on them before it died), never to a
// definite failure; a send after that is kNotSent.
//
// Close closes the child's stdin, waits up to 2 s for it to exit, then sends
// SIGTERM, and SIGKILL after another 2 s (the spec's shutdown sequence).
//
// SIGPIPE: a write to a child that has died must fail with EPIPE rather than
// end idem, so Start sets SIGPIPE to ignored for the process when it is at
// its default.
//
// Thread safety: as ClientTransport.

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "mcp/client_transport.h"

namespace idem::mcp {

/// A transport that spawns `argv` (argv[0] the program). kInvalidArgument
/// from Start for an empty argv; kUnavailable when it cannot be spawned.
std::unique_ptr<ClientTransport> NewStdioTransport(std::vector<std::string> argv);

/// Splits a command line into words without a shell (the --upstream rule):
/// blanks (space, tab) separate words; '...' keeps everything up to the next
/// ' literally; "..." keeps everything up to the next unescaped ", where \"
/// and \\ stand for " and \; outside quotes \ makes the next character
/// literal. Nothing else is special: no $, ~, globs, pipes or redirections.
/// kInvalidArgument for an unterminated quote, a trailing \, or no words.
Result<std::vector<std::string>> SplitCommandLine(const std::string& line);

}  // namespace idem::mcp
