#pragma once
// ServerOptions: where an http::Server listens and every bound it enforces.
// The defaults suit the idem API (small JSON bodies, bearer tokens, a few
// hundred event streams); docs/architecture.md ("HTTP front") lists them.
//
// Every time below is a whole-phase deadline, not a per-byte idle timer: a
// client that sends (or reads) one byte every few seconds still loses its
// connection when the phase's time is up.

#include <cstddef>
#include <cstdint>
#include <string>

namespace idem::http {

struct ServerOptions {
  std::string host = "127.0.0.1";  ///< an IP address or a resolvable name
  int port = 0;                    ///< 0: an ephemeral port (Server::port)

  /// TLS (both or neither; neither: plain HTTP). A PEM certificate chain,
  /// the server's first, and its unencrypted PEM private key, which group
  /// and others may not read. TLS 1.2 is the oldest version accepted. The
  /// handshake counts against the first request's request_timeout_ms.
  std::string tls_cert_file;
  std::string tls_key_file;

  int io_threads = 1;      ///< threads running the sockets (1-2 are plenty)
  int worker_threads = 4;  ///< threads running handlers (they may block)

  // ---- one request
  size_t max_header_bytes = 16 * 1024;  ///< request line + fields; larger: 431
  size_t max_header_fields = 64;        ///< field lines (trailers included); more: 431
  size_t max_body_bytes = 1 << 20;      ///< decoded body, any coding; larger: 413
  /// From the first byte of a request (from accept for a connection's first
  /// request) to its last body byte. Past it the connection is closed.
  int64_t request_timeout_ms = 10'000;
  /// A kept-alive connection's wait for the first byte of its next request.
  int64_t keep_alive_idle_ms = 5'000;
  /// Writing one response (or one stream write) to the client. Past it the
  /// connection is closed: a client that does not read cannot hold it.
  int64_t write_timeout_ms = 10'000;
  int max_requests_per_connection = 1000;

  // ---- admission (counted when a connection is accepted; over: 503 + close)
  size_t max_connections = 1024;
  size_t max_connections_per_client = 64;  ///< per peer IP address
  /// Event streams, counted on top of the connections they hold; a stream
  /// over these limits is answered 503 instead.
  size_t max_streams = 512;
  size_t max_streams_per_client = 32;
  /// Bytes queued on one stream for a client that reads slowly; past it the
  /// stream is closed (Stream::Send returns false).
  size_t max_stream_queue_bytes = 1 << 20;

  // ---- stop
  /// Stop() lets in-flight responses finish for at most this long, then
  /// closes what is left.
  int64_t stop_timeout_ms = 5'000;
};

}  // namespace idem::http
