#pragma once
// Clock: the one source of time for backoff, timestamps, leases and token
// expiry, so tests can inject a virtual clock (RELIABILITY.md H3).
//
// Thread safety: implementations are safe to call from many threads.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace idem {

class Clock {
 public:
  virtual ~Clock() = default;
  /// Wall-clock milliseconds since the Unix epoch.
  virtual int64_t NowMs() = 0;
  /// Blocks the calling thread for `ms` milliseconds of this clock's time.
  virtual void SleepMs(int64_t ms) = 0;
};

/// The real clock. A process-wide instance: SystemClock::Get().
class SystemClock : public Clock {
 public:
  static SystemClock* Get();
  int64_t NowMs() override;
  void SleepMs(int64_t ms) override;
};

/// A virtual clock for tests: time moves only when told to, and SleepMs
/// advances it instead of blocking (and counts the sleeps).
class ManualClock : public Clock {
 public:
  explicit ManualClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t NowMs() override { return now_.load(); }
  void SleepMs(int64_t ms) override {
    sleeps_.fetch_add(1);
    slept_ms_.fetch_add(ms);
    now_.fetch_add(ms);
  }
  void AdvanceMs(int64_t ms) { now_.fetch_add(ms); }
  int64_t sleeps() const { return sleeps_.load(); }
  int64_t slept_ms() const { return slept_ms_.load(); }

 private:
  std::atomic<int64_t> now_;
  std::atomic<int64_t> sleeps_{0};
  std::atomic<int64_t> slept_ms_{0};
};

}  // namespace idem
