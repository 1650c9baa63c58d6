#include "tools/http_tool.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT  // (Debian's pkg-config file sets it too)
#endif
#include <httplib.h>

#include "tools/http_tls.h"
#include "tools/open_policy.h"

#include "common/duration.h"
#include <openssl/err.h>

namespace idem {
namespace {

constexpr int kMaxDepth = 64;
constexpr size_t kMaxResponseBytes = 8u << 20;  // 8 MiB
// Connections kept open between exchanges, per tool, and for how long one
// may idle and still be used: well below the keep-alive timeouts servers
// commonly close idle connections at (5 s: Node, Apache, idem serve), so
// that a request rarely meets a connection the server is closing.
constexpr size_t kMaxIdleConnections = 64;
constexpr int64_t kMaxIdleMs = 2'000;
constexpr int64_t kMaxTimeoutMs = 600'000;
constexpr int64_t kMaxConnectTimeoutMs = 60'000;

// Headers the tool sets itself (lower case); a tools file may not override them.
constexpr std::array<std::string_view, 8> kReservedHeaders = {
    "idempotency-key",   "idempotency-attempt", "if-match",
    "content-type",      "content-length",      "host",
    "transfer-encoding", "connection",
};

bool IsReservedHeader(const std::string& lower_name) {
  return std::find(kReservedHeaders.begin(), kReservedHeaders.end(), lower_name) !=
         kReservedHeaders.end();
}

std::string Quote(const std::string& s) { return "\"" + PrintableText(s) + "\""; }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status Bad(const std::string& place, const std::string& problem) {
  return Status::InvalidArgument(place + ": " + problem);
}

bool ValidToolName(const std::string& name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '-';
  });
}

// RFC 9110 token characters (header names).
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::string("!#$%&'*+-.^_`|~").find(c) != std::string::npos;
}

// A header value we are willing to send: printable ASCII, space and tab.
bool IsSendableHeaderValue(const std::string& v) {
  return std::all_of(v.begin(), v.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return (u >= 0x20 && u < 0x7f) || u == '\t';
  });
}

// Percent-encodes everything but RFC 3986 unreserved characters, so that a
// key such as "saga_1/charge" stays one path segment.
std::string EncodePathSegment(const std::string& s) {
  constexpr const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) != 0 || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

std::string ExpandKey(const std::string& path, const std::string& key) {
  constexpr std::string_view kPlaceholder = "{key}";
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t at = path.find(kPlaceholder, pos);
    if (at == std::string::npos) break;
    out.append(path, pos, at - pos);
    out += EncodePathSegment(key);
    pos = at + kPlaceholder.size();
  }
  out.append(path, pos, std::string::npos);
  return out;
}

// ---- Parsing the tools document ----------------------------------------------

// Checks that `obj` has only the `allowed` fields.
Status OnlyFields(const Json& obj, const std::string& place, const std::set<std::string>& allowed) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (allowed.count(it.key()) == 0) {
      return Bad(place.empty() ? it.key() : place + "." + it.key(), "unknown field");
    }
  }
  return Status::Ok();
}

Result<std::string> RequiredString(const Json& obj, const std::string& field,
                                   const std::string& place) {
  auto it = obj.find(field);
  if (it == obj.end()) return Bad(place + "." + field, "is required");
  if (!it->is_string()) return Bad(place + "." + field, "expected a string");
  return it->get<std::string>();
}

