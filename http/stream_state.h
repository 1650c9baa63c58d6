#pragma once
// StreamState (internal): what a Stream handle and the connection that
// carries the stream share. The connection gives it two callbacks that post
// to its strand: `deliver` (queue bytes for writing) and `close`.
//
// Thread safety: safe from any thread. `deliver` and `close` are only called
// under mu_ while the stream is open, and MarkClosed takes mu_, so once
// MarkClosed has returned nothing posts to the connection any more: the
// server marks every stream closed before its I/O context goes away.

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace idem::http {

class StreamState {
 public:
  StreamState(size_t max_queued_bytes, std::function<void(std::string)> deliver,
              std::function<void()> close)
      : max_queued_(max_queued_bytes), deliver_(std::move(deliver)), close_(std::move(close)) {}

  /// Queues raw bytes. False when closed or closing; a send that would pass
  /// the queue bound asks the connection to close instead.
  bool Send(std::string bytes);
  /// Asks the connection to close the stream.
  void RequestClose();
  /// The connection wrote `n` queued bytes.
  void Written(size_t n);
  /// The stream has ended: no more posts; runs the OnClose callbacks once.
  void MarkClosed();
  bool open() const;
  void OnClose(std::function<void()> fn);

 private:
  const size_t max_queued_;
  mutable std::mutex mu_;
  bool open_ = true;      // guarded by mu_
  bool closing_ = false;  // guarded by mu_: a close was requested
  size_t queued_ = 0;     // guarded by mu_
  std::function<void(std::string)> deliver_;
  std::function<void()> close_;
  std::vector<std::function<void()>> on_close_;  // guarded by mu_
};

}  // namespace idem::http
