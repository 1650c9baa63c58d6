#pragma once
// Admission: counts holders of a resource (connections, event streams) in
// total and per client address, and refuses a holder over either bound.
//
// Thread safety: safe from any thread. A Ticket must not outlive its
// Admission.

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace idem::http {

class Admission {
 public:
  /// One admitted holder; gives its place back when released or destroyed.
  /// Move-only.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Release(); }
    void Release();

   private:
    friend class Admission;
    Ticket(Admission* owner, std::string client) : owner_(owner), client_(std::move(client)) {}
    Admission* owner_ = nullptr;
    std::string client_;
  };

  Admission(size_t max_total, size_t max_per_client)
      : max_total_(max_total), max_per_client_(max_per_client) {}

  /// A ticket for `client`, or nullopt when either bound is reached.
  std::optional<Ticket> TryAcquire(const std::string& client);
  size_t total() const;

 private:
  void Release(const std::string& client);

  const size_t max_total_;
  const size_t max_per_client_;
  mutable std::mutex mu_;
  size_t total_ = 0;                          // guarded by mu_
  std::map<std::string, size_t> per_client_;  // guarded by mu_; no zero entries
};

}  // namespace idem::http
