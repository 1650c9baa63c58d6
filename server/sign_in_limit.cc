#include "server/sign_in_limit.h"

#include <algorithm>

namespace idem::server {

SignInLimiter::SignInLimiter(Clock* clock, int max_failures, int64_t window_ms, size_t max_clients)
    : clock_(clock),
      max_failures_(std::max(1, max_failures)),
      window_ms_(std::max<int64_t>(1, window_ms)),
      max_clients_(std::max<size_t>(1, max_clients)) {}

void SignInLimiter::ForgetOldLocked(std::deque<int64_t>& failures, int64_t now) const {
  while (!failures.empty() && failures.front() <= now - window_ms_) failures.pop_front();
}

int64_t SignInLimiter::RetryAfterMs(const std::string& client) {
  const int64_t now = clock_->NowMs();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(client);
  if (it == failures_.end()) return 0;
  ForgetOldLocked(it->second, now);
  if (it->second.empty()) {
    failures_.erase(it);
    return 0;
  }
  if (static_cast<int>(it->second.size()) < max_failures_) return 0;
  // Free again when the failure that completes the count leaves the window.
  const int64_t oldest_counted = it->second[it->second.size() - max_failures_];
  return std::max<int64_t>(1, oldest_counted + window_ms_ - now);
}

void SignInLimiter::MakeRoomLocked(int64_t now) {
  for (auto it = failures_.begin(); it != failures_.end();) {
    ForgetOldLocked(it->second, now);
    it = it->second.empty() ? failures_.erase(it) : std::next(it);
  }
  if (failures_.size() < max_clients_) return;
  auto stalest = std::min_element(
      failures_.begin(), failures_.end(),
      [](const auto& a, const auto& b) { return a.second.back() < b.second.back(); });
  failures_.erase(stalest);
}

void SignInLimiter::Failed(const std::string& client) {
  const int64_t now = clock_->NowMs();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(client);
  if (it == failures_.end()) {
    if (failures_.size() >= max_clients_) MakeRoomLocked(now);
    it = failures_.emplace(client, std::deque<int64_t>()).first;
  }
  ForgetOldLocked(it->second, now);
  it->second.push_back(now);
  // Only the last max_failures_ matter for the answer.
  while (static_cast<int>(it->second.size()) > max_failures_) it->second.pop_front();
}

size_t SignInLimiter::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_.size();
}

}  // namespace idem::server
