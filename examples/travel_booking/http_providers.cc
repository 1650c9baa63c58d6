#include "examples/travel_booking/http_providers.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <set>
#include <utility>

#include "common/json_util.h"
#include "common/tls_files.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

namespace idem::travel {
namespace {

// Problem types (RFC 9457) of the providers' own answers.
constexpr const char* kProblemStale = "urn:travel:problem:stale";
constexpr const char* kProblemUnavailable = "urn:travel:problem:unavailable";
constexpr const char* kProblemRejected = "urn:travel:problem:rejected";
constexpr const char* kProblemAfterCompensation = "urn:travel:problem:refused-after-compensation";
constexpr const char* kProblemUnknown = "urn:travel:problem:outcome-unknown";
constexpr const char* kProblemBadRequest = "urn:travel:problem:bad-request";
constexpr const char* kProblemKeyMissing = "urn:travel:problem:idempotency-key-missing";

constexpr int kRetryAfterS = 1;
constexpr size_t kMaxBodyBytes = 1u << 20;

/// The in-process error text of an action refused after its compensation.
constexpr const char* kAfterCompensation = "after its compensation";

// Fault modes that refuse a request before the key layer and the ledger
// logic; the in-process tools of their registry log and answer them.
const std::set<std::string>& FrontDoorModes() {
  static const std::set<std::string> modes = {"fail", "reject", "lose_request"};
  return modes;
}

void Problem(httplib::Response& res, int status, const char* type, const std::string& title,
             const std::string& detail) {
  Json doc = {{"type", type}, {"title", title}, {"status", status}, {"detail", detail}};
  res.status = status;
  res.set_content(doc.dump(), "application/problem+json");
}

void JsonAnswer(httplib::Response& res, int status, const Json& doc) {
  res.status = status;
  res.set_content(doc.dump(), "application/json");
}

/// The key as sent, or the content of an RFC 8941 sf-string ("...").
std::string UnquoteHeader(const std::string& value) {
  if (value.size() < 2 || value.front() != '"' || value.back() != '"') return value;
  std::string out;
  for (size_t i = 1; i + 1 < value.size(); ++i) {
    if (value[i] == '\\' && i + 2 < value.size()) ++i;
    out.push_back(value[i]);
  }
  return out;
}

int AttemptOf(const httplib::Request& req) {
  const std::string text = req.get_header_value("Idempotency-Attempt");
  if (text.empty() || text.size() > 6 || !std::all_of(text.begin(), text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
      })) {
    return 1;
  }
  return std::max(1, std::stoi(text));
}

/// The args of a commit or preview body: null when empty.
Result<Json> ArgsOf(const httplib::Request& req) {
  if (req.body.empty()) return Json();
  return ParseJson(req.body, "request body", 64);
}

/// The ports and peer address of a connected socket, or false.
bool SocketEnds(int fd, std::string* peer_addr, int* peer_port, int* local_port) {
  sockaddr_storage peer{};
  sockaddr_storage local{};
  socklen_t peer_len = sizeof peer;
  socklen_t local_len = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  std::array<char, INET6_ADDRSTRLEN> text{};
  if (peer.ss_family == AF_INET && local.ss_family == AF_INET) {
    const auto& p = reinterpret_cast<const sockaddr_in&>(peer);
    const auto& l = reinterpret_cast<const sockaddr_in&>(local);
    ::inet_ntop(AF_INET, &p.sin_addr, text.data(), text.size());
    *peer_port = ntohs(p.sin_port);
    *local_port = ntohs(l.sin_port);
  } else if (peer.ss_family == AF_INET6 && local.ss_family == AF_INET6) {
    const auto& p = reinterpret_cast<const sockaddr_in6&>(peer);
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local);
    ::inet_ntop(AF_INET6, &p.sin6_addr, text.data(), text.size());
    *peer_port = ntohs(p.sin6_port);
    *local_port = ntohs(l.sin6_port);
  } else {
    return false;
  }
  *peer_addr = text.data();
  return true;
}

