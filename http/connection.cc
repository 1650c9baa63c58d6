#include "http/connection.h"

#include <exception>
#include <string_view>
#include <type_traits>
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>

#include "http/response_writer.h"

namespace idem::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

namespace {

template <class Socket>
struct IsTls : std::false_type {};
template <class Next>
struct IsTls<asio::ssl::stream<Next>> : std::true_type {};

constexpr int64_t kDrainMs = 1000;
constexpr size_t kDrainBytes = 1 << 20;

// Room for a header at the limit plus a chunk-size line; the parser consumes
// body bytes as they come, so the buffer never holds more than this.
size_t BufferLimit(const ServerOptions& o) { return o.max_header_bytes + size_t{16} * 1024; }

// What a failed read calls for: a status to answer with, or 0 to close
// silently (the client went away, the deadline passed, the server stops).
int StatusForReadError(const boost::system::error_code& ec, const RequestParser& parser) {
  if (parser.refusal() != 0) return parser.refusal();
  if (ec == bhttp::error::header_limit) return 431;
  if (ec == bhttp::error::body_limit) return 413;
  if (ec == bhttp::error::buffer_overflow) return parser.is_header_done() ? 400 : 431;
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message) return 0;
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category()) return 400;
  return 0;
}

// An answer the server gives on its own: hooks.refusal's body, or a short
// text (`why`, else the status's reason).
Response Refusal(const ServerCore& core, int status, const std::string& why) {
  Response r;
  r.status = status;
  std::string text = why;
  if (text.empty()) {
    auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
    text.assign(reason.data(), reason.size());
  }
  r.SetContent(text + "\n", "text/plain; charset=utf-8");
  if (core.hooks.refusal) {
    try {
      core.hooks.refusal(r);
    } catch (...) {
    }
    r.status = status;
  }
  return r;
}

// The answer to a handler that threw `what`.
Response Failure(const ServerCore& core, const std::string& what) {
  Response r;
  r.status = 500;
  r.SetContent("internal error\n", "text/plain; charset=utf-8");
  if (core.hooks.exception) {
    try {
      core.hooks.exception(what, r);
    } catch (...) {
    }
  }
  return r;
}

}  // namespace

template <class Socket>
Connection<Socket>::Connection(Socket socket, ServerCore* core, Admission::Ticket ticket,
                               std::string peer)
    : socket_(std::move(socket)),
      core_(core),
      ticket_(std::move(ticket)),
      peer_(std::move(peer)),
      timer_(socket_.get_executor()),
      buffer_(BufferLimit(core->options)) {}

template <class Socket>
Connection<Socket>::~Connection() {
  if (stream_ != nullptr) stream_->MarkClosed();
  core_->Unregister(this);
}

template <class Socket>
void Connection<Socket>::Start() {
  core_->Register(this->shared_from_this());
  asio::post(socket_.get_executor(), [self = this->shared_from_this()] {
    if (self->stopping_ || self->core_->stopping) return self->Close();
    self->ArmTimer(self->core_->options.request_timeout_ms);
    self->Handshake();
  });
}

template <class Socket>
void Connection<Socket>::Handshake() {
  if constexpr (IsTls<Socket>::value) {
    phase_ = Phase::kReading;  // the timer armed in Start bounds the handshake too
    socket_.async_handshake(asio::ssl::stream_base::server,
                            [self = this->shared_from_this()](error_code ec) {
                              if (self->phase_ != Phase::kReading) return;
                              if (ec) {  // not TLS, a refused certificate, a reset
                                self->core_->rejected_requests++;
                                return self->Close();
                              }
                              self->ReadRequest();
                            });
  } else {
    ReadRequest();
  }
}

template <class Socket>
void Connection<Socket>::Shutdown() {
  asio::post(socket_.get_executor(), [self = this->shared_from_this()] {
    self->stopping_ = true;
    switch (self->phase_) {
      case Phase::kHandling:
      case Phase::kWriting:
        return;  // finishes, then closes (keep-alive is off once stopping_)
      default:
        self->Close();
    }
  });
}

template <class Socket>
void Connection<Socket>::Abort() {
  asio::post(socket_.get_executor(), [self = this->shared_from_this()] {
    self->stopping_ = true;
    self->Close();
  });
}

template <class Socket>
void Connection<Socket>::ArmTimer(int64_t ms) {
  uint64_t generation = ++timer_generation_;
  timer_.expires_after(std::chrono::milliseconds(ms));
  timer_.async_wait([self = this->shared_from_this(), generation](error_code ec) {
    if (ec || generation != self->timer_generation_) return;
    // The phase's time is up: whatever is pending fails and ends the connection.
    if (self->phase_ == Phase::kReading) self->core_->rejected_requests++;
    self->Close();
  });
}

