#pragma once
// The one place the server meets its HTTP library (cpp-httplib): an HTTP
// listener that serves a route table of the server's own handlers
// (server/http.h), and the Idempotency-Key layer (server/idempotency.h,
// written for httplib) run around one of those handlers. Replacing the HTTP
// library means replacing this file's implementation only.
//
// Thread safety: HttpListener's Bind, Start and Stop from one thread; the
// handlers run on its own threads, many at once. IdempotencyGuard::Serve may
// be called from many threads at once.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/http.h"

#include "common/clock.h"
#include "common/status.h"

namespace idem::storage {
class KeyRecordStore;  // storage/server_state.h
}  // namespace idem::storage

namespace idem::server {

class IdempotencyLayer;

struct HttpListenerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  ///< 0: an ephemeral port
  size_t max_body_bytes = 1 << 20;  ///< larger bodies: 413
  int read_timeout_s = 10;
  int write_timeout_s = 10;
  int keep_alive_timeout_s = 5;
  int keep_alive_max_count = 100;
  int threads = 8;
  int listen_backlog = 1024;
};

struct HttpListenerHooks {
  /// Writes the body of an error the library answers itself (no route, body
  /// too large, ...): `res.status` says which. Required.
  std::function<void(HttpResponse& res)> library_error;
  /// Writes the answer to a handler that threw `what`. Required.
  std::function<void(const std::string& what, HttpResponse& res)> exception;
  /// Told every response's status (metrics). Optional.
  std::function<void(int status)> responded;
};

class HttpListener {
 public:
  HttpListener(std::vector<Route> routes, HttpListenerOptions options, HttpListenerHooks hooks);
  ~HttpListener();  ///< Stop()
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  /// Binds the address. kUnavailable when it cannot be bound.
  Status Bind();
  /// The bound port (after Bind).
  int port() const;
  /// Serves on a thread of its own; returns once listening.
  void Start();
  /// Stops accepting, finishes the requests in progress, joins. Idempotent.
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