Status OptionalString(const Json& obj, const std::string& field, const std::string& place,
                      std::string* out) {
  auto it = obj.find(field);
  if (it == obj.end()) return Status::Ok();
  if (!it->is_string()) return Bad(place + "." + field, "expected a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

Status OptionalMs(const Json& obj, const std::string& field, const std::string& place, int64_t max,
                  int64_t* out) {
  auto it = obj.find(field);
  if (it == obj.end()) return Status::Ok();
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > max) {
    return Bad(place + "." + field, "expected an integer in 1.." + std::to_string(max));
  }
  *out = it->get<int64_t>();
  return Status::Ok();
}

// http(s)://host[:port][/prefix]
Status ParseBaseUrl(const std::string& url, const std::string& place, HttpToolConfig* c) {
  std::string lower = Lower(url);
  c->tls = lower.rfind("https://", 0) == 0;
  const std::string scheme = c->tls ? "https://" : "http://";
  if (lower.rfind(scheme, 0) != 0) {
    return Bad(place, Quote(url) + ": expected http(s)://host[:port][/prefix]");
  }
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string::npos) {
    return Bad(place, Quote(url) + ": user information is not supported (use \"headers\")");
  }
  std::string host;
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [::1]:8080
    size_t close = authority.find(']');
    if (close == std::string::npos) return Bad(place, Quote(url) + ": unterminated IPv6 address");
    host = authority.substr(1, close - 1);
    std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Bad(place, Quote(url) + R"(: expected ":port" after "]")");
      port = after.substr(1);
    }
    if (host.empty() || !std::all_of(host.begin(), host.end(), [](char ch) {
          return std::isxdigit(static_cast<unsigned char>(ch)) != 0 || ch == ':' || ch == '.';
        })) {
      return Bad(place, Quote(url) + ": invalid IPv6 address");
    }
  } else {
    size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
    if (host.empty()) return Bad(place, Quote(url) + ": the host is missing");
    if (!std::all_of(host.begin(), host.end(), [](char ch) {
          return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '.' || ch == '-';
        })) {
      return Bad(place, Quote(url) + ": invalid host " + Quote(host));
    }
  }
  int port_number = c->tls ? 443 : 80;
  if (!port.empty() || authority.find(':') != std::string::npos) {
    bool digits = !port.empty() && port.size() <= 5 &&
                  std::all_of(port.begin(), port.end(),
                              [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
    port_number = digits ? std::stoi(port) : 0;
    if (port_number < 1 || port_number > 65535) {
      return Bad(place, Quote(url) + ": the port must be a number in 1..65535");
    }
  }
  if (prefix.find_first_of("?#") != std::string::npos ||
      !std::all_of(prefix.begin(), prefix.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u > 0x20 && u < 0x7f;
      })) {
    return Bad(place, Quote(url) +
                          ": the path prefix may not hold a query, a fragment, spaces "
                          "or non-ASCII bytes");
  }
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  c->host = host;
  c->port = port_number;
  c->base_path = prefix;
  return Status::Ok();
}

Status CheckPath(const std::string& path, const std::string& place, bool needs_key) {
  if (path.empty() || path[0] != '/') return Bad(place, "must start with \"/\"");
  for (char ch : path) {
    auto u = static_cast<unsigned char>(ch);
    if (u <= 0x20 || u >= 0x7f || ch == '#') {
      return Bad(place, Quote(path) +
                            ": spaces, \"#\", control characters and non-ASCII bytes "
                            "are not allowed");
    }
  }
  // The only placeholder is {key}.
  std::string rest = path;
  size_t pos = 0;
  while ((pos = rest.find("{key}")) != std::string::npos) rest.erase(pos, 5);
  if (rest.find_first_of("{}") != std::string::npos) {
    return Bad(place, Quote(path) + ": the only placeholder is {key}");
  }
  if (needs_key && path.find("{key}") == std::string::npos) {
    return Bad(place, Quote(path) + ": must contain {key}");
  }
  return Status::Ok();
}

Status ParseEndpoint(const Json& obj, const std::string& place,
                     const std::vector<std::string>& methods, bool needs_key, HttpEndpoint* out) {
  if (!obj.is_object()) return Bad(place, R"(expected an object {"method": ..., "path": ...})");
  IDEM_RETURN_IF_ERROR(OnlyFields(obj, place, {"method", "path"}));
  std::string method = methods.front();
  IDEM_RETURN_IF_ERROR(OptionalString(obj, "method", place, &method));
  if (std::find(methods.begin(), methods.end(), method) == methods.end()) {
    std::string list;
    for (const auto& m : methods) list += (list.empty() ? "" : ", ") + m;
    return Bad(place + ".method", Quote(method) + " is not one of " + list);
  }
  Result<std::string> path = RequiredString(obj, "path", place);
  if (!path.ok()) return path.status();
  IDEM_RETURN_IF_ERROR(CheckPath(*path, place + ".path", needs_key));
  out->method = method;
  out->path = *path;
  return Status::Ok();
}

