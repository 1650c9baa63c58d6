#pragma once
// Connection (internal): one accepted HTTP/1.1 connection, from its first
// byte to its close, generic over the transport: a tcp::socket, or an
// ssl::stream over one, whose TLS handshake comes before the first read.
//
// Phases and the bound on each:
//   handshake TLS only: within the first request's request_timeout_ms (the
//             deadline starts at accept), so a client that stalls in the
//             handshake is cut like one that stalls in its request
//   idle      waiting for a kept-alive connection's next request: keep_alive_idle_ms
//   reading   one request, header and body: request_timeout_ms (from accept
//             for the first request, from the first byte for later ones)
//   handling  the handler runs on the worker pool: no bound here
//   writing   the response: write_timeout_ms
//   streaming an event stream: each write bounded by write_timeout_ms, the
//             queue by max_stream_queue_bytes; a read watches for the client
//             going away
//   draining  after a refusal (413, 431, 400): up to 1 s and 1 MiB of input
//             read and dropped, so the client can see the answer, then close
//
// Thread safety: every member function runs on the connection's strand;
// Shutdown and Abort may be called from any thread (they post).

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include "http/admission.h"
#include "http/message.h"
#include "http/request_parser.h"
#include "http/server_core.h"
#include "http/stream_state.h"

namespace idem::http {

template <class Socket>
class Connection final : public ConnectionBase,
                         public std::enable_shared_from_this<Connection<Socket>> {
 public:
  Connection(Socket socket, ServerCore* core, Admission::Ticket ticket, std::string peer);
  ~Connection() override;

  /// Registers with the core and starts reading (posts to the strand).
  void Start();
  void Shutdown() override;
  void Abort() override;

 private:
  using error_code = boost::system::error_code;
  enum class Phase { kIdle, kReading, kHandling, kWriting, kStreaming, kDraining, kClosed };

  void ArmTimer(int64_t ms);
  void DisarmTimer();
  /// TLS: the server handshake, then ReadRequest; plain: ReadRequest.
  void Handshake();
  void WaitForNextRequest();
  void ReadRequest();
  void OnHeaderRead(error_code ec);
  void ReadBody();
  void OnRequestRead(error_code ec);
  /// Answers a request that could not be read (or was refused) and closes.
  void Refuse(int status);
  void Dispatch();
  void OnHandled(Response response);
  /// Sends `response` (told to hooks.responded), then keeps the connection
  /// or drains and closes it.
  void Respond(const Response& response, bool keep_alive);
  void Write(std::string head_and_body, bool keep_alive);
  void OnWritten(error_code ec, bool keep_alive);
  void BeginStream(Response response);
  void Enqueue(std::string bytes);
  void WriteQueue();
  void WatchStreamClient();
  void Drain();
  void Close();

  Socket socket_;
  ServerCore* const core_;
  Admission::Ticket ticket_;
  Admission::Ticket stream_ticket_;
  const std::string peer_;
  boost::asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  boost::beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  Phase phase_ = Phase::kReading;
  bool stopping_ = false;
  int requests_ = 0;
  bool request_keep_alive_ = false;
  bool request_is_head_ = false;
  int request_version_ = 11;
  std::string out_;  // the response being written
  size_t drained_ = 0;

  std::shared_ptr<StreamState> stream_;
  std::deque<std::string> queue_;  // stream bytes not yet written
  bool queue_writing_ = false;
  std::array<char, 4096> scratch_{};  // input read and dropped
};

}  // namespace idem::http
