#include "server/ui_events.h"

#include <chrono>
#include <utility>

namespace idem::server {
namespace {

// A comment line this often keeps proxies from closing a quiet stream.
constexpr int64_t kHeartbeatMs = 15'000;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Json JournalEntryView(const storage::JournalEntry& e) {
  return Json{{"seq", e.seq},
              {"step", e.step_id.empty() ? Json() : Json(e.step_id)},
              {"event", e.event},
              {"data", e.data},
              {"at", FormatTimeMs(e.at_ms)}};
}

UiEventTail::UiEventTail(storage::Store* store, int64_t poll_ms,
                         std::function<bool(const std::string& session)> alive)
    : store_(store), poll_ms_(poll_ms < 10 ? 10 : poll_ms), alive_(std::move(alive)) {}

UiEventTail::~UiEventTail() { Stop(); }

void UiEventTail::Add(const std::string& saga_id, int64_t after_seq, const std::string& session,
                      http::Stream stream) {
  auto sub = std::make_shared<Sub>();
  sub->saga_id = saga_id;
  sub->after = after_seq;
  sub->session = session;
  sub->stream = std::move(stream);
  sub->last_sent_ms = SteadyMs();
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    sub->stream.Close();
    return;
  }
  subs_.push_back(std::move(sub));
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  cv_.notify_all();  // the first entries go out now, not a poll later
}

void UiEventTail::Stop() {
  std::vector<std::shared_ptr<Sub>> subs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    subs.swap(subs_);
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  for (auto& s : subs) s->stream.Close();
}

bool UiEventTail::Pump(Sub& sub, int64_t now_ms) {
  if (!sub.stream.open()) return false;
  if (!alive_(sub.session)) {
    sub.stream.Send(R"({"reason":"session ended"})", "end");
    sub.stream.Close();
    return false;
  }
  auto entries = store_->ReadJournal(sub.saga_id);
  if (!entries.ok()) {
    // A store hiccup: the stream stays; the next poll tries again.
    return true;
  }
  for (const auto& e : *entries) {
    if (e.seq <= sub.after) continue;
    if (!sub.stream.Send(JournalEntryView(e).dump(), "journal", std::to_string(e.seq))) {
      return false;
    }
    sub.after = e.seq;
    sub.last_sent_ms = now_ms;
  }
  if (now_ms - sub.last_sent_ms >= kHeartbeatMs) {
    if (!sub.stream.Comment("keep-alive")) return false;
    sub.last_sent_ms = now_ms;
  }
  return true;
}

void UiEventTail::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    std::vector<std::shared_ptr<Sub>> subs = subs_;
    lock.unlock();
    std::vector<Sub*> done;
    const int64_t now = SteadyMs();
    for (auto& s : subs) {
      if (!Pump(*s, now)) done.push_back(s.get());
    }
    lock.lock();
    if (!done.empty()) {
      std::vector<std::shared_ptr<Sub>> keep;
      for (auto& s : subs_) {
        bool gone = false;
        for (Sub* d : done) gone = gone || d == s.get();
        if (!gone) keep.push_back(s);
      }
      subs_.swap(keep);
    }
    cv_.wait_for(lock, std::chrono::milliseconds(poll_ms_));
  }
}

}  // namespace idem::server