// "completion": {"mode": "done"|"accepted", "window": "2h", "first_check":
// "1s", "max_check": "5m"}: what a 2xx means (saga/completion.h). "accepted"
// needs a status endpoint, the only way to learn how the work ended.
Status ParseCompletion(const Json& j, const std::string& place, bool has_status,
                       CompletionPolicy* out) {
  if (!j.is_object()) return Bad(place, "expected an object");
  IDEM_RETURN_IF_ERROR(OnlyFields(j, place, {"mode", "window", "first_check", "max_check"}));
  std::string mode = "done";
  IDEM_RETURN_IF_ERROR(OptionalString(j, "mode", place, &mode));
  if (mode != "done" && mode != "accepted") {
    return Bad(place + ".mode", Quote(mode) + " is not \"done\" or \"accepted\"");
  }
  if (mode == "accepted" && !has_status) {
    return Bad(place + ".mode", "\"accepted\" needs a \"status\" endpoint to ask how it ended");
  }
  out->accepts = mode == "accepted";
  for (const auto& [field, target] :
       std::vector<std::pair<const char*, int64_t*>>{{"window", &out->window_ms},
                                                     {"first_check", &out->first_check_ms},
                                                     {"max_check", &out->max_check_ms}}) {
    std::string text;
    IDEM_RETURN_IF_ERROR(OptionalString(j, field, place, &text));
    if (text.empty()) continue;
    Result<int64_t> ms = ParseDurationMs(text, place + "." + field);
    if (!ms.ok()) return ms.status();
    if (*ms <= 0) return Bad(place + "." + field, "must be more than 0");
    *target = *ms;
  }
  return Status::Ok();
}

Result<HttpToolConfig> ParseTool(const Json& t, const std::string& place,
                                 const std::string& base_dir) {
  if (!t.is_object()) return Bad(place, "expected an object");
  std::set<std::string> fields = {"name",
                                  "effect",
                                  "description",
                                  "base_url",
                                  "commit",
                                  "status",
                                  "preview",
                                  "honours_keys",
                                  "headers",
                                  "timeout_ms",
                                  "connect_timeout_ms",
                                  "key_retention",
                                  "ca_file",
                                  "client_cert",
                                  "client_key",
                                  "completion"};
  for (const char* const* f = OpenPolicyFields(); *f != nullptr; ++f) fields.insert(*f);
  IDEM_RETURN_IF_ERROR(OnlyFields(t, place, fields));
  HttpToolConfig c;
  IDEM_RETURN_IF_ERROR(ParseOpenCallPolicy(t, place, &c.info.open));
  Result<std::string> name = RequiredString(t, "name", place);
  if (!name.ok()) return name.status();
  if (!ValidToolName(*name)) {
    return Bad(place + ".name", Quote(*name) + " is not [A-Za-z0-9._-]{1,128}");
  }
  c.info.name = *name;

  Result<std::string> effect = RequiredString(t, "effect", place);
  if (!effect.ok()) return effect.status();
  Result<EffectClass> effect_class = ParseEffectClass(*effect);
  if (!effect_class.ok()) return Bad(place + ".effect", effect_class.status().message());
  c.info.effect = *effect_class;

  IDEM_RETURN_IF_ERROR(OptionalString(t, "description", place, &c.info.description));

  Result<std::string> base_url = RequiredString(t, "base_url", place);
  if (!base_url.ok()) return base_url.status();
  IDEM_RETURN_IF_ERROR(ParseBaseUrl(*base_url, place + ".base_url", &c));

  auto commit = t.find("commit");
  if (commit == t.end()) return Bad(place + ".commit", "is required");
  IDEM_RETURN_IF_ERROR(ParseEndpoint(*commit, place + ".commit", {"POST", "PUT", "PATCH", "DELETE"},
                                     false, &c.commit));
  if (auto status = t.find("status"); status != t.end()) {
    IDEM_RETURN_IF_ERROR(ParseEndpoint(*status, place + ".status", {"GET"}, true, &c.status));
  }
  if (auto preview = t.find("preview"); preview != t.end()) {
    IDEM_RETURN_IF_ERROR(
        ParseEndpoint(*preview, place + ".preview", {"POST", "PUT", "PATCH"}, false, &c.preview));
  }
  c.info.has_status = !c.status.path.empty();
  c.info.has_preview = !c.preview.path.empty();
  if (auto completion = t.find("completion"); completion != t.end()) {
    IDEM_RETURN_IF_ERROR(
        ParseCompletion(*completion, place + ".completion", c.info.has_status, &c.info.completion));
  }

  if (auto honours = t.find("honours_keys"); honours != t.end()) {
    if (!honours->is_boolean()) return Bad(place + ".honours_keys", "expected true or false");
    c.info.honours_keys = honours->get<bool>();
  }
  if (auto retention = t.find("key_retention"); retention != t.end()) {
    auto ms = ParseDurationMs(*retention, place + ".key_retention");  // "24h", or seconds
    if (!ms.ok()) return ms.status();
    if (*ms <= 0) return Bad(place + ".key_retention", "must be positive");
    c.info.key_retention_ms = *ms;
  }
  if (auto headers = t.find("headers"); headers != t.end()) {
    if (!headers->is_object()) return Bad(place + ".headers", "expected an object of strings");
    for (auto it = headers->begin(); it != headers->end(); ++it) {
      std::string hplace = place + ".headers." + it.key();
      const std::string& hname = it.key();
      if (hname.empty() || !std::all_of(hname.begin(), hname.end(), IsTokenChar)) {
        return Bad(place + ".headers", Quote(hname) + " is not a valid header name");
      }
      if (IsReservedHeader(Lower(hname))) {
        return Bad(hplace, "is set by idem and may not be overridden");
      }
      if (!it->is_string()) return Bad(hplace, "expected a string");
      std::string value = it->get<std::string>();
      if (!IsSendableHeaderValue(value)) {
        return Bad(hplace, "control characters and non-ASCII bytes are not allowed");
      }
      c.headers[hname] = value;
    }
  }
  IDEM_RETURN_IF_ERROR(OptionalMs(t, "timeout_ms", place, kMaxTimeoutMs, &c.timeout_ms));
  IDEM_RETURN_IF_ERROR(
      OptionalMs(t, "connect_timeout_ms", place, kMaxConnectTimeoutMs, &c.connect_timeout_ms));
  IDEM_RETURN_IF_ERROR(http_tls::ParseFields(t, place, base_dir, &c));
  return c;
}

