// The idem server end to end: a real server on an ephemeral loopback port,
// a real SQLite journal, in-process FunctionTools as providers. Every
// response is checked against server/openapi.json (status declared for the
// operation, content type declared, required fields and types of the body).

#include "server/server.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "preview_commit/token.h"
#include "storage/sqlite_store.h"
#include "storage/store.h"
#include "tests/loopback_server.h"
#include "tests/openapi_check.h"
#include "tests/test_util.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace idem::server {
namespace {

namespace fs = std::filesystem;

using Api = test::OpenApiCheck;

// ---- providers

struct Ledger {
  std::mutex mu;
  std::map<std::string, int> applied;  // key -> times applied
  int previews = 0;
  int Count(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [k, c] : applied) n += k.rfind(prefix, 0) == 0 ? c : 0;
    return n;
  }
};

std::unique_ptr<Tool> MakeTool(const std::string& name, std::shared_ptr<Ledger> ledger,
                               bool preview) {
  ToolInfo info;
  info.name = name;
  info.effect = EffectClass::kWrite;
  info.honours_keys = true;
  auto invoke = [ledger, name](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(ledger->mu);
    if (ledger->applied[call.key] == 0) ledger->applied[call.key] = 1;
    return ToolOutcome::Succeeded({{"ref", name + ":" + call.key}}, name + ":" + call.key);
  };
  auto lookup = [ledger](const std::string& key) {
    std::lock_guard<std::mutex> lock(ledger->mu);
    LookupOutcome o;
    o.kind = ledger->applied[key] > 0 ? LookupKind::kApplied : LookupKind::kNotApplied;
    return o;
  };
  FunctionTool::PreviewFn pv;
  if (preview) {
    pv = [ledger, name](const ToolCall& call) {
      std::lock_guard<std::mutex> lock(ledger->mu);
      ++ledger->previews;
      PreviewOutcome o;
      o.ok = true;
      o.summary = name + " " + call.args.dump();
      o.changes = call.args;
      o.resource_version = "v1";
      return o;
    };
  }
  return std::make_unique<FunctionTool>(info, invoke, lookup, pv);
}

const char* kAgent1 = "token-agent-1";
const char* kAgent2 = "token-agent-2";
const char* kApprover = "token-approver-1";
const char* kOperator = "token-operator-1";
// Approval policies: roles of the auth file beyond the API's.
const char* kFinance1 = "token-finance-1";          // approver and finance
const char* kFinance2 = "token-finance-2";          // finance only
const char* kAgentFinance = "token-agent-finance";  // an agent who also holds finance

Json OneStepSpec() {
  return {{"name", "trip"},
          {"steps",
           {{{"id", "book"},
             {"tool", "a.do"},
             {"args", {{"who", "${input.who}"}}},
             {"compensate", {{"tool", "a.undo"}}}}}}};
}

Json PaySpec() {
  return {{"steps",
           {{{"id", "book"}, {"tool", "a.do"}, {"compensate", {{"tool", "a.undo"}}}},
            {{"id", "pay"},
             {"tool", "pay.charge"},
             {"args", {{"amount", "${input.amount}"}}},
             {"two_phase", true},
             {"approval", "human"},
             {"compensate", {{"tool", "pay.refund"}}}}}}};
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = storage::OpenStore(dir_.File("journal.db"));
    ASSERT_OK(s);
    store_ = std::move(s).value();
    ledger_ = std::make_shared<Ledger>();
    for (const char* n : {"a.do", "a.undo", "pay.refund"}) {
      ASSERT_TRUE(tools_.Register(MakeTool(n, ledger_, false)).ok());
    }
    ASSERT_TRUE(tools_.Register(MakeTool("pay.charge", ledger_, true)).ok());
    // For open sagas: tools whose registry entry names their compensation.
    for (auto [name, preview] :
         {std::pair<const char*, bool>{"open.book", false}, {"open.pay", true}}) {
      auto tool = MakeTool(name, ledger_, preview);
      ToolInfo info = tool->info();
      info.open.compensate_tool = "a.undo";
      info.open.compensate_args = {{"ref", "${result.ref}"}};
      info.open.two_phase = preview;
      info.open.human_approval = preview;
      Tool* raw = tool.get();
      ASSERT_TRUE(tools_
                      .Register(std::make_unique<FunctionTool>(
                          info, [raw](const ToolCall& c) { return raw->Invoke(c); },
                          [raw](const std::string& k) { return raw->Lookup(k); },
                          preview ? FunctionTool::PreviewFn(
                                        [raw](const ToolCall& c) { return raw->Preview(c); })
                                  : nullptr))
                      .ok());
      open_tools_.push_back(std::move(tool));
    }
    // No keys, no status, no answer: parks its saga needs_attention.
    ToolInfo lost;
    lost.name = "lost.do";
    lost.effect = EffectClass::kWrite;
    ASSERT_TRUE(tools_
                    .Register(std::make_unique<FunctionTool>(
                        lost, [](const ToolCall&) { return ToolOutcome::Unknown("timed out"); }))
                    .ok());
    // A step that takes until the test releases it (at most 10 s).
    ToolInfo slow;
    slow.name = "slow.do";
    slow.effect = EffectClass::kWrite;
    slow.honours_keys = true;
    std::shared_ptr<std::atomic<bool>> release = release_;
    std::shared_ptr<Ledger> ledger = ledger_;
    ASSERT_TRUE(tools_
                    .Register(std::make_unique<FunctionTool>(
                        slow,
                        [release, ledger](const ToolCall& call) {
                          for (int i = 0; i < 1000 && !release->load(); ++i) {
                            std::this_thread::sleep_for(std::chrono::milliseconds(10));
                          }
                          std::lock_guard<std::mutex> lock(ledger->mu);
                          ledger->applied[call.key] = 1;
                          return ToolOutcome::Succeeded({{"ref", "slow:" + call.key}});
                        }))
                    .ok());
    ring_ = std::make_unique<preview_commit::KeyRing>(
        preview_commit::KeyRing::ForTesting({{"k1", "0123456789abcdef0123456789abcdef"}}, "k1"));
    preview_commit::TokenOptions to;
    to.max_ttl_ms = 30LL * 24 * 3600 * 1000;
    signer_ = std::make_unique<preview_commit::TokenSigner>(ring_.get(), SystemClock::Get(), to);

    ServerOptions o;
    o.principals = {{"agent-1", Sha256Hex(kAgent1), {"agent"}},
                    {"agent-2", Sha256Hex(kAgent2), {"agent"}},
                    {"approver-1", Sha256Hex(kApprover), {"approver"}},
                    {"ops-1", Sha256Hex(kOperator), {"operator"}},
                    {"maria", Sha256Hex(kFinance1), {"approver", "finance"}},
                    {"jonas", Sha256Hex(kFinance2), {"finance"}},
                    {"agent-fin", Sha256Hex(kAgentFinance), {"agent", "finance"}}};
    o.workers = 2;
    o.sweep_ms = 200;
    o.state_path = dir_.File("server.db");
    o.signer = signer_.get();
    o.http_threads = 16;
    ASSERT_NO_FATAL_FAILURE(server_.Start(store_.get(), &tools_, o));
    port_ = server_.port();
  }

  void TearDown() override {
    server_.Stop();
    store_.reset();
  }

  httplib::Headers Auth(const char* token) const {
    httplib::Headers h;
    if (token != nullptr) h.emplace("Authorization", std::string("Bearer ") + token);
    return h;
  }

  httplib::Result Post(const std::string& path, const Json& body, const char* token,
                       const std::string& key = "") {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(20, 0);
    httplib::Headers h = Auth(token);
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return c.Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result PostRaw(const std::string& path, const std::string& body, const char* token,
                          const std::string& key = "") {
    httplib::Client c("127.0.0.1", port_);
    httplib::Headers h = Auth(token);
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return c.Post(path.c_str(), h, body, "application/json");
  }
  httplib::Result Put(const std::string& path, const Json& body, const char* token) {
    httplib::Client c("127.0.0.1", port_);
    return c.Put(path.c_str(), Auth(token), body.dump(), "application/json");
  }
  httplib::Result Get(const std::string& path, const char* token) {
    httplib::Client c("127.0.0.1", port_);
    return c.Get(path.c_str(), Auth(token));
  }

  // Polls GET /v1/sagas/{id} until the saga is in `state` (10 s at most).
  Json WaitFor(const std::string& id, const std::string& state, const char* token = kAgent1) {
    Json saga;
    for (int i = 0; i < 500; ++i) {
      auto r = Get("/v1/sagas/" + id, token);
      saga = api_.Check("get", "/v1/sagas/{id}", r);
      if (saga.is_object() && saga.value("state", "") == state) return saga;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "saga " << id << " never reached " << state << ": " << saga.dump();
    return saga;
  }

  // A POST with extra headers (Prefer).
  httplib::Result PostWith(const std::string& path, const Json& body, const char* token,
                           httplib::Headers extra) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    httplib::Headers h = Auth(token);
    h.insert(extra.begin(), extra.end());
    return c.Post(path.c_str(), h, body.dump(), "application/json");
  }

  void ExpectHealthy() {
    auto r = Get("/healthz", nullptr);
    api_.Check("get", "/healthz", r);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }

  // A raw request: what httplib's client would not send. Returns the status;
  // raw_response_ holds the head (`whole`: all until the server closes).
  int Raw(const std::string& request, bool whole = false) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
      got.append(buf, static_cast<size_t>(n));
      if (!whole && got.find("\r\n\r\n") != std::string::npos) break;
    }
    ::close(fd);
    if (got.rfind("HTTP/1.1 ", 0) != 0) return -1;
    raw_response_ = got;
    return std::stoi(got.substr(9, 3));
  }

  test::TempDir dir_{"idem_server"};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  std::shared_ptr<Ledger> ledger_;
  std::shared_ptr<std::atomic<bool>> release_ = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<preview_commit::KeyRing> ring_;
  std::unique_ptr<preview_commit::TokenSigner> signer_;
  test::LoopbackServer server_;
  int port_ = 0;
  Api api_;
  std::string raw_response_;
  std::vector<std::unique_ptr<Tool>> open_tools_;  // wrapped by open.book, open.pay
};

