#include "server/problem.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/utf8.h"

namespace idem::server {

namespace {

// The document: `extensions` (an object, or nothing) with type, title,
// status and detail over them.
void WriteProblem(HttpResponse& res, int status, const std::string& type, const std::string& title,
                  const std::string& detail, const Json& extensions) {
  Json p = extensions.is_object() ? extensions : Json::object();
  p["type"] = "urn:idem:problem:" + type;
  p["title"] = title;
  p["status"] = status;
  p["detail"] = PrintableText(detail);
  res.status = status;
  res.SetContent(p.dump(), kProblemJson);
}

}  // namespace

void Problem(HttpResponse& res, int status, const std::string& type, const std::string& title,
             const std::string& detail) {
  WriteProblem(res, status, type, title, detail, Json::object());
}

void Problem(HttpResponse& res, int status, const std::string& type, const std::string& title,
             const std::string& detail, const Json& extensions) {
  WriteProblem(res, status, type, title, detail, extensions);
}

void SendJson(HttpResponse& res, int status, const Json& body) {
  res.status = status;
  res.SetContent(body.dump(), "application/json");
}

void ProblemFor(HttpResponse& res, const Status& s) {
  switch (s.code()) {
    case Code::kInvalidArgument:
      return Problem(res, 400, "invalid-request", "Invalid request", s.message());
    case Code::kNotFound:
      return Problem(res, 404, "not-found", "Not found", s.message());
    case Code::kConflict:
      return Problem(res, 409, "conflict", "Conflict", s.message());
    case Code::kFailedPrecondition:
    case Code::kIllegalTransition:
    case Code::kAborted:
      return Problem(res, 409, "conflict", "Not possible in the current state", s.message());
    case Code::kUnavailable:
      res.SetHeader("Retry-After", "1");
      return Problem(res, 503, "store-unavailable", "Store unavailable", s.message());
    default:
      return Problem(res, 500, "internal", "Internal error", s.message());
  }
}

void ProblemForHttpError(HttpResponse& res) {
  switch (res.status) {
    case 404:
      return Problem(res, 404, "not-found", "Not found", "no such endpoint");
    case 413:
      return Problem(res, 413, "payload-too-large", "Payload too large",
                     "the body exceeds the server's limit");
    case 414:
      return Problem(res, 414, "uri-too-long", "URI too long", "the request target is too long");
    case 431:
      return Problem(res, 431, "request-header-fields-too-large", "Request header fields too large",
                     "the request's header is larger than the server's limit");
    case 503:
      return Problem(res, 503, "too-many-connections", "Too many connections",
                     "the server is at its connection limit; retry later");
    case 405:
      return Problem(res, 405, "method-not-allowed", "Method not allowed", "not allowed here");
    default:
      return Problem(res, res.status, "bad-request", "Bad request",
                     "the request could not be read");
  }
}

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {  // the common case
      ++i;
      continue;
    }
    uint32_t cp = 0;
    if (!NextCodePoint(s, &i, &cp)) return false;
  }
  return true;
}

std::optional<Json> ReadJsonBody(const HttpRequest& req, HttpResponse& res, int max_depth,
                                 std::optional<Json> empty) {
  if (req.body.empty() && empty) return empty;
  if (req.HasHeader("Content-Type")) {
    std::string ct = req.Header("Content-Type");
    ct = ct.substr(0, ct.find(';'));
    std::transform(ct.begin(), ct.end(), ct.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    while (!ct.empty() && ct.back() == ' ') ct.pop_back();
    if (ct != "application/json" && !(ct.size() > 5 && ct.substr(ct.size() - 5) == "+json")) {
      Problem(res, 415, "unsupported-media-type", "Unsupported media type",
              "send the body as application/json");
      return std::nullopt;
    }
  }
  if (!IsValidUtf8(req.body)) {
    Problem(res, 400, "invalid-utf8", "Body is not UTF-8",
            "the body must be UTF-8 (RFC 8259 section 8.1)");
    return std::nullopt;
  }
  auto doc = ParseJson(req.body, "body", max_depth);
  if (!doc.ok()) {
    bool deep = doc.status().message().find("nested deeper") != std::string::npos;
    Problem(res, 400, deep ? "json-too-deep" : "malformed-json",
            deep ? "JSON nested too deep" : "Malformed JSON", doc.status().message());
    return std::nullopt;
  }
  return std::move(doc).value();
}

}  // namespace idem::server
