#include "http/response_writer.h"

#include <ostream>
#include <string_view>

#include <boost/beast/http/status.hpp>

namespace idem::http {
namespace {

bool Clean(std::string_view s) { return s.find_first_of(std::string_view("\r\n\0", 3)) == s.npos; }

bool SameName(std::string_view a, std::string_view b) {
  CaseInsensitiveLess less;
  return !less(a, b) && !less(b, a);
}

bool OwnedByServer(std::string_view name) {
  auto same = [&](std::string_view other) { return SameName(name, other); };
  return same("Content-Length") || same("Transfer-Encoding") || same("Connection");
}

// `own_type`: the server writes Content-Type itself, so a handler's is dropped.
void AppendHead(std::string& out, const Response& r, int version, bool own_type) {
  namespace bhttp = boost::beast::http;
  const int status = (r.status >= 100 && r.status <= 999) ? r.status : 500;
  out.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ").append(std::to_string(status));
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  out.push_back(' ');
  out.append(reason.data(), reason.size()).append("\r\n");
  for (const auto& [name, value] : r.headers) {
    if (name.empty() || !Clean(name) || !Clean(value) || OwnedByServer(name)) continue;
    if (own_type && SameName(name, "Content-Type")) continue;
    out.append(name).append(": ").append(value).append("\r\n");
  }
}

}  // namespace

std::string FormatResponse(const Response& response, int version, bool head, bool keep_alive) {
  const int status = response.status;
  const bool no_body = head || (status >= 100 && status < 200) || status == 204 || status == 304;
  std::string out;
  out.reserve(256 + (no_body ? 0 : response.body.size()));
  AppendHead(out, response, version, !response.content_type.empty());
  if (!response.content_type.empty() && Clean(response.content_type)) {
    out.append("Content-Type: ").append(response.content_type).append("\r\n");
  }
  if (status != 204 && status != 304 && !(status >= 100 && status < 200)) {
    out.append("Content-Length: ").append(std::to_string(response.body.size())).append("\r\n");
  }
  if (!keep_alive) {
    out.append("Connection: close\r\n");
  } else if (version == 10) {
    out.append("Connection: keep-alive\r\n");
  }
  out.append("\r\n");
  if (!no_body) out.append(response.body);
  return out;
}

std::string FormatStreamHead(const Response& response, int version) {
  std::string out;
  AppendHead(out, response, version, true);
  out.append(
      "Content-Type: text/event-stream\r\n"
      "Cache-Control: no-cache\r\n"
      "Connection: close\r\n\r\n");
  return out;
}

std::string_view OverloadedResponse() {
  static constexpr std::string_view kText =
      "HTTP/1.1 503 Service Unavailable\r\n"
      "Content-Type: text/plain; charset=utf-8\r\n"
      "Retry-After: 1\r\n"
      "Content-Length: 17\r\n"
      "Connection: close\r\n\r\n"
      "too many clients\n";
  return kText;
}

}  // namespace idem::http