// ---- The tool -----------------------------------------------------------------

// What one HTTP exchange produced.
struct Exchange {
  httplib::Error error = httplib::Error::Unknown;
  bool answered = false;  // a complete response arrived
  int status = 0;
  httplib::Headers headers;
  std::string body;
  bool too_large = false;
  http_tls::Failure tls;  // a TLS failure, when tls.tls
};

// True when the failure happened before any byte of the request was sent:
// the provider cannot have seen it. Everything else (a write that failed
// half way, a read timeout, a reset after the request left) may follow an
// applied effect.
bool NeverSent(httplib::Error e) {
  return e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout ||
         e == httplib::Error::BindIPAddress;
}

std::string DescribeError(const Exchange& x) {
  if (x.tls.tls) return x.tls.reason;
  switch (x.error) {
    case httplib::Error::Connection:
      return "could not connect";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out";
    case httplib::Error::BindIPAddress:
      return "could not bind the local address";
    case httplib::Error::Read:
      return "no complete response (read failed, timed out or the connection closed)";
    case httplib::Error::Write:
      return "sending the request failed part way";
    case httplib::Error::Canceled:
      return "the response was abandoned";
    default:
      return "request failed (" + httplib::to_string(x.error) + ")";
  }
}

// The problem type of an RFC 9457 body, or "".
std::string ProblemType(const std::string& body) {
  Json doc = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object()) {
    auto it = doc.find("type");
    if (it != doc.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

// A short, printable excerpt of a body for an error message.
std::string Excerpt(const std::string& body) {
  constexpr size_t kMax = 300;
  std::string text = PrintableText(body.substr(0, kMax));
  if (body.size() > kMax) text += "...";
  return text;
}

std::string StatusError(const std::string& what, int status, const std::string& body) {
  std::string msg = what + ": HTTP " + std::to_string(status);
  if (!body.empty()) msg += ": " + Excerpt(body);
  return msg;
}

std::string RefOf(const Json& v) {
  if (!v.is_object()) return "";
  for (const char* field : {"external_ref", "id"}) {
    auto it = v.find(field);
    if (it == v.end()) continue;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return it->dump();
  }
  return "";
}

// The provider's Retry-After in ms when it gives whole seconds (RFC 9110
// also allows an HTTP date, which is ignored: the tool's own backoff then
// decides); 0 when absent or not a plain number.
int64_t RetryAfterMs(const Exchange& x) {
  auto ra = x.headers.find("Retry-After");
  if (ra == x.headers.end()) return 0;
  const std::string& v = ra->second;
  if (v.empty() || v.size() >= 9 ||
      !std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return 0;
  }
  return std::stoll(v) * 1000;
}

ToolOutcome ClassifyCommit(const std::string& what, const Exchange& x, bool accepts) {
  if (!x.answered) {
    std::string msg = what + ": " + DescribeError(x);
    if (x.too_large) {
      msg = what + ": the response is larger than " + std::to_string(kMaxResponseBytes) +
            " bytes and was abandoned";
    }
    if (x.tls.tls && x.tls.not_sent) {
      return ToolOutcome::Failed(msg + "; the request was not sent", !x.tls.refused);
    }
    if (NeverSent(x.error)) return ToolOutcome::Failed(msg + "; the request was not sent", true);
    return ToolOutcome::Unknown(msg + "; the request may have taken effect");
  }
  const int s = x.status;
  if (s == 202 && accepts) {
    // Accepted: the provider finishes later; its status endpoint says how.
    Json body;
    if (!x.body.empty()) {
      Result<Json> parsed = ParseJson(x.body, what, kMaxDepth);
      if (parsed.ok()) body = std::move(parsed).value();
    }
    return ToolOutcome::Accepted(RefOf(body), RetryAfterMs(x));
  }
  if (s >= 200 && s < 300) {
    Json result;
    if (!x.body.empty()) {
      Result<Json> parsed = ParseJson(x.body, what, kMaxDepth);
      result = parsed.ok() ? std::move(parsed).value() : Json(PrintableText(x.body));
    }
    std::string ref = RefOf(result);
    ToolOutcome out = ToolOutcome::Succeeded(std::move(result), std::move(ref));
    auto replayed = x.headers.find("Idempotent-Replayed");
    out.replayed = replayed != x.headers.end() && Lower(replayed->second) == "true";
    return out;
  }
  const std::string type = Lower(ProblemType(x.body));
  const std::string msg = StatusError(what, s, x.body);
  if (s == 412 || (s == 409 && EndsWith(type, "stale"))) return ToolOutcome::Stale(msg);
  if (s == 409 && (x.headers.count("Retry-After") != 0 || EndsWith(type, "in-flight"))) {
    return ToolOutcome::Unknown(msg + " (an earlier request under this key is still running)");
  }
  if (s == 422 && EndsWith(type, "idempotency-key-reused")) {
    return ToolOutcome::Unknown(msg + " (an earlier request under this key exists)");
  }
  if (s == 408 || s == 425 || s == 429 || s == 503) return ToolOutcome::Failed(msg, true);
  if ((s >= 300 && s < 500) || s == 501) return ToolOutcome::Failed(msg, false);
  return ToolOutcome::Unknown(msg + " (the provider may have applied it)");
}

class HttpTool : public Tool {
 public:
  explicit HttpTool(HttpToolConfig config) : config_(std::move(config)) {}

  const ToolInfo& info() const override { return config_.info; }

  ToolOutcome Invoke(const ToolCall& call) override {
    const std::string what = config_.info.name + " " + config_.commit.method + " " +
                             config_.base_path + config_.commit.path;
    if (!IsSendableHeaderValue(call.key) || call.key.empty()) {
      return ToolOutcome::Failed(what + ": the idempotency key " + Quote(call.key) +
                                     " cannot be sent as a header; the request was not sent",
                                 false);
    }
    if (!IsSendableHeaderValue(call.expected_version)) {
      return ToolOutcome::Failed(what + ": the expected version " + Quote(call.expected_version) +
                                     " cannot be sent as If-Match; the request was not sent",
                                 false);
    }
    try {
      httplib::Headers headers = {{"Idempotency-Key", call.key},
                                  {"Idempotency-Attempt", std::to_string(call.attempt)}};
      if (!call.expected_version.empty()) headers.emplace("If-Match", call.expected_version);
      // A provider that honours keys answers a resent request from its
      // record of the first: the request may be sent again.
      Exchange x = Send(config_.commit, ExpandKey(config_.commit.path, call.key), headers,
                        Body(call.args), config_.info.honours_keys);
      return ClassifyCommit(what, x, config_.info.completion.accepts);
    } catch (const std::exception& e) {
      return ToolOutcome::Unknown(what + ": unexpected error: " + e.what());
    }
  }

  LookupOutcome Lookup(const std::string& key) override {
    LookupOutcome o;
    o.kind = LookupKind::kError;
    const std::string what = config_.info.name + " status lookup";
    if (config_.status.path.empty()) {
      o.error = what + ": the tool has no status endpoint";
      return o;
    }
    try {
      Exchange x = Send(config_.status, ExpandKey(config_.status.path, key), {}, "",
                        /*resendable=*/true);  // a read
      if (!x.answered) {
        o.error = what + ": " + DescribeError(x);
        return o;
      }
      Result<Json> doc = x.body.empty() ? Result<Json>(Status::InvalidArgument("empty body"))
                                        : ParseJson(x.body, what, kMaxDepth);
      if (x.status == 404) {
        if (doc.ok()) {
          o.kind = LookupKind::kNotApplied;
        } else {
          o.error = StatusError(what, x.status, x.body) +
                    " without a JSON body: is the status path right?";
        }
        return o;
      }
      if (x.status != 200) {
        o.error = StatusError(what, x.status, x.body);
        return o;
      }
      if (!doc.ok() || !doc->is_object() || !doc->contains("status") ||
          !(*doc)["status"].is_string()) {
        o.error =
            what + ": expected a JSON object with a \"status\" string, got: " + Excerpt(x.body);
        return o;
      }
      const std::string status = Lower((*doc)["status"].get<std::string>());
      if (status == "applied" || status == "succeeded") {
        o.kind = LookupKind::kApplied;
        if (auto it = doc->find("result"); it != doc->end()) o.result = *it;
        o.external_ref = RefOf(*doc);
        if (o.external_ref.empty()) o.external_ref = RefOf(o.result);
      } else if (status == "failed" && config_.info.completion.accepts) {
        // An accepted call the provider finished with a refusal.
        o.kind = LookupKind::kFailed;
        if (auto it = doc->find("error"); it != doc->end() && it->is_string()) {
          o.error = it->get<std::string>();
        }
      } else if (status == "not_found" || status == "not_applied" || status == "failed") {
        o.kind = LookupKind::kNotApplied;
      } else if (status == "pending" || status == "processing" || status == "in_progress") {
        // The provider holds the key and has not finished (not an error);
        // its Retry-After, if any, sets the next check.
        o.kind = LookupKind::kPending;
        o.external_ref = RefOf(*doc);
        o.check_after_ms = RetryAfterMs(x);
      } else {
        o.error = what + ": status " + Quote(status) + " (still in flight?); ask again later";
      }
      return o;
    } catch (const std::exception& e) {
      o.error = what + ": unexpected error: " + e.what();
      return o;
    }
  }

  PreviewOutcome Preview(const ToolCall& call) override {
    PreviewOutcome o;
    const std::string what = config_.info.name + " preview";
    if (config_.preview.path.empty()) {
      o.error = what + ": the tool has no preview endpoint";
      return o;
    }
    try {
      Exchange x =
          Send(config_.preview, ExpandKey(config_.preview.path, call.key), {}, Body(call.args),
               /*resendable=*/true);  // a preview has no effect
      if (!x.answered) {
        o.error = what + ": " + DescribeError(x);
        o.retryable = true;  // a preview has no effect: asking again is safe
        return o;
      }
      if (x.status != 200) {
        o.error = StatusError(what, x.status, x.body);
        o.retryable = x.status == 408 || x.status == 425 || x.status == 429 || x.status >= 500;
        return o;
      }
      Result<Json> doc = ParseJson(x.body, what, kMaxDepth);
      if (!doc.ok() || !doc->is_object()) {
        o.error = what + ": expected a JSON object, got: " + Excerpt(x.body);
        return o;
      }
      auto summary = doc->find("summary");
      if (summary == doc->end() || !summary->is_string()) {
        o.error = what + ": the answer has no \"summary\" string";
        return o;
      }
      o.summary = summary->get<std::string>();
      if (auto changes = doc->find("changes"); changes != doc->end()) o.changes = *changes;
      if (auto version = doc->find("resource_version"); version != doc->end()) {
        if (version->is_string()) {
          o.resource_version = version->get<std::string>();
        } else if (version->is_number_integer()) {
          o.resource_version = version->dump();
        } else if (!version->is_null()) {
          o.error = what + ": \"resource_version\" must be a string or an integer";
          return o;
        }
      }
      o.ok = true;
      return o;
    } catch (const std::exception& e) {
      o.error = what + ": unexpected error: " + e.what();
      o.retryable = true;
      return o;
    }
  }

 private:
  static std::string Body(const Json& args) {
    return args.is_null() ? std::string("{}") : CanonicalJson(args);
  }

  // A client of config_, kept open since `idle_since`.
  struct Idle {
    std::unique_ptr<http_tls::Client> client;
    std::chrono::steady_clock::time_point idle_since;
  };

  // A client whose connection is still open from an earlier exchange and
  // idled less than kMaxIdleMs (*kept set), else a new one (connected by
  // its send). Connections idle longer are closed.
  std::unique_ptr<http_tls::Client> TakeClient(bool* kept) const {
    const auto now = std::chrono::steady_clock::now();
    const auto fresh = [&](const Idle& i) {
      return now - i.idle_since < std::chrono::milliseconds(kMaxIdleMs);
    };
    std::vector<Idle> stale;  // closed outside the lock
    std::unique_ptr<http_tls::Client> client;
    {
      std::lock_guard<std::mutex> lock(idle_mu_);
      // Oldest first: the stale ones lead.
      auto first_fresh = std::find_if(idle_.begin(), idle_.end(), fresh);
      stale.assign(std::make_move_iterator(idle_.begin()), std::make_move_iterator(first_fresh));
      idle_.erase(idle_.begin(), first_fresh);
      if (!idle_.empty()) {
        client = std::move(idle_.back().client);  // the most recently used
        idle_.pop_back();
      }
    }
    *kept = client != nullptr;
    return client ? std::move(client) : std::make_unique<http_tls::Client>(config_);
  }

  // Keeps `client` for the next exchange if its exchange ended with a
  // whole response on a connection the server keeps open.
  void GiveBack(std::unique_ptr<http_tls::Client> client, const Exchange& x) const {
    if (!x.answered || !client->get().is_socket_open()) return;
    std::lock_guard<std::mutex> lock(idle_mu_);
    if (idle_.size() >= kMaxIdleConnections) return;
    idle_.push_back(Idle{std::move(client), std::chrono::steady_clock::now()});
  }

  // One exchange. On a kept connection that the server closed or reset as
  // the request went out (a failed write, or a read that failed before any
  // byte of an answer and before the timeout), a `resendable` request (a
  // read, a preview, a commit to a provider that honours keys) goes out
  // once more on a new connection; any other stays as it failed (unknown).
  Exchange Send(const HttpEndpoint& endpoint, const std::string& path,
                const httplib::Headers& headers, const std::string& body, bool resendable) const {
    bool kept = false;
    std::unique_ptr<http_tls::Client> client = TakeClient(&kept);
    const auto start = std::chrono::steady_clock::now();
    Exchange x = SendOn(*client, endpoint, path, headers, body);
    const bool cut =
        x.error == httplib::Error::Write ||
        (x.error == httplib::Error::Read && x.status == 0 && x.body.empty() &&
         std::chrono::steady_clock::now() - start < std::chrono::milliseconds(config_.timeout_ms));
    if (kept && resendable && !x.answered && !x.too_large && cut) {
      client = std::make_unique<http_tls::Client>(config_);
      x = SendOn(*client, endpoint, path, headers, body);
    }
    GiveBack(std::move(client), x);
    return x;
  }

  Exchange SendOn(http_tls::Client& client, const HttpEndpoint& endpoint, const std::string& path,
                  const httplib::Headers& headers, const std::string& body) const {
    client.BeginExchange();
    httplib::ClientImpl& cli = client.get();
    cli.set_connection_timeout(config_.connect_timeout_ms / 1000,
                               (config_.connect_timeout_ms % 1000) * 1000);
    cli.set_read_timeout(config_.timeout_ms / 1000, (config_.timeout_ms % 1000) * 1000);
    cli.set_write_timeout(config_.timeout_ms / 1000, (config_.timeout_ms % 1000) * 1000);
    cli.set_keep_alive(true);
    // A kept connection sends each request as soon as it is written (its
    // head and body go out in separate writes, which Nagle's algorithm
    // would hold for the peer's delayed ACK).
    cli.set_tcp_nodelay(true);
    cli.set_follow_location(false);
    cli.set_url_encode(false);  // paths are validated ASCII; keys are encoded above

    httplib::Request req;
    req.method = endpoint.method;
    req.path = config_.base_path + path;
    req.headers = headers;
    for (const auto& [name, value] : config_.headers) req.headers.emplace(name, value);
    req.headers.emplace("Accept", "application/json, application/problem+json");
    if (endpoint.method != "GET") {
      req.headers.emplace("Content-Type", "application/json");
      req.body = body;
    }
    Exchange x;
    if (!cli.is_valid()) {  // the client certificate or key no longer loads
      x.error = httplib::Error::SSLLoadingCerts;
      x.tls = {true, true, true,
               "cannot load the client certificate " + config_.client_cert + " and its key"};
      return x;
    }
    req.content_receiver = [&x](const char* data, size_t n, uint64_t /*offset*/,
                                uint64_t /*total*/) {
      if (x.body.size() + n > kMaxResponseBytes) {
        x.too_large = true;
        return false;
      }
      x.body.append(data, n);
      return true;
    };
    ERR_clear_error();  // http_tls::Classify reads what this exchange queues
    httplib::Result res = cli.send(req);
    x.error = res.error();
    if (!res) x.tls = client.Classify(x.error);
    if (res) {
      x.answered = !x.too_large;
      x.status = res->status;
      x.headers = res->headers;
    } else if (x.error == httplib::Error::Success) {
      x.error = httplib::Error::Unknown;
    }
    return x;
  }

  HttpToolConfig config_;
  mutable std::mutex idle_mu_;
  mutable std::vector<Idle> idle_;  // GUARDED_BY(idle_mu_), oldest first
};

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open the tools file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::NotFound(path + ": cannot read the tools file");
  return text.str();
}

}  // namespace

