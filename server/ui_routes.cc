#include "server/ui_routes.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "saga/approval_rights.h"
#include "saga/open_saga.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/auth.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"
#include "server/sign_in_limit.h"
#include "server/ui_assets.h"
#include "server/ui_events.h"
#include "server/ui_session.h"

#include "common/json_util.h"
#include "common/principal_name.h"

namespace idem::server {
namespace {

constexpr const char* kCookie = "idem_session";
constexpr const char* kCsrfHeader = "X-CSRF-Token";
constexpr size_t kMaxTokenBytes = 4096;
constexpr int kDefaultPage = 50;
constexpr int kMaxPage = 500;

// The page's policy: its own scripts, styles and connections only; no
// inline script, no framing, no plugins, no <base>.
constexpr const char* kCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

void SecurityHeaders(HttpResponse& res) {
  res.SetHeader("Content-Security-Policy", kCsp);
  res.SetHeader("X-Content-Type-Options", "nosniff");
  res.SetHeader("X-Frame-Options", "DENY");
  res.SetHeader("Referrer-Policy", "no-referrer");
  res.SetHeader("Cross-Origin-Opener-Policy", "same-origin");
}

// The model decision behind a pending commit (saga/open_saga.h): the one
// journaled with the open saga's call that became `step_id`, or with a spec
// saga's submission; null when none was recorded or the journal is unreadable.
Json RecordedDecision(storage::Store* store, const storage::SagaRecord& saga,
                      const std::string& step_id) {
  auto journal = store->ReadJournal(saga.summary.saga_id);
  if (!journal.ok()) return nullptr;
  if (!IsOpenPlan(saga.spec)) return SubmissionDecision(*journal);
  for (const Json& call : OpenCallsView(saga, *journal)) {
    if (call.value("step_id", "") == step_id) return call.value("decision", Json());
  }
  return nullptr;
}

bool AllDigits(const std::string& s, size_t max) {
  return !s.empty() && s.size() <= max &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// ---- the embedded page

void ServeAsset(const std::string& name, const HttpRequest& req, HttpResponse& res) {
  SecurityHeaders(res);
  const EmbeddedFile* f = FindUiAsset(name);
  if (f == nullptr) {
    return Problem(res, 404, "not-found", "Not found", "no file /ui/" + name);
  }
  const std::string body(reinterpret_cast<const char*>(f->data), f->size);
  const std::string etag = "\"" + Sha256Hex(body).substr(0, 32) + "\"";
  // Revalidated on every load: a new binary serves its new page at once.
  res.SetHeader("Cache-Control", "no-cache");
  res.SetHeader("ETag", etag);
  if (req.Header("If-None-Match") == etag) {
    res.status = 304;
    return;
  }
  res.SetContent(body, UiContentType(name));
}

}  // namespace

std::string CookieValue(const std::string& header, const std::string& name) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(';', pos);
    if (end == std::string::npos) end = header.size();
    std::string part = header.substr(pos, end - pos);
    size_t a = part.find_first_not_of(' ');
    if (a != std::string::npos) part = part.substr(a);
    size_t eq = part.find('=');
    if (eq != std::string::npos && part.substr(0, eq) == name) {
      std::string v = part.substr(eq + 1);
      while (!v.empty() && v.back() == ' ') v.pop_back();
      return v;
    }
    pos = end + 1;
  }
  return "";
}

