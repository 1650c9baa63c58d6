// The web UI's server side (server/ui_routes.h, ui_session.h, ui_events.h)
// over a real server on a loopback port and a real SQLite journal, with
// in-process tools: sessions and their expiry, the CSRF token, roles, and
// the timeline's event stream with Last-Event-ID. The browser drives the
// same endpoints in tests/ui/ui_test.mjs; this suite also runs under ASan.

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "preview_commit/token.h"
#include "server/server.h"
#include "server/sign_in_limit.h"
#include "server/ui_routes.h"
#include "server/ui_session.h"
#include "storage/store.h"
#include "tests/test_util.h"
#include "tools/tool.h"

#include "common/json_util.h"

namespace idem::server {
namespace {

// ---- sessions

TEST(UiSessionsTest, EndsWhenIdleAndAtTheAbsoluteLimit) {
  ManualClock clock;
  UiSessions sessions(&clock, /*idle_ms=*/1000, /*max_ms=*/2500, /*max_sessions=*/10);
  auto opened = sessions.Open("maria");
  ASSERT_OK(opened);
  EXPECT_EQ(opened->id.size(), 64u);
  EXPECT_EQ(opened->session.csrf_token.size(), 64u);
  EXPECT_NE(opened->id, opened->session.csrf_token);
  // Used every 900 ms, it lives past the idle limit, up to the absolute one.
  for (int i = 0; i < 2; ++i) {
    clock.AdvanceMs(900);
    auto s = sessions.Use(opened->id);
    ASSERT_TRUE(s.has_value()) << "use " << i;
    EXPECT_EQ(s->principal, "maria");
  }
  clock.AdvanceMs(700);  // 2500 ms after sign-in
  EXPECT_FALSE(sessions.Use(opened->id).has_value());

  auto idle = sessions.Open("maria");
  ASSERT_OK(idle);
  clock.AdvanceMs(999);
  EXPECT_TRUE(sessions.Peek(idle->id).has_value());
  clock.AdvanceMs(1);  // Peek did not touch it: idle for 1000 ms
  EXPECT_FALSE(sessions.Use(idle->id).has_value());
  EXPECT_EQ(sessions.size(), 0u);
}

TEST(UiSessionsTest, SignOutUnknownIdsAndTheBound) {
  ManualClock clock;
  UiSessions sessions(&clock, 60'000, 600'000, 2);
  auto a = sessions.Open("a");
  auto b = sessions.Open("b");
  ASSERT_OK(a);
  ASSERT_OK(b);
  auto c = sessions.Open("c");
  EXPECT_EQ(c.status().code(), Code::kUnavailable);
  EXPECT_TRUE(sessions.End(a->id));
  EXPECT_FALSE(sessions.End(a->id));
  EXPECT_FALSE(sessions.Use(a->id).has_value());
  EXPECT_FALSE(sessions.Use("").has_value());
  EXPECT_FALSE(sessions.Use(b->session.csrf_token).has_value()) << "the CSRF token is no cookie";
  EXPECT_OK(sessions.Open("c"));
}

TEST(UiSessionsTest, CookieValueAndSameSecret) {
  EXPECT_EQ(CookieValue("a=1; idem_session=xyz; b=2", "idem_session"), "xyz");
  EXPECT_EQ(CookieValue("idem_session=xyz", "idem_session"), "xyz");
  EXPECT_EQ(CookieValue("xidem_session=no; idem_session_x=no", "idem_session"), "");
  EXPECT_EQ(CookieValue("", "idem_session"), "");
  EXPECT_TRUE(UiSessions::SameSecret("abc", "abc"));
  EXPECT_FALSE(UiSessions::SameSecret("abc", "abd"));
  EXPECT_FALSE(UiSessions::SameSecret("abc", "abcd"));
  EXPECT_FALSE(UiSessions::SameSecret("", ""));
}

// ---- the server

const char* kAgent = "token-agent-1";
const char* kApprover = "token-approver-1";

std::unique_ptr<Tool> Recording(const std::string& name, bool preview) {
  ToolInfo info;
  info.name = name;
  info.effect = EffectClass::kWrite;
  info.honours_keys = true;
  FunctionTool::PreviewFn pv;
  if (preview) {
    pv = [name](const ToolCall& call) {
      PreviewOutcome o;
      o.ok = true;
      o.summary = name + " " + call.args.dump();
      o.changes = call.args;
      o.resource_version = "v1";
      return o;
    };
  }
  return std::make_unique<FunctionTool>(
      info,
      [name](const ToolCall& call) {
        return ToolOutcome::Succeeded({{"ref", name + ":" + call.key}}, name + ":" + call.key);
      },
      nullptr, pv);
}

// ---- failed sign-ins

TEST(SignInLimiterTest, RefusesAnAddressPastItsFailuresUntilTheWindowMoves) {
  ManualClock clock(1'000'000);
  SignInLimiter limit(&clock, 3, 60'000, 100);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(limit.RetryAfterMs("10.0.0.1"), 0) << "failure " << i;
    limit.Failed("10.0.0.1");
    clock.AdvanceMs(1'000);
  }
  // Three failures at t=0, 1 s, 2 s; now t=3 s: free again at t=60 s.
  EXPECT_EQ(limit.RetryAfterMs("10.0.0.1"), 57'000);
  EXPECT_EQ(limit.RetryAfterMs("10.0.0.2"), 0) << "another address is not held back";
  clock.AdvanceMs(57'000);
  EXPECT_EQ(limit.RetryAfterMs("10.0.0.1"), 0) << "the first failure left the window";
  limit.Failed("10.0.0.1");
  EXPECT_GT(limit.RetryAfterMs("10.0.0.1"), 0) << "the two later ones still count";
}

TEST(SignInLimiterTest, TracksABoundedNumberOfAddresses) {
  ManualClock clock(1'000'000);
  SignInLimiter limit(&clock, 2, 60'000, 3);
  for (int i = 0; i < 10; ++i) {
    limit.Failed("10.0.0." + std::to_string(i));
    clock.AdvanceMs(10);
  }
  EXPECT_EQ(limit.size(), 3u);
  // The newest are kept, the stalest dropped.
  limit.Failed("10.0.0.9");
  EXPECT_GT(limit.RetryAfterMs("10.0.0.9"), 0);
  EXPECT_EQ(limit.RetryAfterMs("10.0.0.0"), 0);
}

class UiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = storage::OpenStore(dir_.File("journal.db"));
    ASSERT_OK(s);
    store_ = std::move(s).value();
    ASSERT_OK(tools_.Register(Recording("a.do", false)));
    ASSERT_OK(tools_.Register(Recording("pay.charge", true)));
    ring_ = std::make_unique<preview_commit::KeyRing>(
        preview_commit::KeyRing::ForTesting({{"k1", "0123456789abcdef0123456789abcdef"}}, "k1"));
    signer_ = std::make_unique<preview_commit::TokenSigner>(ring_.get(), &clock_,
                                                            preview_commit::TokenOptions{});
    ServerOptions o;
    o.port = 0;
    o.principals = {{"agent-1", Sha256Hex(kAgent), {"agent"}},
                    {"approver-1", Sha256Hex(kApprover), {"approver"}}};
    o.workers = 1;
    o.sweep_ms = 100;
    o.signer = signer_.get();
    o.clock = &clock_;
    o.ui.session_idle_ms = 60'000;
    o.ui.poll_ms = 20;
    auto srv = Server::Create(store_.get(), &tools_, o);
    ASSERT_OK(srv);
    server_ = std::move(srv).value();
    ASSERT_OK(server_->Start());
    port_ = server_->port();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  httplib::Client Client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    return c;
  }

  struct Signed {
    std::string cookie;  // "idem_session=..."
    std::string csrf;
  };
  Signed SignIn(const char* token) {
    auto r = Client().Post("/ui/api/session", Json{{"token", token}}.dump(), "application/json");
    Signed s;
    if (!r || r->status != 200) {
      ADD_FAILURE() << "sign-in: " << (r ? r->body : "no answer");
      return s;
    }
    std::string set = r->get_header_value("Set-Cookie");
    s.cookie = set.substr(0, set.find(';'));
    s.csrf = Json::parse(r->body)["csrf_token"];
    return s;
  }
  httplib::Result Post(const std::string& path, const Signed& s, const Json& body,
                       bool with_csrf = true, const std::string& origin = "") {
    httplib::Headers h{{"Cookie", s.cookie}};
    if (with_csrf) h.emplace("X-CSRF-Token", s.csrf);
    if (!origin.empty()) h.emplace("Origin", origin);
    return Client().Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result Get(const std::string& path, const Signed& s) {
    return Client().Get(path.c_str(), httplib::Headers{{"Cookie", s.cookie}});
  }

  // A saga of agent-1 whose payment waits for a person; its commit token.
  std::string WaitingSaga(std::string* saga_id, const Json& decision = nullptr) {
    Json spec = {
        {"name", "pay"},
        {"steps",
         {{{"id", "book"}, {"tool", "a.do"}, {"compensate", nullptr}, {"reason", "a test booking"}},
          {{"id", "pay"},
           {"tool", "pay.charge"},
           {"args", {{"amount", "<b>12</b>"}}},
           {"two_phase", true},
           {"approval", "human"},
           {"compensate", nullptr},
           {"reason", "a test charge"}}}}};
    auto r = Client().Post(
        "/v1/sagas",
        httplib::Headers{{"Authorization", std::string("Bearer ") + kAgent},
                         {"Idempotency-Key", "k-" + std::to_string(++n_)}},
        Json{{"spec", spec}, {"input", Json::object()}, {"decision", decision}}.dump(),
        "application/json");
    if (!r || r->status != 201) {
      ADD_FAILURE() << "submit: " << (r ? r->body : "no answer");
      return "";
    }
    *saga_id = Json::parse(r->body)["saga_id"];
    for (int i = 0; i < 500; ++i) {
      auto rec = store_->LoadSaga(*saga_id);
      if (rec.ok() && rec->summary.state == "awaiting_approval") {
        return rec->steps[1].phase.value("token", "");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "the saga never waited for approval";
    return "";
  }
  std::string State(const std::string& id) {
    auto rec = store_->LoadSaga(id);
    return rec.ok() ? rec->summary.state : rec.status().message();
  }

  test::TempDir dir_{"idem_ui_server"};
  ManualClock clock_{SystemClock::Get()->NowMs()};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  std::unique_ptr<preview_commit::KeyRing> ring_;
  std::unique_ptr<preview_commit::TokenSigner> signer_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
  int n_ = 0;
};

TEST_F(UiServerTest, ThePageIsEmbeddedWithAStrictPolicy) {
  auto r = Client().Get("/ui");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<script type=\"module\" src=\"/ui/app.js\">"), std::string::npos);
  const std::string csp = r->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << csp;
  EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
  auto js = Client().Get("/ui/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  auto again = Client().Get("/ui/app.js", {{"If-None-Match", js->get_header_value("ETag")}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 304);
  auto missing = Client().Get("/ui/nope.js");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(UiServerTest, SignInSetsAStrictCookieAndRefusesOtherTokens) {
  auto bad = Client().Post("/ui/api/session", R"({"token":"nope"})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 401);
  EXPECT_FALSE(bad->has_header("Set-Cookie"));
  auto shape = Client().Post("/ui/api/session", R"({"token":1})", "application/json");
  ASSERT_TRUE(shape);
  EXPECT_EQ(shape->status, 400);
  auto form = Client().Post("/ui/api/session", "token=x", "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 415) << "no sign-in by a cross-site form";
  auto ok = Client().Post("/ui/api/session", Json{{"token", kApprover}}.dump(), "application/json");
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  const std::string cookie = ok->get_header_value("Set-Cookie");
  EXPECT_NE(cookie.find("; HttpOnly"), std::string::npos) << cookie;
  EXPECT_NE(cookie.find("; SameSite=Strict"), std::string::npos) << cookie;
  EXPECT_NE(cookie.find("; Path=/"), std::string::npos) << cookie;
  EXPECT_EQ(cookie.find("Secure"), std::string::npos) << "no TLS here: " << cookie;
  EXPECT_EQ(ok->body.find(cookie.substr(13, 64)), std::string::npos) << "the id is not in the body";
  Json me = Json::parse(ok->body);
  EXPECT_EQ(me["name"], "approver-1");
  EXPECT_EQ(me["may_approve"], true);
  EXPECT_EQ(me["may_operate"], false);
}

TEST_F(UiServerTest, TooManyFailedSignInsAreRefusedWithoutLookingAtTheToken) {
  // ServerOptions' default: 10 failures a minute per address.
  for (int i = 0; i < 10; ++i) {
    auto bad = Client().Post("/ui/api/session", R"({"token":"guess"})", "application/json");
    ASSERT_TRUE(bad);
    ASSERT_EQ(bad->status, 401) << "failure " << i;
  }
  auto held =
      Client().Post("/ui/api/session", Json{{"token", kApprover}}.dump(), "application/json");
  ASSERT_TRUE(held);
  EXPECT_EQ(held->status, 429) << "even the right token: the answer is no oracle";
  EXPECT_FALSE(held->has_header("Set-Cookie"));
  EXPECT_EQ(held->get_header_value("Retry-After"), "60");
  clock_.AdvanceMs(60'000);
  auto ok = Client().Post("/ui/api/session", Json{{"token", kApprover}}.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(UiServerTest, ADecisionNeedsTheSessionsCsrfTokenAndChangesNothingWithout) {
  std::string saga;
  const std::string token = WaitingSaga(&saga);
  ASSERT_FALSE(token.empty());
  Signed maria = SignIn(kApprover);
  const std::string path = "/ui/api/approvals/" + token + "/approve";
  auto none = Post(path, maria, Json{{"note", "x"}}, /*with_csrf=*/false);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 403);
  EXPECT_NE(none->body.find("csrf-token-invalid"), std::string::npos) << none->body;
  Signed other = SignIn(kApprover);  // another session's token is not this one's
  Signed mixed{maria.cookie, other.csrf};
  auto wrong = Post(path, mixed, Json{{"note", "x"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 403);
  auto foreign = Post(path, maria, Json{{"note", "x"}}, true, "http://evil.example");
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->status, 403);
  EXPECT_NE(foreign->body.find("cross-origin"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(State(saga), "awaiting_approval");
  auto ok = Post(path, maria, Json{{"note", "fine"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(UiServerTest, AnAgentsSessionCannotApproveNorSeeTheInbox) {
  std::string saga;
  const std::string token = WaitingSaga(&saga);
  Signed agent = SignIn(kAgent);
  auto inbox = Get("/ui/api/approvals", agent);
  ASSERT_TRUE(inbox);
  EXPECT_EQ(inbox->status, 403);
  auto r = Post("/ui/api/approvals/" + token + "/approve", agent, Json::object());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_NE(r->body.find("forbidden"), std::string::npos) << r->body;
  EXPECT_EQ(State(saga), "awaiting_approval");
  // It sees its own saga, not the inbox.
  auto own = Get("/ui/api/sagas/" + saga, agent);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 200);
}

TEST_F(UiServerTest, TheInboxAndTheSagaListAnswerTheSignedInApprover) {
  std::string saga;
  ASSERT_FALSE(WaitingSaga(&saga).empty());
  Signed maria = SignIn(kApprover);
  auto inbox = Get("/ui/api/approvals", maria);
  ASSERT_TRUE(inbox);
  ASSERT_EQ(inbox->status, 200) << inbox->body;
  EXPECT_EQ(inbox->get_header_value("Cache-Control"), "no-store");
  Json a = Json::parse(inbox->body)["approvals"][0];
  EXPECT_EQ(a["saga_id"], saga);
  EXPECT_EQ(a["requested_by"], "agent-1");
  EXPECT_EQ(a["args"]["amount"], "<b>12</b>");
  auto list = Get("/ui/api/sagas?state=awaiting_approval&spec=pay&intent_key=k-&limit=1", maria);
  ASSERT_TRUE(list);
  ASSERT_EQ(list->status, 200) << list->body;
  EXPECT_EQ(Json::parse(list->body)["sagas"].size(), 1u);
  auto bad = Get("/ui/api/sagas?state=nope", maria);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto bad_since = Get("/ui/api/sagas?since=yesterday", maria);
  ASSERT_TRUE(bad_since);
  EXPECT_EQ(bad_since->status, 400);
  EXPECT_NE(bad_since->body.find("since"), std::string::npos);
  auto none = Client().Get("/ui/api/approvals");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
}

TEST_F(UiServerTest, TheInboxShowsTheModelDecisionRecordedWithTheSubmission) {
  const Json decision = {{"model", "gpt-4.1"},
                         {"call_id", "call_7"},
                         {"prompt_sha256", std::string(64, 'a')},
                         {"reasoning", "Ana asked for the <i>cheapest</i> fare"}};
  std::string with, without;
  ASSERT_FALSE(WaitingSaga(&with, decision).empty());
  ASSERT_FALSE(WaitingSaga(&without).empty());
  Signed maria = SignIn(kApprover);
  auto inbox = Get("/ui/api/approvals", maria);
  ASSERT_TRUE(inbox);
  ASSERT_EQ(inbox->status, 200) << inbox->body;
  int seen = 0;
  const Json body = Json::parse(inbox->body);
  for (const Json& a : body["approvals"]) {
    if (a["saga_id"] == with) {
      ++seen;
      ASSERT_TRUE(a.contains("decision")) << a.dump();
      EXPECT_EQ(a["decision"]["model"], "gpt-4.1");
      EXPECT_EQ(a["decision"]["call_id"], "call_7");
      EXPECT_EQ(a["decision"]["reasoning"], "Ana asked for the <i>cheapest</i> fare");
    } else if (a["saga_id"] == without) {
      ++seen;
      EXPECT_FALSE(a.contains("decision")) << a.dump();
    }
  }
  EXPECT_EQ(seen, 2) << inbox->body;
}

TEST_F(UiServerTest, ASessionEndsWhenIdleAndAtSignOut) {
  Signed maria = SignIn(kApprover);
  auto r = Get("/ui/api/session", maria);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  clock_.AdvanceMs(60'000);
  r = Get("/ui/api/session", maria);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << "idle for the whole idle limit";
  Signed again = SignIn(kApprover);
  auto out = Post("/ui/api/session/end", again, Json::object(), /*with_csrf=*/false);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->status, 403) << "sign-out needs the CSRF token too";
  out = Post("/ui/api/session/end", again, Json::object());
  ASSERT_TRUE(out);
  EXPECT_EQ(out->status, 200);
  EXPECT_NE(out->get_header_value("Set-Cookie").find("Max-Age=0"), std::string::npos);
  r = Get("/ui/api/session", again);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
}

// Reads the saga's event stream after `last_event_id` until `want` events
// came; answers their ids.
std::vector<int64_t> ReadEvents(int port, const std::string& cookie, const std::string& saga,
                                const std::string& last_event_id, size_t want) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5, 0);
  std::vector<int64_t> ids;
  std::string buf;
  httplib::Headers h{{"Cookie", cookie}};
  if (!last_event_id.empty()) h.emplace("Last-Event-ID", last_event_id);
  c.Get(("/ui/api/sagas/" + saga + "/events").c_str(), h, [&](const char* data, size_t n) {
    buf.append(data, n);
    size_t pos;
    while (ids.size() < want && (pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      size_t id = ev.find("id: ");
      if (id != std::string::npos) ids.push_back(std::stoll(ev.substr(id + 4)));
    }
    return ids.size() < want;
  });
  return ids;
}

TEST_F(UiServerTest, TheTimelineStreamsJournalEntriesAfterLastEventId) {
  std::string saga;
  const std::string token = WaitingSaga(&saga);
  Signed maria = SignIn(kApprover);
  auto journal = store_->ReadJournal(saga);
  ASSERT_OK(journal);
  ASSERT_GE(journal->size(), 4u);
  std::vector<int64_t> all = ReadEvents(port_, maria.cookie, saga, "", journal->size());
  ASSERT_EQ(all.size(), journal->size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], (*journal)[i].seq);
  std::vector<int64_t> rest =
      ReadEvents(port_, maria.cookie, saga, std::to_string((*journal)[1].seq), 2);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0], (*journal)[2].seq);
  // New entries arrive live: the approval's, written while the stream is open.
  std::thread approve([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto r = Post("/ui/api/approvals/" + token + "/approve", maria, Json::object());
    EXPECT_TRUE(r && r->status == 200);
  });
  std::vector<int64_t> live =
      ReadEvents(port_, maria.cookie, saga, std::to_string(journal->back().seq), 1);
  approve.join();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_GT(live[0], journal->back().seq);
  auto bad = Client().Get(("/ui/api/sagas/" + saga + "/events").c_str(),
                          httplib::Headers{{"Cookie", maria.cookie}, {"Last-Event-ID", "x"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto anonymous = Client().Get(("/ui/api/sagas/" + saga + "/events").c_str());
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
}

}  // namespace
}  // namespace idem::server
