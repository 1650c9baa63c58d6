#pragma once
// The web UI (docs/server.md "Web UI"): the approval inbox and the saga
// timeline at /ui, for people, beside the /v1 API for programs.
//
//   GET  /ui, /ui/, /ui/{file}            the embedded page (server/ui/, ui_assets.h)
//   POST /ui/api/session                  sign in {"token": <bearer token>}: session cookie
//   GET  /ui/api/session                  who is signed in, roles, the CSRF token
//   POST /ui/api/session/end              sign out
//   GET  /ui/api/approvals                the inbox (approver), newest first
//   POST /ui/api/approvals/{token}/approve|reject   as /v1 (approver; never one's own)
//   GET  /ui/api/sagas?state&spec&intent_key&since&until&offset&limit
//   GET  /ui/api/sagas/{id}               the saga, its steps, effects and journal
//   GET  /ui/api/sagas/{id}/events        its journal entries after ?after=N or
//                                         Last-Event-ID, as server-sent events
//   POST /ui/api/sagas/{id}/cancel|pause|resume|resolve   as /v1 (operator)
//
// Every /ui/api request but the sign-in needs the session cookie; every
// POST but the sign-in also the session's CSRF token in X-CSRF-Token (403
// csrf-token-invalid without it, and nothing is done). A POST whose Origin
// is another site's is refused 403. The session names the auth file's
// principal, and the decision and operator endpoints run the /v1 handlers
// as that principal (HttpRequest::principal), so roles, the self-approval
// refusal and every answer are the API's. Bearer tokens are not taken
// here; the /v1 API takes no cookie.
//
// Who sees which saga: an approver or an operator every saga, an agent its
// own (as GET /v1/sagas).
//
// Thread safety: the handlers run on the HTTP threads, many at once.

#include <memory>
#include <vector>

#include "server/context.h"
#include "server/http.h"
#include "server/server.h"

namespace idem::server {

class UiSessions;
class UiEventTail;
class SignInLimiter;

class UiService {
 public:
  /// `ctx` is not owned and outlives the service.
  UiService(ServerContext* ctx, const UiOptions& options, Clock* clock);
  ~UiService();  ///< Stop()
  UiService(const UiService&) = delete;
  UiService& operator=(const UiService&) = delete;

  /// The routes above (none when the UI is disabled).
  std::vector<Route> Routes();
  /// Ends every event stream. Idempotent.
  void Stop();

  UiSessions& sessions() { return *sessions_; }

 private:
  ServerContext* ctx_;
  UiOptions options_;
  std::unique_ptr<UiSessions> sessions_;
  std::unique_ptr<SignInLimiter> sign_in_limit_;
  std::unique_ptr<UiEventTail> tail_;
};

/// The value of cookie `name` in a Cookie header ("a=1; b=2"), or "".
std::string CookieValue(const std::string& header, const std::string& name);

}  // namespace idem::server
