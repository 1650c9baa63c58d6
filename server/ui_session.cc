#include "server/ui_session.h"

#include <algorithm>
#include <stdexcept>

#include "common/json_util.h"
#include <openssl/crypto.h>
#include <openssl/rand.h>

namespace idem::server {
namespace {

// 32 random bytes as 64 lower-case hex digits.
std::string RandomSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace

UiSessions::UiSessions(Clock* clock, int64_t idle_ms, int64_t max_ms, size_t max_sessions)
    : clock_(clock), idle_ms_(idle_ms), max_ms_(max_ms), max_sessions_(max_sessions) {}

int64_t UiSessions::ExpiresLocked(const UiSession& s) const {
  return std::min(s.last_used_ms + idle_ms_, s.created_ms + max_ms_);
}

void UiSessions::DropExpiredLocked(int64_t now) {
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    it = ExpiresLocked(it->second.session) <= now ? by_hash_.erase(it) : std::next(it);
  }
}

Result<OpenedSession> UiSessions::Open(const std::string& principal) {
  const int64_t now = clock_->NowMs();
  OpenedSession out;
  out.id = RandomSecret();
  out.session.principal = principal;
  out.session.csrf_token = RandomSecret();
  out.session.created_ms = now;
  out.session.last_used_ms = now;
  std::lock_guard<std::mutex> lock(mu_);
  if (by_hash_.size() >= max_sessions_) DropExpiredLocked(now);
  if (by_hash_.size() >= max_sessions_) {
    return Status::Unavailable("ui: " + std::to_string(max_sessions_) +
                               " sessions are open; sign in again later");
  }
  out.session.expires_ms = ExpiresLocked(out.session);
  by_hash_[Sha256Hex(out.id)] = Entry{out.session};
  return out;
}

std::optional<UiSession> UiSessions::Find(const std::string& id, bool touch) {
  if (id.empty()) return std::nullopt;
  const int64_t now = clock_->NowMs();
  const std::string key = Sha256Hex(id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_hash_.find(key);
  if (it == by_hash_.end()) return std::nullopt;
  if (ExpiresLocked(it->second.session) <= now) {
    by_hash_.erase(it);
    return std::nullopt;
  }
  if (touch) {
    it->second.session.last_used_ms = now;
    it->second.session.expires_ms = ExpiresLocked(it->second.session);
  }
  return it->second.session;
}

std::optional<UiSession> UiSessions::Use(const std::string& id) { return Find(id, true); }

std::optional<UiSession> UiSessions::Peek(const std::string& id) { return Find(id, false); }

bool UiSessions::End(const std::string& id) {
  if (id.empty()) return false;
  const std::string key = Sha256Hex(id);
  std::lock_guard<std::mutex> lock(mu_);
  return by_hash_.erase(key) > 0;
}

size_t UiSessions::size() {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLocked(clock_->NowMs());
  return by_hash_.size();
}

bool UiSessions::SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace idem::server
