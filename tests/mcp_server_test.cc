// idem as an MCP server (mcp/): the version negotiation table, the session's
// lifecycle and errors, the tool catalog and its annotations, tool calls
// journaled in an open saga (one effect for a repeated call, approvals,
// rollback, cancellation, progress), over a real SQLite journal; and the
// Streamable HTTP transport over real HTTP on loopback (`idem serve`'s
// server): session ids, 202/400/404/405/406, Origin, Host, the protocol
// version header, bearer tokens, SSE answers.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "preview_commit/token.h"
#include "saga/engine.h"
#include "saga/views.h"
#include "server/server.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "mcp/catalog.h"
#include "mcp/http.h"
#include "mcp/protocol.h"
#include "mcp/session.h"

namespace idem {
namespace {

using mcp::Message;
using mcp::RequestId;

// ---- the negotiation table

TEST(McpProtocol, NegotiatesTheRequestedRevisionOrAnswersTheLatest) {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"2025-11-25", "2025-11-25"}, {"2025-06-18", "2025-06-18"}, {"2025-03-26", "2025-03-26"},
      {"2024-11-05", "2025-11-25"}, {"2026-01-01", "2025-11-25"}, {"", "2025-11-25"},
      {"latest", "2025-11-25"}};
  for (const auto& [asked, answered] : table) {
    EXPECT_EQ(mcp::NegotiateProtocolVersion(asked), answered) << "asked " << asked;
  }
  EXPECT_TRUE(mcp::IsSupportedProtocolVersion("2025-06-18"));
  EXPECT_FALSE(mcp::IsSupportedProtocolVersion("2024-11-05"));
  EXPECT_EQ(mcp::SupportedProtocolVersions().front(), mcp::kLatestProtocolVersion);
}

// ---- tools with a ledger of their effects

struct Ledger {
  std::mutex mu;
  std::map<std::string, int> calls;  // tool -> invocations
  int Count(const std::string& tool) {
    std::lock_guard<std::mutex> lock(mu);
    return calls[tool];
  }
  void Add(const std::string& tool) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls[tool];
  }
};

void Register(ToolRegistry* reg, ToolInfo info, FunctionTool::InvokeFn fn,
              FunctionTool::PreviewFn preview = nullptr) {
  ASSERT_TRUE(reg->Register(std::make_unique<FunctionTool>(std::move(info), std::move(fn), nullptr,
                                                           std::move(preview)))
                  .ok());
}

void RegisterTools(ToolRegistry* reg, std::shared_ptr<Ledger> ledger,
                   std::shared_ptr<std::atomic<int>> slow_ms) {
  ToolInfo book;
  book.name = "book.make";
  book.effect = EffectClass::kWrite;
  book.honours_keys = true;
  book.description = "Book a room: {city}.";
  book.open.compensate_tool = "book.cancel";
  book.open.compensate_args = {{"ref", "${result.ref}"}};
  Register(reg, book, [ledger](const ToolCall& c) {
    ledger->Add("book.make");
    return ToolOutcome::Succeeded({{"ref", "R-" + c.key}, {"city", c.args.value("city", "")}});
  });
  ToolInfo cancel;
  cancel.name = "book.cancel";
  cancel.effect = EffectClass::kIdempotent;
  cancel.honours_keys = true;
  Register(reg, cancel, [ledger](const ToolCall&) {
    ledger->Add("book.cancel");
    return ToolOutcome::Succeeded({{"cancelled", true}});
  });
  ToolInfo info;
  info.name = "info.get";
  info.effect = EffectClass::kRead;
  Register(reg, info, [ledger](const ToolCall&) {
    ledger->Add("info.get");
    return ToolOutcome::Succeeded({{"weather", "sunny"}});
  });
  ToolInfo pay;
  pay.name = "pay.charge";
  pay.effect = EffectClass::kWrite;
  pay.honours_keys = true;
  pay.open.compensate_tool = "pay.refund";
  pay.open.two_phase = true;
  pay.open.human_approval = true;
  Register(
      reg, pay,
      [ledger](const ToolCall& c) {
        ledger->Add("pay.charge");
        return ToolOutcome::Succeeded({{"charge", "ch-" + c.key}});
      },
      [](const ToolCall& c) {
        PreviewOutcome p;
        p.ok = true;
        p.summary = "charge EUR " + std::to_string(c.args.value("eur", 0)) + " to card 4242";
        p.changes = {{"eur", c.args.value("eur", 0)}};
        p.resource_version = "v1";
        return p;
      });
  ToolInfo refund;
  refund.name = "pay.refund";
  refund.effect = EffectClass::kIdempotent;
  refund.honours_keys = true;
  Register(reg, refund, [ledger](const ToolCall&) {
    ledger->Add("pay.refund");
    return ToolOutcome::Succeeded({{"refunded", true}});
  });
  ToolInfo broken;
  broken.name = "broken.do";
  broken.effect = EffectClass::kWrite;
  broken.open.no_compensation_reason = "it never does anything";
  Register(reg, broken,
           [](const ToolCall&) { return ToolOutcome::Failed("provider said no", false); });
  ToolInfo slow;
  slow.name = "slow.do";
  slow.effect = EffectClass::kWrite;
  slow.honours_keys = true;
  slow.open.no_compensation_reason = "a log line";
  Register(reg, slow, [ledger, slow_ms](const ToolCall&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms->load()));
    ledger->Add("slow.do");
    return ToolOutcome::Succeeded({{"done", true}});
  });
  // A write with no compensation and no reason: an open saga may not call it.
  ToolInfo raw;
  raw.name = "raw.write";
  raw.effect = EffectClass::kWrite;
  Register(reg, raw, [](const ToolCall&) { return ToolOutcome::Succeeded({}); });
}

