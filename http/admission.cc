#include "http/admission.h"

#include <utility>

namespace idem::http {

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    client_ = std::move(other.client_);
  }
  return *this;
}

void Admission::Ticket::Release() {
  if (owner_ != nullptr) std::exchange(owner_, nullptr)->Release(client_);
}

std::optional<Admission::Ticket> Admission::TryAcquire(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  if (total_ >= max_total_) return std::nullopt;
  size_t& mine = per_client_[client];
  if (mine >= max_per_client_) {
    if (mine == 0) per_client_.erase(client);
    return std::nullopt;
  }
  ++mine;
  ++total_;
  return Ticket(this, client);
}

size_t Admission::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

void Admission::Release(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  --total_;
  auto it = per_client_.find(client);
  if (it != per_client_.end() && --it->second == 0) per_client_.erase(it);
}

}  // namespace idem::http
