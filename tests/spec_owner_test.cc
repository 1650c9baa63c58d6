// Owned specs (issue 12, item 6) and bounded submissions over HTTP (item 7):
// a real `idem` server on an ephemeral loopback port, two agents and an
// approver, on a real SQLite journal and on a real PostgreSQL database (the
// ctest fixture `postgres`), with an in-process payment tool that records
// what it charged.

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "server/server.h"
#include "storage/pg_store.h"
#include "storage/store.h"
#include "tests/test_util.h"
#include "tools/tool.h"

#include "common/json_util.h"

namespace idem::server {
namespace {

namespace fs = std::filesystem;

const char* kAlice = "token-alice";
const char* kMallory = "token-mallory";
const char* kApprover = "token-approver";

// What pay.charge charged, by key.
struct Charges {
  std::mutex mu;
  std::map<std::string, Json> by_key;
  std::vector<Json> All() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<Json> out;
    for (auto& [k, v] : by_key) out.push_back(v);
    return out;
  }
};

std::unique_ptr<Tool> ChargeTool(Charges* charges, const std::string& name) {
  ToolInfo info;
  info.name = name;
  info.effect = EffectClass::kWrite;
  info.honours_keys = true;
  return std::make_unique<FunctionTool>(info, [charges, name](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(charges->mu);
    if (name == "pay.charge") charges->by_key.emplace(call.key, call.args);
    return ToolOutcome::Succeeded({{"ok", true}}, name + ":" + call.key);
  });
}

// Alice's spec: charge what the input says. Mallory's: a fixed 999,999.
Json ChargeSpec(const Json& amount) {
  return {{"steps",
           {{{"id", "charge"},
             {"tool", "pay.charge"},
             {"args", {{"amount_cents", amount}}},
             {"compensate", {{"tool", "pay.refund"}}}}}}};
}
const Json kAlicesSpec = ChargeSpec("${input.amount_cents}");
const Json kMallorysSpec = ChargeSpec(999'999);

class SpecOwnerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "postgresql") {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    }
    ASSERT_OK(tools_.Register(ChargeTool(&charges_, "pay.charge")));
    ASSERT_OK(tools_.Register(ChargeTool(&charges_, "pay.refund")));
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.principals = {{"alice", Sha256Hex(kAlice), {"agent"}},
                    {"mallory", Sha256Hex(kMallory), {"agent"}},
                    {"approver", Sha256Hex(kApprover), {"approver"}}};
    o.workers = 2;
    o.sweep_ms = 200;
    ASSERT_OK_AND_ASSIGN(server_, Server::Create(store_.get(), &tools_, o));
    ASSERT_OK(server_->Start());
  }

  void TearDown() override {
    if (server_) server_->Stop();
    server_.reset();
    store_.reset();
  }

  httplib::Headers Auth(const char* token, const std::string& key = "") const {
    httplib::Headers h{{"Authorization", std::string("Bearer ") + token}};
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return h;
  }
  // The status and the body as JSON (null when it is not JSON).
  std::pair<int, Json> Call(const std::string& method, const std::string& path, const char* token,
                            const Json& body = nullptr, const std::string& key = "") {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(20, 0);
    httplib::Result r =
        method == "PUT"    ? c.Put(path.c_str(), Auth(token), body.dump(), "application/json")
        : method == "POST" ? c.Post(path.c_str(), Auth(token, key), body.dump(), "application/json")
                           : c.Get(path.c_str(), Auth(token));
    if (!r) {
      ADD_FAILURE() << method << " " << path << ": no response";
      return {0, nullptr};
    }
    return {r->status, Json::parse(r->body, nullptr, false)};
  }

  Json WaitFor(const std::string& id, const std::string& state, const char* token = kAlice) {
    Json saga;
    for (int i = 0; i < 500; ++i) {
      saga = Call("GET", "/v1/sagas/" + id, token).second;
      if (saga.is_object() && saga.value("state", "") == state) return saga;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "saga " << id << " never reached " << state << ": " << saga.dump();
    return saga;
  }

  size_t SagaCount() {
    auto all = store_->ListSagas({});
    EXPECT_OK(all);
    return all.ok() ? all->size() : 0;
  }

  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::unique_ptr<storage::Store> store_;
  Charges charges_;
  ToolRegistry tools_;
  std::unique_ptr<Server> server_;
};

