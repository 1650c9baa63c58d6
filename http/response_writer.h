#pragma once
// The wire form of responses (internal): status line, fields, body.
//
// Fields whose name or value holds CR, LF or NUL are dropped (no header
// injection through a handler's values), as are the fields the server owns
// (Content-Length, Transfer-Encoding, Connection).

#include <string>
#include <string_view>

#include "http/message.h"

namespace idem::http {

/// A whole response with Content-Length (and no body for HEAD, 1xx, 204, 304).
std::string FormatResponse(const Response& response, int version, bool head, bool keep_alive);

/// The header of an event stream: the handler's status and fields,
/// Content-Type: text/event-stream, Cache-Control: no-cache, and
/// Connection: close (the body ends when the connection does).
std::string FormatStreamHead(const Response& response, int version);

/// What a connection refused at accept receives, if anything: a 503.
std::string_view OverloadedResponse();

}  // namespace idem::http