Json TripSpec() {
  return {{"name", "stay"},
          {"description", "Book a room, then charge for it."},
          {"steps",
           {{{"id", "room"},
             {"tool", "book.make"},
             {"args", {{"city", "${input.city}"}}},
             {"compensate",
              {{"tool", "book.cancel"}, {"args", {{"ref", "${steps.room.result.ref}"}}}}}}}}};
}

class McpSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = storage::OpenStore(dir_.File("journal.db"));
    ASSERT_OK(s);
    store_ = std::move(s).value();
    RegisterTools(&tools_, ledger_, slow_ms_);
    ring_ = std::make_unique<preview_commit::KeyRing>(
        preview_commit::KeyRing::ForTesting({{"k1", "0123456789abcdef0123456789abcdef"}}, "k1"));
    preview_commit::TokenOptions to;
    to.max_ttl_ms = 30LL * 24 * 3600 * 1000;
    signer_ = std::make_unique<preview_commit::TokenSigner>(ring_.get(), SystemClock::Get(), to);
    EngineOptions eo;
    eo.signer = signer_.get();
    engine_ = std::make_unique<Engine>(store_.get(), &tools_, eo);
    session_ = NewSession();
  }

  std::unique_ptr<mcp::Session> NewSession(size_t page_size = 100) {
    mcp::Backend b;
    b.engine = engine_.get();
    b.store = store_.get();
    b.tools = &tools_;
    b.specs = [] { return std::vector<mcp::SpecSource>{{"stay", 0, TripSpec()}}; };
    mcp::SessionOptions so;
    so.page_size = page_size;
    so.progress_interval_ms = 50;
    return std::make_unique<mcp::Session>(b, so);
  }

  Message Ask(mcp::Session* s, const std::string& method, Json params = Json::object(),
              const mcp::Session::Notify& notify = nullptr) {
    auto answer =
        s->Handle(Message::Request(RequestId(++next_id_), method, std::move(params)), notify);
    EXPECT_TRUE(answer.has_value()) << method;
    return answer ? *answer : Message();
  }

  void Initialize(mcp::Session* s) {
    Message m = Ask(s, "initialize",
                    {{"protocolVersion", "2025-11-25"},
                     {"capabilities", Json::object()},
                     {"clientInfo", {{"name", "test"}, {"version", "1"}}}});
    ASSERT_EQ(m.kind, Message::Kind::kResult) << mcp::Encode(m);
    EXPECT_FALSE(s->Handle(Message::Notification("notifications/initialized"), nullptr));
  }

  Json Call(mcp::Session* s, const std::string& tool, Json args, Json meta = Json::object()) {
    Json params = {{"name", tool}, {"arguments", std::move(args)}};
    if (!meta.empty()) params["_meta"] = meta;
    Message m = Ask(s, "tools/call", params);
    EXPECT_EQ(m.kind, Message::Kind::kResult) << mcp::Encode(m);
    return m.result;
  }

  test::TempDir dir_{"idem_mcp"};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  std::shared_ptr<Ledger> ledger_ = std::make_shared<Ledger>();
  std::shared_ptr<std::atomic<int>> slow_ms_ = std::make_shared<std::atomic<int>>(600);
  std::unique_ptr<preview_commit::KeyRing> ring_;
  std::unique_ptr<preview_commit::TokenSigner> signer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<mcp::Session> session_;
  int64_t next_id_ = 0;
};

