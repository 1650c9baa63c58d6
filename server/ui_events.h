#pragma once
// UiEventTail: the web UI's live timelines. Each subscription is one
// server-sent-event stream (http/stream.h) of one saga's journal entries
// after a sequence number; one thread looks for new entries every `poll_ms`
// and sends them in journal order, as
//   id: <seq>\nevent: journal\ndata: {"seq":..,"step":..,"event":..,"data":..,"at":..}
// so that a browser's EventSource resumes after the last one it saw
// (Last-Event-ID). A stream ends when its client goes, when its session
// ends (checked at every poll), or at Stop. How many streams may be open is
// the HTTP front's bound (max_streams, max_streams_per_client).
//
// Thread safety: Add and Stop from any thread.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/store.h"

#include "common/json_util.h"
#include "http/stream.h"

namespace idem::server {

/// A journal entry as the UI shows it (one timeline line).
Json JournalEntryView(const storage::JournalEntry& e);

class UiEventTail {
 public:
  /// `alive` says whether a subscription's session still holds. `store` is
  /// not owned.
  UiEventTail(storage::Store* store, int64_t poll_ms,
              std::function<bool(const std::string& session)> alive);
  ~UiEventTail();  ///< Stop()
  UiEventTail(const UiEventTail&) = delete;
  UiEventTail& operator=(const UiEventTail&) = delete;

  /// Streams the journal of `saga_id` after `after_seq` to `stream`, for as
  /// long as the session `session` (a cookie value) holds. Starts the
  /// thread on first use.
  void Add(const std::string& saga_id, int64_t after_seq, const std::string& session,
           http::Stream stream);
  /// Ends every stream and joins the thread. Idempotent.
  void Stop();

 private:
  struct Sub {
    std::string saga_id;
    int64_t after = 0;
    std::string session;
    http::Stream stream;
    int64_t last_sent_ms = 0;
  };
  void Loop();
  // Sends what is new for `sub`; false when the stream is done.
  bool Pump(Sub& sub, int64_t now_ms);

  storage::Store* store_;
  const int64_t poll_ms_;
  std::function<bool(const std::string&)> alive_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Sub>> subs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace idem::server
