#include "server/httplib_adapter.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>

#include <httplib.h>

#include "server/idempotency.h"

#include <sys/socket.h>

namespace idem::server {
namespace {

HttpRequest FromHttplib(const httplib::Request& req) {
  HttpRequest out;
  out.method = req.method;
  out.path = req.path;
  for (const auto& m : req.matches) out.matches.push_back(m.str());
  for (const auto& [k, v] : req.headers) out.headers.emplace(k, v);
  for (const auto& [k, v] : req.params) out.params.emplace(k, v);
  out.body = req.body;
  return out;
}

httplib::Request ToHttplib(const HttpRequest& req) {
  httplib::Request out;
  out.method = req.method;
  out.path = req.path;
  for (const auto& [k, v] : req.headers) out.headers.emplace(k, v);
  for (const auto& [k, v] : req.params) out.params.emplace(k, v);
  out.body = req.body;
  return out;
}

void ToHttplib(const HttpResponse& res, httplib::Response* out) {
  out->status = res.status;
  for (const auto& [k, v] : res.headers) out->set_header(k, v);
  if (res.content_type.empty()) {
    out->body = res.body;
  } else {
    out->set_content(res.body, res.content_type);
  }
}

HttpResponse FromHttplib(const httplib::Response& res) {
  HttpResponse out;
  out.status = res.status == -1 ? 200 : res.status;  // httplib's unset status
  for (const auto& [k, v] : res.headers) {
    if (HeaderNameLess()(k, "Content-Type") || HeaderNameLess()("Content-Type", k)) {
      out.headers.emplace(k, v);
    } else {
      out.content_type = v;
    }
  }
  out.body = res.body;
  return out;
}

}  // namespace

// ---- HttpListener

struct HttpListener::Impl {
  std::vector<Route> routes;
  HttpListenerOptions options;
  HttpListenerHooks hooks;
  httplib::Server http;
  std::thread thread;
  int port = 0;
  bool bound = false;
  bool stopped = false;
};

HttpListener::HttpListener(std::vector<Route> routes, HttpListenerOptions options,
                           HttpListenerHooks hooks)
    : impl_(std::make_unique<Impl>()) {
  impl_->routes = std::move(routes);
  impl_->options = std::move(options);
  impl_->hooks = std::move(hooks);
}

HttpListener::~HttpListener() { Stop(); }

int HttpListener::port() const { return impl_->port; }

Status HttpListener::Bind() {
  Impl& s = *impl_;
  const HttpListenerOptions& o = s.options;
  for (const Route& r : s.routes) {
    const HttpHandler& handler = r.handler;
    httplib::Server::Handler h = [&handler](const httplib::Request& req, httplib::Response& res) {
      HttpResponse out;
      handler(FromHttplib(req), out);
      ToHttplib(out, &res);
    };
    if (r.method == "GET") {
      s.http.Get(r.pattern, h);
    } else if (r.method == "POST") {
      s.http.Post(r.pattern, h);
    } else if (r.method == "PUT") {
      s.http.Put(r.pattern, h);
    } else if (r.method == "PATCH") {
      s.http.Patch(r.pattern, h);
    } else if (r.method == "DELETE") {
      s.http.Delete(r.pattern, h);
    } else {
      return Status::InvalidArgument("http: unsupported method " + r.method);
    }
  }
  // Errors httplib answers itself (404 route, 413 body, 400 request line).
  s.http.set_error_handler(
      httplib::Server::HandlerWithResponse([&s](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        HttpResponse out;
        out.status = res.status;
        s.hooks.library_error(out);
        ToHttplib(out, &res);
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.http.set_exception_handler(
      [&s](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unexpected error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        HttpResponse out;
        s.hooks.exception(what, out);
        ToHttplib(out, &res);
      });
  s.http.set_logger([&s](const httplib::Request&, const httplib::Response& res) {
    if (s.hooks.responded) s.hooks.responded(res.status);
  });
  s.http.set_payload_max_length(o.max_body_bytes);
  s.http.set_read_timeout(o.read_timeout_s, 0);
  s.http.set_write_timeout(o.write_timeout_s, 0);
  s.http.set_keep_alive_timeout(o.keep_alive_timeout_s);
  s.http.set_keep_alive_max_count(static_cast<size_t>(o.keep_alive_max_count));
  int threads = o.threads;
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // cpp-httplib listens with a backlog of 5 (compiled in): a burst of
  // clients would overflow it and see resets. Keep the socket, listen again.
  std::atomic<int> listen_fd{-1};
  s.http.set_socket_options([&listen_fd](int fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = fd;
  });
  if (o.port == 0) {
    s.port = s.http.bind_to_any_port(o.host);
  } else {
    s.port = s.http.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (s.port > 0 && listen_fd >= 0) (void)::listen(listen_fd, o.listen_backlog);
  if (s.port <= 0) {
    return Status::Unavailable("server: cannot listen on " + o.host + ":" + std::to_string(o.port));
  }
  s.bound = true;
  return Status::Ok();
}

void HttpListener::Start() {
  Impl& s = *impl_;
  if (!s.bound || s.thread.joinable()) return;
  s.thread = std::thread([&s] { s.http.listen_after_bind(); });
  for (int i = 0; i < 5000 && !s.http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void HttpListener::Stop() {
  Impl& s = *impl_;
  if (s.stopped || !s.thread.joinable()) return;
  s.stopped = true;
  for (int i = 0; i < 5000 && !s.http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // stop() needs a running loop
  }
  s.http.stop();
  s.thread.join();
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
  WrapOptions wo;
  wo.key_required = true;
  wo.scope = [&scope](const httplib::Request&) { return scope; };
  // The layer passes its request through unchanged: `inner` reads the
  // original one.
  auto guarded = layer_->Wrap(
      [&](const httplib::Request&, httplib::Response& out) {
        HttpResponse r;
        inner(req, r);
        ToHttplib(r, &out);
      },
      std::move(wo));
  httplib::Response out;
  guarded(ToHttplib(req), out);
  res = FromHttplib(out);
}

size_t MaxIdempotencyKeyLength() { return kMaxIdempotencyKeyLength; }

}  // namespace idem::server
