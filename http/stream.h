#pragma once
// Stream: a handler's handle on one server-sent-event response
// (text/event-stream, https://html.spec.whatwg.org/#server-sent-events).
//
// A handler asks for a stream through Response::on_stream and receives the
// handle there; it may keep copies and push events from any thread, for as
// long as it likes: a stream is not bound by the request deadline. The
// stream ends when the client goes away, when a client reads too slowly
// (ServerOptions::max_stream_queue_bytes, write_timeout_ms), on Close(), or
// when the server stops; Send then returns false and the OnClose callbacks
// run, once.
//
// Thread safety: every member is safe from any thread. Copies share one
// stream. A default-constructed Stream is closed.

#include <functional>
#include <memory>
#include <string_view>

namespace idem::http {

class StreamState;

class Stream {
 public:
  Stream() = default;
  explicit Stream(std::shared_ptr<StreamState> state) : state_(std::move(state)) {}

  /// Queues one event: `data` (a line per "data:" field; newlines split it),
  /// with an optional event name and id (CR/LF removed). False when the
  /// stream has ended, or is ended now because its queue is full.
  bool Send(std::string_view data, std::string_view event = {}, std::string_view id = {});
  /// Queues a comment line (": text"), e.g. a heartbeat that proxies keep.
  bool Comment(std::string_view text);
  /// Ends the stream (the connection is closed once queued bytes are sent or
  /// dropped). Idempotent.
  void Close();
  /// False once the stream has ended.
  bool open() const;
  /// `fn` runs once when the stream ends (at once, here, if it has already
  /// ended), on an I/O thread or in Server::Stop: keep it short and
  /// non-blocking.
  void OnClose(std::function<void()> fn);

 private:
  std::shared_ptr<StreamState> state_;
};

/// The wire form of one event (exposed for tests).
std::string FormatEvent(std::string_view data, std::string_view event, std::string_view id);

}  // namespace idem::http