// The reproduction: Mallory's PUT of Alice's name is refused (403, never a
// version 2), and Alice's next submission by name still charges 184,000.
TEST_P(SpecOwnerTest, AnotherAgentCannotReplaceASpec) {
  auto [put, v1] = Call("PUT", "/v1/specs/shared", kAlice, kAlicesSpec);
  ASSERT_EQ(put, 201) << v1.dump();
  EXPECT_EQ(v1["version"], 1);
  EXPECT_EQ(v1["owner"], "alice");

  auto [hijack, problem] = Call("PUT", "/v1/specs/shared", kMallory, kMallorysSpec);
  EXPECT_EQ(hijack, 403) << problem.dump();
  EXPECT_EQ(problem.value("type", ""), "urn:idem:problem:spec-not-owned") << problem.dump();
  Json pinned = kMallorysSpec;
  pinned["version"] = 2;
  EXPECT_EQ(Call("PUT", "/v1/specs/shared", kMallory, pinned).first, 403);
  EXPECT_EQ(Call("GET", "/v1/specs/shared", kAlice).second["version"], 1) << "no version 2";

  auto [code, saga] = Call("POST", "/v1/sagas", kAlice,
                           {{"spec", "shared"}, {"input", {{"amount_cents", 184'000}}}}, "trip-1");
  ASSERT_EQ(code, 201) << saga.dump();
  Json done = WaitFor(saga["saga_id"], "succeeded");
  auto charged = charges_.All();
  ASSERT_EQ(charged.size(), 1u);
  EXPECT_EQ(charged[0]["amount_cents"], 184'000);
  EXPECT_EQ(done["spec"], "shared");
  EXPECT_EQ(done["spec_version"], 1);
  EXPECT_EQ(done["spec_sha256"], v1["fingerprint"]);

  // Not shared: Mallory can neither run nor read it, nor see it listed.
  auto [run, denied] = Call("POST", "/v1/sagas", kMallory,
                            {{"spec", "shared"}, {"input", {{"amount_cents", 1}}}}, "m-1");
  EXPECT_EQ(run, 403) << denied.dump();
  EXPECT_EQ(denied.value("type", ""), "urn:idem:problem:spec-not-shared");
  EXPECT_EQ(Call("GET", "/v1/specs/shared", kMallory).first, 403);
  EXPECT_TRUE(Call("GET", "/v1/specs", kMallory).second["specs"].empty());
  EXPECT_EQ(Call("GET", "/v1/specs", kApprover).second["specs"].size(), 1u);
  EXPECT_EQ(charges_.All().size(), 1u);
}

// Versions never change: the same content is the same version, other content
// the next one (only for the owner); a submission runs the version it names.
TEST_P(SpecOwnerTest, VersionsAreImmutableAndAPinnedVersionRuns) {
  ASSERT_EQ(Call("PUT", "/v1/specs/pay", kAlice, kAlicesSpec).first, 201);
  auto [again, same] = Call("PUT", "/v1/specs/pay", kAlice, kAlicesSpec);
  EXPECT_EQ(again, 200) << "the same content: the same version";
  EXPECT_EQ(same["version"], 1);
  auto [next, v2] = Call("PUT", "/v1/specs/pay", kAlice, ChargeSpec(5'000));
  EXPECT_EQ(next, 201);
  EXPECT_EQ(v2["version"], 2);
  Json rewrite = ChargeSpec(7);
  rewrite["version"] = 1;
  EXPECT_EQ(Call("PUT", "/v1/specs/pay", kAlice, rewrite).first, 409) << "version 1 never changes";

  const Json input = {{"amount_cents", 184'000}};
  auto [c1, s1] = Call("POST", "/v1/sagas", kAlice, {{"spec", "pay@1"}, {"input", input}}, "p-1");
  ASSERT_EQ(c1, 201) << s1.dump();
  auto [c2, s2] =
      Call("POST", "/v1/sagas", kAlice, {{"spec", "pay"}, {"version", 1}, {"input", input}}, "p-2");
  ASSERT_EQ(c2, 201) << s2.dump();
  auto [c3, s3] = Call("POST", "/v1/sagas", kAlice, {{"spec", "pay"}, {"input", input}}, "p-3");
  ASSERT_EQ(c3, 201) << s3.dump();
  EXPECT_EQ(WaitFor(s1["saga_id"], "succeeded")["spec_version"], 1);
  EXPECT_EQ(WaitFor(s2["saga_id"], "succeeded")["spec_version"], 1);
  Json latest = WaitFor(s3["saga_id"], "succeeded");
  EXPECT_EQ(latest["spec_version"], 2) << "no version named: the latest";
  EXPECT_EQ(latest["spec_sha256"], v2["fingerprint"]);
  std::multiset<int> amounts;
  for (const Json& c : charges_.All()) amounts.insert(c["amount_cents"].get<int>());
  EXPECT_EQ(amounts, (std::multiset<int>{5'000, 184'000, 184'000}));

  // The journal records which spec ran: on the saga row and in saga_created.
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(s1["saga_id"]));
  EXPECT_EQ(rec.summary.spec_name, "pay");
  EXPECT_EQ(rec.summary.spec_version, 1);
  EXPECT_EQ(rec.summary.spec_sha256, same["fingerprint"]);
  EXPECT_EQ(rec.summary.spec_sha256, Fingerprint(rec.spec));
  ASSERT_OK_AND_ASSIGN(auto journal, store_->ReadJournal(s1["saga_id"]));
  ASSERT_FALSE(journal.empty());
  EXPECT_EQ(journal[0].event, "saga_created");
  EXPECT_EQ(journal[0].data["spec_version"], 1);
  EXPECT_EQ(journal[0].data["spec_sha256"], same["fingerprint"]);
  ASSERT_OK_AND_ASSIGN(auto listed, store_->ListSagas({}));
  for (const auto& s : listed) EXPECT_FALSE(s.spec_sha256.empty()) << s.saga_id;
}

// A shared name runs for every agent (the owner's versions); still only the
// owner writes it.
TEST_P(SpecOwnerTest, ASharedSpecRunsForOthersButStaysTheOwners) {
  auto [put, v1] = Call("PUT", "/v1/specs/catalog?shared=true", kAlice, kAlicesSpec);
  ASSERT_EQ(put, 201) << v1.dump();
  EXPECT_EQ(v1["shared"], true);
  EXPECT_EQ(Call("PUT", "/v1/specs/catalog", kMallory, kMallorysSpec).first, 403);
  auto [code, saga] = Call("POST", "/v1/sagas", kMallory,
                           {{"spec", "catalog"}, {"input", {{"amount_cents", 42}}}}, "m-1");
  ASSERT_EQ(code, 201) << saga.dump();
  WaitFor(saga["saga_id"], "succeeded", kMallory);
  ASSERT_EQ(charges_.All().size(), 1u);
  EXPECT_EQ(charges_.All()[0]["amount_cents"], 42);
  EXPECT_EQ(Call("GET", "/v1/specs/catalog", kMallory).first, 200);
  // The owner takes it back: a same-content put with shared=false.
  EXPECT_EQ(Call("PUT", "/v1/specs/catalog?shared=false", kAlice, kAlicesSpec).first, 200);
  EXPECT_EQ(Call("POST", "/v1/sagas", kMallory,
                 {{"spec", "catalog"}, {"input", {{"amount_cents", 1}}}}, "m-2")
                .first,
            403);
}

// An inline spec has no registry version; its hash is recorded all the same.
TEST_P(SpecOwnerTest, InlineSpecRecordsItsHash) {
  Json spec = kAlicesSpec;
  spec["name"] = "inline-pay";
  auto [code, saga] =
      Call("POST", "/v1/sagas", kAlice, {{"spec", spec}, {"input", {{"amount_cents", 10}}}}, "i-1");
  ASSERT_EQ(code, 201) << saga.dump();
  Json done = WaitFor(saga["saga_id"], "succeeded");
  EXPECT_EQ(done["spec"], "inline-pay");
  EXPECT_TRUE(done["spec_version"].is_null()) << done.dump();
  EXPECT_EQ(done["spec_sha256"], Fingerprint(spec));
}

// Item 7 over HTTP: the 372 KB request whose templates make a 200 MB
// argument is 422 with the place named, and nothing is written.
TEST_P(SpecOwnerTest, AmplifiedSubmissionIsRefusedWithThePlace) {
  Json uses = Json::array();
  for (int i = 0; i < 20'000; ++i) uses.push_back("${input.note}");
  Json spec = ChargeSpec(1);
  spec["name"] = "amplify";
  spec["steps"][0]["args"]["items"] = uses;
  Json body = {{"spec", spec}, {"input", {{"note", std::string(10'000, 'n')}}}};
  EXPECT_GT(body.dump().size(), 300'000u);
  const uintmax_t before = GetParam() == "sqlite" ? fs::file_size(sqlite_.path()) +
                                                        fs::file_size(sqlite_.path() + "-wal")
                                                  : 0;
  auto [code, problem] = Call("POST", "/v1/sagas", kAlice, body, "big-1");
  EXPECT_EQ(code, 422) << problem.dump();
  EXPECT_EQ(problem.value("type", ""), "urn:idem:problem:saga-too-large");
  EXPECT_NE(problem.value("detail", "").find("steps[0].args.items["), std::string::npos)
      << problem.dump();
  EXPECT_EQ(SagaCount(), 0u);
  if (GetParam() == "sqlite") {
    EXPECT_EQ(fs::file_size(sqlite_.path()) + fs::file_size(sqlite_.path() + "-wal"), before);
  }
  // The key was not taken: a fitting request with it runs.
  Json small = ChargeSpec(1);
  small["name"] = "small";
  auto [ok, saga] =
      Call("POST", "/v1/sagas", kAlice, {{"spec", small}, {"input", Json::object()}}, "big-1");
  EXPECT_EQ(ok, 201) << saga.dump();
}

INSTANTIATE_TEST_SUITE_P(Stores, SpecOwnerTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem::server