template <class Socket>
void Connection<Socket>::DisarmTimer() {
  ++timer_generation_;
  timer_.cancel();
}

template <class Socket>
void Connection<Socket>::WaitForNextRequest() {
  phase_ = Phase::kIdle;
  if (buffer_.size() > 0) {  // pipelined: the next request has begun
    ArmTimer(core_->options.request_timeout_ms);
    return ReadRequest();
  }
  ArmTimer(core_->options.keep_alive_idle_ms);
  socket_.async_read_some(buffer_.prepare(4096),
                          [self = this->shared_from_this()](error_code ec, size_t n) {
                            if (self->phase_ != Phase::kIdle) return;
                            if (ec) return self->Close();
                            self->buffer_.commit(n);
                            self->ArmTimer(self->core_->options.request_timeout_ms);
                            self->ReadRequest();
                          });
}

template <class Socket>
void Connection<Socket>::ReadRequest() {
  phase_ = Phase::kReading;
  parser_.emplace(core_->options);
  bhttp::async_read_header(
      socket_, buffer_, *parser_,
      [self = this->shared_from_this()](error_code ec, size_t) { self->OnHeaderRead(ec); });
}

template <class Socket>
void Connection<Socket>::OnHeaderRead(error_code ec) {
  if (phase_ != Phase::kReading) return;
  if (ec) return OnRequestRead(ec);
  if (parser_->is_done()) return OnRequestRead(ec);
  // RFC 9110 10.1.1: a client waiting for 100 Continue gets it once the
  // header has passed every check (a body over the limit was refused above).
  const Request& r = parser_->request();
  if (r.version >= 11 && beast::iequals(r.Header("Expect"), "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    return asio::async_write(socket_, asio::buffer(kContinue.data(), kContinue.size()),
                             [self = this->shared_from_this()](error_code ec, size_t) {
                               if (self->phase_ != Phase::kReading) return;
                               if (ec) return self->Close();
                               self->ReadBody();
                             });
  }
  ReadBody();
}

template <class Socket>
void Connection<Socket>::ReadBody() {
  bhttp::async_read(
      socket_, buffer_, *parser_,
      [self = this->shared_from_this()](error_code ec, size_t) { self->OnRequestRead(ec); });
}

template <class Socket>
void Connection<Socket>::OnRequestRead(error_code ec) {
  if (phase_ != Phase::kReading) return;
  if (ec) {
    int status = StatusForReadError(ec, *parser_);
    if (status == 0) return Close();
    return Refuse(status);
  }
  Dispatch();
}

template <class Socket>
void Connection<Socket>::Refuse(int status) {
  core_->rejected_requests++;
  request_version_ = 11;
  request_is_head_ = false;
  Respond(Refusal(*core_, status, ""), false);
  phase_ = Phase::kDraining;
}

template <class Socket>
void Connection<Socket>::Dispatch() {
  DisarmTimer();
  phase_ = Phase::kHandling;
  ++requests_;
  core_->requests++;
  request_keep_alive_ = parser_->keep_alive();
  request_version_ = parser_->request().version;
  request_is_head_ = parser_->request().method == "HEAD";
  auto request = std::make_shared<Request>(std::move(parser_->request()));
  parser_.reset();
  request->peer = peer_;
  asio::post(core_->workers, [self = this->shared_from_this(), request] {
    Response response;
    try {
      self->core_->handler(*request, response);
    } catch (const std::exception& e) {
      response = Failure(*self->core_, e.what());
    } catch (...) {
      response = Failure(*self->core_, "unknown exception");
    }
    asio::post(self->socket_.get_executor(), [self, response = std::move(response)]() mutable {
      self->OnHandled(std::move(response));
    });
  });
}

template <class Socket>
void Connection<Socket>::OnHandled(Response response) {
  if (phase_ != Phase::kHandling) return;
  if (response.on_stream && response.status >= 200 && response.status < 300 && !stopping_ &&
      !core_->stopping) {
    return BeginStream(std::move(response));
  }
  if (response.on_stream) response = Refusal(*core_, 503, "stopping");  // no new streams
  const bool keep_alive = request_keep_alive_ && !stopping_ && !core_->stopping &&
                          requests_ < core_->options.max_requests_per_connection &&
                          !beast::iequals(response.Header("Connection"), "close");
  Respond(response, keep_alive);
}

template <class Socket>
void Connection<Socket>::Respond(const Response& response, bool keep_alive) {
  core_->Responded(response.status);
  Write(FormatResponse(response, request_version_, request_is_head_, keep_alive), keep_alive);
}

template <class Socket>
void Connection<Socket>::Write(std::string head_and_body, bool keep_alive) {
  phase_ = Phase::kWriting;
  out_ = std::move(head_and_body);
  ArmTimer(core_->options.write_timeout_ms);
  asio::async_write(socket_, asio::buffer(out_),
                    [self = this->shared_from_this(), keep_alive](error_code ec, size_t) {
                      self->OnWritten(ec, keep_alive);
                    });
}