TEST_F(McpSessionTest, InitializeAnswersTheNegotiatedRevisionCapabilitiesAndServerInfo) {
  for (const auto& [asked, answered] :
       std::vector<std::pair<std::string, std::string>>{{"2025-11-25", "2025-11-25"},
                                                        {"2025-03-26", "2025-03-26"},
                                                        {"1999-01-01", "2025-11-25"}}) {
    auto s = NewSession();
    Message m =
        Ask(s.get(), "initialize", {{"protocolVersion", asked}, {"capabilities", Json::object()}});
    ASSERT_EQ(m.kind, Message::Kind::kResult) << mcp::Encode(m);
    EXPECT_EQ(m.result["protocolVersion"], answered);
    EXPECT_EQ(m.result["capabilities"]["tools"]["listChanged"], false);
    EXPECT_EQ(m.result["serverInfo"]["name"], "idem");
    EXPECT_EQ(s->protocol_version(), answered);
  }
  // A second initialize, and one without a version, are refused.
  Initialize(session_.get());
  EXPECT_EQ(Ask(session_.get(), "initialize", {{"protocolVersion", "2025-11-25"}}).error.code,
            mcp::rpc_error::kInvalidRequest);
  auto s = NewSession();
  EXPECT_EQ(Ask(s.get(), "initialize", Json::object()).error.code, mcp::rpc_error::kInvalidParams);
}

TEST_F(McpSessionTest, RequestsBeforeInitializeAreRefusedButPingIsAnswered) {
  Message list = Ask(session_.get(), "tools/list");
  EXPECT_EQ(list.kind, Message::Kind::kError);
  EXPECT_EQ(list.error.code, mcp::rpc_error::kInvalidRequest);
  Message call = Ask(session_.get(), "tools/call", {{"name", "info.get"}});
  EXPECT_EQ(call.error.code, mcp::rpc_error::kInvalidRequest);
  EXPECT_EQ(ledger_->Count("info.get"), 0);
  Message ping = Ask(session_.get(), "ping");
  EXPECT_EQ(ping.kind, Message::Kind::kResult);
  EXPECT_TRUE(ping.result.is_object() && ping.result.empty());
  Initialize(session_.get());
  EXPECT_EQ(Ask(session_.get(), "tools/list").kind, Message::Kind::kResult);
  EXPECT_EQ(Ask(session_.get(), "resources/list").error.code, mcp::rpc_error::kMethodNotFound);
}