/// Whole seconds for Retry-After, rounded up: never ask before it is ready.
int64_t RetryAfterSeconds(int64_t ms) { return std::max<int64_t>(0, (ms + 999) / 1000); }

/// The in-process outcome of a commit as an HTTP answer (see the header).
void AnswerOutcome(const ToolOutcome& outcome, httplib::Response& res) {
  switch (outcome.kind) {
    case OutcomeKind::kSucceeded: {
      Json body = outcome.result.is_null() ? Json::object() : outcome.result;
      if (body.is_object() && !outcome.external_ref.empty() && !body.contains("external_ref")) {
        body["external_ref"] = outcome.external_ref;
      }
      JsonAnswer(res, 200, body);
      return;
    }
    case OutcomeKind::kFailed:
      if (outcome.stale) {
        Problem(res, 412, kProblemStale, "The previewed version is stale", outcome.error);
      } else if (outcome.retryable) {
        Problem(res, 503, kProblemUnavailable, "Try again later", outcome.error);
        res.set_header("Retry-After", std::to_string(kRetryAfterS));
      } else if (outcome.error.find(kAfterCompensation) != std::string::npos) {
        Problem(res, 409, kProblemAfterCompensation, "Refused: the action was compensated",
                outcome.error);
      } else {
        Problem(res, 422, kProblemRejected, "Refused", outcome.error);
      }
      return;
    case OutcomeKind::kUnknown:
      Problem(res, 500, kProblemUnknown, "The outcome is unknown", outcome.error);
      return;
    case OutcomeKind::kAccepted:
      JsonAnswer(res, 202, {{"id", outcome.external_ref}, {"status", "pending"}});
      res.set_header("Retry-After", std::to_string(RetryAfterSeconds(outcome.check_after_ms)));
      return;
  }
}

/// The first rule that hits call `n` (as providers.cc matches them).
const FaultRule* FaultFor(const std::vector<FaultRule>& faults, int n) {
  for (const auto& rule : faults) {
    if (rule.mode == "fail_times") {
      if (n <= rule.param) return &rule;
    } else if (rule.nth == 0 || rule.nth == n) {
      return &rule;
    }
  }
  return nullptr;
}

std::string RoutePrefix(const std::string& tool) {
  std::string path = "/" + tool;
  std::replace(path.begin(), path.end(), '.', '/');
  return path;
}

std::string ProviderOf(const std::string& tool) { return tool.substr(0, tool.find('.')); }

/// The providers that guard their commit routes with the key layer.
bool HasKeyLayer(const std::string& provider) {
  return provider == "flights" || provider == "payments";
}

}  // namespace

// ---- routes and faults

std::vector<HttpRoute> TravelHttpRoutes() {
  // The table of providers.h: which tools answer lookups and previews.
  static const std::set<std::string> with_status = {
      "flights.reserve", "hotels.book", "hotels.cancel", "payments.charge", "transfers.book"};
  static const std::set<std::string> with_preview = {"flights.reserve", "payments.charge"};
  std::vector<HttpRoute> routes;
  for (const std::string& tool : TravelToolNames()) {
    const std::string prefix = RoutePrefix(tool);
    routes.push_back({tool, "POST", prefix, "commit"});
    if (with_status.count(tool) != 0) {
      routes.push_back({tool, "GET", prefix + "/status/{key}", "status"});
    }
    if (with_preview.count(tool) != 0) {
      routes.push_back({tool, "POST", prefix + "/preview/{key}", "preview"});
      routes.push_back({tool, "POST", prefix + "/preview", "preview"});
    }
  }
  return routes;
}

