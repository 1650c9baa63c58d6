// What the server refuses a caller who holds the roles, tried as an attacker
// or a confused agent would, over real HTTP on loopback (a real server, a
// real SQLite journal; the payment provider keeps a ledger, so "nothing was
// charged" is asserted on what it saw). Every answer is checked against
// server/openapi.json.
//
//   - a call id reused for another call: 409 call-id-reused, nothing called;
//   - a principal with the operator and approver roles that makes a charge
//     in another agent's open saga and approves it itself: 403
//     self-approval, nothing charged, until another approver decides;
//   - an auth file whose names fold alike: refused at start.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <gtest/gtest.h>
#include <httplib.h>

#include "preview_commit/token.h"
#include "server/server.h"
#include "storage/sqlite_store.h"
#include "storage/store.h"
#include "tests/loopback_server.h"
#include "tests/openapi_check.h"
#include "tests/test_util.h"
#include "tools/tool.h"

#include "common/clock.h"
#include "common/json_util.h"

namespace idem::server {
namespace {

const char* kAgent = "token-agent-ana";
const char* kMallory = "token-mallory";  // operator and approver
const char* kApprover = "token-approver-olga";

// A provider that applies each key once and counts what it applied.
struct Ledger {
  std::mutex mu;
  std::map<std::string, int> applied;  // tool:key -> times applied
  int Count(const std::string& tool) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [k, c] : applied) n += k.rfind(tool + ":", 0) == 0 ? c : 0;
    return n;
  }
};

class ServerRefusalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = storage::OpenStore(dir_.File("journal.db"));
    ASSERT_OK(s);
    store_ = std::move(s).value();
    Add("payments.refund", EffectClass::kIdempotent, false, {});
    Add("flights.cancel", EffectClass::kIdempotent, false, {});
    OpenCallPolicy book;
    book.compensate_tool = "flights.cancel";
    Add("flights.book", EffectClass::kWrite, false, book);
    OpenCallPolicy charge;  // two-phase, a person approves each charge
    charge.compensate_tool = "payments.refund";
    charge.two_phase = true;
    charge.human_approval = true;
    Add("payments.charge", EffectClass::kWrite, true, charge);

    ring_ = std::make_unique<preview_commit::KeyRing>(
        preview_commit::KeyRing::ForTesting({{"k1", std::string(32, 'k')}}, "k1"));
    signer_ = std::make_unique<preview_commit::TokenSigner>(ring_.get(), SystemClock::Get());
    ServerOptions o;
    o.principals = {{"ana", Sha256Hex(kAgent), {"agent"}},
                    {"mallory", Sha256Hex(kMallory), {"operator", "approver"}},
                    {"olga", Sha256Hex(kApprover), {"approver"}}};
    o.workers = 2;
    o.sweep_ms = 200;
    o.state_path = dir_.File("server.db");
    o.signer = signer_.get();
    ASSERT_NO_FATAL_FAILURE(server_.Start(store_.get(), &tools_, o));
    port_ = server_.port();
  }

  void TearDown() override {
    server_.Stop();
    store_.reset();
  }

  void Add(const std::string& name, EffectClass effect, bool preview, OpenCallPolicy open) {
    ToolInfo info;
    info.name = name;
    info.effect = effect;
    info.honours_keys = true;
    info.open = std::move(open);
    std::shared_ptr<Ledger> ledger = ledger_;
    FunctionTool::PreviewFn pv;
    if (preview) {
      pv = [name](const ToolCall& call) {
        PreviewOutcome o;
        o.ok = true;
        o.summary = name + " " + call.args.dump();
        o.changes = call.args;
        return o;
      };
    }
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        info,
        [ledger, name](const ToolCall& call) {
          std::lock_guard<std::mutex> lock(ledger->mu);
          ledger->applied[name + ":" + call.key] = 1;
          return ToolOutcome::Succeeded({{"ref", name + ":" + call.key}});
        },
        nullptr, pv)));
  }

  httplib::Result Post(const std::string& path, const Json& body, const char* token) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(20, 0);
    httplib::Headers h{{"Authorization", std::string("Bearer ") + token}};
    return c.Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result Get(const std::string& path, const char* token) {
    httplib::Client c("127.0.0.1", port_);
    return c.Get(path.c_str(), {{"Authorization", std::string("Bearer ") + token}});
  }

  // An open saga that `token`'s principal begins with `tools`.
  std::string Begin(const std::string& key, const Json& tools, const char* token) {
    auto r = Post("/v1/open-sagas", {{"intent_key", key}, {"tools", tools}}, token);
    Json saga = api_.Check("post", "/v1/open-sagas", r);
    EXPECT_TRUE(r && r->status == 201) << (r ? r->body : "no answer");
    return saga.value("saga_id", "");
  }

  test::TempDir dir_{"idem_server_refusals"};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  std::shared_ptr<Ledger> ledger_ = std::make_shared<Ledger>();
  std::unique_ptr<preview_commit::KeyRing> ring_;
  std::unique_ptr<preview_commit::TokenSigner> signer_;
  test::LoopbackServer server_;
  int port_ = 0;
  test::OpenApiCheck api_;
};

