#pragma once
// UiSessions: the web UI's signed-in sessions (docs/server.md "Web UI").
//
// A sign-in with a bearer token from the auth file opens a session: a
// 256-bit random id (the cookie's value) and a 256-bit CSRF token (the
// synchronizer token every state-changing request must carry). Only the
// SHA-256 of the id is kept, so a dump of this table names no cookie. A
// session ends at sign-out, when unused for `idle_ms`, and `max_ms` after
// sign-in, whichever comes first.
//
// Kept in memory, on purpose: a session is a convenience over the bearer
// token (signing in again needs only the token), so a restart that signs
// people out loses nothing durable; and the table is never written to the
// journal's store, so sessions add no writes to the store every saga drive
// waits on. Several servers behind one address therefore need sticky
// routing for the UI (the /v1 API needs none).
//
// Thread safety: every member is safe from any thread.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace idem::server {

/// A live session as a handler sees it.
struct UiSession {
  std::string principal;  ///< the auth file's name ("anonymous" without auth)
  std::string csrf_token;
  int64_t created_ms = 0;
  int64_t last_used_ms = 0;
  int64_t expires_ms = 0;  ///< the earlier of the idle and the absolute end
};

/// A session just opened: `id` goes into the cookie, once.
struct OpenedSession {
  std::string id;
  UiSession session;
};

class UiSessions {
 public:
  /// `clock` is not owned.
  UiSessions(Clock* clock, int64_t idle_ms, int64_t max_ms, size_t max_sessions);

  /// Opens a session for `principal`. kUnavailable when max_sessions are
  /// open (after dropping the expired ones).
  Result<OpenedSession> Open(const std::string& principal);
  /// The session of cookie value `id`, touched (its idle time restarts);
  /// nullopt when unknown, ended or expired (an expired one is dropped).
  std::optional<UiSession> Use(const std::string& id);
  /// The session of `id` without touching it (event streams check it).
  std::optional<UiSession> Peek(const std::string& id);
  /// Ends the session of `id`; false when there was none.
  bool End(const std::string& id);
  /// Sessions open now (expired ones not counted).
  size_t size();

  int64_t idle_ms() const { return idle_ms_; }
  int64_t max_ms() const { return max_ms_; }

  /// True when `a` equals `b`, in time independent of where they differ.
  static bool SameSecret(const std::string& a, const std::string& b);

 private:
  struct Entry {
    UiSession session;
  };
  std::optional<UiSession> Find(const std::string& id, bool touch);
  void DropExpiredLocked(int64_t now);
  int64_t ExpiresLocked(const UiSession& s) const;

  Clock* clock_;
  const int64_t idle_ms_;
  const int64_t max_ms_;
  const size_t max_sessions_;
  std::mutex mu_;
  std::map<std::string, Entry> by_hash_;  ///< SHA-256 of the id -> session
};

}  // namespace idem::server
