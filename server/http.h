#pragma once
// The server's own HTTP request and response: what handlers and routes are
// written against, so that the HTTP library stays inside one adapter
// (server/front.h).
//
// Header names compare case-insensitively (RFC 9110); a header may appear
// more than once. Plain values, no thread safety of their own.

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace idem::http {
class Stream;  // http/stream.h
}  // namespace idem::http

namespace idem::server {

struct Principal;  // server/server.h

/// Orders header names case-insensitively (ASCII).
struct HeaderNameLess {
  bool operator()(const std::string& a, const std::string& b) const;
};
using HttpHeaders = std::multimap<std::string, std::string, HeaderNameLess>;

/// A request as a handler sees it.
struct HttpRequest {
  std::string method;                              ///< "GET", "POST", ...
  std::string path;                                ///< without the query
  std::vector<std::string> matches;                ///< the route's match: [0] whole, [1..] groups
  HttpHeaders headers;                             ///< as received
  std::multimap<std::string, std::string> params;  ///< query parameters, decoded
  std::string body;
  std::string peer;  ///< the client's address ("127.0.0.1"), from the socket
  /// Set only by the server itself, never from the wire: the caller a web
  /// UI session names (server/ui_routes.cc), which Authenticator::Identify
  /// takes instead of a bearer token. nullptr for every API request.
  const Principal* principal = nullptr;

  bool HasHeader(const std::string& name) const { return headers.count(name) > 0; }
  /// The first value of `name`, or "".
  std::string Header(const std::string& name) const;
  bool HasParam(const std::string& name) const { return params.count(name) > 0; }
  /// The first value of `name`, or "".
  std::string Param(const std::string& name) const;
};

/// A response as a handler writes it. The body's media type is kept apart
/// from the other headers.
struct HttpResponse {
  int status = 200;
  HttpHeaders headers;  ///< without Content-Type
  std::string body;
  std::string content_type;  ///< "" sends no Content-Type
  /// Set (with a 2xx status) to answer with a server-sent-event stream
  /// instead of a body: see http::Response::on_stream (http/message.h).
  std::function<void(http::Stream)> on_stream;

  /// Replaces every value of `name` with `value`.
  void SetHeader(const std::string& name, const std::string& value);
  /// The first value of `name`, or "".
  std::string Header(const std::string& name) const;
  void SetContent(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

/// One endpoint: a method and a path pattern (ECMAScript regex, matched
/// whole; its groups become HttpRequest::matches).
struct Route {
  std::string method;
  std::string pattern;
  HttpHandler handler;
};

}  // namespace idem::server