Result<FaultRule> ParseHttpFaultRule(const std::string& text) {
  const std::string drop = "drop_connection";
  const auto eq = text.find('=');
  if (eq != std::string::npos && text.compare(eq + 1, drop.size(), drop) == 0) {
    const std::string rest = text.substr(eq + 1 + drop.size());
    if (rest.empty() || rest[0] == '@') {
      // Same syntax as lose_response: reuse its parser for TOOL and @N.
      Result<FaultRule> rule = ParseFaultRule(text.substr(0, eq + 1) + "lose_response" + rest);
      if (!rule.ok()) {
        return Status::InvalidArgument("fault \"" + text +
                                       "\": expected TOOL=drop_connection[@N], N positive");
      }
      FaultRule out = *rule;
      out.mode = drop;
      return out;
    }
  }
  Result<FaultRule> rule = ParseFaultRule(text);
  if (!rule.ok()) {
    return Status::InvalidArgument(rule.status().message() +
                                   "; the HTTP providers also take drop_connection");
  }
  return rule;
}

// ---- the server

struct HttpProviders::Route {
  std::string tool;  ///< "flights.reserve"
  std::string provider;
  std::vector<FaultRule> faults;
  std::atomic<int> commits{0};  ///< commit requests received: the @N count
  /// The commit handlers behind the key layer (or bare): "" runs the clean
  /// tool, "reprice" the tool that moves the version first.
  std::map<std::string, httplib::Server::Handler> guarded;
};

HttpProviders::HttpProviders(HttpProviderOptions options) : options_(std::move(options)) {}

HttpProviders::~HttpProviders() { Stop(); }

Result<std::unique_ptr<HttpProviders>> HttpProviders::Create(HttpProviderOptions options) {
  if (options.ledger_path.empty()) return Status::InvalidArgument("http providers: no ledger path");
  if (options.latency_ms < 0 || options.lost_response_hold_ms < 0 ||
      options.socket_timeout_ms < 1) {
    return Status::InvalidArgument(
        "http providers: latency_ms and lost_response_hold_ms must be >= 0, "
        "socket_timeout_ms >= 1");
  }
  if (options.keys_path.empty()) options.keys_path = options.ledger_path + ".keys.sqlite";
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return Status::InvalidArgument("http providers: --tls-cert and --tls-key go together");
  }
  if (!options.tls_cert_file.empty()) {
    IDEM_RETURN_IF_ERROR(CheckCertificateAndKey(options.tls_cert_file, "--tls-cert",
                                                options.tls_key_file, "--tls-key"));
  }
  std::unique_ptr<HttpProviders> providers(new HttpProviders(std::move(options)));
  IDEM_RETURN_IF_ERROR(providers->Init());
  return providers;
}

