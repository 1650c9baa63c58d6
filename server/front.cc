#include "server/front.h"

#include <algorithm>
#include <array>
#include <regex>
#include <utility>

#include "server/idempotency.h"

#include "http/server.h"

namespace idem::server {
namespace {

// The methods an HTTP/1.1 server knows; any other is a bad request.
constexpr std::array<const char*, 10> kKnownMethods = {
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "PRI"};
// The longest request-target served (what cpp-httplib allowed a request
// line); longer: 414.
constexpr size_t kMaxTargetBytes = 8 * 1024;
constexpr std::array<const char*, 5> kRouteMethods = {"GET", "POST", "PUT", "PATCH", "DELETE"};

bool IsOneOf(const std::string& method, const char* const* first, const char* const* last) {
  return std::any_of(first, last, [&method](const char* m) { return method == m; });
}

HttpRequest FromFront(const http::Request& req) {
  HttpRequest out;
  out.method = req.method;
  out.path = req.path;
  for (const auto& [k, v] : req.headers) out.headers.emplace(k, v);
  out.params = req.params;
  out.body = req.body;
  out.peer = req.peer;
  return out;
}

void ToFront(const HttpResponse& res, http::Response* out) {
  out->status = res.status;
  for (const auto& [k, v] : res.headers) out->headers.emplace(k, v);
  out->content_type = res.content_type;
  out->body = res.body;
  out->on_stream = res.on_stream;
}

}  // namespace

// ---- HttpListener

struct HttpListener::Impl {
  struct Compiled {
    std::string method;
    std::regex pattern;
    HttpHandler handler;
  };
  std::vector<Compiled> routes;
  Status route_error = Status::Ok();
  http::ServerOptions options;
  HttpListenerHooks hooks;
  std::unique_ptr<http::Server> front;

  // Answers `status` without a handler, in the server's error format.
  void LibraryError(int status, http::Response& res) const {
    HttpResponse out;
    out.status = status;
    hooks.library_error(out);
    out.status = status;
    res = http::Response();
    ToFront(out, &res);
  }

  void Handle(const http::Request& req, http::Response& res) const {
    if (!IsOneOf(req.method, kKnownMethods.begin(), kKnownMethods.end())) {
      LibraryError(400, res);
      return;
    }
    if (req.target.size() > kMaxTargetBytes) {
      LibraryError(414, res);
      return;
    }
    const std::string method = req.method == "HEAD" ? "GET" : req.method;
    for (const Compiled& r : routes) {
      if (r.method != method) continue;
      std::smatch m;
      if (!std::regex_match(req.path, m, r.pattern)) continue;
      HttpRequest in = FromFront(req);
      for (const auto& g : m) in.matches.push_back(g.str());
      HttpResponse out;
      r.handler(in, out);
      ToFront(out, &res);
      return;
    }
    LibraryError(404, res);
  }
};

HttpListener::HttpListener(std::vector<Route> routes, http::ServerOptions options,
                           HttpListenerHooks hooks)
    : impl_(std::make_unique<Impl>()) {
  for (Route& r : routes) {
    if (!IsOneOf(r.method, kRouteMethods.begin(), kRouteMethods.end())) {
      impl_->route_error = Status::InvalidArgument("http: unsupported method " + r.method);
      continue;
    }
    impl_->routes.push_back({r.method, std::regex(r.pattern), std::move(r.handler)});
  }
  impl_->options = std::move(options);
  impl_->hooks = std::move(hooks);
}

HttpListener::~HttpListener() { Stop(); }

int HttpListener::port() const { return impl_->front ? impl_->front->port() : 0; }

Status HttpListener::Start() {
  Impl& s = *impl_;
  if (!s.route_error.ok()) return s.route_error;
  if (s.front) return Status::FailedPrecondition("http: already started");
  http::ServerHooks hooks;
  hooks.refusal = [&s](http::Response& res) { s.LibraryError(res.status, res); };
  hooks.exception = [&s](const std::string& what, http::Response& res) {
    HttpResponse out;
    out.status = 500;
    s.hooks.exception(what, out);
    res = http::Response();
    ToFront(out, &res);
  };
  if (s.hooks.responded) hooks.responded = s.hooks.responded;
  auto front = http::Server::Create(
      s.options, [&s](const http::Request& req, http::Response& res) { s.Handle(req, res); },
      std::move(hooks));
  if (!front.ok()) return front.status();
  Status started = (*front)->Start();
  if (!started.ok()) {
    return Status::Unavailable("server: cannot listen on " + s.options.host + ":" +
                               std::to_string(s.options.port) + ": " + started.message());
  }
  s.front = std::move(front).value();
  return Status::Ok();
}

void HttpListener::Stop() {
  if (impl_->front) impl_->front->Stop();
}

// ---- IdempotencyGuard

Result<std::unique_ptr<IdempotencyGuard>> IdempotencyGuard::Create(storage::KeyRecordStore* records,
                                                                   int64_t ttl_ms, Clock* clock) {
  IdempotencyOptions io;
  io.ttl_ms = ttl_ms;
  io.clock = clock;
  auto layer = IdempotencyLayer::Create(records, io);
  if (!layer.ok()) return layer.status();
  return std::unique_ptr<IdempotencyGuard>(new IdempotencyGuard(std::move(layer).value()));
}

IdempotencyGuard::IdempotencyGuard(std::unique_ptr<IdempotencyLayer> layer)
    : layer_(std::move(layer)) {}

IdempotencyGuard::~IdempotencyGuard() = default;

void IdempotencyGuard::Serve(const std::string& scope, const HttpRequest& req, HttpResponse& res,
                             const HttpHandler& inner) {
  IdempotentRequest in;
  in.method = req.method;
  in.path = req.path;
  in.params.insert(req.params.begin(), req.params.end());
  auto keys = req.headers.equal_range("Idempotency-Key");
  for (auto it = keys.first; it != keys.second; ++it) in.keys.push_back(it->second);
  in.scope = scope;
  in.body = req.body;
  bool handled = false;  // `inner` ran and returned: `res` is its answer
  IdempotentResponse out;
  layer_->Run(
      in,
      [&](IdempotentResponse& r) {
        inner(req, res);
        handled = true;
        r.status = res.status;
        r.content_type = res.content_type;
        r.body = res.body;
      },
      /*key_required=*/true, WrapOptions().released_statuses, out);
  if (handled) return;
  res = HttpResponse();
  res.status = out.status;
  for (const auto& [k, v] : out.headers) res.headers.emplace(k, v);
  res.SetContent(std::move(out.body), std::move(out.content_type));
}

size_t MaxIdempotencyKeyLength() { return kMaxIdempotencyKeyLength; }

}  // namespace idem::server