// A call id names one intent. Answering a reused id with the earlier call's
// result would tell the agent that a call which never ran succeeded.
TEST_F(ServerRefusalsTest, ACallIdReusedWithOtherArgumentsIs409AndCallsNothing) {
  const std::string id = Begin("trip-1", {"flights.book"}, kAgent);
  const std::string calls = "/v1/sagas/" + id + "/calls";
  const Json lisbon = {{"to", "lisbon"}};
  const Json rome = {{"to", "rome"}};
  auto first =
      Post(calls, {{"call_id", "call_1"}, {"tool", "flights.book"}, {"args", lisbon}}, kAgent);
  ASSERT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", first)["state"], "succeeded");

  auto other =
      Post(calls, {{"call_id", "call_1"}, {"tool", "flights.book"}, {"args", rome}}, kAgent);
  Json p = api_.Check("post", "/v1/sagas/{id}/calls", other);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 409) << other->body;
  EXPECT_EQ(other->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_EQ(p["type"], "urn:idem:problem:call-id-reused");
  EXPECT_EQ(p["code"], "call-id-reused");
  EXPECT_EQ(p["call_id"], "call_1");
  EXPECT_EQ(p["recorded_args_fingerprint"], Fingerprint(lisbon));
  EXPECT_EQ(p["args_fingerprint"], Fingerprint(rome));
  const std::string detail = p.value("detail", "");
  EXPECT_NE(detail.find(Fingerprint(lisbon)), std::string::npos) << detail;
  EXPECT_NE(detail.find(Fingerprint(rome)), std::string::npos) << detail;
  EXPECT_NE(detail.find("call_1"), std::string::npos) << detail;
  // `repeat` does not make a reused id a new call.
  auto repeated = Post(
      calls, {{"call_id", "call_1"}, {"tool", "flights.book"}, {"args", rome}, {"repeat", true}},
      kAgent);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", repeated)["type"],
            "urn:idem:problem:call-id-reused");
  EXPECT_EQ(ledger_->Count("flights.book"), 1) << "nothing was booked for rome";

  // The same id with its own arguments still answers from the journal.
  auto same =
      Post(calls, {{"call_id", "call_1"}, {"tool", "flights.book"}, {"args", lisbon}}, kAgent);
  Json s = api_.Check("post", "/v1/sagas/{id}/calls", same);
  EXPECT_EQ(same->status, 200);
  EXPECT_EQ(s["deduplicated"], true);
  EXPECT_EQ(s["reason"], "same call_id");
  // A new id with `repeat` is a second effect on purpose.
  auto again = Post(
      calls, {{"call_id", "call_2"}, {"tool", "flights.book"}, {"args", lisbon}, {"repeat", true}},
      kAgent);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", again)["step_id"], "c2");
  EXPECT_EQ(ledger_->Count("flights.book"), 2);
}