const EmbeddedFile* FindUiAsset(const std::string& name) {
  for (const EmbeddedFile& f : UiAssets()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string UiContentType(const std::string& name) {
  auto ends = [&name](const std::string& ext) {
    return name.size() >= ext.size() &&
           name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

// ---- the service

namespace {

// One request of the UI's API, once its session is checked.
struct Signed {
  std::string cookie;  ///< the session id, as sent
  UiSession session;
  const Principal* principal = nullptr;  ///< nullptr only without auth
};

class Api {
 public:
  Api(ServerContext* ctx, const UiOptions& o, UiSessions* sessions, SignInLimiter* sign_in_limit,
      UiEventTail* tail)
      : ctx_(ctx), o_(o), sessions_(sessions), sign_in_limit_(sign_in_limit), tail_(tail) {}

  // The session of `req`, its CSRF token checked when `changes`; else
  // nullopt and a 401/403 problem in `res`.
  std::optional<Signed> Check(const HttpRequest& req, HttpResponse& res, bool changes) const {
    if (changes && !SameOrigin(req)) {
      Problem(res, 403, "cross-origin", "Forbidden",
              "Origin: a request from another site is refused");
      return std::nullopt;
    }
    Signed s;
    s.cookie = CookieValue(req.Header("Cookie"), kCookie);
    auto session = sessions_->Use(s.cookie);
    if (!session) {
      Problem(res, 401, "session-required", "Sign-in required",
              "no session, or it ended: sign in at /ui");
      return std::nullopt;
    }
    if (changes && !UiSessions::SameSecret(req.Header(kCsrfHeader), session->csrf_token)) {
      Problem(res, 403, "csrf-token-invalid", "Forbidden",
              std::string(kCsrfHeader) + ": missing or not this session's CSRF token");
      return std::nullopt;
    }
    s.session = *session;
    if (ctx_->auth->enabled()) {
      s.principal = ctx_->auth->Find(session->principal);
      if (s.principal == nullptr) {
        Problem(res, 401, "session-required", "Sign-in required", "the session's caller is gone");
        return std::nullopt;
      }
    }
    return s;
  }

  // The principal the rest of the server sees for a signed request.
  const Principal& Who(const HttpRequest& req) const {
    return *ctx_->auth->Identify(req);  // never nullptr: the request carries it
  }

  // The answer's headers, the session check, and the request as the
  // session's principal (its cookie value in `cookie`); nullopt with the
  // problem in `res`.
  std::optional<HttpRequest> Enter(const HttpRequest& req, HttpResponse& res, bool changes,
                                   std::string* cookie = nullptr) const {
    SecurityHeaders(res);
    res.SetHeader("Cache-Control", "no-store");
    auto s = Check(req, res, changes);
    if (!s) return std::nullopt;
    if (cookie != nullptr) *cookie = s->cookie;
    HttpRequest as = req;
    as.headers.erase("Authorization");
    as.principal = s->principal;
    return as;
  }

  // Runs `inner` (a /v1 handler) as the session's principal.
  void AsSession(const HttpRequest& req, HttpResponse& res, bool changes,
                 const std::function<void(const HttpRequest&, HttpResponse&)>& inner) const {
    auto as = Enter(req, res, changes);
    if (!as) return;
    inner(*as, res);
    res.SetHeader("Cache-Control", "no-store");
    SecurityHeaders(res);
  }

  void SignIn(const HttpRequest& req, HttpResponse& res) const {
    SecurityHeaders(res);
    res.SetHeader("Cache-Control", "no-store");
    if (!SameOrigin(req)) {
      return Problem(res, 403, "cross-origin", "Forbidden",
                     "Origin: a request from another site is refused");
    }
    // Before the token is read: a client over its limit learns nothing of it.
    if (int64_t wait_ms = sign_in_limit_->RetryAfterMs(req.peer); wait_ms > 0) {
      res.SetHeader("Retry-After", std::to_string((wait_ms + 999) / 1000));
      return Problem(res, 429, "too-many-sign-ins", "Too many failed sign-ins",
                     "sign-in: too many failed attempts from this address; try again later");
    }
    auto body = ReadJsonBody(req, res, 4);
    if (!body) return;
    if (!body->is_object() || !body->contains("token") || !(*body)["token"].is_string() ||
        body->size() != 1) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "body: expected {\"token\": \"<bearer token>\"}");
    }
    const std::string token = (*body)["token"].get<std::string>();
    if (token.size() > kMaxTokenBytes) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "token: at most " + std::to_string(kMaxTokenBytes) + " bytes");
    }
    std::string name = kAnonymous;
    if (ctx_->auth->enabled()) {
      const Principal* p = token.empty() ? nullptr : ctx_->auth->IdentifyToken(token);
      if (p == nullptr) {
        sign_in_limit_->Failed(req.peer);
        return Problem(res, 401, "sign-in-refused", "Sign-in refused",
                       "token: not a token of the auth file");
      }
      name = p->name;
    }
    // A sign-in over a live session ends that one: one cookie, one session.
    sessions_->End(CookieValue(req.Header("Cookie"), kCookie));
    auto opened = sessions_->Open(name);
    if (!opened.ok()) return ProblemFor(res, opened.status());
    res.SetHeader("Set-Cookie", std::string(kCookie) + "=" + opened->id +
                                    "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" +
                                    std::to_string(o_.session_max_ms / 1000) +
                                    (o_.secure_cookie ? "; Secure" : ""));
    Signed s;
    s.session = opened->session;
    s.principal = ctx_->auth->enabled() ? ctx_->auth->Find(name) : nullptr;
    SendJson(res, 200, SessionView(s));
  }

  void Session(const HttpRequest& req, HttpResponse& res) const {
    SecurityHeaders(res);
    res.SetHeader("Cache-Control", "no-store");
    auto s = Check(req, res, false);
    if (!s) return;
    SendJson(res, 200, SessionView(*s));
  }

  void SignOut(const HttpRequest& req, HttpResponse& res) const {
    SecurityHeaders(res);
    res.SetHeader("Cache-Control", "no-store");
    auto s = Check(req, res, true);
    if (!s) return;
    sessions_->End(s->cookie);
    res.SetHeader("Set-Cookie", std::string(kCookie) +
                                    "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0" +
                                    (o_.secure_cookie ? "; Secure" : ""));
    SendJson(res, 200, {{"signed_out", true}});
  }

  void Approvals(const HttpRequest& req, HttpResponse& res) const {
    AsSession(req, res, false, [this](const HttpRequest& as, HttpResponse& out) {
      const Principal* decider = ctx_->auth->Identify(as);
      if (decider == nullptr || !MayDecideApprovals(*decider)) {
        if (ctx_->auth->Authorize(as, out, {kRoleApprover}) == nullptr) return;
      }
      const Principal& me = Who(as);
      auto pending = ListPendingApprovals(*ctx_);
      if (!pending.ok()) return ProblemFor(out, pending.status());
      std::stable_sort(pending->begin(), pending->end(),
                       [](const PendingApproval& a, const PendingApproval& b) {
                         return a.step.updated_ms > b.step.updated_ms;
                       });
      Json list = Json::array();
      for (auto& a : *pending) {
        Json v = std::move(a.view);
        v["waiting_since"] = FormatTimeMs(a.step.updated_ms);
        v["intent_key"] = ClientKeyOf(a.saga.summary.intent_key);
        v["saga_created_at"] = FormatTimeMs(a.saga.summary.created_ms);
        v["description"] = a.saga.spec.value("description", "");
        bool own = false;  // whoever asked for the commit: the card says another decides
        for (const std::string& r : Requesters(a.saga, a.step.step_id)) {
          own = own || SameName(r, me.name);
        }
        v["own"] = ctx_->auth->enabled() && own;
        v.update(MayDecide(*ctx_, me, a));
        // Why the agent asked: the model decision journaled with this call
        // (an open saga) or with the submission (a spec saga).
        if (Json d = RecordedDecision(ctx_->store, a.saga, a.step.step_id); d.is_object())
          v["decision"] = d;
        list.push_back(std::move(v));
      }
      SendJson(out, 200, {{"approvals", list}});
    });
  }

  void Sagas(const HttpRequest& req, HttpResponse& res) const {
    AsSession(req, res, false, [this](const HttpRequest& as, HttpResponse& out) {
      const Principal* p =
          ctx_->auth->Authorize(as, out, {kRoleAgent, kRoleApprover, kRoleOperator});
      if (p == nullptr) return;
      storage::SagaFilter f;
      if (as.HasParam("state") && !as.Param("state").empty()) {
        const std::string st = as.Param("state");
        if (!ParseSagaState(st)) {
          return Problem(out, 400, "invalid-request", "Invalid request",
                         "state: unknown saga state \"" + PrintableText(st) + "\"");
        }
        f.states.push_back(st);
      }
      int64_t since = 0, until = 0;
      int offset = 0, limit = kDefaultPage;
      for (auto [name, target, max] :
           {std::tuple<const char*, int64_t*, size_t>{"since", &since, 15},
            std::tuple<const char*, int64_t*, size_t>{"until", &until, 15}}) {
        if (!as.HasParam(name) || as.Param(name).empty()) continue;
        if (!AllDigits(as.Param(name), max)) {
          return Problem(out, 400, "invalid-request", "Invalid request",
                         std::string(name) + ": expected milliseconds since 1970 (digits)");
        }
        *target = std::stoll(as.Param(name));
      }
      if (as.HasParam("offset") && !as.Param("offset").empty()) {
        if (!AllDigits(as.Param("offset"), 7)) {
          return Problem(out, 400, "invalid-request", "Invalid request",
                         "offset: expected 0..9999999");
        }
        offset = std::stoi(as.Param("offset"));
      }
      if (as.HasParam("limit") && !as.Param("limit").empty()) {
        limit = AllDigits(as.Param("limit"), 4) ? std::stoi(as.Param("limit")) : -1;
        if (limit < 1 || limit > kMaxPage) {
          return Problem(out, 400, "invalid-request", "Invalid request",
                         "limit: expected 1.." + std::to_string(kMaxPage));
        }
      }
      const std::string spec = as.Param("spec");
      const std::string key = as.Param("intent_key");
      const bool all = HasRole(*p, kRoleApprover) || HasRole(*p, kRoleOperator);
      // Every filter in the query (migration 14's indexes); one more than
      // the page tells whether there is a next one.
      if (!all) f.owner = p->name;
      f.spec_name = spec;
      f.key_contains = key;
      f.created_from_ms = since;
      f.created_to_ms = until;
      f.offset = offset;
      f.limit = limit + 1;
      auto list = ctx_->store->ListSagas(f);
      if (!list.ok()) return ProblemFor(out, list.status());
      Json sagas = Json::array();
      const bool more = static_cast<int>(list->size()) > limit;
      if (more) list->pop_back();
      for (const auto& s : *list) {
        Json v = SummaryView(s);
        v["requested_by"] = OwnerOf(s.intent_key);
        sagas.push_back(std::move(v));
      }
      SendJson(out, 200, {{"sagas", sagas}, {"offset", offset}, {"limit", limit}, {"more", more}});
    });
  }

  // The saga `id` if the caller may see it, else a 404 problem.
  std::optional<storage::SagaRecord> Visible(const Principal& p, const std::string& id,
                                             HttpResponse& res) const {
    if (!HasRole(p, kRoleApprover) && !HasRole(p, kRoleOperator)) {
      return OwnedSaga(*ctx_, p, id, res);
    }
    return AnySaga(*ctx_, id, res);
  }

  void Saga(const HttpRequest& req, HttpResponse& res) const {
    AsSession(req, res, false, [this](const HttpRequest& as, HttpResponse& out) {
      const Principal* p =
          ctx_->auth->Authorize(as, out, {kRoleAgent, kRoleApprover, kRoleOperator});
      if (p == nullptr) return;
      auto rec = Visible(*p, as.matches[1], out);
      if (!rec) return;
      auto effects = ctx_->store->ListEffects(rec->summary.saga_id);
      if (!effects.ok()) return ProblemFor(out, effects.status());
      auto journal = ctx_->store->ReadJournal(rec->summary.saga_id);
      if (!journal.ok()) return ProblemFor(out, journal.status());
      Json v = SagaView(*rec, *effects);
      v["requested_by"] = OwnerOf(rec->summary.intent_key);
      v["description"] = rec->spec.value("description", "");
      Json entries = Json::array();
      for (const auto& e : *journal) entries.push_back(JournalEntryView(e));
      v["journal"] = std::move(entries);
      SendJson(out, 200, v);
    });
  }

  void Events(const HttpRequest& req, HttpResponse& res) const {
    std::string cookie;
    auto as = Enter(req, res, false, &cookie);
    if (!as) return;
    const Principal* p =
        ctx_->auth->Authorize(*as, res, {kRoleAgent, kRoleApprover, kRoleOperator});
    if (p == nullptr) return;
    auto rec = Visible(*p, as->matches[1], res);
    if (!rec) return;
    std::string after = req.Header("Last-Event-ID");
    if (after.empty()) after = req.Param("after");
    int64_t after_seq = 0;
    if (!after.empty()) {
      if (!AllDigits(after, 18)) {
        return Problem(res, 400, "invalid-request", "Invalid request",
                       "after (or Last-Event-ID): expected a journal sequence number");
      }
      after_seq = std::stoll(after);
    }
    res.status = 200;
    res.SetHeader("X-Accel-Buffering", "no");
    UiEventTail* tail = tail_;
    res.on_stream = [tail, id = rec->summary.saga_id, after_seq, cookie](http::Stream stream) {
      tail->Add(id, after_seq, cookie, std::move(stream));
    };
  }

 private:
  // False when the request names an Origin other than its own Host.
  static bool SameOrigin(const HttpRequest& req) {
    // Without an Origin (not a browser, or an old one) SameSite=Strict and
    // the CSRF token are the defence.
    if (!req.HasHeader("Origin")) return true;
    const std::string origin = req.Header("Origin");
    const std::string host = req.Header("Host");
    return !host.empty() && (origin == "http://" + host || origin == "https://" + host);
  }

  Json SessionView(const Signed& s) const {
    std::vector<std::string> roles =
        s.principal != nullptr ? s.principal->roles
                               : std::vector<std::string>{kRoleAgent, kRoleApprover, kRoleOperator};
    auto has = [&roles](const char* r) {
      return std::find(roles.begin(), roles.end(), r) != roles.end();
    };
    return Json{{"name", s.session.principal},
                {"roles", roles},
                {"csrf_token", s.session.csrf_token},
                {"may_approve",
                 has(kRoleApprover) || s.principal == nullptr || MayDecideApprovals(*s.principal)},
                {"may_operate", has(kRoleOperator)},
                {"expires_at", FormatTimeMs(s.session.expires_ms)},
                {"idle_timeout_s", o_.session_idle_ms / 1000}};
  }

  ServerContext* ctx_;
  UiOptions o_;
  UiSessions* sessions_;
  SignInLimiter* sign_in_limit_;
  UiEventTail* tail_;
};

using Handler = void (Api::*)(const HttpRequest&, HttpResponse&) const;

}  // namespace