TEST_F(McpSessionTest, ListsToolsWithTruthfulAnnotationsAndPagesThem) {
  Initialize(session_.get());
  Json page = Ask(session_.get(), "tools/list").result;
  std::map<std::string, Json> by_name;
  for (const Json& t : page["tools"]) by_name[t["name"]] = t;
  EXPECT_FALSE(page.contains("nextCursor"));
  EXPECT_EQ(by_name.count("raw.write"), 0u) << "a write without a compensation is not offered";
  ASSERT_EQ(by_name.count("book.make"), 1u);
  const Json& book = by_name["book.make"]["annotations"];
  EXPECT_EQ(book["readOnlyHint"], false);
  EXPECT_EQ(book["destructiveHint"], false) << "its compensation undoes it";
  EXPECT_EQ(book["idempotentHint"], true) << "a repeat is answered from the journal";
  EXPECT_EQ(book["openWorldHint"], true);
  EXPECT_EQ(by_name["info.get"]["annotations"]["readOnlyHint"], true);
  EXPECT_EQ(by_name["broken.do"]["annotations"]["destructiveHint"], true) << "nothing undoes it";
  EXPECT_EQ(by_name["book.cancel"]["annotations"]["destructiveHint"], true);
  EXPECT_EQ(by_name["book.cancel"]["annotations"]["idempotentHint"], true);
  ASSERT_EQ(by_name.count("saga.stay"), 1u);
  EXPECT_EQ(by_name["saga.stay"]["inputSchema"]["required"], Json::array({"city"}));
  EXPECT_EQ(by_name["saga.stay"]["annotations"]["destructiveHint"], false);
  ASSERT_EQ(by_name.count("idem_commit"), 1u);
  ASSERT_EQ(by_name.count("idem_rollback"), 1u);
  EXPECT_EQ(by_name["idem_rollback"]["annotations"]["destructiveHint"], true);
  for (const auto& [name, t] : by_name) EXPECT_EQ(t["inputSchema"]["type"], "object") << name;

  // Pages of two walk the same list.
  auto paged = NewSession(2);
  Initialize(paged.get());
  std::vector<std::string> names;
  std::string cursor;
  int pages = 0;
  do {
    Json params = Json::object();
    if (!cursor.empty()) params["cursor"] = cursor;
    Json p = Ask(paged.get(), "tools/list", params).result;
    EXPECT_LE(p["tools"].size(), 2u);
    for (const Json& t : p["tools"]) names.push_back(t["name"]);
    cursor = p.value("nextCursor", "");
    ++pages;
  } while (!cursor.empty() && pages < 50);
  EXPECT_EQ(names.size(), by_name.size());
  EXPECT_GT(pages, 1);
  EXPECT_EQ(Ask(paged.get(), "tools/list", {{"cursor", "bogus"}}).error.code,
            mcp::rpc_error::kInvalidParams);
}

TEST_F(McpSessionTest, BadCallsAreJsonRpcErrorsAndToolFailuresAreIsError) {
  Initialize(session_.get());
  Message unknown = Ask(session_.get(), "tools/call", {{"name", "nope.do"}});
  EXPECT_EQ(unknown.error.code, mcp::rpc_error::kInvalidParams);
  EXPECT_NE(unknown.error.message.find("nope.do"), std::string::npos);
  EXPECT_EQ(Ask(session_.get(), "tools/call", {{"arguments", Json::object()}}).error.code,
            mcp::rpc_error::kInvalidParams);
  EXPECT_EQ(
      Ask(session_.get(), "tools/call", {{"name", "info.get"}, {"arguments", "x"}}).error.code,
      mcp::rpc_error::kInvalidParams);
  // Arguments that fail the input schema: a tool error the model can read.
  Json bad = Call(session_.get(), "saga.stay", Json::object());
  EXPECT_EQ(bad["isError"], true);
  EXPECT_NE(bad["content"][0]["text"].get<std::string>().find("arguments.city: required"),
            std::string::npos);
  EXPECT_EQ(ledger_->Count("book.make"), 0);
  // A tool's refusal.
  Json failed = Call(session_.get(), "broken.do", Json::object());
  EXPECT_EQ(failed["isError"], true);
  EXPECT_EQ(failed["structuredContent"]["state"], "failed");
  EXPECT_NE(failed["content"][0]["text"].get<std::string>().find("provider said no"),
            std::string::npos);
}

TEST_F(McpSessionTest, ARepeatedCallMakesOneEffectAndIsAnsweredFromTheJournal) {
  Initialize(session_.get());
  Json first = Call(session_.get(), "book.make", {{"city", "rome"}});
  EXPECT_EQ(first["isError"], false);
  EXPECT_EQ(first["structuredContent"]["state"], "succeeded");
  EXPECT_EQ(first["structuredContent"]["result"]["city"], "rome");
  const std::string saga = first["_meta"]["io.idem/saga"]["saga_id"];
  EXPECT_EQ(saga, session_->saga_id());
  Json again = Call(session_.get(), "book.make", {{"city", "rome"}});
  EXPECT_EQ(again["structuredContent"]["deduplicated"], true);
  EXPECT_EQ(again["structuredContent"]["result"], first["structuredContent"]["result"]);
  // The same call id: the same answer.
  Json by_id = Call(session_.get(), "book.make", {{"city", "oslo"}}, {{"io.idem/call-id", "m-1"}});
  Json by_id2 = Call(session_.get(), "book.make", {{"city", "oslo"}}, {{"io.idem/call-id", "m-1"}});
  EXPECT_EQ(by_id2["structuredContent"]["reason"], "same call_id");
  EXPECT_EQ(ledger_->Count("book.make"), 2) << "rome once, oslo once";
  // Reads are called again.
  Call(session_.get(), "info.get", Json::object());
  Call(session_.get(), "info.get", Json::object());
  EXPECT_EQ(ledger_->Count("info.get"), 2);
  // A spec tool: the same arguments answer the same saga.
  Json spec1 = Call(session_.get(), "saga.stay", {{"city", "bern"}});
  EXPECT_EQ(spec1["structuredContent"]["state"], "succeeded") << spec1.dump();
  Json spec2 = Call(session_.get(), "saga.stay", {{"city", "bern"}});
  EXPECT_EQ(spec2["structuredContent"]["saga_id"], spec1["structuredContent"]["saga_id"]);
  EXPECT_EQ(spec2["structuredContent"]["created"], false);
  EXPECT_EQ(ledger_->Count("book.make"), 3);
}

