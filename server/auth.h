#pragma once
// Callers: the auth file's principals, bearer tokens checked against their
// SHA-256 (CRYPTO_memcmp over every entry), and roles. Internal to the server
// (Principal, ParsePrincipals and LoadPrincipals are declared in server.h).
//
// Thread safety: an Authenticator is immutable after construction.

#include <initializer_list>
#include <string>
#include <vector>

#include "server/http.h"
#include "server/server.h"

namespace idem::server {

inline constexpr const char* kAnonymous = "anonymous";
inline constexpr const char* kRoleAgent = "agent";
inline constexpr const char* kRoleApprover = "approver";
/// Operates live sagas: cancel, pause, resume and resolve any saga (an agent
/// may cancel its own).
inline constexpr const char* kRoleOperator = "operator";

/// True when `p` holds a role that decides on commits: `approver` (for
/// "approval": "human") or a role of an approval policy (any role but
/// agent and operator).
bool MayDecideApprovals(const Principal& p);

/// True for a loopback host name or address (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& host);

class Authenticator {
 public:
  /// No principals: every caller is "anonymous" with every role (the
  /// server's --insecure-no-auth).
  explicit Authenticator(std::vector<Principal> principals) : principals_(std::move(principals)) {}

  /// True when callers need a bearer token.
  bool enabled() const { return !principals_.empty(); }

  /// The principal named by the request's bearer token; nullptr when absent
  /// or bad.
  /// A request the server itself marked with a principal (a web UI
  /// session, HttpRequest::principal) is that principal.
  const Principal* Identify(const HttpRequest& req) const;

  /// The principal whose bearer token is `token` (the web UI's sign-in);
  /// nullptr when none is.
  const Principal* IdentifyToken(const std::string& token) const;

  /// The principal named `name`; nullptr when none is (or auth is off).
  const Principal* Find(const std::string& name) const;

  /// The principal if it holds one of `roles`; else nullptr and a 401
  /// (+ WWW-Authenticate) or 403 problem in `res`.
  const Principal* Authorize(const HttpRequest& req, HttpResponse& res,
                             std::initializer_list<const char*> roles) const;

 private:
  std::vector<Principal> principals_;
};

}  // namespace idem::server
