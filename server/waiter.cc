#include "server/waiter.h"

#include <algorithm>
#include <cctype>

namespace idem::server {

int PreferredWaitSeconds(const std::string& prefer) {
  // Preferences are separated by ',', parameters by ';' (RFC 7240 section 2).
  size_t i = 0;
  while (i < prefer.size()) {
    size_t end = prefer.find_first_of(",;", i);
    if (end == std::string::npos) end = prefer.size();
    std::string token = prefer.substr(i, end - i);
    token.erase(std::remove_if(token.begin(), token.end(),
                               [](unsigned char c) { return std::isspace(c) != 0; }),
                token.end());
    if (token.size() > 5 &&
        (token.compare(0, 5, "wait=") == 0 || token.compare(0, 5, "WAIT=") == 0)) {
      const std::string n = token.substr(5);
      if (n.empty() || n.size() > 9 ||
          !std::all_of(n.begin(), n.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
        return -1;
      }
      return std::min(std::stoi(n), kMaxPreferWaitSeconds);
    }
    i = end + 1;
  }
  return -1;
}

void SagaWaiter::Notify(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = generation_.find(saga_id);
  if (it == generation_.end()) return;  // nobody waits on it: nothing to do
  ++it->second;
  cv_.notify_all();
}

void SagaWaiter::StopAll() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

bool SagaWaiter::WaitFor(const std::string& saga_id, int seconds,
                         const std::function<bool()>& done) {
  bool registered = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_ && active_ < max_waiters_ && seconds > 0) {
      ++active_;
      ++waiting_[saga_id];
      generation_.emplace(saga_id, 0);
      registered = true;
    }
  }
  if (!registered) return done();  // asked once
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  bool result = false;
  for (;;) {
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = generation_[saga_id];
    }
    if (done()) {
      result = true;
      break;
    }
    std::unique_lock<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (stopped_ || now >= deadline) break;
    const auto until = std::min(deadline, now + std::chrono::milliseconds(recheck_ms_));
    cv_.wait_until(lock, until, [&] { return stopped_ || generation_[saga_id] != seen; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  --active_;
  if (--waiting_[saga_id] == 0) {
    waiting_.erase(saga_id);
    generation_.erase(saga_id);
  }
  return result;
}

}  // namespace idem::server