// An io.idem/call-id reused with other arguments is another intent: the
// model gets an error result saying so, never the earlier call's outcome.
TEST_F(McpSessionTest, ACallIdReusedWithOtherArgumentsIsAnErrorResultAndCallsNothing) {
  Initialize(session_.get());
  Json first = Call(session_.get(), "book.make", {{"city", "oslo"}}, {{"io.idem/call-id", "m-1"}});
  EXPECT_EQ(first["structuredContent"]["state"], "succeeded");
  Json other = Call(session_.get(), "book.make", {{"city", "rome"}}, {{"io.idem/call-id", "m-1"}});
  EXPECT_EQ(other["isError"], true) << other.dump();
  const Json& error = other["structuredContent"]["error"];
  EXPECT_EQ(error["code"], "call-id-reused");
  EXPECT_EQ(error["recorded_args_fingerprint"], Fingerprint(Json{{"city", "oslo"}}));
  EXPECT_EQ(error["args_fingerprint"], Fingerprint(Json{{"city", "rome"}}));
  const std::string text = other["content"][0]["text"];
  EXPECT_NE(text.find("call-id-reused"), std::string::npos) << text;
  EXPECT_NE(text.find(Fingerprint(Json{{"city", "rome"}})), std::string::npos) << text;
  EXPECT_EQ(other["structuredContent"].count("result"), 0u);
  EXPECT_EQ(ledger_->Count("book.make"), 1) << "rome was never booked";
  Json same = Call(session_.get(), "book.make", {{"city", "oslo"}}, {{"io.idem/call-id", "m-1"}});
  EXPECT_EQ(same["isError"], false);
  EXPECT_EQ(same["structuredContent"]["reason"], "same call_id");
}

TEST_F(McpSessionTest, AWriteThatNeedsAPersonAnswersWhatWaitsThenItsOutcomeOnceApproved) {
  Initialize(session_.get());
  Json wait = Call(session_.get(), "pay.charge", {{"eur", 90}});
  EXPECT_EQ(wait["isError"], false);
  const Json& sc = wait["structuredContent"];
  EXPECT_EQ(sc["status"], "awaiting_approval");
  EXPECT_EQ(sc["summary"], "charge EUR 90 to card 4242");
  EXPECT_FALSE(sc.value("saga_id", "").empty());
  EXPECT_FALSE(sc.value("call_id", "").empty());
  EXPECT_EQ(sc["approve_at"]["ui"], "/ui/approvals/" + sc["saga_id"].get<std::string>() + "/c1");
  EXPECT_NE(sc["approve_at"]["api"].get<std::string>().find("/v1/approvals"), std::string::npos);
  EXPECT_EQ(sc.count("token"), 0u) << "the agent never gets the commit token";
  EXPECT_EQ(ledger_->Count("pay.charge"), 0);
  // Asked again before a person decides: the same wait, nothing called.
  Json still = Call(session_.get(), "pay.charge", {{"eur", 90}});
  EXPECT_EQ(still["structuredContent"]["status"], "awaiting_approval") << still.dump();
  EXPECT_EQ(ledger_->Count("pay.charge"), 0);
  // A person approves (as the API's approve does), then the repeat answers the outcome.
  auto rec = store_->LoadSaga(sc["saga_id"]);
  ASSERT_OK(rec);
  auto view = ApprovalView(rec->summary.saga_id, rec->steps[0]);
  ASSERT_TRUE(view.has_value());
  ApprovalDecision d;
  d.approve = true;
  d.who = "maria";
  ASSERT_OK(engine_->Decide((*view)["token"].get<std::string>(), d));
  Json done = Call(session_.get(), "pay.charge", {{"eur", 90}});
  EXPECT_EQ(done["structuredContent"]["state"], "succeeded") << done.dump();
  EXPECT_EQ(ledger_->Count("pay.charge"), 1);
  Json commit = Call(session_.get(), "idem_commit", Json::object());
  EXPECT_EQ(commit["structuredContent"]["state"], "succeeded") << commit.dump();
}