Status HttpProviders::Init() {
  const auto& names = TravelToolNames();
  // The clean tools: every commit without a front-door fault, every lookup
  // and preview.
  {
    ProviderOptions clean;
    clean.ledger_path = options_.ledger_path;
    clean.latency_ms = options_.latency_ms;
    clean.confirm_delay_ms = options_.confirm_delay_ms;
    auto registry = std::make_unique<ToolRegistry>();
    IDEM_RETURN_IF_ERROR(RegisterTravelTools(*registry, clean));
    registries_[""] = std::move(registry);
  }
  const ToolRegistry& clean = *registries_[""];
  // One more set of tools per fault mode that providers.cc carries out
  // itself, each faulting on every call; the server decides which call hits.
  std::set<std::string> modes;
  for (const FaultRule& rule : options_.faults) {
    if (std::find(names.begin(), names.end(), rule.tool) == names.end()) {
      return Status::InvalidArgument("fault for unknown tool \"" + rule.tool + "\"");
    }
    if (rule.mode == "reprice" && !clean.Find(rule.tool)->info().has_preview) {
      return Status::InvalidArgument("fault reprice for \"" + rule.tool +
                                     "\": the tool has no preview (reprice applies to "
                                     "flights.reserve and payments.charge)");
    }
    if (rule.mode == "decline") {
      return Status::InvalidArgument(
          "fault decline for \"" + rule.tool +
          "\": the HTTP providers do not inject it (run the slow provider in-process, "
          "travel-booking --fault transfers.book=decline)");
    }
    std::string mode = rule.mode == "fail_times" ? "fail" : rule.mode;
    if (FrontDoorModes().count(mode) != 0 || mode == "reprice") modes.insert(mode);
  }
  for (const std::string& mode : modes) {
    ProviderOptions faulty;
    faulty.ledger_path = options_.ledger_path;
    faulty.latency_ms = options_.latency_ms;
    faulty.confirm_delay_ms = options_.confirm_delay_ms;
    for (const std::string& tool : names) {
      if (mode == "reprice" && !clean.Find(tool)->info().has_preview) continue;
      FaultRule rule;
      rule.tool = tool;
      rule.mode = mode;
      faulty.faults.push_back(rule);
    }
    auto registry = std::make_unique<ToolRegistry>();
    IDEM_RETURN_IF_ERROR(RegisterTravelTools(*registry, faulty));
    registries_[mode] = std::move(registry);
  }

  Result<std::unique_ptr<server::IdempotencyLayer>> layer =
      server::IdempotencyLayer::Open(options_.keys_path);
  if (!layer.ok()) return layer.status();
  layer_ = std::move(layer).value();

  if (options_.tls_cert_file.empty()) {
    server_ = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(options_.tls_cert_file.c_str(),
                                                    options_.tls_key_file.c_str());
    if (!tls->is_valid()) {
      return Status::InvalidArgument("--tls-cert " + options_.tls_cert_file +
                                     ": OpenSSL could not load it with its key");
    }
    SSL_CTX_set_min_proto_version(tls->ssl_context(), TLS1_2_VERSION);
    server_ = std::move(tls);
  }
  server_->set_read_timeout(options_.socket_timeout_ms / 1000,
                            (options_.socket_timeout_ms % 1000) * 1000);
  server_->set_write_timeout(options_.socket_timeout_ms / 1000,
                             (options_.socket_timeout_ms % 1000) * 1000);
  server_->set_payload_max_length(kMaxBodyBytes);

  for (const std::string& tool : names) {
    auto route = std::make_unique<Route>();
    route->tool = tool;
    route->provider = ProviderOf(tool);
    for (const FaultRule& rule : options_.faults) {
      if (rule.tool == tool) route->faults.push_back(rule);
    }
    Route* r = route.get();
    for (const auto& [mode, registry] : registries_) {
      if (!mode.empty() && mode != "reprice") continue;
      Tool* t = registry->Find(tool);
      if (t == nullptr) continue;  // reprice: tools with a preview only
      httplib::Server::Handler run = [this, r, t](const httplib::Request& req,
                                                  httplib::Response& res) {
        ToolCall call;
        call.tool = r->tool;
        call.key = UnquoteHeader(req.get_header_value("Idempotency-Key"));
        call.attempt = AttemptOf(req);
        call.expected_version = UnquoteHeader(req.get_header_value("If-Match"));
        if (call.expected_version == "*") call.expected_version.clear();
        Result<Json> args = ArgsOf(req);
        if (!args.ok()) {
          Problem(res, 400, kProblemBadRequest, "The body is not JSON", args.status().message());
          return;
        }
        call.args = std::move(args).value();
        AnswerOutcome(t->Invoke(call), res);
      };
      if (HasKeyLayer(r->provider)) {
        server::WrapOptions wrap;
        wrap.scope = [provider = r->provider](const httplib::Request&) { return provider; };
        // A stale commit did nothing: the commit after a re-preview, under
        // the same key and body, must run.
        wrap.released_statuses = {412, 429, 503};
        run = layer_->Wrap(std::move(run), std::move(wrap));
      }
      r->guarded[mode] = std::move(run);
    }
    routes_.push_back(std::move(route));
  }

  for (const HttpRoute& hr : TravelHttpRoutes()) {
    auto it = std::find_if(routes_.begin(), routes_.end(),
                           [&](const auto& r) { return r->tool == hr.tool; });
    Route* r = it->get();
    std::string pattern = hr.path;
    const auto brace = pattern.find("{key}");
    if (brace != std::string::npos) pattern.replace(brace, 5, "(.+)");
    if (hr.purpose == "commit") {
      server_->Post(pattern, [this, r](const httplib::Request& req, httplib::Response& res) {
        Commit(*r, req, res);
      });
    } else if (hr.purpose == "status") {
      server_->Get(pattern, [this, r](const httplib::Request& req, httplib::Response& res) {
        Lookup(*r, req, res);
      });
    } else {
      server_->Post(pattern, [this, r](const httplib::Request& req, httplib::Response& res) {
        Preview(*r, req, res);
      });
    }
  }
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    JsonAnswer(res, 200, {{"ok", true}});
  });
  server_->Get("/tools", [this](const httplib::Request&, httplib::Response& res) {
    Json tools = Json::array();
    for (const ToolInfo& info : registries_[""]->List()) {
      Json routes = Json::array();
      for (const HttpRoute& hr : TravelHttpRoutes()) {
        if (hr.tool == info.name) {
          routes.push_back({{"method", hr.method}, {"path", hr.path}, {"purpose", hr.purpose}});
        }
      }
      tools.push_back({{"name", info.name},
                       {"effect", EffectClassName(info.effect)},
                       {"honours_keys", info.honours_keys},
                       {"key_layer", HasKeyLayer(ProviderOf(info.name))},
                       {"routes", routes},
                       {"description", info.description}});
    }
    JsonAnswer(res, 200, {{"tools", tools}});
  });
  return Status::Ok();
}

