#pragma once
// The Streamable HTTP transport of MCP (MCP "Transports", revision
// 2025-11-25) at /mcp on `idem serve`, over the server's HTTP front and its
// bearer-token auth (server/auth.h; role agent).
//
//   POST /mcp    one JSON-RPC message. Accept must name application/json
//                and text/event-stream (else 406), the body be
//                application/json (else 415). initialize opens a session and
//                answers its Mcp-Session-Id; every later POST carries it (400
//                without, 404 for an unknown or ended one). A notification or
//                a response is answered 202 with no body; a request with
//                application/json, or with an SSE stream (progress
//                notifications, then the response) when its _meta carries a
//                progressToken.
//   DELETE /mcp  ends the session (200); 404 for an unknown one.
//   GET /mcp     405: the server offers no server-to-client stream.
// Every request: Origin, when sent, must be allowed (403; default: loopback
// origins only: http(s)://localhost, 127.0.0.1, [::1], any port); Host must
// be allowed (403; default: loopback names and the listen host), against
// DNS rebinding; MCP-Protocol-Version, when sent, must be a supported
// revision (400).
//
// What lives where (docs/mcp.md "Sessions"): a session's state in memory is
// its negotiated revision and which requests are in flight; its open saga is
// in the store, begun at initialize with intent key
// `<principal>:mcp-session:<nonce>`. The session id is `<saga id>.<nonce>`:
// a server that does not know an id (another server on the same PostgreSQL,
// or this one after a restart) loads the saga, checks that its intent key
// is that caller's and that nonce, and that it is still open, and takes the
// session up. DELETE rolls back a session saga that has no calls (so it
// ends everywhere); one with calls stays open for idem_commit/idem_rollback
// through an io.idem/intent, the REST API, or its idle policy, and is ended
// only on the server that got the DELETE.
//
// Thread safety: the handlers run on the front's threads, many at once.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "server/http.h"

#include "mcp/session.h"

namespace idem::server {
class Authenticator;
}  // namespace idem::server

namespace idem::mcp {

struct HttpOptions {
  /// Origins allowed besides loopback ones ("https://app.example.com").
  std::vector<std::string> allowed_origins;
  /// Host header names allowed besides loopback ones and `listen_host`.
  std::vector<std::string> allowed_hosts;
  std::string listen_host = "127.0.0.1";
  size_t max_sessions = 10'000;         ///< more: 503 at initialize
  int64_t session_idle_ms = 3'600'000;  ///< unused this long: forgotten here (the saga stays)
  size_t page_size = 100;
  int64_t progress_interval_ms = 1000;
};

class HttpTransport {
 public:
  /// `auth` is not owned and must outlive the transport. `backend_for`
  /// gives the backend of a session of `principal` (its specs are the ones
  /// that principal may use).
  HttpTransport(std::function<Backend(const std::string& principal)> backend_for,
                const server::Authenticator* auth, HttpOptions options);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  /// POST, GET and DELETE /mcp.
  std::vector<server::Route> Routes();

  /// Whether an Origin header value may call (exposed for tests).
  bool OriginAllowed(const std::string& origin) const;
  /// Whether a Host header value names this server (exposed for tests).
  bool HostAllowed(const std::string& host) const;

 private:
  struct Entry {
    std::shared_ptr<Session> session;
    std::string principal;
    int64_t used_ms = 0;
  };
  void Post(const server::HttpRequest& req, server::HttpResponse& res);
  void Delete(const server::HttpRequest& req, server::HttpResponse& res);
  /// Common checks; false with `res` written when the request is refused.
  bool Admit(const server::HttpRequest& req, server::HttpResponse& res, std::string* principal);
  /// The session named by the request's Mcp-Session-Id, or nullptr with
  /// `res` written (400, 404).
  std::shared_ptr<Session> Find(const server::HttpRequest& req, const std::string& principal,
                                server::HttpResponse& res);

  std::function<Backend(const std::string&)> backend_for_;
  const server::Authenticator* auth_;
  HttpOptions options_;
  std::mutex mu_;
  std::map<std::string, Entry> sessions_;  // GUARDED_BY(mu_)
  std::set<std::string> ended_;            // GUARDED_BY(mu_)
};

}  // namespace idem::mcp