TEST_F(McpSessionTest, RollbackThroughTheToolCompensatesInReverseOrder) {
  Initialize(session_.get());
  Call(session_.get(), "book.make", {{"city", "rome"}});
  Call(session_.get(), "book.make", {{"city", "oslo"}});
  Json rb = Call(session_.get(), "idem_rollback", {{"reason", "plans changed"}});
  EXPECT_EQ(rb["isError"], false) << rb.dump();
  EXPECT_EQ(rb["structuredContent"]["state"], "compensated");
  EXPECT_EQ(ledger_->Count("book.cancel"), 2);
  // The saga is over: a further call is refused, calling nothing.
  Json after = Call(session_.get(), "book.make", {{"city", "kyiv"}});
  EXPECT_EQ(after["isError"], true);
  EXPECT_EQ(ledger_->Count("book.make"), 2);
}

TEST_F(McpSessionTest, AnIntentSharesOneOpenSagaAcrossSessions) {
  Initialize(session_.get());
  auto other = NewSession();
  Initialize(other.get());
  const Json meta = {{"io.idem/intent", "trip-42"}};
  Json a = Call(session_.get(), "book.make", {{"city", "rome"}}, meta);
  Json b = Call(other.get(), "book.make", {{"city", "rome"}}, meta);
  EXPECT_EQ(a["_meta"]["io.idem/saga"]["saga_id"], b["_meta"]["io.idem/saga"]["saga_id"]);
  EXPECT_EQ(b["structuredContent"]["deduplicated"], true);
  EXPECT_EQ(ledger_->Count("book.make"), 1);
  EXPECT_NE(a["_meta"]["io.idem/saga"]["saga_id"].get<std::string>(), session_->saga_id());
}

