#pragma once
// WorkSignal: wakes Engine::Work's idle workers when this process knows of
// new work (a saga it has just submitted, an approval just decided), so that
// one claims it at once instead of at its next poll. Optional
// (WorkerOptions::wake): without it an idle worker sleeps its poll interval
// on the engine's clock, as it must for work another process records (a
// fleet on one PostgreSQL).
//
// Each Notify is one wake-up, kept until a worker waits (at most
// kMaxPending are kept, so that a burst met by busy workers costs a few
// empty claims later, not thousands).
//
// Thread safety: every method may be called from any thread.

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace idem {

class WorkSignal {
 public:
  static constexpr int64_t kMaxPending = 64;

  /// One more piece of work: wakes one waiter, or the next to wait.
  void Notify();
  /// Wakes every waiter now and every later WaitFor at once (the pool stops).
  void NotifyAll();
  /// Waits until a Notify (taking it) or NotifyAll, or until `ms` pass in
  /// real time. True when woken.
  bool WaitFor(int64_t ms);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t pending_ = 0;  // GUARDED_BY(mu_) wake-ups not taken yet
  bool all_ = false;     // GUARDED_BY(mu_)
};

}  // namespace idem