// The attack: mallory holds operator (so may call in any saga) and approver
// (so may decide on commits). She makes a charge in ana's open saga, lists
// the approvals, and approves her own charge.
TEST_F(ServerRefusalsTest, AnOperatorCannotApproveTheChargeItMadeInAnotherAgentsSaga) {
  const std::string id = Begin("shop-1", {"payments.charge"}, kAgent);
  const std::string calls = "/v1/sagas/" + id + "/calls";
  auto call =
      Post(calls, {{"call_id", "m1"}, {"tool", "payments.charge"}, {"args", {{"amount", 99900}}}},
           kMallory);
  Json answer = api_.Check("post", "/v1/sagas/{id}/calls", call);
  ASSERT_EQ(call->status, 202) << call->body;
  ASSERT_EQ(answer["state"], "awaiting_approval");

  Json list = api_.Check("get", "/v1/approvals", Get("/v1/approvals", kMallory));
  ASSERT_EQ(list["approvals"].size(), 1u) << list.dump();
  const Json& pending = list["approvals"][0];
  EXPECT_EQ(pending["requested_by"], "mallory") << "the caller asked for the charge";
  EXPECT_EQ(pending["may_decide"], false);
  EXPECT_NE(pending.value("why_not", "").find("self-approval"), std::string::npos)
      << pending.dump();
  const std::string token = pending["token"];

  auto own = Post("/v1/approvals/" + token + "/approve", {{"note", "looks fine"}}, kMallory);
  Json refused = api_.Check("post", "/v1/approvals/{token}/approve", own);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 403) << own->body;
  EXPECT_EQ(refused["type"], "urn:idem:problem:self-approval");
  EXPECT_NE(refused.value("detail", "").find("mallory asked for this commit"), std::string::npos)
      << refused.dump();
  EXPECT_EQ(ledger_->Count("payments.charge"), 0) << "nothing was charged";
  auto rec = store_->LoadSaga(id);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "awaiting_approval");
  bool by_mallory = false;
  auto journal = store_->ReadJournal(id);
  ASSERT_OK(journal);
  for (const auto& e : *journal) {
    if (e.event == "call_appended") by_mallory = e.data.value("by", "") == "mallory";
    EXPECT_NE(e.event, "approved") << "no approval was recorded";
  }
  EXPECT_TRUE(by_mallory) << "the call records who made it";

  // Another approver decides; the charge runs once.
  auto olga = Post("/v1/approvals/" + token + "/approve", {{"note", "checked"}}, kApprover);
  Json done = api_.Check("post", "/v1/approvals/{token}/approve", olga);
  ASSERT_EQ(olga->status, 200) << olga->body;
  EXPECT_EQ(ledger_->Count("payments.charge"), 1);
  (void)done;
}

TEST(PrincipalNames, NamesThatFoldAlikeAreRefusedNamingBoth) {
  auto entry = [](const std::string& name, const std::string& token) {
    return Json{{"name", name}, {"token_sha256", Sha256Hex(token)}, {"roles", {"approver"}}};
  };
  for (const std::string& twin : {std::string("Maria"), std::string("MARIA"),
                                  std::string("\xEF\xBD\x8D"
                                              "aria")}) {  // fullwidth m
    SCOPED_TRACE(twin);
    Json doc = Json::array({entry("maria", "t1"), entry("olga", "t2"), entry(twin, "t3")});
    auto parsed = ParsePrincipals(doc.dump());
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().message(),
              "auth[2].name: " + Json(twin).dump() +
                  " and auth[0].name \"maria\" are one name to idem (compared after Unicode NFKC "
                  "normalization and case folding): give each caller its own name");
  }
  // Names beyond ASCII are names; invisible characters are not.
  ASSERT_OK(ParsePrincipals(Json::array({entry("maria", "t1"), entry("Zoë", "t2")}).dump()));
  auto hidden = ParsePrincipals(Json::array({entry("mar\xE2\x80\x8Bia", "t1")}).dump());
  ASSERT_FALSE(hidden.ok());
  EXPECT_NE(hidden.status().message().find("auth[0].name: expected"), std::string::npos)
      << hidden.status().message();
  // A server given such principals directly refuses to start, too.
  test::TempDir dir{"idem_fold"};
  auto store = storage::OpenStore(dir.File("j.db"));
  ASSERT_OK(store);
  ToolRegistry tools;
  ServerOptions o;
  o.port = 0;
  o.state_path = dir.File("s.db");
  o.principals = {{"maria", Sha256Hex("t1"), {"approver"}}, {"Maria", Sha256Hex("t2"), {"agent"}}};
  auto srv = Server::Create(store->get(), &tools, o);
  ASSERT_FALSE(srv.ok());
  EXPECT_NE(srv.status().message().find("principals[1].name: \"Maria\" and principals[0].name"),
            std::string::npos)
      << srv.status().message();
}

}  // namespace
}  // namespace idem::server
