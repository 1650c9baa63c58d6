// WorkSignal (saga/work_signal.h).

#include "saga/work_signal.h"

#include <algorithm>
#include <chrono>

namespace idem {

void WorkSignal::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::min(pending_ + 1, kMaxPending);
  }
  cv_.notify_one();
}

void WorkSignal::NotifyAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    all_ = true;
  }
  cv_.notify_all();
}

bool WorkSignal::WaitFor(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool woken = cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(ms, 0)),
                                  [this] { return all_ || pending_ > 0; });
  if (woken && !all_) --pending_;
  return woken;
}

}  // namespace idem