UiService::UiService(ServerContext* ctx, const UiOptions& options, Clock* clock)
    : ctx_(ctx),
      options_(options),
      sessions_(std::make_unique<UiSessions>(clock, options.session_idle_ms, options.session_max_ms,
                                             options.max_sessions)),
      sign_in_limit_(std::make_unique<SignInLimiter>(clock, options.sign_in_max_failures,
                                                     options.sign_in_window_ms, 10'000)) {
  UiSessions* sessions = sessions_.get();
  tail_ = std::make_unique<UiEventTail>(
      ctx->store, options.poll_ms,
      [sessions](const std::string& cookie) { return sessions->Peek(cookie).has_value(); });
}

UiService::~UiService() { Stop(); }

void UiService::Stop() { tail_->Stop(); }

std::vector<Route> UiService::Routes() {
  if (!options_.enabled) return {};
  auto api =
      std::make_shared<Api>(ctx_, options_, sessions_.get(), sign_in_limit_.get(), tail_.get());
  auto on = [api](const char* method, const char* pattern, Handler h) {
    return Route{method, pattern,
                 [api, h](const HttpRequest& req, HttpResponse& res) { ((*api).*h)(req, res); }};
  };
  // The /v1 handlers, run as the session's principal.
  auto as = [api](const char* pattern, bool changes, HttpHandler inner) {
    return Route{changes ? "POST" : "GET", pattern,
                 [api, changes, inner](const HttpRequest& req, HttpResponse& res) {
                   api->AsSession(req, res, changes, inner);
                 }};
  };
  ServerContext* ctx = ctx_;
  auto v1 = [ctx](void (*fn)(ServerContext&, const HttpRequest&, HttpResponse&)) {
    return HttpHandler([ctx, fn](const HttpRequest& r, HttpResponse& o) { fn(*ctx, r, o); });
  };
  auto decide = [ctx](bool approve) {
    return HttpHandler([ctx, approve](const HttpRequest& r, HttpResponse& o) {
      DecideApproval(*ctx, r, o, approve);
    });
  };
  constexpr const char* kId = R"(([A-Za-z0-9_-]{1,128}))";
  const std::string saga = std::string("/ui/api/sagas/") + kId;
  return {
      {"GET", "/ui/?",
       [](const HttpRequest& req, HttpResponse& res) { ServeAsset("index.html", req, res); }},
      {"GET", R"(/ui/([a-z0-9_-]{1,64}\.(?:js|css|svg)))",
       [](const HttpRequest& req, HttpResponse& res) { ServeAsset(req.matches[1], req, res); }},
      on("POST", "/ui/api/session", &Api::SignIn),
      on("GET", "/ui/api/session", &Api::Session),
      on("POST", "/ui/api/session/end", &Api::SignOut),
      on("GET", "/ui/api/approvals", &Api::Approvals),
      as(R"(/ui/api/approvals/([A-Za-z0-9_.-]{1,1024})/approve)", true, decide(true)),
      as(R"(/ui/api/approvals/([A-Za-z0-9_.-]{1,1024})/reject)", true, decide(false)),
      on("GET", "/ui/api/sagas", &Api::Sagas),
      Route{"GET", saga, [api](const HttpRequest& r, HttpResponse& o) { api->Saga(r, o); }},
      Route{"GET", saga + "/events",
            [api](const HttpRequest& r, HttpResponse& o) { api->Events(r, o); }},
      as((saga + "/cancel").c_str(), true, v1(CancelSaga)),
      as((saga + "/pause").c_str(), true, v1(PauseSaga)),
      as((saga + "/resume").c_str(), true, v1(ResumeSaga)),
      as((saga + "/resolve").c_str(), true, v1(ResolveSaga)),
  };
}

}  // namespace idem::server