TEST_F(ServerTest, SubmitThenPollUntilSucceeded) {
  auto r =
      Post("/v1/sagas", {{"spec", OneStepSpec()}, {"input", {{"who", "ada"}}}}, kAgent1, "trip-1");
  Json saga = api_.Check("post", "/v1/sagas", r);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(saga["intent_key"], "trip-1");
  EXPECT_EQ(r->get_header_value("Location"), "/v1/sagas/" + saga["saga_id"].get<std::string>());
  Json done = WaitFor(saga["saga_id"], "succeeded");
  ASSERT_EQ(done["steps"].size(), 1u);
  EXPECT_EQ(done["steps"][0]["state"], "succeeded");
  EXPECT_EQ(done["steps"][0]["args"]["who"], "ada");
  ASSERT_EQ(done["effects"].size(), 1u);
  EXPECT_EQ(ledger_->Count(""), 1);

  auto list = Get("/v1/sagas?status=succeeded&limit=10", kAgent1);
  Json l = api_.Check("get", "/v1/sagas", list);
  ASSERT_EQ(l["sagas"].size(), 1u);
  EXPECT_EQ(l["sagas"][0]["saga_id"], saga["saga_id"]);
  auto bad = Get("/v1/sagas?status=nope", kAgent1);
  api_.Check("get", "/v1/sagas", bad);
  EXPECT_EQ(bad->status, 400);

  // A retry after completion: the stored response, marked as a replay.
  auto again =
      Post("/v1/sagas", {{"input", {{"who", "ada"}}}, {"spec", OneStepSpec()}}, kAgent1, "trip-1");
  Json replay = api_.Check("post", "/v1/sagas", again);
  EXPECT_EQ(again->status, 201);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay["saga_id"], saga["saga_id"]);
  EXPECT_EQ(ledger_->Count(""), 1);

  auto m = Get("/metrics", nullptr);
  api_.Check("get", "/metrics", m);
  EXPECT_NE(m->body.find("idem_sagas{state=\"succeeded\"} 1"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("idem_step_outcomes_total{outcome=\"succeeded\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("idem_duplicates_absorbed_total{how=\"stored_response\"} 1"),
            std::string::npos);
  EXPECT_NE(m->body.find("idem_saga_time_to_terminal_seconds_count 1"), std::string::npos);
  auto ready = Get("/readyz", nullptr);
  api_.Check("get", "/readyz", ready);
  EXPECT_EQ(ready->status, 200);
}

TEST_F(ServerTest, CancellingARunningSagaRollsItBackAfterTheStepInProgress) {
  Json spec = {{"name", "slow"},
               {"steps",
                {{{"id", "first"}, {"tool", "slow.do"}, {"compensate", {{"tool", "a.undo"}}}},
                 {{"id", "second"}, {"tool", "a.do"}, {"compensate", {{"tool", "a.undo"}}}}}}};
  auto r = Post("/v1/sagas", {{"spec", spec}, {"input", Json::object()}}, kAgent1, "slow-1");
  Json saga = api_.Check("post", "/v1/sagas", r);
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string id = saga["saga_id"];
  // Wait until the first step's call is in progress.
  for (int i = 0; i < 500; ++i) {
    Json s = Json::parse(Get("/v1/sagas/" + id, kAgent1)->body);
    if (s["steps"][0]["state"] == "submitted") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto cancel = Post("/v1/sagas/" + id + "/cancel", Json::object(), kAgent1);
  api_.Check("post", "/v1/sagas/{id}/cancel", cancel);
  ASSERT_EQ(cancel->status, 202) << cancel->body;
  release_->store(true);
  Json done = WaitFor(id, "compensated");
  EXPECT_EQ(done["steps"][0]["state"], "compensated");
  EXPECT_EQ(done["steps"][1]["state"], "planned") << "the second step never ran";
  EXPECT_NE(done["reason"].get<std::string>().find("cancelled by agent-1"), std::string::npos)
      << done.dump();
  EXPECT_EQ(ledger_->Count(done["steps"][1]["key"].get<std::string>()), 0);
}

// An approval policy over HTTP (issue 19): the pending approval shows the
// rule and the approvals so far; the rule's role decides; the requester never
// counts; the same person twice is 409; two distinct people commit.
TEST_F(ServerTest, ApprovalPolicyQuorumOverHttp) {
  Json spec = PaySpec();
  spec["name"] = "policy-pay";
  spec["steps"][1]["approval"] = {
      {"rules",
       {{{"when", "preview.changes.amount <= 100"}, {"pass", "small: no person needed"}},
        {{"role", "finance"}, {"quorum", 2}}}}};
  // A small payment passes by policy and journals why.
  auto small = Post("/v1/sagas", {{"spec", spec}, {"input", {{"amount", 40}}}}, kAgentFinance,
                    "policy-small");
  ASSERT_EQ(small->status, 201) << small->body;
  Json passed =
      WaitFor(api_.Check("post", "/v1/sagas", small)["saga_id"], "succeeded", kAgentFinance);
  auto big = Post("/v1/sagas", {{"spec", spec}, {"input", {{"amount", 900}}}}, kAgentFinance,
                  "policy-big");
  ASSERT_EQ(big->status, 201) << big->body;
  const std::string id = api_.Check("post", "/v1/sagas", big)["saga_id"];
  WaitFor(id, "awaiting_approval", kAgentFinance);

  auto list_as = [&](const char* token) {
    Json l = api_.Check("get", "/v1/approvals", Get("/v1/approvals", token));
    for (const auto& a : l.value("approvals", Json::array())) {
      if (a["saga_id"] == id) return a;
    }
    ADD_FAILURE() << "no pending approval of " << id << ": " << l.dump();
    return Json();
  };
  Json pending = list_as(kFinance2);  // finance only: may list
  EXPECT_EQ(pending["policy"], (Json{{"rule", 1}, {"role", "finance"}, {"quorum", 2}}));
  EXPECT_EQ(pending["approvals"], Json::array());
  EXPECT_EQ(pending["may_decide"], true);
  const std::string token = pending["token"];
  EXPECT_EQ(list_as(kApprover)["may_decide"], false);
  EXPECT_NE(list_as(kApprover).value("why_not", "").find("does not hold the role finance"),
            std::string::npos);

  auto path = "/v1/approvals/" + token + "/approve";
  // An approver without finance: 403 role-missing, nothing changes.
  auto no_role = Post(path, {{"note", "fine"}}, kApprover);
  Json p1 = api_.Check("post", "/v1/approvals/{token}/approve", no_role);
  EXPECT_EQ(no_role->status, 403);
  EXPECT_EQ(p1["type"], "urn:idem:problem:role-missing");
  // The requester holds finance, and still never counts.
  auto own = Post(path, {{"note", "mine"}}, kAgentFinance);
  Json p2 = api_.Check("post", "/v1/approvals/{token}/approve", own);
  EXPECT_EQ(own->status, 403);
  EXPECT_EQ(p2["type"], "urn:idem:problem:self-approval");
  EXPECT_NE(p2.value("detail", "").find("the requester never counts"), std::string::npos);

  auto first = Post(path, {{"note", "checked the invoice"}}, kFinance1);
  Json s1 = api_.Check("post", "/v1/approvals/{token}/approve", first);
  ASSERT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(s1["state"], "awaiting_approval");
  EXPECT_EQ(ledger_->Count(s1["steps"][1].value("key", "")), 0) << "one of two: no charge";
  Json after = list_as(kFinance2);
  ASSERT_EQ(after["approvals"].size(), 1u);
  EXPECT_EQ(after["approvals"][0]["by"], "maria");
  EXPECT_EQ(after["approvals"][0]["role"], "finance");
  EXPECT_EQ(after["approvals"][0]["note"], "checked the invoice");
  EXPECT_EQ(list_as(kFinance1)["may_decide"], false) << "maria decided already";

  auto twice = Post(path, {{"note", "again"}}, kFinance1);
  Json p3 = api_.Check("post", "/v1/approvals/{token}/approve", twice);
  EXPECT_EQ(twice->status, 409);
  EXPECT_EQ(p3["type"], "urn:idem:problem:already-decided");
  EXPECT_EQ(list_as(kFinance2)["approvals"].size(), 1u) << "nothing changed";

  auto second = Post(path, {{"note", "ok"}}, kFinance2);
  Json s2 = api_.Check("post", "/v1/approvals/{token}/approve", second);
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_EQ(s2["state"], "succeeded");
  EXPECT_EQ(ledger_->Count(s2["steps"][1].value("key", "")), 1);
  EXPECT_EQ(passed["state"], "succeeded");
}

TEST_F(ServerTest, ApprovalFlowOverHttp) {
  auto put = Put("/v1/specs/pay", PaySpec(), kAgent1);
  Json v = api_.Check("put", "/v1/specs/{name}", put);
  ASSERT_EQ(put->status, 201) << put->body;
  EXPECT_EQ(v["version"], 1);
  auto same = Put("/v1/specs/pay", PaySpec(), kAgent1);
  EXPECT_EQ(api_.Check("put", "/v1/specs/{name}", same)["version"], 1);
  EXPECT_EQ(same->status, 200) << "no version given, the same content: the same version";
  Json described = PaySpec();
  described["description"] = "pay after booking";
  auto next = Put("/v1/specs/pay", described, kAgent1);
  EXPECT_EQ(api_.Check("put", "/v1/specs/{name}", next)["version"], 2);
  EXPECT_EQ(next->status, 201) << "no version given, other content: a new version";
  Json v1 = PaySpec();
  v1["version"] = 1;
  v1["description"] = "changed";
  auto clash = Put("/v1/specs/pay", v1, kAgent1);
  api_.Check("put", "/v1/specs/{name}", clash);
  EXPECT_EQ(clash->status, 409) << "versions never change";
  Json badspec = PaySpec();
  badspec["steps"][0]["tool"] = "no.such";
  auto invalid = Put("/v1/specs/pay", badspec, kAgent1);
  Json p = api_.Check("put", "/v1/specs/{name}", invalid);
  EXPECT_EQ(invalid->status, 422);
  EXPECT_NE(p.value("detail", "").find("steps[0].tool"), std::string::npos) << p.dump();
  auto specs = Get("/v1/specs", kApprover);
  Json sl = api_.Check("get", "/v1/specs", specs);
  ASSERT_EQ(sl["specs"].size(), 1u);
  EXPECT_EQ(sl["specs"][0]["latest_version"], 2);
  auto one = Get("/v1/specs/pay?version=1", kAgent1);
  Json sv = api_.Check("get", "/v1/specs/{name}", one);
  EXPECT_EQ(sv["version"], 1);

  // Three sagas wait for approval: one approved, one rejected, one cancelled.
  std::vector<std::string> ids;
  for (const char* key : {"pay-1", "pay-2", "pay-3"}) {
    auto r = Post("/v1/sagas", {{"spec", "pay@1"}, {"input", {{"amount", 40}}}}, kAgent1, key);
    Json s = api_.Check("post", "/v1/sagas", r);
    ASSERT_EQ(r->status, 201) << r->body;
    ids.push_back(s["saga_id"]);
  }
  for (const auto& id : ids) {
    Json w = WaitFor(id, "awaiting_approval");
    EXPECT_EQ(w["steps"][1]["state"], "awaiting_approval");
    EXPECT_TRUE(w["steps"][1]["preview"].is_object());
  }
  EXPECT_EQ(ledger_->Count(""), 3) << "only the first steps ran";

  auto forbidden = Get("/v1/approvals", kAgent1);
  api_.Check("get", "/v1/approvals", forbidden);
  EXPECT_EQ(forbidden->status, 403);
  auto list = Get("/v1/approvals", kApprover);
  Json a = api_.Check("get", "/v1/approvals", list);
  ASSERT_EQ(list->status, 200);
  ASSERT_EQ(a["approvals"].size(), 3u);
  std::map<std::string, std::string> token_of;
  for (const auto& e : a["approvals"]) {
    EXPECT_EQ(e["requested_by"], "agent-1");
    token_of[e["saga_id"]] = e["token"];
  }

  // An agent cannot approve; a forged token is refused; the approver can.
  auto by_agent = Post("/v1/approvals/" + token_of[ids[0]] + "/approve", Json::object(), kAgent1);
  api_.Check("post", "/v1/approvals/{token}/approve", by_agent);
  EXPECT_EQ(by_agent->status, 403);
  std::string forged = token_of[ids[0]];
  forged[forged.size() - 3] = forged[forged.size() - 3] == 'A' ? 'B' : 'A';
  auto bad = Post("/v1/approvals/" + forged + "/approve", Json::object(), kApprover);
  Json bp = api_.Check("post", "/v1/approvals/{token}/approve", bad);
  EXPECT_EQ(bad->status, 403);
  EXPECT_EQ(bp["type"], "urn:idem:problem:invalid-commit-token");

  auto ok = Post("/v1/approvals/" + token_of[ids[0]] + "/approve", {{"note", "fine"}}, kApprover);
  Json s0 = api_.Check("post", "/v1/approvals/{token}/approve", ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(s0["state"], "succeeded");
  EXPECT_EQ(s0["steps"][1]["approval"]["by"], "approver-1");

  auto no_reason = Post("/v1/approvals/" + token_of[ids[1]] + "/reject", Json::object(), kApprover);
  api_.Check("post", "/v1/approvals/{token}/reject", no_reason);
  EXPECT_EQ(no_reason->status, 400);
  auto rej =
      Post("/v1/approvals/" + token_of[ids[1]] + "/reject", {{"reason", "too much"}}, kApprover);
  Json s1 = api_.Check("post", "/v1/approvals/{token}/reject", rej);
  ASSERT_EQ(rej->status, 200) << rej->body;
  EXPECT_EQ(s1["state"], "compensated");

  auto cancel = Post("/v1/sagas/" + ids[2] + "/cancel", Json::object(), kAgent1);
  Json s2 = api_.Check("post", "/v1/sagas/{id}/cancel", cancel);
  ASSERT_EQ(cancel->status, 200) << cancel->body;
  EXPECT_EQ(s2["state"], "compensated");
  auto again = Post("/v1/sagas/" + ids[0] + "/cancel", Json::object(), kAgent1);
  api_.Check("post", "/v1/sagas/{id}/cancel", again);
  EXPECT_EQ(again->status, 409) << "a finished saga cannot be cancelled";

  EXPECT_EQ(ledger_->Count(""), 3 + 1 + 2) << "3 first steps, 1 charge, 2 undos";
  auto m = Get("/metrics", nullptr);
  EXPECT_NE(m->body.find("idem_compensations_total{outcome=\"compensated\"} 2"), std::string::npos)
      << m->body;
}

TEST_F(ServerTest, FiftyConcurrentSubmissionsWithOneKeyMakeOneSaga) {
  Json body = {{"spec", OneStepSpec()}, {"input", {{"who", "bob"}}}};
  std::mutex mu;
  std::map<int, int> statuses;
  std::set<std::string> saga_ids;
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int i = 0; i < 50; ++i) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      auto r = Post("/v1/sagas", body, kAgent1, "same-key");
      Json b = api_.Check("post", "/v1/sagas", r);
      std::lock_guard<std::mutex> lock(mu);
      if (!r) return;
      ++statuses[r->status];
      if (r->status == 200 || r->status == 201) saga_ids.insert(b["saga_id"].get<std::string>());
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  int total = 0;
  for (const auto& [status, n] : statuses) {
    EXPECT_TRUE(status == 201 || status == 200 || status == 409) << status;
    total += n;
  }
  EXPECT_EQ(total, 50);
  EXPECT_EQ(saga_ids.size(), 1u);
  EXPECT_GE(statuses[201], 1);
  WaitFor(*saga_ids.begin(), "succeeded");
  auto list = Get("/v1/sagas", kAgent1);
  Json l = api_.Check("get", "/v1/sagas", list);
  EXPECT_EQ(l["sagas"].size(), 1u);
  EXPECT_EQ(ledger_->Count(""), 1);
}

TEST_F(ServerTest, IdempotencyKeyErrors) {
  Json body = {{"spec", OneStepSpec()}, {"input", {{"who", "cy"}}}};
  auto missing = Post("/v1/sagas", body, kAgent1);
  Json p = api_.Check("post", "/v1/sagas", missing);
  EXPECT_EQ(missing->status, 400);
  EXPECT_EQ(missing->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_EQ(p["type"], "urn:idem:problem:idempotency-key-missing");

  auto first = Post("/v1/sagas", body, kAgent1, "k-1");
  api_.Check("post", "/v1/sagas", first);
  EXPECT_EQ(first->status, 201);
  Json other = body;
  other["input"]["who"] = "dee";
  auto reused = Post("/v1/sagas", other, kAgent1, "k-1");
  Json rp = api_.Check("post", "/v1/sagas", reused);
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(rp["type"], "urn:idem:problem:idempotency-key-reused");
}

TEST_F(ServerTest, SagasAndKeysBelongToTheirCaller) {
  Json body = {{"spec", OneStepSpec()}, {"input", {{"who", "eve"}}}};
  auto mine = Post("/v1/sagas", body, kAgent1, "shared-key");
  Json s1 = api_.Check("post", "/v1/sagas", mine);
  ASSERT_EQ(mine->status, 201);
  std::string id = s1["saga_id"];
  auto peek = Get("/v1/sagas/" + id, kAgent2);
  api_.Check("get", "/v1/sagas/{id}", peek);
  EXPECT_EQ(peek->status, 404);
  auto cancel = Post("/v1/sagas/" + id + "/cancel", Json::object(), kAgent2);
  api_.Check("post", "/v1/sagas/{id}/cancel", cancel);
  EXPECT_EQ(cancel->status, 404);
  auto theirs = Post("/v1/sagas", body, kAgent2, "shared-key");
  Json s2 = api_.Check("post", "/v1/sagas", theirs);
  ASSERT_EQ(theirs->status, 201);
  EXPECT_NE(s2["saga_id"], s1["saga_id"]);
  EXPECT_NE(theirs->get_header_value("Idempotent-Replayed"), "true");
  auto list = Get("/v1/sagas", kAgent2);
  Json l = api_.Check("get", "/v1/sagas", list);
  ASSERT_EQ(l["sagas"].size(), 1u);
  EXPECT_EQ(l["sagas"][0]["saga_id"], s2["saga_id"]);
}

TEST_F(ServerTest, AuthenticationAndRoles) {
  Json body = {{"spec", OneStepSpec()}, {"input", Json::object()}};
  auto none = Post("/v1/sagas", body, nullptr, "k");
  api_.Check("post", "/v1/sagas", none);
  EXPECT_EQ(none->status, 401);
  EXPECT_NE(none->get_header_value("WWW-Authenticate"), "");
  auto wrong = Post("/v1/sagas", body, "not-a-token", "k");
  api_.Check("post", "/v1/sagas", wrong);
  EXPECT_EQ(wrong->status, 401);
  auto role = Post("/v1/sagas", body, kApprover, "k");
  api_.Check("post", "/v1/sagas", role);
  EXPECT_EQ(role->status, 403);
  auto list = Get("/v1/sagas", nullptr);
  api_.Check("get", "/v1/sagas", list);
  EXPECT_EQ(list->status, 401);
  auto approvals = Get("/v1/approvals", kAgent2);
  api_.Check("get", "/v1/approvals", approvals);
  EXPECT_EQ(approvals->status, 403);
}

TEST_F(ServerTest, OperatorPausesResumesCancelsAndResolvesWithRoles) {
  Json spec = {{"name", "slow"},
               {"steps",
                {{{"id", "first"}, {"tool", "slow.do"}, {"compensate", {{"tool", "a.undo"}}}},
                 {{"id", "second"}, {"tool", "a.do"}, {"compensate", {{"tool", "a.undo"}}}}}}};
  auto r = Post("/v1/sagas", {{"spec", spec}, {"input", Json::object()}}, kAgent1, "op-1");
  Json saga = api_.Check("post", "/v1/sagas", r);
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string id = saga["saga_id"];
  for (int i = 0; i < 500; ++i) {
    Json s = Json::parse(Get("/v1/sagas/" + id, kAgent1)->body);
    if (s["steps"][0]["state"] == "submitted") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string pause = "/v1/sagas/" + id + "/pause";
  // Roles: pause, resume and resolve are the operator's; anonymous is refused.
  for (const char* token : {kAgent1, kApprover}) {
    auto refused = PostRaw(pause, "", token);
    api_.Check("post", "/v1/sagas/{id}/pause", refused);
    EXPECT_EQ(refused->status, 403) << refused->body;
  }
  auto anonymous = PostRaw(pause, "", nullptr);
  api_.Check("post", "/v1/sagas/{id}/pause", anonymous);
  EXPECT_EQ(anonymous->status, 401);
  // A body-less POST: recorded, the driver stops after the step in progress.
  auto paused = PostRaw(pause, "", kOperator);
  Json pv = api_.Check("post", "/v1/sagas/{id}/pause", paused);
  ASSERT_EQ(paused->status, 202) << paused->body;
  EXPECT_TRUE(pv["control"]["recorded"].get<bool>());
  release_->store(true);
  Json p = WaitFor(id, "paused");
  EXPECT_EQ(p["steps"][0]["state"], "succeeded");
  EXPECT_EQ(p["steps"][1]["state"], "planned");
  EXPECT_EQ(p["reason"], "paused by ops-1");
  // Pausing again is a no-op answer; the saga stays put (no sweeper moves it).
  auto again = Post(pause, {{"reason", "still"}}, kOperator);
  Json av = api_.Check("post", "/v1/sagas/{id}/pause", again);
  EXPECT_EQ(again->status, 200) << again->body;
  EXPECT_FALSE(av["control"]["recorded"].get<bool>());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // > sweep_ms
  EXPECT_EQ(Json::parse(Get("/v1/sagas/" + id, kAgent1)->body)["state"], "paused");
  auto resumed = Post("/v1/sagas/" + id + "/resume", {{"reason", "maintenance over"}}, kOperator);
  api_.Check("post", "/v1/sagas/{id}/resume", resumed);
  EXPECT_EQ(resumed->status, 202) << resumed->body;
  Json done = WaitFor(id, "succeeded");
  EXPECT_EQ(ledger_->Count(done["steps"][1]["key"].get<std::string>()), 1);
  // A finished saga cannot be cancelled: 409.
  auto late = Post("/v1/sagas/" + id + "/cancel", Json::object(), kOperator);
  api_.Check("post", "/v1/sagas/{id}/cancel", late);
  EXPECT_EQ(late->status, 409) << late->body;

  // An operator cancels another caller's saga that needs attention: the
  // cancel waits for the resolve, which then rolls it back.
  Json lost = {{"name", "lost"},
               {"steps",
                {{{"id", "book"}, {"tool", "a.do"}, {"compensate", {{"tool", "a.undo"}}}},
                 {{"id", "charge"}, {"tool", "lost.do"}, {"compensate", {{"tool", "a.undo"}}}}}}};
  r = Post("/v1/sagas", {{"spec", lost}, {"input", Json::object()}}, kAgent1, "op-2");
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string parked = Json::parse(r->body)["saga_id"];
  WaitFor(parked, "needs_attention");
  auto cancel = PostRaw("/v1/sagas/" + parked + "/cancel", "", kOperator);
  Json cv = api_.Check("post", "/v1/sagas/{id}/cancel", cancel);
  ASSERT_EQ(cancel->status, 202) << cancel->body;
  EXPECT_NE(cv["control"]["note"].get<std::string>().find("resolves step charge"),
            std::string::npos);
  const std::string resolve = "/v1/sagas/" + parked + "/resolve";
  auto by_agent = Post(resolve, {{"step", "charge"}, {"decision", "applied"}}, kAgent1);
  api_.Check("post", "/v1/sagas/{id}/resolve", by_agent);
  EXPECT_EQ(by_agent->status, 403);
  auto bad = Post(resolve, {{"step", "charge"}, {"decision", "maybe"}}, kOperator);
  api_.Check("post", "/v1/sagas/{id}/resolve", bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  auto wrong_step = Post(resolve, {{"step", "book"}, {"decision", "applied"}}, kOperator);
  api_.Check("post", "/v1/sagas/{id}/resolve", wrong_step);
  EXPECT_EQ(wrong_step->status, 409) << wrong_step->body;
  auto ok = Post(resolve,
                 {{"step", "charge"},
                  {"decision", "applied"},
                  {"result", {{"ref", "found"}}},
                  {"note", "the provider says it went through"}},
                 kOperator);
  Json rv = api_.Check("post", "/v1/sagas/{id}/resolve", ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(rv["state"], "compensated") << "the pending cancel rolled it back";
  EXPECT_EQ(rv["steps"][1]["state"], "compensated");
}

TEST_F(ServerTest, HostileInputIsRefusedAndTheServerKeepsServing) {
  // 413: a body over 1 MiB, refused on its Content-Length before it is read.
  // The server may close while a client still writes the rest (a client
  // sending it all then fails its write, with no response to read), so the
  // request goes out raw: the headers and the body's first bytes.
  const std::string big =
      "POST /v1/sagas HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kAgent1) +
      "\r\nContent-Type: application/json\r\nIdempotency-Key: big"
      "\r\nConnection: close\r\nContent-Length: " +
      std::to_string(2 << 20) + "\r\n\r\n{\"spec\": \"" + std::string(4096, 'a');
  EXPECT_EQ(413, Raw(big, /*whole=*/true)) << raw_response_;
  EXPECT_NE(raw_response_.find("application/problem+json"), std::string::npos) << raw_response_;
  EXPECT_NE(raw_response_.find("urn:idem:problem:payload-too-large"), std::string::npos)
      << raw_response_;
  ExpectHealthy();
  // A request line over 8 KiB: cpp-httplib answers 400 (it has no 431).
  std::string req = "GET /healthz?" + std::string(10000, 'x') + " HTTP/1.1\r\nHost: x\r\n\r\n";
  int status = Raw(req);
  EXPECT_TRUE(status == 400 || status == 414 || status == -1) << status;
  ExpectHealthy();

  // 400: nesting depth 65.
  std::string deep = "{\"spec\": \"x\", \"input\": ";
  for (int i = 0; i < 64; ++i) deep += "[";
  for (int i = 0; i < 64; ++i) deep += "]";
  deep += "}";
  auto d = PostRaw("/v1/sagas", deep, kAgent1, "deep");
  Json dp = api_.Check("post", "/v1/sagas", d);
  EXPECT_EQ(d->status, 400);
  EXPECT_EQ(dp["type"], "urn:idem:problem:json-too-deep");
  ExpectHealthy();

  // 400: bytes that are not UTF-8 (an overlong '/', a lone surrogate).
  for (std::string bad :
       {std::string("{\"spec\": \"\xC0\xAF\"}"), std::string("{\"spec\": \"\xED\xA0\x80\"}"),
        std::string("{\"spec\": \"\\ud800\"}")}) {
    auto u = PostRaw("/v1/sagas", bad, kAgent1, "utf8");
    api_.Check("post", "/v1/sagas", u);
    EXPECT_EQ(u->status, 400) << bad;
    ExpectHealthy();
  }

  // 400: truncated JSON.
  auto t = PostRaw("/v1/sagas", "{\"spec\": {\"name\": \"tr", kAgent1, "trunc");
  Json tp = api_.Check("post", "/v1/sagas", t);
  EXPECT_EQ(t->status, 400);
  EXPECT_EQ(tp["type"], "urn:idem:problem:malformed-json");
  ExpectHealthy();

  // None of them was stored: the same keys now work.
  auto ok =
      Post("/v1/sagas", {{"spec", OneStepSpec()}, {"input", Json::object()}}, kAgent1, "trunc");
  api_.Check("post", "/v1/sagas", ok);
  EXPECT_EQ(ok->status, 201);

  // 415, and an unknown endpoint: problem+json too.
  httplib::Client c("127.0.0.1", port_);
  auto form = c.Post("/v1/sagas", Auth(kAgent1), "a=b", "application/x-www-form-urlencoded");
  api_.Check("post", "/v1/sagas", form);
  EXPECT_EQ(form->status, 415);
  auto nowhere = Get("/v1/nowhere", kAgent1);
  ASSERT_TRUE(nowhere);
  EXPECT_EQ(nowhere->status, 404);
  EXPECT_EQ(nowhere->get_header_value("Content-Type"), "application/problem+json");
  ExpectHealthy();
}

TEST(ServerCreate, RefusesToServeWithoutAuthUnlessInsecureOnLoopback) {
  test::TempDir dir("idem_server_create");
  auto store = storage::OpenStore(dir.File("j.db"));
  ASSERT_OK(store);
  ToolRegistry tools;
  ServerOptions o;
  o.port = 0;
  o.state_path = dir.File("s.db");
  auto no_auth = Server::Create(store->get(), &tools, o);
  EXPECT_EQ(no_auth.status().code(), Code::kFailedPrecondition);
  o.insecure_no_auth = true;
  o.host = "0.0.0.0";
  auto open = Server::Create(store->get(), &tools, o);
  EXPECT_EQ(open.status().code(), Code::kFailedPrecondition);
  o.host = "127.0.0.1";
  auto loop = Server::Create(store->get(), &tools, o);
  EXPECT_OK(loop);
}

// ---- open sagas (issue 14): begin, calls, duplicates, decisions, commit

TEST_F(ServerTest, OpenSagaBeginCallsDuplicatesAndCommit) {
  Json begin = {{"intent_key", "trip-1"}, {"tools", {"open.book"}}, {"metadata", {{"u", 1}}}};
  auto r = Post("/v1/open-sagas", begin, kAgent1);
  Json saga = api_.Check("post", "/v1/open-sagas", r);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(saga["state"], "open");
  const std::string id = saga["saga_id"];
  EXPECT_EQ(saga["links"]["calls"], "/v1/sagas/" + id + "/calls");
  auto again = Post("/v1/open-sagas", begin, kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/open-sagas", again)["saga_id"], id);
  EXPECT_EQ(again->status, 200);
  begin["metadata"] = {{"u", 2}};
  auto other = Post("/v1/open-sagas", begin, kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/open-sagas", other)["type"],
            "urn:idem:problem:intent-conflict");
  EXPECT_EQ(other->status, 409);
  auto unknown = Post("/v1/open-sagas", {{"intent_key", "t2"}, {"tools", {"nope"}}}, kAgent1);
  Json up = api_.Check("post", "/v1/open-sagas", unknown);
  EXPECT_EQ(unknown->status, 422);
  EXPECT_NE(up.value("detail", "").find("tools[0]"), std::string::npos) << up.dump();
  // a.do names no compensation in the registry: refused at begin.
  auto bare = Post("/v1/open-sagas", {{"intent_key", "t3"}, {"tools", {"a.do"}}}, kAgent1);
  EXPECT_EQ(bare->status, 422);

  const std::string calls = "/v1/sagas/" + id + "/calls";
  Json decision = {{"model", "gpt-4.1"},
                   {"message_id", "msg_1"},
                   {"call_id", "call_1"},
                   {"prompt_sha256", std::string(64, 'c')},
                   {"prompt", "book lisbon"}};
  auto c1 = Post(calls,
                 {{"call_id", "call_1"},
                  {"tool", "open.book"},
                  {"args", {{"to", "lisbon"}}},
                  {"decision", decision}},
                 kAgent1);
  Json a1 = api_.Check("post", "/v1/sagas/{id}/calls", c1);
  ASSERT_EQ(c1->status, 200) << c1->body;
  EXPECT_EQ(a1["state"], "succeeded");
  EXPECT_EQ(a1["deduplicated"], false);
  EXPECT_EQ(ledger_->Count(id + "/c1"), 1);
  // The same call id: the recorded answer, nothing called.
  auto rep = Post(
      calls, {{"call_id", "call_1"}, {"tool", "open.book"}, {"args", {{"to", "lisbon"}}}}, kAgent1);
  Json ar = api_.Check("post", "/v1/sagas/{id}/calls", rep);
  EXPECT_EQ(ar["deduplicated"], true);
  EXPECT_EQ(ar["reason"], "same call_id");
  // The same write under a new call id: answered from the journal.
  auto dup = Post(
      calls, {{"call_id", "call_2"}, {"tool", "open.book"}, {"args", {{"to", "lisbon"}}}}, kAgent1);
  Json ad = api_.Check("post", "/v1/sagas/{id}/calls", dup);
  EXPECT_EQ(ad["duplicate_of"], "call_1");
  EXPECT_EQ(ad["reason"], "same tool and arguments");
  EXPECT_EQ(ledger_->Count(id + "/"), 1);
  // repeat: true is a second effect.
  auto second = Post(calls,
                     {{"call_id", "call_3"},
                      {"tool", "open.book"},
                      {"args", {{"to", "lisbon"}}},
                      {"repeat", true}},
                     kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", second)["step_id"], "c2");
  EXPECT_EQ(ledger_->Count(id + "/"), 2);
  auto denied = Post(calls, {{"call_id", "x"}, {"tool", "pay.charge"}}, kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", denied)["type"],
            "urn:idem:problem:tool-not-allowed");
  EXPECT_EQ(denied->status, 403);
  auto bad = Post(calls, {{"call_id", ""}, {"tool", "open.book"}}, kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", bad)["type"],
            "urn:idem:problem:invalid-call");
  // Another agent's saga is not found.
  auto foreign = Post(calls, {{"call_id", "y"}, {"tool", "open.book"}}, kAgent2);
  EXPECT_EQ(foreign->status, 404);
  auto got = Get(calls + "/call_1", kAgent1);
  EXPECT_EQ(api_.Check("get", "/v1/sagas/{id}/calls/{call_id}", got)["state"], "succeeded");
  Json view = api_.Check("get", "/v1/sagas/{id}", Get("/v1/sagas/" + id, kAgent1));
  ASSERT_EQ(view["calls"].size(), 2u);
  EXPECT_EQ(view["calls"][0]["decision"]["model"], "gpt-4.1");
  EXPECT_EQ(view["calls"][0]["decision"]["prompt"], "book lisbon");
  auto commit = Post("/v1/sagas/" + id + "/commit", Json::object(), kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/commit", commit)["state"], "succeeded");
  auto late =
      Post(calls, {{"call_id", "call_9"}, {"tool", "open.book"}, {"args", {{"to", "x"}}}}, kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", late)["type"],
            "urn:idem:problem:saga-not-open");
  EXPECT_EQ(late->status, 409);
  ExpectHealthy();
}

TEST_F(ServerTest, OpenSagaApprovalWithPreferWaitAndRollback) {
  auto r = Post("/v1/open-sagas", {{"intent_key", "pay-1"}, {"tools", {"open.book", "open.pay"}}},
                kAgent1);
  const std::string id = api_.Check("post", "/v1/open-sagas", r)["saga_id"];
  const std::string calls = "/v1/sagas/" + id + "/calls";
  auto book =
      Post(calls, {{"call_id", "b1"}, {"tool", "open.book"}, {"args", {{"to", "rome"}}}}, kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/calls", book)["state"], "succeeded");
  auto pay =
      Post(calls, {{"call_id", "p1"}, {"tool", "open.pay"}, {"args", {{"eur", 90}}}}, kAgent1);
  Json ap = api_.Check("post", "/v1/sagas/{id}/calls", pay);
  ASSERT_EQ(pay->status, 202) << pay->body;
  EXPECT_EQ(ap["state"], "awaiting_approval");
  EXPECT_EQ(ap["approval"].count("token"), 0u) << "an agent does not see the token";
  EXPECT_FALSE(ap["approval"].value("token_ref", "").empty());
  auto commit = Post("/v1/sagas/" + id + "/commit", Json::object(), kAgent1);
  EXPECT_EQ(api_.Check("post", "/v1/sagas/{id}/commit", commit)["type"],
            "urn:idem:problem:calls-pending");
  // The approver sees the token; the agent waits (Prefer: wait) for the outcome.
  Json list = api_.Check("get", "/v1/approvals", Get("/v1/approvals", kApprover));
  ASSERT_EQ(list["approvals"].size(), 1u);
  const std::string token = list["approvals"][0]["token"];
  std::thread approver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto ok = Post("/v1/approvals/" + token + "/approve", Json::object(), kApprover);
    EXPECT_TRUE(ok && ok->status == 200) << (ok ? ok->body : "no answer");
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = PostWith(calls, {{"call_id", "p1"}, {"tool", "open.pay"}, {"args", {{"eur", 90}}}},
                         kAgent1, {{"Prefer", "wait=10"}});
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  approver.join();
  Json aw = api_.Check("post", "/v1/sagas/{id}/calls", waited);
  EXPECT_EQ(waited->status, 200) << waited->body;
  EXPECT_EQ(aw["state"], "succeeded");
  EXPECT_EQ(waited->get_header_value("Preference-Applied"), "wait=10");
  EXPECT_LT(ms, 5000) << "woken by the journal, not by the deadline";
  EXPECT_EQ(ledger_->Count(id + "/c2"), 1);
  // Rollback compensates both calls (each with its own key).
  auto rb = PostWith("/v1/sagas/" + id + "/rollback", {{"reason", "user changed plans"}}, kAgent1,
                     {{"Prefer", "wait=10"}});
  Json rv = api_.Check("post", "/v1/sagas/{id}/rollback", rb);
  EXPECT_EQ(rb->status, 200) << rb->body;
  EXPECT_EQ(rv["state"], "compensated");
  EXPECT_EQ(ledger_->Count(id + "/c1:compensate"), 1);
  EXPECT_EQ(ledger_->Count(id + "/c2:compensate"), 1);
}

TEST_F(ServerTest, SubmitWithPreferWaitAnswersTheOutcomeAndRecordsTheDecision) {
  Json body = {{"spec", OneStepSpec()},
               {"input", {{"who", "ana"}}},
               {"decision", {{"model", "m1"}, {"prompt_sha256", std::string(64, 'd')}}}};
  auto r =
      PostWith("/v1/sagas", body, kAgent1, {{"Idempotency-Key", "wait-1"}, {"Prefer", "wait=10"}});
  Json saga = api_.Check("post", "/v1/sagas", r);
  EXPECT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(saga["state"], "succeeded");
  EXPECT_EQ(r->get_header_value("Preference-Applied"), "wait=10");
  EXPECT_EQ(saga["decision"]["model"], "m1");
  // Without the preference: the saga as submitted.
  auto plain =
      Post("/v1/sagas", {{"spec", OneStepSpec()}, {"input", {{"who", "bo"}}}}, kAgent1, "wait-2");
  api_.Check("post", "/v1/sagas", plain);
  EXPECT_TRUE(plain->get_header_value("Preference-Applied").empty());
  auto bad =
      PostWith("/v1/sagas",
               {{"spec", OneStepSpec()}, {"decision", {{"model", "m1"}, {"prompt_sha256", "x"}}}},
               kAgent1, {{"Idempotency-Key", "wait-3"}});
  EXPECT_EQ(api_.Check("post", "/v1/sagas", bad)["type"], "urn:idem:problem:invalid-decision");
}

// A caller that waits (Prefer: wait) has its intent recorded with the first
// step's `submitted`, as `idem run` does: a one-step saga commits twice
// (intent + started + submitted, then succeeded + terminal); submitted
// without the preference it commits three times (the intent alone first).
TEST_F(ServerTest, SubmitWithPreferWaitRecordsTheIntentWithTheFirstSubmitted) {
  auto* sqlite = dynamic_cast<storage::SqliteStore*>(store_.get());
  ASSERT_NE(sqlite, nullptr);
  const int64_t before = sqlite->Stats().commit_transactions;
  auto r = PostWith("/v1/sagas", {{"spec", OneStepSpec()}, {"input", {{"who", "ana"}}}}, kAgent1,
                    {{"Idempotency-Key", "folded-1"}, {"Prefer", "wait=10"}});
  Json saga = api_.Check("post", "/v1/sagas", r);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(saga["state"], "succeeded");
  EXPECT_EQ(sqlite->Stats().commit_transactions - before, 2);
  const std::string id = saga["saga_id"];
  EXPECT_EQ(ledger_->Count(id + "/book"), 1);
  // The journal as Submit then Run leave it.
  auto journal = store_->ReadJournal(id);
  ASSERT_OK(journal);
  std::vector<std::string> events;
  for (const auto& e : *journal) events.push_back(e.event);
  EXPECT_EQ(events, (std::vector<std::string>{"saga_created", "saga_started", "submitted",
                                              "succeeded", "saga_succeeded"}));
  // The same key again: the stored answer, no new saga, no write.
  const int64_t after = sqlite->Stats().commit_transactions;
  auto again = PostWith("/v1/sagas", {{"spec", OneStepSpec()}, {"input", {{"who", "ana"}}}},
                        kAgent1, {{"Idempotency-Key", "folded-1"}, {"Prefer", "wait=10"}});
  Json same = api_.Check("post", "/v1/sagas", again);
  EXPECT_EQ(same["saga_id"], id);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(sqlite->Stats().commit_transactions, after);
  EXPECT_EQ(ledger_->Count(id + "/book"), 1);

  // Without the preference: the intent first, then the drive.
  const int64_t plain_before = sqlite->Stats().commit_transactions;
  auto plain =
      Post("/v1/sagas", {{"spec", OneStepSpec()}, {"input", {{"who", "bo"}}}}, kAgent1, "plain-1");
  const std::string plain_id = api_.Check("post", "/v1/sagas", plain)["saga_id"];
  for (int i = 0; i < 500; ++i) {
    auto rec = store_->LoadSaga(plain_id);
    ASSERT_OK(rec);
    if (rec->summary.state == "succeeded") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(sqlite->Stats().commit_transactions - plain_before, 3);
}

TEST(Principals, ParsesAndRefusesBadEntries) {
  auto ok = ParsePrincipals(R"([{"name": "a", "token_sha256": ")" + Sha256Hex("t") +
                            R"(", "roles": ["agent", "approver"]}])");
  ASSERT_OK(ok);
  EXPECT_EQ(ok->size(), 1u);
  EXPECT_FALSE(
      ParsePrincipals(R"([{"name": "a", "token_sha256": "xyz", "roles": ["agent"]}])").ok());
  auto role = ParsePrincipals(R"([{"name": "a", "token_sha256": ")" + Sha256Hex("t") +
                              R"(", "roles": ["Admin!"]}])");
  EXPECT_NE(role.status().message().find("roles[0]"), std::string::npos);
  // Any other well-formed name is a role an approval policy may ask for.
  auto custom = ParsePrincipals(R"([{"name": "a", "token_sha256": ")" + Sha256Hex("t") +
                                R"(", "roles": ["approver", "finance"]}])");
  ASSERT_OK(custom);
  EXPECT_EQ((*custom)[0].roles, (std::vector<std::string>{"approver", "finance"}));
  auto twice = ParsePrincipals(R"([{"name": "a", "token_sha256": ")" + Sha256Hex("t") +
                               R"(", "roles": ["finance", "finance"]}])");
  EXPECT_NE(twice.status().message().find("roles[1]: \"finance\" appears twice"),
            std::string::npos);
}

}  // namespace
}  // namespace idem::server
