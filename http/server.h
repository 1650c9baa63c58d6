#pragma once
// http::Server: an asynchronous HTTP/1.1 server (Boost.Beast) that one
// client cannot stop.
//
// A few I/O threads (ServerOptions::io_threads) run every socket; handlers
// run on a separate worker pool, so a handler that blocks (a database read)
// never stalls accepting or other connections. Each request is read whole,
// within ServerOptions' bounds, before the handler sees it:
//
//   over max_header_bytes / max_header_fields      431, then close
//   over max_body_bytes (Content-Length or chunked) 413 as soon as known, close
//   conflicting Content-Length, two Authorization  400, then close
//   other malformed requests                        400, then close
//   request not complete within request_timeout_ms  closed
//   over max_connections(_per_client) at accept     503 if it can be sent, closed
//
// With ServerOptions::tls_cert_file/tls_key_file every connection is TLS
// (1.2 or later): the handshake runs within the first request's deadline; a
// client that does not speak TLS fails it and is closed; over the admission
// limits a TLS connection is closed without the plain-text 503.
//
// Range is never interpreted (no 206). Responses go out with Content-Length;
// a response the client does not read within write_timeout_ms closes the
// connection. Event streams: see Response::on_stream and http/stream.h.
//
// Thread safety: Start, Stop and the destructor from one thread, never from
// a handler or a stream callback (Stop waits for them); port() and stats()
// from any. The handler is called concurrently from the worker
// threads. Not copyable.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "http/message.h"
#include "http/options.h"
#include "http/stream.h"

namespace idem::http {

/// Fills `response` for `request`. Runs on a worker thread; may block. An
/// exception becomes a 500 with a plain-text body.
using Handler = std::function<void(const Request& request, Response& response)>;

/// Optional callbacks for what the server answers without the handler, so
/// that an embedding server keeps one error format and one set of metrics.
/// Each runs on an I/O thread (`exception` on a worker): keep them short,
/// non-blocking, and free of exceptions (one thrown is ignored).
struct ServerHooks {
  /// Writes the body of an answer the server gives itself (400, 413, 431, a
  /// 503 for a stream over its limits): `response.status` says which, and
  /// stays. Unset: a short text/plain body.
  std::function<void(Response& response)> refusal;
  /// Writes the answer to a handler that threw `what` (status preset to 500).
  /// Unset: 500 with a short text/plain body.
  std::function<void(const std::string& what, Response& response)> exception;
  /// Told the status of every response sent, refusals included (a connection
  /// refused at accept counts as 503).
  std::function<void(int status)> responded;
};

/// Counters for metrics and tests.
struct ServerStats {
  size_t connections = 0;          ///< open now (streams included)
  size_t streams = 0;              ///< event streams open now
  uint64_t accepted = 0;           ///< connections admitted since Start
  uint64_t refused = 0;            ///< connections refused by the admission limits
  uint64_t requests = 0;           ///< requests handed to the handler
  uint64_t rejected_requests = 0;  ///< requests answered 400/413/431 or timed out
};

class Server {
 public:
  /// Checks the options (positive limits and thread counts) and, for TLS,
  /// loads the certificate and key (common/tls_files.h's checks).
  /// kInvalidArgument naming the bad option; for a TLS file also kNotFound
  /// (unreadable) and kFailedPrecondition (a key others may read).
  static Result<std::unique_ptr<Server>> Create(ServerOptions options, Handler handler,
                                                ServerHooks hooks = {});
  ~Server();  ///< Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds and listens, starts the threads, returns once accepting.
  /// kUnavailable when the address cannot be resolved or bound;
  /// kFailedPrecondition when called twice.
  Status Start();
  /// The bound port (after Start).
  int port() const;
  ServerStats stats() const;
  /// Graceful: stops accepting, closes idle connections and streams, lets
  /// in-flight responses finish for up to stop_timeout_ms, closes the rest,
  /// waits for running handlers, joins every thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::http