void HttpProviders::Commit(Route& route, const httplib::Request& req, httplib::Response& res) {
  try {
    const int n = route.commits.fetch_add(1) + 1;
    const FaultRule* fault = FaultFor(route.faults, n);
    std::string mode = fault != nullptr ? fault->mode : "";
    if (mode == "delay") {
      Hold(fault->param);
      mode.clear();
    }
    if (mode == "fail_times") mode = "fail";
    if (req.get_header_value_count("Idempotency-Key") == 0) {
      Problem(res, 400, kProblemKeyMissing, "Idempotency-Key is missing",
              "every commit carries an Idempotency-Key header");
      return;
    }
    if (FrontDoorModes().count(mode) != 0) {
      // Refused (or lost) before the key layer: a retry runs normally.
      ToolCall call;
      call.tool = route.tool;
      call.key = UnquoteHeader(req.get_header_value("Idempotency-Key"));
      call.attempt = AttemptOf(req);
      Result<Json> args = ArgsOf(req);
      call.args = args.ok() ? std::move(args).value() : Json();
      ToolOutcome outcome = registries_.at(mode)->Find(route.tool)->Invoke(call);
      if (mode == "lose_request" && DropConnection(req)) return;
      AnswerOutcome(outcome, res);
      return;
    }
    auto guarded = route.guarded.find(mode == "reprice" ? "reprice" : "");
    guarded->second(req, res);
    if (mode == "lose_response") Hold(options_.lost_response_hold_ms);
    if (mode == "lose_response" || mode == "drop_connection") {
      if (!DropConnection(req)) {
        Problem(res, 500, kProblemUnknown, "The response was lost",
                "injected " + mode + ": the effect may have been applied");
      }
    }
  } catch (const std::exception& e) {
    Problem(res, 500, kProblemUnknown, "The outcome is unknown",
            std::string("unexpected error: ") + e.what());
  }
}

