// Gateway mode (issue 15): the upstream MCP server's tools as idem tools
// (mcp/upstream_tool.h, cli/mcp_gateway.h) in open sagas of an Engine, on a
// real SQLite file and on PostgreSQL, against the real test upstream
// (tests/mcp_upstream/upstream.mjs) and its durable ledger:
//   - one effect per call, every call carrying its key in _meta;
//   - a repeated call answered from the journal (no second tools/call);
//   - rollback through the compensation the config maps;
//   - a process running the call SIGKILLed while the upstream write is in
//     flight, then a new process retrying the same call: a keyed tool makes
//     one effect in all; an unkeyed tool parks for a person and the
//     upstream sees no second call.

#include "cli/mcp_gateway.h"

#include <csignal>
#include <fstream>

#include <gtest/gtest.h>

#include "saga/engine.h"
#include "saga/open_saga.h"
#include "tests/mcp_upstream.h"
#include "tests/test_util.h"

#include "mcp/upstream_tool.h"
#include <sys/wait.h>
#include <unistd.h>

namespace idem {
namespace {

constexpr const char* kHelper = IDEM_BINARY_DIR "/tests/mcp-gateway-call";

constexpr const char* kConfig = R"({"timeout_ms": 20000, "tools": {
  "send_keyed": {"honours_keys": true, "status": {"tool": "send_status"},
                 "compensate": {"tool": "cancel_send",
                                "args": {"id": "${result.structuredContent.id}"}}},
  "send_unkeyed": {"compensate": {"tool": "cancel_send",
                                  "args": {"id": "${result.structuredContent.id}"}}},
  "cancel_send": {"compensate": null, "reason": "a recall is not undone"}}})";

class McpGatewayTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ledger_ = dir_.File("ledger.jsonl");
    config_ = dir_.File("gateway.json");
    std::ofstream(config_) << kConfig;
    if (GetParam() == "sqlite") {
      db_ = sqlite_.path();
    } else {
      ASSERT_OK(pg_.db().status());
      db_ = pg_.db().Url();
    }
  }

  void TearDown() override {
    engine_.reset();
    store_.reset();
    handle_.reset();  // ends the upstream before the ledger's folder goes
  }

  std::unique_ptr<storage::Store> OpenStore() {
    auto s = storage::OpenStore(db_);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  EngineOptions Options() {
    EngineOptions o;
    o.use_leases = GetParam() != "sqlite";
    o.lease_ms = 1'500;
    return o;
  }

  cli::GatewayFlags Flags(const std::string& extra = "") {
    cli::GatewayFlags f;
    f.upstream_command = test::UpstreamCommand(ledger_, extra);
    f.config_path = config_;
    return f;
  }

  // The gateway in this process, an engine on the store, and the open saga
  // of `intent` (begun_).
  void Start(const std::string& intent, std::vector<std::string> tools) {
    ASSERT_OK_AND_ASSIGN(handle_, cli::ConnectGateway(Flags(), &registry_));
    store_ = OpenStore();
    ASSERT_NE(store_, nullptr);
    engine_ = std::make_unique<Engine>(store_.get(), &registry_, Options());
    BeginRequest br;
    br.intent_key = intent;
    br.tools = std::move(tools);
    ASSERT_OK_AND_ASSIGN(begun, engine_->Begin(br));
  }

  // The helper process: one call, printed as JSON; its pid.
  int SpawnCall(const std::string& extra, const std::string& intent, const std::string& tool,
                const std::string& out) {
    return test::SpawnProcess(kHelper,
                              {db_, test::UpstreamCommand(ledger_, extra), config_, intent,
                               "send_keyed,send_unkeyed", "call-1", tool, R"({"to": "ana"})"},
                              out, out + ".err");
  }
  Json RunCall(const std::string& intent, const std::string& tool) {
    const std::string out = dir_.File("retry.out");
    int pid = SpawnCall("", intent, tool, out);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::ReadFile(out + ".err");
    return Json::parse(test::ReadFile(out), nullptr, false);
  }

  // SIGKILLs a helper process once the upstream write is in flight, then
  // waits for the orphaned upstream to finish the write it had begun.
  void KillMidWrite(const std::string& intent, const std::string& tool) {
    int pid = SpawnCall("--delay-ms 2000", intent, tool, dir_.File("killed.out"));
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(test::WaitForLedger(ledger_, "begin", tool, 1, 20'000))
        << test::ReadFile(dir_.File("killed.out.err"));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ASSERT_TRUE(test::WaitForLedger(ledger_, "effect", tool, 1, 10'000));
  }

  ToolRegistry registry_;
  std::shared_ptr<void> handle_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<Engine> engine_;
  BeginResult begun;

  test::TempDir dir_{"mcp_gateway"};
  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::string db_, ledger_, config_;
};

TEST_P(McpGatewayTest, EffectClassesComeFromAnnotationsAndTheConfig) {
  ToolRegistry registry;
  ASSERT_OK_AND_ASSIGN(auto handle, cli::ConnectGateway(Flags(), &registry));
  ASSERT_EQ(registry.List().size(), 7u);
  EXPECT_EQ(registry.Find("get_value")->info().effect, EffectClass::kRead);
  EXPECT_EQ(registry.Find("set_value")->info().effect, EffectClass::kIdempotent);
  const ToolInfo& keyed = registry.Find("send_keyed")->info();
  EXPECT_EQ(keyed.effect, EffectClass::kWrite);
  EXPECT_TRUE(keyed.honours_keys);
  EXPECT_TRUE(keyed.has_status);
  EXPECT_EQ(keyed.open.compensate_tool, "cancel_send");
  const ToolInfo& unkeyed = registry.Find("send_unkeyed")->info();
  EXPECT_EQ(unkeyed.effect, EffectClass::kWrite);
  EXPECT_FALSE(unkeyed.honours_keys);
  EXPECT_FALSE(unkeyed.has_status);
  // The upstream's listing, for an MCP server that lists the tool again.
  const Json* listed = mcp::UpstreamListing(*registry.Find("send_unkeyed"));
  ASSERT_NE(listed, nullptr);
  EXPECT_EQ((*listed)["inputSchema"]["required"], Json::array({"to"}));
  EXPECT_FALSE(listed->contains("annotations"));
}

TEST_P(McpGatewayTest, OneEffectPerCallAndARepeatIsAnsweredFromTheJournal) {
  ASSERT_NO_FATAL_FAILURE(
      Start("mail-1", {"get_value", "set_value", "send_keyed", "send_unkeyed"}));
  Engine& e = *engine_;
  CallRequest cr;
  cr.call_id = "c-1";
  cr.tool = "send_unkeyed";
  cr.args = {{"to", "ana"}, {"body", "hi"}};
  ASSERT_OK_AND_ASSIGN(auto first, e.Call(begun.saga_id, cr));
  EXPECT_EQ(first.state, "succeeded") << first.error;
  EXPECT_EQ(first.result["structuredContent"]["to"], "ana");
  ASSERT_EQ(test::LedgerCount(ledger_, "effect", "send_unkeyed"), 1);
  // The key the upstream saw is idem's step key.
  EXPECT_EQ(test::ReadLedger(ledger_).back()["key"], begun.saga_id + "/c1");

  ASSERT_OK_AND_ASSIGN(auto again, e.Call(begun.saga_id, cr));
  EXPECT_TRUE(again.deduplicated);
  EXPECT_EQ(again.duplicate_reason, "same call_id");
  EXPECT_EQ(again.result, first.result);
  cr.call_id = "c-2";  // the model repeating itself under a new id
  ASSERT_OK_AND_ASSIGN(auto repeat, e.Call(begun.saga_id, cr));
  EXPECT_TRUE(repeat.deduplicated);
  EXPECT_EQ(repeat.duplicate_of, "c-1");
  EXPECT_EQ(test::LedgerCount(ledger_, "begin", "send_unkeyed"), 1);
  EXPECT_EQ(test::LedgerCount(ledger_, "effect", "send_unkeyed"), 1);

  cr.call_id = "c-3";
  cr.tool = "get_value";
  cr.args = {{"name", "x"}};
  ASSERT_OK_AND_ASSIGN(auto read, e.Call(begun.saga_id, cr));
  EXPECT_EQ(read.state, "succeeded");
  EXPECT_TRUE(read.result["structuredContent"]["value"].is_null());
}

TEST_P(McpGatewayTest, RollbackCompensatesThroughTheMappedUpstreamTool) {
  ASSERT_NO_FATAL_FAILURE(Start("mail-2", {"send_keyed"}));
  Engine& e = *engine_;
  CallRequest cr;
  cr.call_id = "c-1";
  cr.tool = "send_keyed";
  cr.args = {{"to", "bo"}};
  ASSERT_OK_AND_ASSIGN(auto sent, e.Call(begun.saga_id, cr));
  ASSERT_EQ(sent.state, "succeeded") << sent.error;
  ControlRequest rb;
  rb.who = "ana";
  ASSERT_OK(e.Rollback(begun.saga_id, rb));
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(begun.saga_id));
  EXPECT_EQ(rec.summary.state, "compensated");
  ASSERT_EQ(test::LedgerCount(ledger_, "undo", "cancel_send"), 1);
  EXPECT_EQ(test::ReadLedger(ledger_).back()["args"]["id"], sent.result["structuredContent"]["id"]);
}

TEST_P(McpGatewayTest, AKeyedWriteKilledInFlightAndRetriedMakesOneEffect) {
  KillMidWrite("crash-keyed", "send_keyed");
  Json answer = RunCall("crash-keyed", "send_keyed");
  EXPECT_EQ(answer.value("state", ""), "succeeded") << answer.dump();
  EXPECT_EQ(test::LedgerCount(ledger_, "effect", "send_keyed"), 1);
  EXPECT_EQ(test::LedgerCount(ledger_, "begin", "send_keyed"), 1);
}

TEST_P(McpGatewayTest, AnUnkeyedWriteKilledInFlightParksForAPersonWithoutASecondCall) {
  KillMidWrite("crash-unkeyed", "send_unkeyed");
  Json answer = RunCall("crash-unkeyed", "send_unkeyed");
  EXPECT_EQ(answer.value("saga_state", ""), "needs_attention") << answer.dump();
  EXPECT_EQ(test::LedgerCount(ledger_, "effect", "send_unkeyed"), 1);
  EXPECT_EQ(test::LedgerCount(ledger_, "begin", "send_unkeyed"), 1);  // never called again
}

TEST_P(McpGatewayTest, BadFlagsNameTheFlag) {
  ToolRegistry registry;
  cli::GatewayFlags f;
  f.upstream_command = "node 'unterminated";
  EXPECT_THAT(cli::ConnectGateway(f, &registry),
              test::StatusIs(Code::kInvalidArgument, "--upstream: unterminated '"));
  f.upstream_url = "http://127.0.0.1:1/mcp";
  EXPECT_THAT(cli::ConnectGateway(f, &registry),
              test::StatusIs(Code::kInvalidArgument, "--upstream-url: give --upstream or"));
  f = {};
  f.config_path = config_;
  EXPECT_FALSE(cli::GatewayRequested(f));
  EXPECT_THAT(cli::ConnectGateway(f, &registry),
              test::StatusIs(Code::kInvalidArgument, "--gateway-config: needs --upstream"));
  f = Flags();
  std::ofstream(config_) << R"({"tools": {"send_keyed": {"compensate": {"tool": "nope"}}}})";
  EXPECT_THAT(cli::ConnectGateway(f, &registry),
              test::StatusIs(Code::kInvalidArgument,
                             "tools[\"send_keyed\"].compensate.tool: no upstream tool \"nope\""));
  EXPECT_TRUE(registry.List().empty());
}

INSTANTIATE_TEST_SUITE_P(Stores, McpGatewayTest, ::testing::Values("sqlite", "postgres"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
