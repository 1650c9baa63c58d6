#pragma once
// SignInLimiter: how many failed sign-ins one client address may make
// (the web UI's POST /ui/api/sign-in; docs/server.md "Web UI").
//
// Tokens are long random secrets, so guessing one is hopeless; the limit
// keeps a client from making the server hash guesses at line rate, and makes
// a guessing client visible (429 in its logs, and in ours). A client that
// has failed `max_failures` times within `window_ms` is refused until its
// oldest failure leaves the window, without its token being looked at (the
// refusal answers the same whether the token is right or wrong, so it is no
// oracle). A success does not clear earlier failures: a client that holds
// one token cannot use it to reset the count while guessing another.
//
// Memory is bounded: at most `max_clients` addresses are tracked; a new one
// beyond that first drops those with no failure in the window, then the one
// whose latest failure is oldest.
//
// Thread safety: every member is safe from any thread.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "common/clock.h"

namespace idem::server {

class SignInLimiter {
 public:
  /// `clock` is not owned.
  SignInLimiter(Clock* clock, int max_failures, int64_t window_ms, size_t max_clients);

  /// 0 when `client` may try to sign in now; else the milliseconds until it
  /// may (for Retry-After).
  int64_t RetryAfterMs(const std::string& client);
  /// Counts one failed sign-in of `client`.
  void Failed(const std::string& client);
  /// Addresses tracked now.
  size_t size();

 private:
  void ForgetOldLocked(std::deque<int64_t>& failures, int64_t now) const;
  void MakeRoomLocked(int64_t now);

  Clock* clock_;
  const int max_failures_;
  const int64_t window_ms_;
  const size_t max_clients_;
  std::mutex mu_;
  std::map<std::string, std::deque<int64_t>> failures_;  ///< client -> failure times, oldest first
};

}  // namespace idem::server