TEST_F(McpSessionTest, ACancelledCallSendsNoResponseAndItsEffectIsJournaledOnce) {
  Initialize(session_.get());
  std::optional<Message> answer;
  std::thread call([&] {
    answer = session_->Handle(Message::Request(RequestId(int64_t{900}), "tools/call",
                                               {{"name", "slow.do"}, {"arguments", {{"n", 1}}}}),
                              nullptr);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(session_->Handle(
      Message::Notification("notifications/cancelled", {{"requestId", 900}, {"reason", "user"}}),
      nullptr));
  call.join();
  EXPECT_FALSE(answer.has_value()) << "no response to a cancelled request";
  EXPECT_EQ(ledger_->Count("slow.do"), 1) << "the journaled call ran to its end";
  slow_ms_->store(0);
  Json repeat = Call(session_.get(), "slow.do", {{"n", 1}});
  EXPECT_EQ(repeat["structuredContent"]["state"], "succeeded");
  EXPECT_EQ(repeat["structuredContent"]["deduplicated"], true);
  EXPECT_EQ(ledger_->Count("slow.do"), 1);
}

TEST_F(McpSessionTest, ACallWithAProgressTokenGetsProgressNotifications) {
  Initialize(session_.get());
  std::mutex mu;
  std::vector<Message> notes;
  Message m =
      Ask(session_.get(), "tools/call",
          {{"name", "slow.do"}, {"arguments", {{"n", 2}}}, {"_meta", {{"progressToken", "p-1"}}}},
          [&](const Message& n) {
            std::lock_guard<std::mutex> lock(mu);
            notes.push_back(n);
          });
  EXPECT_EQ(m.result["structuredContent"]["state"], "succeeded");
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(notes.size(), 2u);
  EXPECT_EQ(notes[0].method, "notifications/progress");
  EXPECT_EQ(notes[0].params["progressToken"], "p-1");
  EXPECT_LT(notes[0].params["progress"].get<int>(), notes[1].params["progress"].get<int>());
}

// ---- Streamable HTTP on a real server

const char* kAgentToken = "mcp-agent-token";

class McpHttpTest : public McpSessionTest {
 protected:
  void SetUp() override {
    McpSessionTest::SetUp();
    server::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.principals = {{"agent-1", Sha256Hex(kAgentToken), {"agent"}}};
    o.workers = 1;
    o.signer = signer_.get();
    o.mcp.allowed_origins = {"https://app.example.com"};
    auto srv = server::Server::Create(store_.get(), &tools_, o);
    ASSERT_OK(srv);
    server_ = std::move(srv).value();
    ASSERT_OK(server_->Start());
    port_ = server_->port();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  httplib::Headers Headers(const std::string& session = "",
                           const std::string& accept = "application/json, text/event-stream") {
    httplib::Headers h = {{"Authorization", std::string("Bearer ") + kAgentToken},
                          {"Accept", accept}};
    if (!session.empty()) h.emplace("Mcp-Session-Id", session);
    return h;
  }
  httplib::Result Post(const Json& body, httplib::Headers h) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(20, 0);
    return c.Post("/mcp", h, body.dump(), "application/json");
  }
  Json Rpc(int id, const std::string& method, Json params = Json::object()) {
    return {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
  }
  std::string Open() {
    auto r = Post(
        Rpc(1, "initialize", {{"protocolVersion", "2025-11-25"}, {"capabilities", Json::object()}}),
        Headers());
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    if (!r) return "";
    EXPECT_EQ(Json::parse(r->body)["result"]["protocolVersion"], "2025-11-25");
    return r->get_header_value("Mcp-Session-Id");
  }

  std::unique_ptr<server::Server> server_;
  int port_ = 0;
};

TEST_F(McpHttpTest, SessionLifecycleOverStreamableHttp) {
  const std::string sid = Open();
  ASSERT_FALSE(sid.empty());
  EXPECT_NE(sid.find('.'), std::string::npos);
  // A notification, and a client's response: 202, no body.
  auto note = Post({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}, Headers(sid));
  ASSERT_TRUE(note);
  EXPECT_EQ(note->status, 202);
  EXPECT_TRUE(note->body.empty());
  auto resp = Post({{"jsonrpc", "2.0"}, {"id", 77}, {"result", Json::object()}}, Headers(sid));
  EXPECT_EQ(resp->status, 202);
  // A request: JSON.
  auto list = Post(Rpc(2, "tools/list"), Headers(sid));
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  EXPECT_EQ(list->get_header_value("Content-Type"), "application/json");
  EXPECT_GT(Json::parse(list->body)["result"]["tools"].size(), 3u);
  // A tool call journaled in the session's saga, which the REST API shows its caller.
  auto call = Post(Rpc(3, "tools/call", {{"name", "book.make"}, {"arguments", {{"city", "rome"}}}}),
                   Headers(sid));
  Json cr = Json::parse(call->body)["result"];
  EXPECT_EQ(cr["structuredContent"]["state"], "succeeded") << call->body;
  const std::string saga = cr["_meta"]["io.idem/saga"]["saga_id"];
  EXPECT_EQ(sid.substr(0, sid.find('.')), saga);
  httplib::Client c("127.0.0.1", port_);
  auto view = c.Get(("/v1/sagas/" + saga).c_str(), Headers());
  EXPECT_EQ(view->status, 200) << view->body;
  // Missing session: 400; unknown: 404; wrong nonce for a real saga: 404.
  EXPECT_EQ(Post(Rpc(4, "tools/list"), Headers())->status, 400);
  EXPECT_EQ(Post(Rpc(5, "tools/list"), Headers("nope"))->status, 404);
  EXPECT_EQ(Post(Rpc(6, "tools/list"), Headers(saga + ".forgednonce"))->status, 404);
  // GET: no server-to-client stream.
  auto get = c.Get("/mcp", Headers(sid));
  EXPECT_EQ(get->status, 405);
  // DELETE ends it; then 404.
  auto del = c.Delete("/mcp", Headers(sid));
  EXPECT_EQ(del->status, 200);
  EXPECT_EQ(Post(Rpc(7, "tools/list"), Headers(sid))->status, 404);
  EXPECT_EQ(c.Delete("/mcp", Headers(sid))->status, 404);
}

TEST_F(McpHttpTest, ASessionIsTakenUpByAnotherServerOnTheSameStore) {
  const std::string sid = Open();
  auto first =
      Post(Rpc(2, "tools/call", {{"name", "book.make"}, {"arguments", {{"city", "rome"}}}}),
           Headers(sid));
  ASSERT_EQ(first->status, 200);
  // A second server on the same journal has never seen the session.
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.principals = {{"agent-1", Sha256Hex(kAgentToken), {"agent"}}};
  o.signer = signer_.get();
  auto other = server::Server::Create(store_.get(), &tools_, o);
  ASSERT_OK(other);
  ASSERT_OK((*other)->Start());
  httplib::Client c("127.0.0.1", (*other)->port());
  c.set_read_timeout(20, 0);
  httplib::Headers h = Headers(sid);
  h.emplace("MCP-Protocol-Version", "2025-11-25");
  auto again = c.Post(
      "/mcp", h,
      Rpc(3, "tools/call", {{"name", "book.make"}, {"arguments", {{"city", "rome"}}}}).dump(),
      "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
  Json r = Json::parse(again->body)["result"];
  EXPECT_EQ(r["structuredContent"]["deduplicated"], true) << again->body;
  EXPECT_EQ(ledger_->Count("book.make"), 1);
  (*other)->Stop();
}

TEST_F(McpHttpTest, RefusesBadHeadersOriginsHostsAndCallersWithoutToken) {
  const std::string sid = Open();
  const Json list = Rpc(9, "tools/list");
  // Accept without text/event-stream: 406.
  EXPECT_EQ(Post(list, Headers(sid, "application/json"))->status, 406);
  // An unsupported protocol version: 400; a supported one: 200.
  httplib::Headers bad = Headers(sid);
  bad.emplace("MCP-Protocol-Version", "1999-01-01");
  EXPECT_EQ(Post(list, bad)->status, 400);
  httplib::Headers good = Headers(sid);
  good.emplace("MCP-Protocol-Version", "2025-06-18");
  EXPECT_EQ(Post(list, good)->status, 200);
  // A foreign Origin: 403; loopback and the allow-listed one: served.
  for (const auto& [origin, status] :
       std::vector<std::pair<std::string, int>>{{"https://evil.example", 403},
                                                {"http://localhost:3000", 200},
                                                {"http://127.0.0.1", 200},
                                                {"https://app.example.com", 200},
                                                {"http://localhost.evil.example", 403}}) {
    httplib::Headers h = Headers(sid);
    h.emplace("Origin", origin);
    EXPECT_EQ(Post(list, h)->status, status) << origin;
  }
  // A Host that is not this server (DNS rebinding): 403.
  {
    httplib::Client c("127.0.0.1", port_);
    httplib::Headers h = Headers(sid);
    h.emplace("Host", "attacker.example:80");
    auto r = c.Post("/mcp", h, list.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << r->body;
  }
  // No bearer token: 401, like the API.
  httplib::Client c("127.0.0.1", port_);
  auto anon = c.Post("/mcp", {{"Accept", "application/json, text/event-stream"}}, list.dump(),
                     "application/json");
  EXPECT_EQ(anon->status, 401);
  // Not JSON: 400 with a parse error; not application/json: 415.
  auto garbage = c.Post("/mcp", Headers(sid), "{nope", "application/json");
  EXPECT_EQ(garbage->status, 400);
  EXPECT_EQ(Json::parse(garbage->body)["error"]["code"], mcp::rpc_error::kParseError);
  EXPECT_EQ(c.Post("/mcp", Headers(sid), list.dump(), "text/plain")->status, 415);
}

TEST_F(McpHttpTest, ACallWithAProgressTokenIsAnsweredWithAnSseStream) {
  slow_ms_->store(2'500);  // the transport's progress comes every second
  const std::string sid = Open();
  auto r =
      Post(Rpc(4, "tools/call",
               {{"name", "slow.do"}, {"arguments", {{"n", 3}}}, {"_meta", {{"progressToken", 7}}}}),
           Headers(sid));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  EXPECT_NE(r->body.find("notifications/progress"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("\"id\":4"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("\"succeeded\""), std::string::npos) << r->body;
}

}  // namespace
}  // namespace idem
