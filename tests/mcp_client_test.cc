// The MCP client (mcp/client*) against the real test upstream
// (tests/mcp_upstream/upstream.mjs, the official TypeScript SDK's server)
// over stdio and Streamable HTTP: version negotiation, tools/list, calls,
// errors, deadlines, and an upstream killed mid-call (unknown, never a
// definite failure). Also the --upstream split rule and the gateway
// config's errors.

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include "tests/mcp_upstream.h"
#include "tests/test_util.h"

#include "mcp/client.h"
#include "mcp/client_http.h"
#include "mcp/client_stdio.h"
#include "mcp/gateway_config.h"
#include "mcp/upstream_tool.h"
#include <sys/wait.h>
#include <unistd.h>

namespace idem::mcp {
namespace {

using Kind = CallResult::Kind;

std::unique_ptr<ClientTransport> Stdio(const std::string& ledger, const std::string& extra = "") {
  auto argv = SplitCommandLine(test::UpstreamCommand(ledger, extra));
  EXPECT_TRUE(argv.ok());
  return NewStdioTransport(argv.ok() ? *argv : std::vector<std::string>{});
}

Json Find(const std::vector<Json>& tools, const std::string& name) {
  for (const Json& t : tools) {
    if (t.value("name", "") == name) return t;
  }
  return nullptr;
}

// A Streamable HTTP upstream in a process of its own, on a free port.
class HttpUpstream {
 public:
  HttpUpstream(const test::TempDir& dir, const std::string& extra_flag = "",
               const std::string& extra_value = "") {
    ledger_ = dir.File("http-ledger.jsonl");
    out_ = dir.File("http-upstream.out");
    std::vector<std::string> args = {IDEM_SOURCE_DIR "/tests/mcp_upstream/upstream.mjs", "--ledger",
                                     ledger_, "--http", "0"};
    if (!extra_flag.empty()) {
      args.push_back(extra_flag);
      args.push_back(extra_value);
    }
    pid_ = test::SpawnProcess(IDEM_NODE, args, out_, dir.File("http-upstream.err"));
    for (int i = 0; i < 300 && port_ == 0; ++i) {
      std::string text = test::ReadFile(out_);
      if (auto at = text.find("listening "); at != std::string::npos) {
        port_ = std::atoi(text.c_str() + at + 10);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    EXPECT_NE(port_, 0) << "the HTTP upstream did not start";
  }
  ~HttpUpstream() { Kill(); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/mcp"; }
  const std::string& ledger() const { return ledger_; }

 private:
  std::string ledger_, out_;
  int pid_ = -1;
  int port_ = 0;
};

std::unique_ptr<ClientTransport> Http(const std::string& url) {
  HttpTransportOptions o;
  o.url = url;
  auto t = NewHttpTransport(o, "--upstream-url");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// ---- The same checks over both transports -------------------------------

void ListCallAndErrors(Client& c, const std::string& ledger) {
  EXPECT_EQ(c.protocol_version(), "2025-11-25");
  EXPECT_EQ(c.server_info().value("name", ""), "idem-test-upstream");
  ASSERT_OK_AND_ASSIGN(auto tools, c.ListTools());
  EXPECT_EQ(tools.size(), 7u);
  EXPECT_EQ(EffectFromAnnotations(Find(tools, "get_value")["annotations"]), EffectClass::kRead);
  EXPECT_EQ(EffectFromAnnotations(Find(tools, "set_value")["annotations"]),
            EffectClass::kIdempotent);
  EXPECT_EQ(EffectFromAnnotations(Find(tools, "send_keyed")["annotations"]), EffectClass::kWrite);
  EXPECT_FALSE(Find(tools, "send_unkeyed").contains("annotations"));
  EXPECT_EQ(EffectFromAnnotations(nullptr), EffectClass::kWrite);

  // A keyed write: one effect, its key from _meta recorded by the upstream.
  CallResult r = c.CallTool("send_keyed", {{"to", "ana"}}, {{kIdempotencyKeyMeta, "s/c1"}}, 10'000);
  ASSERT_EQ(r.kind, Kind::kResult) << r.reason;
  EXPECT_EQ(r.result["structuredContent"]["to"], "ana");
  ToolOutcome o = MapCallResult(r);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(o.external_ref, r.result["structuredContent"]["id"].get<std::string>());
  std::vector<Json> led = test::ReadLedger(ledger);
  ASSERT_EQ(test::LedgerCount(ledger, "effect"), 1);
  EXPECT_EQ(led.back()["key"], "s/c1");
  // The same key again: the upstream answers the first result, no effect.
  CallResult again =
      c.CallTool("send_keyed", {{"to", "ana"}}, {{kIdempotencyKeyMeta, "s/c1"}}, 10'000);
  ASSERT_EQ(again.kind, Kind::kResult);
  EXPECT_EQ(again.result["structuredContent"]["id"], r.result["structuredContent"]["id"]);
  EXPECT_EQ(test::LedgerCount(ledger, "effect"), 1);

  // isError: a definite failure.
  CallResult failed = c.CallTool("fail_always", Json::object(), Json::object(), 10'000);
  ASSERT_EQ(failed.kind, Kind::kResult);
  ToolOutcome fo = MapCallResult(failed);
  EXPECT_EQ(fo.kind, OutcomeKind::kFailed);
  EXPECT_NE(fo.error.find("this tool always fails"), std::string::npos) << fo.error;
  EXPECT_FALSE(fo.retryable);

  // An unknown method: a JSON-RPC error, definite (nothing ran).
  CallResult unknown = c.Request("no/such/method", Json::object(), 10'000);
  ASSERT_EQ(unknown.kind, Kind::kRpcError);
  EXPECT_EQ(unknown.error.code, rpc_error::kMethodNotFound);
  EXPECT_EQ(MapCallResult(unknown).kind, OutcomeKind::kFailed);
  EXPECT_OK(c.Ping());
}

TEST(McpClientStdioTest, NegotiatesListsCallsAndMapsErrors) {
  test::TempDir dir("mcp_client");
  const std::string ledger = dir.File("ledger.jsonl");
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(Stdio(ledger), {}));
  ListCallAndErrors(*c, ledger);
}

TEST(McpClientHttpTest, NegotiatesListsCallsAndMapsErrorsWithASession) {
  test::TempDir dir("mcp_client_http");
  HttpUpstream up(dir);
  // The upstream refuses any request but initialize without a valid
  // Mcp-Session-Id (400), so every call below passing proves it is sent.
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(Http(up.Url()), {}));
  ListCallAndErrors(*c, up.ledger());
}

TEST(McpClientStdioTest, AcceptsAnOlderRevisionAndRefusesAnUnknownOne) {
  test::TempDir dir("mcp_client_version");
  ASSERT_OK_AND_ASSIGN(auto old,
                       Client::Connect(Stdio(dir.File("l1"), "--version 2025-03-26"), {}));
  EXPECT_EQ(old->protocol_version(), "2025-03-26");
  auto refused = Client::Connect(Stdio(dir.File("l2"), "--version 2024-11-05"), {});
  EXPECT_THAT(refused, test::StatusIs(Code::kFailedPrecondition, "\"2024-11-05\""));
}

TEST(McpClientStdioTest, AnUpstreamKilledMidCallIsUnknownAndLaterCallsAreNotSent) {
  test::TempDir dir("mcp_client_kill");
  const std::string ledger = dir.File("ledger.jsonl");
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(Stdio(ledger, "--delay-ms 5000"), {}));
  CallResult r;
  std::thread call([&] {
    r = c->CallTool("send_unkeyed", {{"to", "bo"}}, {{kIdempotencyKeyMeta, "k"}}, 30'000);
  });
  ASSERT_TRUE(test::WaitForLedger(ledger, "begin", "send_unkeyed", 1, 10'000));
  const int pid = test::ReadLedger(ledger).back()["pid"].get<int>();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  call.join();
  EXPECT_EQ(r.kind, Kind::kUnknown) << r.reason;
  EXPECT_NE(r.reason.find("in flight"), std::string::npos) << r.reason;
  EXPECT_EQ(MapCallResult(r).kind, OutcomeKind::kUnknown);
  EXPECT_TRUE(c->closed());
  CallResult later = c->CallTool("get_value", {{"name", "x"}}, Json::object(), 5'000);
  EXPECT_EQ(later.kind, Kind::kNotSent);
  ToolOutcome lo = MapCallResult(later);
  EXPECT_EQ(lo.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(lo.retryable);
}

TEST(McpClientStdioTest, ADeadlineAfterSendingIsUnknown) {
  test::TempDir dir("mcp_client_deadline");
  const std::string ledger = dir.File("ledger.jsonl");
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(Stdio(ledger, "--delay-ms 3000"), {}));
  const auto t0 = std::chrono::steady_clock::now();
  CallResult r = c->CallTool("send_unkeyed", {{"to", "cy"}}, {{kIdempotencyKeyMeta, "k"}}, 500);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_EQ(r.kind, Kind::kUnknown);
  EXPECT_NE(r.reason.find("no answer within 500 ms"), std::string::npos) << r.reason;
  EXPECT_LT(ms, 2'500);
  // The connection still works after the cancelled request.
  EXPECT_OK(c->Ping());
}

TEST(McpClientHttpTest, AServerKilledMidCallIsUnknownAndNoServerIsNotSent) {
  test::TempDir dir("mcp_client_http_kill");
  HttpUpstream up(dir, "--delay-ms", "5000");
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(Http(up.Url()), {}));
  CallResult r;
  std::thread call([&] {
    r = c->CallTool("send_unkeyed", {{"to", "di"}}, {{kIdempotencyKeyMeta, "k"}}, 30'000);
  });
  ASSERT_TRUE(test::WaitForLedger(up.ledger(), "begin", "send_unkeyed", 1, 10'000));
  up.Kill();
  call.join();
  EXPECT_EQ(r.kind, Kind::kUnknown) << r.reason;
  // Nothing listens any more: not sent, a definite (retryable) failure.
  CallResult later = c->CallTool("get_value", {{"name", "x"}}, Json::object(), 5'000);
  EXPECT_EQ(later.kind, Kind::kNotSent) << later.reason;
  EXPECT_THAT(Client::Connect(Http(up.Url()), {}), test::StatusIs(Code::kUnavailable));
}

TEST(McpClientHttpTest, BadUrlsNameTheFlag) {
  HttpTransportOptions o;
  o.url = "ftp://x/mcp";
  EXPECT_THAT(NewHttpTransport(o, "--upstream-url"),
              test::StatusIs(Code::kInvalidArgument, "--upstream-url: \"ftp://x/mcp\""));
  o.url = "http://127.0.0.1:99999/mcp";
  EXPECT_THAT(NewHttpTransport(o, "--upstream-url"),
              test::StatusIs(Code::kInvalidArgument, "1..65535"));
}

TEST(McpClientStdioTest, AProgramThatCannotBeStartedIsAClearError) {
  auto c = Client::Connect(NewStdioTransport({"/nonexistent/mcp-server"}), {});
  EXPECT_THAT(c, test::StatusIs(Code::kUnavailable, "/nonexistent/mcp-server"));
}

// ---- The --upstream split rule -------------------------------------------

TEST(SplitCommandLineTest, SplitsWithoutAShell) {
  using V = std::vector<std::string>;
  EXPECT_THAT(SplitCommandLine("npx -y  some-server"),
              test::IsOkAndHolds(V{"npx", "-y", "some-server"}));
  EXPECT_THAT(SplitCommandLine("node 'my dir/s.js' \"a \\\"b\\\"\" c\\ d $HOME"),
              test::IsOkAndHolds(V{"node", "my dir/s.js", "a \"b\"", "c d", "$HOME"}));
  EXPECT_THAT(SplitCommandLine("x ''"), test::IsOkAndHolds(V{"x", ""}));
  EXPECT_THAT(SplitCommandLine("node 'oops"),
              test::StatusIs(Code::kInvalidArgument, "unterminated '"));
  EXPECT_THAT(SplitCommandLine("a \"b"), test::StatusIs(Code::kInvalidArgument, "unterminated \""));
  EXPECT_THAT(SplitCommandLine("a b\\"), test::StatusIs(Code::kInvalidArgument, "trailing"));
  EXPECT_THAT(SplitCommandLine("   "), test::StatusIs(Code::kInvalidArgument, "no command"));
}

// ---- The gateway config ----------------------------------------------------

TEST(GatewayConfigTest, ErrorsNameThePlace) {
  auto parse = [](const char* text) { return ParseGatewayConfig(Json::parse(text), ""); };
  EXPECT_THAT(parse(R"({"tools": {"send_email": {"effect": "wrte"}}})"),
              test::StatusIs(Code::kInvalidArgument,
                             "tools[\"send_email\"].effect: \"wrte\" is not one of"));
  EXPECT_THAT(
      parse(R"({"tools": {"send_email": {"honour_keys": true}}})"),
      test::StatusIs(Code::kInvalidArgument, "tools[\"send_email\"].honour_keys: unknown field"));
  EXPECT_THAT(parse(R"({"tools": {"s": {"compensate": {"args": {}}}}})"),
              test::StatusIs(Code::kInvalidArgument, "tools[\"s\"].compensate.tool: is required"));
  EXPECT_THAT(parse(R"({"tools": {"s": {"status": {}}}})"),
              test::StatusIs(Code::kInvalidArgument, "tools[\"s\"].status.tool: is required"));
  EXPECT_THAT(parse(R"({"timeout_ms": 0})"), test::StatusIs(Code::kInvalidArgument, "timeout_ms"));
  EXPECT_THAT(parse(R"({"client_cert": "c.pem"})"),
              test::StatusIs(Code::kInvalidArgument, "client_cert and client_key go together"));

  ASSERT_OK_AND_ASSIGN(auto c, parse(R"({"tools": {"send_email": {
      "effect": "irreversible", "honours_keys": true, "status": {"tool": "email_status"},
      "compensate": {"tool": "x", "args": {"id": "${result.structuredContent.id}"}}}}})"));
  const UpstreamToolConfig& t = c.tools.at("send_email");
  EXPECT_EQ(t.effect, EffectClass::kIrreversible);
  EXPECT_TRUE(t.honours_keys);
  EXPECT_EQ(t.status_key_arg, "key");
  EXPECT_THAT(CheckAgainstUpstream(c, {"send_email", "email_status"}),
              test::StatusIs(Code::kInvalidArgument,
                             "tools[\"send_email\"].compensate.tool: no upstream tool \"x\""));
  EXPECT_THAT(
      CheckAgainstUpstream(c, {"send_email", "x"}),
      test::StatusIs(Code::kInvalidArgument,
                     "tools[\"send_email\"].status.tool: no upstream tool \"email_status\""));
  EXPECT_THAT(CheckAgainstUpstream(c, {"other", "x", "email_status"}),
              test::StatusIs(Code::kInvalidArgument, "tools[\"send_email\"]: no upstream tool"));
  EXPECT_OK(CheckAgainstUpstream(c, {"send_email", "x", "email_status"}));
}

TEST(UpstreamToolTest, UnannotatedToolsAreWritesWithoutKeysAndTheConfigOverrides) {
  std::vector<Json> listed = {
      {{"name", "plain"}},
      {{"name", "lying"}, {"annotations", {{"readOnlyHint", true}}}},
      {{"name", "idem_set"}, {"annotations", {{"idempotentHint", true}}}},
  };
  ASSERT_OK_AND_ASSIGN(auto none, PlanUpstreamTools(listed, {}));
  EXPECT_EQ(none[0].info.effect, EffectClass::kWrite);
  EXPECT_FALSE(none[0].info.honours_keys);
  EXPECT_FALSE(none[0].info.has_status);
  EXPECT_EQ(none[0].info.open.no_compensation_reason,
            "no compensation mapped in the gateway config");
  EXPECT_EQ(none[1].info.effect, EffectClass::kRead);
  // idempotentHint with the default destructiveHint (true) is no idempotent tool.
  EXPECT_EQ(none[2].info.effect, EffectClass::kWrite);

  ASSERT_OK_AND_ASSIGN(auto config, ParseGatewayConfig(Json::parse(R"({"tools": {
      "lying": {"effect": "write", "approval": "human", "compensate": {"tool": "plain"}}}})"),
                                                       ""));
  ASSERT_OK_AND_ASSIGN(auto over, PlanUpstreamTools(listed, config));
  EXPECT_EQ(over[1].info.effect, EffectClass::kWrite);
  EXPECT_TRUE(over[1].info.open.human_approval);
  EXPECT_TRUE(over[1].info.has_preview);
  EXPECT_EQ(over[1].info.open.compensate_tool, "plain");

  std::vector<Json> bad = {{{"name", "has space"}}};
  EXPECT_THAT(PlanUpstreamTools(bad, {}),
              test::StatusIs(Code::kInvalidArgument, "tools/list[0].name: \"has space\""));
}

TEST(UpstreamToolTest, JsonRpcErrorsAreDefiniteOnlyWhenSentBeforeTheToolRan) {
  CallResult r;
  r.kind = Kind::kRpcError;
  r.error.code = rpc_error::kInvalidParams;
  EXPECT_EQ(MapCallResult(r).kind, OutcomeKind::kFailed);
  r.error.code = rpc_error::kInternalError;
  EXPECT_EQ(MapCallResult(r).kind, OutcomeKind::kUnknown);
  r.error.code = -32000;
  EXPECT_EQ(MapCallResult(r).kind, OutcomeKind::kUnknown);
}

}  // namespace
}  // namespace idem::mcp
