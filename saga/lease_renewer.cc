#include "saga/lease_renewer.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace idem {

struct LeaseRenewer::Held {
  storage::Lease lease;
  std::chrono::steady_clock::time_point due;
  std::atomic<bool> lost{false};
  bool renewing = false;  // GUARDED_BY(LeaseRenewer::mu_)
};

LeaseRenewer::LeaseRenewer(storage::Store* store, int64_t lease_ms, Observer observer)
    : store_(store),
      observer_(std::move(observer)),
      period_(std::max<int64_t>(1, lease_ms / 3)),
      lease_ms_(lease_ms) {}

LeaseRenewer::~LeaseRenewer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

LeaseRenewer::Hold LeaseRenewer::Keep(const storage::Lease& lease) {
  return Hold(this, Add(lease));
}

std::shared_ptr<LeaseRenewer::Held> LeaseRenewer::Add(const storage::Lease& lease) {
  auto held = std::make_shared<Held>();
  held->lease = lease;
  held->due = std::chrono::steady_clock::now() + period_;
  std::lock_guard<std::mutex> lock(mu_);
  // No wake-up: the thread never sleeps longer than one period, and a new
  // lease is first due a period from now.
  held_.push_back(held);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  return held;
}

void LeaseRenewer::Remove(const std::shared_ptr<Held>& held) {
  std::unique_lock<std::mutex> lock(mu_);
  held_.erase(std::remove(held_.begin(), held_.end(), held), held_.end());
  cv_.wait(lock, [&] { return !held->renewing; });
}

void LeaseRenewer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_) {
    auto now = std::chrono::steady_clock::now();
    auto next = now + period_;
    std::vector<std::shared_ptr<Held>> due;
    for (const auto& h : held_) {
      if (h->due <= now) {
        h->renewing = true;
        due.push_back(h);
      } else {
        next = std::min(next, h->due);
      }
    }
    if (due.empty()) {
      cv_.wait_until(lock, next);
      continue;
    }
    lock.unlock();
    for (const auto& h : due) {
      Status s = store_->RenewLease(h->lease, lease_ms_);
      // kUnavailable: the store is unreachable; keep trying. If the lease
      // expires meanwhile, the fenced writes will be refused.
      if (s.code() == Code::kAborted || s.code() == Code::kNotFound) h->lost = true;
      if (!s.ok() && observer_) observer_(h->lost ? Failure::kLost : Failure::kError);
    }
    lock.lock();
    auto after = std::chrono::steady_clock::now();
    for (const auto& h : due) {
      h->renewing = false;
      h->due = after + period_;
      if (h->lost) held_.erase(std::remove(held_.begin(), held_.end(), h), held_.end());
    }
    cv_.notify_all();
  }
}

LeaseRenewer::Hold::Hold(LeaseRenewer* renewer, std::shared_ptr<Held> held)
    : renewer_(renewer), held_(std::move(held)) {}

LeaseRenewer::Hold::Hold(Hold&& other) noexcept
    : renewer_(other.renewer_), held_(std::move(other.held_)), released_(other.released_) {}

LeaseRenewer::Hold::~Hold() {
  if (held_ == nullptr) return;  // moved from
  renewer_->Remove(held_);
  if (released_) return;
  try {
    // Lost already, or the store is down: the lease expires on its own.
    (void)renewer_->store_->ReleaseLease(held_->lease);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor; the lease expires
  }
}

const std::atomic<bool>* LeaseRenewer::Hold::lost() const { return &held_->lost; }

}  // namespace idem
