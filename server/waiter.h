#pragma once
// SagaWaiter: lets a request wait for a saga to move (`Prefer: wait=N`, RFC
// 7240) without polling the store. The engine's journal observer calls
// Notify for every committed entry; a waiter re-reads its saga only when
// an entry of that saga was committed in this process, or every
// `recheck_ms` (a change another process made: a PostgreSQL fleet), and
// stops at its deadline or when the server stops.
//
// A waiter holds one of the HTTP front's handler threads: at most
// `max_waiters` wait at once; past that a request answers at once (without
// Preference-Applied).
//
// Thread safety: every method may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace idem::server {

/// The longest wait a request may ask for; longer asks are capped to it.
inline constexpr int kMaxPreferWaitSeconds = 60;

/// The `wait` preference of a Prefer header ("wait=10", "respond-async,
/// wait=5"), capped to kMaxPreferWaitSeconds; -1 when absent or malformed.
int PreferredWaitSeconds(const std::string& prefer);

class SagaWaiter {
 public:
  SagaWaiter(int max_waiters, int64_t recheck_ms)
      : max_waiters_(max_waiters), recheck_ms_(recheck_ms) {}

  /// An entry of `saga_id` was committed: wake its waiters.
  void Notify(const std::string& saga_id);
  /// Wakes every waiter for good (the server stops).
  void StopAll();

  /// Waits until `done()` holds (checked at once, after each Notify of
  /// `saga_id` and every recheck), `seconds` pass, or StopAll. True when
  /// done() held; false on the deadline, at stop, or when `max_waiters`
  /// wait already (then done() is asked once).
  bool WaitFor(const std::string& saga_id, int seconds, const std::function<bool()>& done);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, uint64_t> generation_;  // GUARDED_BY(mu_) sagas waited on
  std::unordered_map<std::string, int> waiting_;          // GUARDED_BY(mu_)
  int active_ = 0;                                        // GUARDED_BY(mu_)
  bool stopped_ = false;                                  // GUARDED_BY(mu_)
  const int max_waiters_;
  const int64_t recheck_ms_;
};

}  // namespace idem::server