void HttpProviders::Lookup(Route& route, const httplib::Request& req, httplib::Response& res) {
  try {
    const std::string key = req.matches.size() > 1 ? req.matches[1].str() : "";
    LookupOutcome o = registries_.at("")->Find(route.tool)->Lookup(key);
    switch (o.kind) {
      case LookupKind::kApplied:
        JsonAnswer(res, 200,
                   {{"status", "applied"}, {"result", o.result}, {"external_ref", o.external_ref}});
        return;
      case LookupKind::kNotApplied:
        JsonAnswer(res, 404, {{"status", "not_applied"}, {"key", key}});
        return;
      case LookupKind::kPending:
        JsonAnswer(res, 200, {{"status", "pending"}, {"id", o.external_ref}});
        res.set_header("Retry-After", std::to_string(RetryAfterSeconds(o.check_after_ms)));
        return;
      case LookupKind::kFailed:
        JsonAnswer(res, 200, {{"status", "failed"}, {"error", o.error}});
        return;
      case LookupKind::kError:
        Problem(res, 503, kProblemUnavailable, "The lookup failed", o.error);
        res.set_header("Retry-After", std::to_string(kRetryAfterS));
        return;
    }
  } catch (const std::exception& e) {
    Problem(res, 503, kProblemUnavailable, "The lookup failed",
            std::string("unexpected error: ") + e.what());
  }
}

void HttpProviders::Preview(Route& route, const httplib::Request& req, httplib::Response& res) {
  try {
    ToolCall call;
    call.tool = route.tool;
    call.key = req.matches.size() > 1 ? req.matches[1].str() : "";
    Result<Json> args = ArgsOf(req);
    if (!args.ok()) {
      Problem(res, 400, kProblemBadRequest, "The body is not JSON", args.status().message());
      return;
    }
    call.args = std::move(args).value();
    PreviewOutcome o = registries_.at("")->Find(route.tool)->Preview(call);
    if (o.ok) {
      JsonAnswer(res, 200,
                 {{"summary", o.summary},
                  {"changes", o.changes},
                  {"resource_version", o.resource_version}});
    } else if (o.retryable) {
      Problem(res, 503, kProblemUnavailable, "The preview failed", o.error);
      res.set_header("Retry-After", std::to_string(kRetryAfterS));
    } else {
      Problem(res, 422, kProblemRejected, "The preview was refused", o.error);
    }
  } catch (const std::exception& e) {
    Problem(res, 503, kProblemUnavailable, "The preview failed",
            std::string("unexpected error: ") + e.what());
  }
}

bool HttpProviders::DropConnection(const httplib::Request& req) {
  // httplib does not hand its socket to handlers: find the descriptor by the
  // connection's two ends and shut it down (httplib still owns and closes
  // it). Its answer then goes nowhere: the client reads EOF, no response.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    std::string peer_addr;
    int peer_port = 0;
    int local_port = 0;
    if (!SocketEnds(fd, &peer_addr, &peer_port, &local_port)) continue;
    if (peer_port == req.remote_port && local_port == req.local_port &&
        peer_addr == req.remote_addr) {
      return ::shutdown(fd, SHUT_RDWR) == 0;
    }
  }
  return false;
}

void HttpProviders::Hold(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  hold_cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

Result<int> HttpProviders::Bind(const std::string& host, int port) {
  if (bound_) return Status::FailedPrecondition("http providers: already bound");
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument("http providers: port " + std::to_string(port) +
                                   " is not in 0..65535");
  }
  if (port == 0) {
    port_ = server_->bind_to_any_port(host);
    if (port_ <= 0) {
      return Status::Unavailable("http providers: cannot bind " + host + " on an ephemeral port");
    }
  } else {
    if (!server_->bind_to_port(host, port)) {
      return Status::Unavailable("http providers: cannot bind " + host + ":" +
                                 std::to_string(port) + " (in use?)");
    }
    port_ = port;
  }
  bound_ = true;
  return port_;
}

Status HttpProviders::Run() {
  if (!bound_) return Status::FailedPrecondition("http providers: Run before Bind");
  if (!server_->listen_after_bind()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) return Status::Internal("http providers: the server stopped unexpectedly");
  }
  return Status::Ok();
}

Result<int> HttpProviders::Start(const std::string& host, int port) {
  std::signal(SIGPIPE, SIG_IGN);
  Result<int> bound = Bind(host, port);
  if (!bound.ok()) return bound;
  thread_ = std::thread([this] { (void)Run(); });
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) return Status::Internal("http providers: the server did not start");
  return port_;
}

void HttpProviders::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  hold_cv_.notify_all();
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace idem::travel
