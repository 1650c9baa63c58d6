#pragma once
// Request and Response: what an http::Server hands a handler and what the
// handler gives back. Plain values, no Beast types, so a handler (and its
// tests) need nothing but this header.
//
// Header names compare case-insensitively (RFC 9110 5.1); a name may repeat
// (Headers is a multimap, in arrival order for equal names).
//
// Thread safety: values; a Request is owned by the handler call that
// receives it, a Response by the handler that fills it.

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace idem::http {

class Stream;

/// ASCII case-insensitive ordering for header names.
struct CaseInsensitiveLess {
  bool operator()(std::string_view a, std::string_view b) const;
  using is_transparent = void;
};

/// Header fields: name -> value, names case-insensitive, duplicates kept.
using Headers = std::multimap<std::string, std::string, CaseInsensitiveLess>;

/// The value of the first field named `name`, or "" when there is none.
std::string HeaderValue(const Headers& headers, std::string_view name);

/// Decodes %XX escapes (and '+' as a space when `plus_is_space`). A malformed
/// escape is kept as it stands.
std::string PercentDecode(std::string_view text, bool plus_is_space);

/// The parameters of a query string ("a=1&b=x%20y"), decoded ('+' is a space).
std::multimap<std::string, std::string> ParseQuery(std::string_view query);

/// One HTTP request, read whole (the body is bounded by
/// ServerOptions::max_body_bytes whatever its transfer coding).
struct Request {
  std::string method;  ///< "GET", "POST", ... as sent (case kept)
  std::string target;  ///< the request-target as sent: "/v1/sagas?limit=5"
  std::string path;    ///< the target before '?', percent-decoded
  std::string query;   ///< the target after '?', raw ("" when absent)
  std::multimap<std::string, std::string> params;  ///< the query's parameters, decoded
  int version = 11;                                ///< 10 for HTTP/1.0, 11 for HTTP/1.1
  Headers headers;   ///< at most one Authorization, one Content-Length value
  std::string body;  ///< "" for a request without a body
  std::string peer;  ///< the client's address ("127.0.0.1", "::1")

  /// The first value of header `name`, or "".
  std::string Header(std::string_view name) const { return HeaderValue(headers, name); }
  bool HasHeader(std::string_view name) const { return headers.count(std::string(name)) > 0; }
  bool HasParam(const std::string& name) const { return params.count(name) > 0; }
  /// The first value of query parameter `name`, or "".
  std::string Param(const std::string& name) const;
};

/// A handler's answer. The server adds Content-Length, Connection and, when
/// content_type is set, Content-Type. Range is never honoured: whatever the
/// request asked, the body goes out whole with the handler's status.
struct Response {
  int status = 200;
  Headers headers;           ///< extra fields (Location, Retry-After, ...)
  std::string content_type;  ///< "" for none
  std::string body;

  /// Sets `name` to `value`, replacing every field of that name.
  void SetHeader(const std::string& name, std::string value);
  /// The first value of `name`, or "".
  std::string Header(std::string_view name) const { return HeaderValue(headers, name); }
  void SetContent(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }

  /// Set (with a 2xx status) to answer with a server-sent-event stream
  /// (text/event-stream) instead of a body: once the stream is admitted
  /// (ServerOptions::max_streams*), the server sends the header and calls
  /// on_stream once on a worker thread with the Stream handle. When the
  /// stream limits refuse it, the client gets 503 and on_stream is never
  /// called. `body` is ignored.
  std::function<void(Stream)> on_stream;
};

}  // namespace idem::http