Result<std::vector<HttpToolConfig>> ParseHttpTools(const Json& doc, const std::string& base_dir) {
  try {
    if (!doc.is_object()) return Bad("document", "expected a JSON object {\"tools\": [...]}");
    IDEM_RETURN_IF_ERROR(OnlyFields(doc, "", {"tools"}));
    auto tools = doc.find("tools");
    if (tools == doc.end()) return Bad("tools", "is required");
    if (!tools->is_array()) return Bad("tools", "expected an array");
    std::vector<HttpToolConfig> out;
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string place = "tools[" + std::to_string(i) + "]";
      Result<HttpToolConfig> c = ParseTool((*tools)[i], place, base_dir);
      if (!c.ok()) return c.status();
      auto [it, fresh] = seen.emplace(c->info.name, i);
      if (!fresh) {
        return Bad(place + ".name", Quote(c->info.name) + " is declared twice (also tools[" +
                                        std::to_string(it->second) + "])");
      }
      out.push_back(std::move(c).value());
    }
    return out;
  } catch (const std::exception& e) {
    return Status::Internal(std::string("tools: unexpected error: ") + e.what());
  }
}

Result<std::unique_ptr<Tool>> NewHttpTool(HttpToolConfig config) {
  const std::string place = "tool " + Quote(config.info.name);
  if (!ValidToolName(config.info.name)) {
    return Bad(place, "the name is not [A-Za-z0-9._-]{1,128}");
  }
  if (config.host.empty()) return Bad(place, "the host is missing");
  if (config.port < 1 || config.port > 65535) return Bad(place, "the port is not in 1..65535");
  IDEM_RETURN_IF_ERROR(CheckPath(config.commit.path, place + ": commit.path", false));
  if (!config.status.path.empty()) {
    IDEM_RETURN_IF_ERROR(CheckPath(config.status.path, place + ": status.path", true));
  }
  if (!config.preview.path.empty()) {
    IDEM_RETURN_IF_ERROR(CheckPath(config.preview.path, place + ": preview.path", false));
  }
  if (config.timeout_ms < 1 || config.connect_timeout_ms < 1) {
    return Bad(place, "timeouts must be at least 1 ms");
  }
  config.info.has_status = !config.status.path.empty();
  config.info.has_preview = !config.preview.path.empty();
  if (config.status.method.empty()) config.status.method = "GET";
  if (config.commit.method.empty()) config.commit.method = "POST";
  if (config.preview.method.empty()) config.preview.method = "POST";
  return std::unique_ptr<Tool>(new HttpTool(std::move(config)));
}

