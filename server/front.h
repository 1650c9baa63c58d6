#pragma once
// The one place the server meets its HTTP front (idem::http, http/server.h):
// an HTTP listener that serves a route table of the server's own handlers
// (server/http.h), and the Idempotency-Key layer (server/idempotency.h) run
// around one of those handlers. Replacing the HTTP front means replacing
// this file's implementation only.
//
// The listener matches routes itself: a request whose method and path match
// no route is answered 404 (a method no HTTP/1.1 server knows: 400; a
// request-target over 8 KiB: 414) through
// HttpListenerHooks::library_error; HEAD is served by the GET route (the
// front sends no body). Everything else the front answers on its own (400,
// 413, 431, 503 at admission) goes through the same hook.
//
// Thread safety: HttpListener's Start and Stop from one thread; the
// handlers run on the front's worker threads, many at once.
// IdempotencyGuard::Serve may be called from many threads at once.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/http.h"

#include "common/clock.h"
#include "common/status.h"
#include "http/options.h"

namespace idem::storage {
class KeyRecordStore;  // storage/server_state.h
}  // namespace idem::storage

namespace idem::server {

class IdempotencyLayer;

struct HttpListenerHooks {
  /// Writes the body of an error answered without a handler (no route, body
  /// too large, too many header lines, ...): `res.status` says which, and
  /// stays. Required.
  std::function<void(HttpResponse& res)> library_error;
  /// Writes the answer to a handler that threw `what`. Required.
  std::function<void(const std::string& what, HttpResponse& res)> exception;
  /// Told every response's status, refusals included (metrics). Optional.
  std::function<void(int status)> responded;
};

class HttpListener {
 public:
  /// `options` are the front's bounds (http/options.h). Each route's pattern
  /// is compiled here.
  HttpListener(std::vector<Route> routes, http::ServerOptions options, HttpListenerHooks hooks);
  ~HttpListener();  ///< Stop()
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  /// Binds and serves; returns once listening. kUnavailable when the address
  /// cannot be bound; kInvalidArgument for bad options or a route with an
  /// unsupported method.
  Status Start();
  /// The bound port (after Start).
  int port() const;
  /// Stops accepting, finishes the requests in progress (up to the front's
  /// stop_timeout_ms), joins. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The Idempotency-Key layer of server/idempotency.h around the server's
/// handlers (the key is required).
class IdempotencyGuard {
 public:
  /// The layer over `records` (see IdempotencyLayer::Create), e.g. the
  /// journal's store's KeyRecords(). `records` and `clock` are not owned.
  static Result<std::unique_ptr<IdempotencyGuard>> Create(storage::KeyRecordStore* records,
                                                          int64_t ttl_ms, Clock* clock);
  ~IdempotencyGuard();
  IdempotencyGuard(const IdempotencyGuard&) = delete;
  IdempotencyGuard& operator=(const IdempotencyGuard&) = delete;

  /// Runs `inner` at most once per (scope, Idempotency-Key) and answers
  /// retries as the layer does (400, 409, 422, the stored response).
  void Serve(const std::string& scope, const HttpRequest& req, HttpResponse& res,
             const HttpHandler& inner);

 private:
  explicit IdempotencyGuard(std::unique_ptr<IdempotencyLayer> layer);
  std::unique_ptr<IdempotencyLayer> layer_;
};

/// The longest Idempotency-Key the layer accepts.
size_t MaxIdempotencyKeyLength();

}  // namespace idem::server