template <class Socket>
void Connection<Socket>::OnWritten(error_code ec, bool keep_alive) {
  if (phase_ != Phase::kWriting && phase_ != Phase::kDraining) return;
  DisarmTimer();
  out_.clear();
  out_.shrink_to_fit();
  if (ec) return Close();
  if (phase_ == Phase::kDraining) return Drain();
  if (!keep_alive || stopping_ || core_->stopping) {
    phase_ = Phase::kDraining;
    return Drain();
  }
  WaitForNextRequest();
}

template <class Socket>
void Connection<Socket>::Drain() {
  // Half-closed: read and drop what the client still sends (bounded), so that
  // closing does not reset the connection before it has read the answer.
  if (drained_ == 0) {
    error_code ignored;
    beast::get_lowest_layer(socket_).shutdown(asio::socket_base::shutdown_send, ignored);
    buffer_.consume(buffer_.size());
    ArmTimer(kDrainMs);
  }
  socket_.async_read_some(asio::buffer(scratch_),
                          [self = this->shared_from_this()](error_code ec, size_t n) {
                            if (self->phase_ != Phase::kDraining) return;
                            self->drained_ += n + 1;
                            if (ec || self->drained_ > kDrainBytes) return self->Close();
                            self->Drain();
                          });
}

template <class Socket>
void Connection<Socket>::BeginStream(Response response) {
  auto ticket = core_->streams.TryAcquire(peer_);
  if (!ticket) {
    Response busy = Refusal(*core_, 503, "too many event streams");
    busy.SetHeader("Retry-After", "1");
    return Respond(busy, false);
  }
  stream_ticket_ = std::move(*ticket);
  phase_ = Phase::kStreaming;
  std::weak_ptr<Connection> weak = this->shared_from_this();
  auto executor = socket_.get_executor();
  stream_ = std::make_shared<StreamState>(
      core_->options.max_stream_queue_bytes,
      [weak, executor](std::string bytes) {
        asio::post(executor, [weak, bytes = std::move(bytes)]() mutable {
          if (auto self = weak.lock()) self->Enqueue(std::move(bytes));
        });
      },
      [weak, executor] {
        asio::post(executor, [weak] {
          if (auto self = weak.lock()) self->Close();
        });
      });
  core_->RegisterStream(stream_);
  core_->Responded(response.status);
  (void)stream_->Send(FormatStreamHead(response, request_version_));
  WatchStreamClient();
  asio::post(core_->workers, [open = std::move(response.on_stream), stream = stream_] {
    try {
      open(Stream(stream));
    } catch (...) {
      stream->RequestClose();
    }
  });
}

template <class Socket>
void Connection<Socket>::Enqueue(std::string bytes) {
  if (phase_ != Phase::kStreaming) return;
  queue_.push_back(std::move(bytes));
  WriteQueue();
}

template <class Socket>
void Connection<Socket>::WriteQueue() {
  if (queue_writing_ || queue_.empty()) return;
  queue_writing_ = true;
  ArmTimer(core_->options.write_timeout_ms);
  asio::async_write(socket_, asio::buffer(queue_.front()),
                    [self = this->shared_from_this()](error_code ec, size_t) {
                      if (self->phase_ != Phase::kStreaming) return;
                      self->DisarmTimer();
                      if (ec) return self->Close();
                      self->stream_->Written(self->queue_.front().size());
                      self->queue_.pop_front();
                      self->queue_writing_ = false;
                      self->WriteQueue();
                    });
}

template <class Socket>
void Connection<Socket>::WatchStreamClient() {
  // A stream's client sends nothing more; any read completing with an error
  // (EOF, reset) means it has gone away. Stray input is dropped.
  socket_.async_read_some(asio::buffer(scratch_),
                          [self = this->shared_from_this()](error_code ec, size_t) {
                            if (self->phase_ != Phase::kStreaming) return;
                            if (ec) return self->Close();
                            self->WatchStreamClient();
                          });
}

template <class Socket>
void Connection<Socket>::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  DisarmTimer();
  error_code ignored;
  auto& layer = beast::get_lowest_layer(socket_);
  layer.shutdown(asio::socket_base::shutdown_both, ignored);
  layer.close(ignored);
  queue_.clear();  // (the parser stays: a read still pending completes on it)
  ticket_.Release();
  stream_ticket_.Release();
  if (stream_ != nullptr) stream_->MarkClosed();
}

template class Connection<boost::asio::ip::tcp::socket>;
template class Connection<boost::asio::ssl::stream<boost::asio::ip::tcp::socket>>;

}  // namespace idem::http