Status LoadHttpTools(const std::string& path_or_json, ToolRegistry* registry) {
  if (registry == nullptr) return Status::InvalidArgument("LoadHttpTools: registry is null");
  size_t first = path_or_json.find_first_not_of(" \t\r\n");
  const bool inline_doc = first != std::string::npos && path_or_json[first] == '{';
  std::string text = path_or_json;
  std::string prefix;  // names the file in errors
  if (!inline_doc) {
    if (path_or_json.empty()) return Status::InvalidArgument("tools file: the path is empty");
    Result<std::string> read = ReadFile(path_or_json);
    if (!read.ok()) return read.status();
    text = std::move(read).value();
    prefix = path_or_json + ": ";
  }
  Result<Json> doc = ParseJson(text, inline_doc ? "tools" : path_or_json, kMaxDepth);
  if (!doc.ok()) return doc.status();
  std::string base_dir;  // TLS file paths are relative to the tools file
  if (!inline_doc) {
    size_t slash = path_or_json.rfind('/');
    base_dir = slash == std::string::npos ? "" : path_or_json.substr(0, slash == 0 ? 1 : slash);
  }
  Result<std::vector<HttpToolConfig>> configs = ParseHttpTools(*doc, base_dir);
  if (!configs.ok()) {
    return {configs.status().code(), prefix + configs.status().message()};
  }
  // All or nothing: check every name before registering any.
  for (size_t i = 0; i < configs->size(); ++i) {
    const std::string& name = (*configs)[i].info.name;
    if (registry->Find(name) != nullptr) {
      return Status::Conflict(prefix + "tools[" + std::to_string(i) + "].name: tool " +
                              Quote(name) + " is already registered");
    }
  }
  std::vector<std::unique_ptr<Tool>> tools;
  for (HttpToolConfig& c : *configs) {
    Result<std::unique_ptr<Tool>> tool = NewHttpTool(std::move(c));
    if (!tool.ok()) return {tool.status().code(), prefix + tool.status().message()};
    tools.push_back(std::move(tool).value());
  }
  for (auto& tool : tools) IDEM_RETURN_IF_ERROR(registry->Register(std::move(tool)));
  return Status::Ok();
}

}  // namespace idem
