// The travel providers as real HTTP servers (examples/travel_booking/
// http_providers.h), driven by idem's HTTP tools loaded from the shipped
// tools file, on a loopback port: a whole saga over HTTP, lost responses and
// dropped connections resolved through status lookups (RELIABILITY.md row
// 24), and same-key retries replayed by the provider's key layer (rows 8-10).

#include "examples/travel_booking/http_providers.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "preview_commit/token.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"
#include "tools/http_tool.h"

#include "common/clock.h"
#include <unistd.h>

namespace idem::travel {
namespace {

namespace fs = std::filesystem;

// The trip of examples/travel_booking/trip.json, with a two-phase flight
// (previewed over HTTP, committed with If-Match) and no human approval.
Json TripSpec() {
  return Json::parse(R"({
    "name": "trip_over_http",
    "steps": [
      {"id": "reserve_flight", "tool": "flights.reserve", "two_phase": true,
       "args": {"traveller": "${input.traveller}", "from": "LIS", "to": "NRT",
                "date": "2026-12-01", "currency": "EUR"},
       "compensate": {"tool": "flights.cancel",
                      "args": {"reservation_id": "${steps.reserve_flight.result.reservation_id}"}}},
      {"id": "book_hotel", "tool": "hotels.book",
       "args": {"traveller": "${input.traveller}", "city": "Tokyo", "check_in": "2026-12-01",
                "check_out": "2026-12-08"},
       "compensate": {"tool": "hotels.cancel",
                      "args": {"booking_id": "${steps.book_hotel.result.booking_id}"}}},
      {"id": "rent_car", "tool": "cars.rent",
       "args": {"traveller": "${input.traveller}", "city": "Tokyo"},
       "compensate": {"tool": "cars.return",
                      "args": {"rental_id": "${steps.rent_car.result.rental_id}"}}},
      {"id": "charge_payment", "tool": "payments.charge",
       "args": {"traveller": "${input.traveller}", "amount_cents": 184000, "currency": "EUR"},
       "compensate": {"tool": "payments.refund",
                      "args": {"charge_id": "${steps.charge_payment.result.charge_id}",
                               "amount_cents": 184000}}}
    ]})");
}

class HttpProvidersTest : public ::testing::Test {
 protected:
  void SetUp() override { ledger_path_ = dir_.File("ledger.sqlite"); }
  void TearDown() override {
    // The tools first: the connections they keep open would hold the
    // providers' server (cpp-httplib waits out its keep-alive) at Stop.
    tools_ = ToolRegistry();
    if (providers_) providers_->Stop();
    providers_.reset();
  }

  /// Starts the providers on an ephemeral loopback port with `faults`, and
  /// loads the shipped tools file pointed at it, with `timeout_ms`.
  void Start(const std::vector<std::string>& faults = {}, int64_t timeout_ms = 5'000,
             int64_t hold_ms = 15'000) {
    HttpProviderOptions options;
    options.ledger_path = ledger_path_;
    options.lost_response_hold_ms = hold_ms;
    options.confirm_delay_ms = confirm_delay_ms_;
    for (const auto& text : faults) {
      auto rule = ParseHttpFaultRule(text);
      ASSERT_OK(rule);
      options.faults.push_back(*rule);
    }
    auto providers = HttpProviders::Create(options);
    ASSERT_OK(providers);
    providers_ = std::move(providers).value();
    auto port = providers_->Start("127.0.0.1", 0);
    ASSERT_OK(port);
    port_ = *port;

    std::ifstream in(std::string(IDEM_SOURCE_DIR) + "/examples/travel_booking/tools.http.json");
    ASSERT_TRUE(in) << "cannot read tools.http.json";
    std::stringstream text;
    text << in.rdbuf();
    Json doc = Json::parse(text.str());
    for (auto& tool : doc["tools"]) {
      ASSERT_EQ(tool["base_url"], "http://127.0.0.1:8091");
      tool["base_url"] = "http://127.0.0.1:" + std::to_string(port_);
      tool["timeout_ms"] = timeout_ms;
    }
    Status loaded = LoadHttpTools(doc.dump(), &tools_);
    ASSERT_OK(loaded);
    auto ledger = Ledger::Open(ledger_path_);
    ASSERT_OK(ledger);
    ledger_ = *ledger;
  }

  /// Runs the trip as a saga with the HTTP tools on a SQLite journal.
  storage::SagaRecord RunTrip() {
    auto store = storage::OpenStore(dir_.File("journal.db"));
    EXPECT_OK(store);
    if (!store.ok()) return {};
    store_ = std::move(store).value();
    EngineOptions o;
    o.signer = &signer_;
    o.lookup_backoff = RetryPolicy{5, 20, 200};
    Engine engine(store_.get(), &tools_, o);
    auto spec = ParseSpec(TripSpec(), tools_);
    EXPECT_OK(spec);
    if (!spec.ok()) return {};
    auto sub = engine.Submit(*spec, {{"traveller", "Ana"}}, "trip-1");
    EXPECT_OK(sub);
    if (!sub.ok()) return {};
    auto rec = engine.Run(sub->saga_id);
    EXPECT_OK(rec);
    return rec.ok() ? *rec : storage::SagaRecord{};
  }

  const storage::StepRecord& Step(const storage::SagaRecord& rec, const std::string& id) {
    for (const auto& st : rec.steps) {
      if (st.step_id == id) return st;
    }
    ADD_FAILURE() << "no step " << id;
    static storage::StepRecord none;
    return none;
  }

  int Effects(const std::string& tool, const std::string& key) {
    auto n = ledger_->CountEffects(tool, key);
    EXPECT_OK(n);
    return n.ok() ? *n : -1;
  }
  int Calls(const std::string& tool, const std::string& key) {
    auto n = ledger_->CountCalls(tool, key);
    EXPECT_OK(n);
    return n.ok() ? *n : -1;
  }
  /// The outcomes the ledger logged for (provider, operation, key).
  std::vector<std::string> Outcomes(const std::string& provider, const std::string& operation,
                                    const std::string& key) {
    std::vector<std::string> out;
    auto calls = ledger_->Calls();
    EXPECT_OK(calls);
    if (!calls.ok()) return out;
    for (const auto& c : *calls) {
      if (c.provider == provider && c.operation == operation && c.idempotency_key == key) {
        out.push_back(c.outcome);
      }
    }
    return out;
  }

  ToolOutcome Invoke(const std::string& tool, const std::string& key, const Json& args,
                     const std::string& expected_version = "") {
    ToolCall call;
    call.tool = tool;
    call.key = key;
    call.args = args;
    call.expected_version = expected_version;
    Tool* t = tools_.Find(tool);
    EXPECT_NE(t, nullptr) << tool;
    return t == nullptr ? ToolOutcome::Failed("no tool", false) : t->Invoke(call);
  }

  test::TempDir dir_{"idem_http_providers"};
  std::string ledger_path_;
  int64_t confirm_delay_ms_ = 3'000;  ///< the slow provider's, for Start
  std::unique_ptr<HttpProviders> providers_;
  int port_ = 0;
  ToolRegistry tools_;
  std::shared_ptr<Ledger> ledger_;
  std::unique_ptr<storage::Store> store_;
  preview_commit::KeyRing keys_ =
      preview_commit::KeyRing::ForTesting({{"k1", std::string(32, 'k')}}, "k1");
  preview_commit::TokenSigner signer_{&keys_, SystemClock::Get()};
};

// The slow provider over the wire, through the shipped tools file's entry
// ("completion": {"mode": "accepted"}): 202 with the job id and a
// Retry-After of the time left, a pending status with the same; nothing is
// applied before the job is ready.
TEST_F(HttpProvidersTest, TheSlowProviderAnswers202AndPendingWithItsRetryAfter) {
  confirm_delay_ms_ = 600'000;
  ASSERT_NO_FATAL_FAILURE(Start());
  const Json args = {{"traveller", "Ana"}, {"city", "Tokyo"}, {"date", "2026-12-01"}};
  ToolOutcome accepted = Invoke("transfers.book", "t1", args);
  ASSERT_EQ(accepted.kind, OutcomeKind::kAccepted) << accepted.error;
  EXPECT_EQ(accepted.external_ref.rfind("JOB-", 0), 0u) << accepted.external_ref;
  EXPECT_EQ(accepted.check_after_ms, 600'000);
  LookupOutcome pending = tools_.Find("transfers.book")->Lookup("t1");
  ASSERT_EQ(pending.kind, LookupKind::kPending) << pending.error;
  EXPECT_EQ(pending.external_ref, accepted.external_ref);
  EXPECT_GE(pending.check_after_ms, 599'000);  // whole seconds, rounded up
  EXPECT_LE(pending.check_after_ms, 600'000);
  EXPECT_EQ(Effects("transfers.book", "t1"), 0);
  EXPECT_EQ(Outcomes("transfers", "book", "t1"), (std::vector<std::string>{"accepted"}));
}

// Once ready, the status endpoint answers applied (the effect written once),
// and a same-key commit answers that result with no second job.
TEST_F(HttpProvidersTest, TheSlowProvidersJobOnceReadyIsAppliedOnceAndReplayed) {
  confirm_delay_ms_ = 0;
  ASSERT_NO_FATAL_FAILURE(Start());
  const Json args = {{"traveller", "Ana"}, {"city", "Tokyo"}, {"date", "2026-12-01"}};
  ASSERT_EQ(Invoke("transfers.book", "t1", args).kind, OutcomeKind::kAccepted);
  LookupOutcome done = tools_.Find("transfers.book")->Lookup("t1");
  ASSERT_EQ(done.kind, LookupKind::kApplied) << done.error;
  EXPECT_EQ(done.external_ref, done.result["transfer_id"]);
  ToolOutcome again = Invoke("transfers.book", "t1", args);
  ASSERT_EQ(again.kind, OutcomeKind::kSucceeded) << again.error;
  EXPECT_EQ(again.result["transfer_id"], done.result["transfer_id"]);
  EXPECT_EQ(Effects("transfers.book", "t1"), 1);
}

// `decline` is carried out by the in-process provider only: the HTTP
// servers refuse it at start, saying where it works, rather than ignore it.
TEST_F(HttpProvidersTest, TheDeclineFaultIsRefusedAtStartNotIgnored) {
  HttpProviderOptions options;
  options.ledger_path = ledger_path_;
  auto rule = ParseHttpFaultRule("transfers.book=decline");
  ASSERT_OK(rule);
  options.faults.push_back(*rule);
  auto providers = HttpProviders::Create(options);
  ASSERT_FALSE(providers.ok());
  EXPECT_EQ(providers.status().code(), Code::kInvalidArgument);
  EXPECT_NE(providers.status().message().find("in-process"), std::string::npos)
      << providers.status().ToString();
}

TEST_F(HttpProvidersTest, ASagaOverHttpSucceedsWithOneLedgerRowPerStep) {
  ASSERT_NO_FATAL_FAILURE(Start());
  storage::SagaRecord rec = RunTrip();
  ASSERT_EQ(rec.summary.state, "succeeded") << rec.summary.reason;
  auto effects = ledger_->Effects();
  ASSERT_OK(effects);
  ASSERT_EQ(effects->size(), 4u);
  for (const auto& st : rec.steps) {
    EXPECT_EQ(st.state, "succeeded") << st.step_id;
    EXPECT_EQ(Effects(st.tool, st.step_key), 1) << st.step_id;
    EXPECT_EQ(Calls(st.tool, st.step_key), 1) << st.step_id;
  }
  // The journal holds what the providers answered over HTTP.
  const auto& flight = Step(rec, "reserve_flight");
  EXPECT_EQ(flight.result["reservation_id"], flight.external_ref);
  EXPECT_EQ(flight.result["reservation_id"], (*effects)[0].result["reservation_id"]);
  EXPECT_EQ(Step(rec, "charge_payment").result["amount_cents"], 184000);
  // The flight was previewed over HTTP (with its key) and committed with If-Match.
  EXPECT_EQ(Outcomes("flights", "preview", flight.step_key), std::vector<std::string>{"previewed"});
  EXPECT_EQ(flight.phase["preview"]["resource_version"], "v1") << flight.phase.dump();
  auto dups = ledger_->Duplicates();
  ASSERT_OK(dups);
  EXPECT_TRUE(dups->empty());
}

TEST_F(HttpProvidersTest, DroppedConnectionAfterTheCommitIsResolvedThroughTheStatusLookup) {
  // RELIABILITY.md row 24 (commit_then_RST): hotels.book applies the
  // booking, then closes the connection without an answer. hotels.book does
  // not deduplicate keys, so a blind retry would book twice.
  ASSERT_NO_FATAL_FAILURE(Start({"hotels.book=drop_connection@1"}));
  storage::SagaRecord rec = RunTrip();
  ASSERT_EQ(rec.summary.state, "succeeded") << rec.summary.reason;
  const auto& hotel = Step(rec, "book_hotel");
  EXPECT_EQ(Effects("hotels.book", hotel.step_key), 1);
  EXPECT_EQ(Calls("hotels.book", hotel.step_key), 1) << "no re-call after the lost answer";
  EXPECT_EQ(Outcomes("hotels", "lookup", hotel.step_key), std::vector<std::string>{"applied"});
  auto effects = ledger_->Effects();
  ASSERT_OK(effects);
  EXPECT_EQ(effects->size(), 4u);
  // The booking the journal holds is the one the provider made.
  for (const auto& e : *effects) {
    if (e.provider == "hotels") {
      EXPECT_EQ(e.result["booking_id"], hotel.result["booking_id"]);
    }
  }
}

TEST_F(HttpProvidersTest, ResponseWithheldPastTheClientTimeoutIsResolvedThroughTheStatusLookup) {
  // RELIABILITY.md row 24 (commit_then_hang): the answer never comes in time.
  ASSERT_NO_FATAL_FAILURE(Start({"hotels.book=lose_response@1"}, /*timeout_ms=*/300,
                                /*hold_ms=*/3'000));
  auto before = std::chrono::steady_clock::now();
  storage::SagaRecord rec = RunTrip();
  ASSERT_EQ(rec.summary.state, "succeeded") << rec.summary.reason;
  const auto& hotel = Step(rec, "book_hotel");
  EXPECT_EQ(Effects("hotels.book", hotel.step_key), 1);
  EXPECT_EQ(Calls("hotels.book", hotel.step_key), 1);
  // The status lookups share the tool's 300 ms timeout: on a loaded machine
  // the first one's answer can miss it too and the lookup is asked again.
  // Each finds the booking; none is a re-call.
  const std::vector<std::string> lookups = Outcomes("hotels", "lookup", hotel.step_key);
  EXPECT_FALSE(lookups.empty());
  for (const std::string& o : lookups) EXPECT_EQ(o, "applied");
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(2'500))
      << "resolved without waiting for the withheld answer";
}

TEST_F(HttpProvidersTest, ALostResponseOfAKeyHonouringProviderIsReplayedToTheRetry) {
  // payments.charge commits, the connection drops; the charge's stored
  // response is what a same-key retry gets (from the key layer, not the ledger).
  ASSERT_NO_FATAL_FAILURE(Start({"payments.charge=drop_connection@1"}));
  const Json args = {{"traveller", "Ana"}, {"amount_cents", 5000}, {"currency", "EUR"}};
  ToolOutcome lost = Invoke("payments.charge", "k-charge", args);
  EXPECT_EQ(lost.kind, OutcomeKind::kUnknown) << lost.error;
  EXPECT_NE(lost.error.find("no complete response"), std::string::npos)
      << "the connection closed without an answer: " << lost.error;
  ToolOutcome retry = Invoke("payments.charge", "k-charge", args);
  ASSERT_EQ(retry.kind, OutcomeKind::kSucceeded) << retry.error;
  EXPECT_EQ(Effects("payments.charge", "k-charge"), 1);
  EXPECT_EQ(Calls("payments.charge", "k-charge"), 1);
  auto effects = ledger_->Effects();
  ASSERT_OK(effects);
  ASSERT_EQ(effects->size(), 1u);
  EXPECT_EQ(retry.external_ref, (*effects)[0].result["charge_id"]);
}

TEST_F(HttpProvidersTest, SameKeyRetryIsReplayedByTheKeyLayer) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const Json args = {{"traveller", "Ana"}, {"from", "LIS"}, {"to", "NRT"}, {"date", "2026-12-01"}};
  ToolOutcome first = Invoke("flights.reserve", "k-flight", args);
  ToolOutcome second = Invoke("flights.reserve", "k-flight", args);
  ASSERT_EQ(first.kind, OutcomeKind::kSucceeded) << first.error;
  ASSERT_EQ(second.kind, OutcomeKind::kSucceeded) << second.error;
  EXPECT_EQ(first.external_ref, second.external_ref);
  EXPECT_EQ(first.result, second.result);
  EXPECT_EQ(Effects("flights.reserve", "k-flight"), 1);
  EXPECT_EQ(Calls("flights.reserve", "k-flight"), 1) << "the replay never reached the ledger";

  // On the wire: the replay says so; another body under the key is refused.
  httplib::Client cli("127.0.0.1", port_);
  httplib::Headers headers = {{"Idempotency-Key", "k-flight"}};
  auto replay = cli.Post("/flights/reserve", headers, CanonicalJson(args), "application/json");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 200);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  auto other = cli.Post("/flights/reserve", headers, R"({"traveller":"Bob"})", "application/json");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 422) << other->body;
  EXPECT_EQ(Effects("flights.reserve", "k-flight"), 1);

  // hotels mount no key layer and book again: why idem never blind-retries them.
  ToolOutcome h1 = Invoke("hotels.book", "k-hotel", {{"city", "Tokyo"}});
  ToolOutcome h2 = Invoke("hotels.book", "k-hotel", {{"city", "Tokyo"}});
  ASSERT_EQ(h1.kind, OutcomeKind::kSucceeded) << h1.error;
  ASSERT_EQ(h2.kind, OutcomeKind::kSucceeded) << h2.error;
  EXPECT_NE(h1.external_ref, h2.external_ref);
  EXPECT_EQ(Effects("hotels.book", "k-hotel"), 2);
}

TEST_F(HttpProvidersTest, OutcomesMapToTheHttpToolsClassification) {
  ASSERT_NO_FATAL_FAILURE(Start({"cars.rent=fail@1", "cars.rent=reject@2",
                                 "cars.rent=lose_request@3", "payments.charge=reprice@1"}));
  const Json car = {{"city", "Tokyo"}};
  ToolOutcome busy = Invoke("cars.rent", "k-car", car);
  EXPECT_EQ(busy.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(busy.retryable) << busy.error;
  EXPECT_NE(busy.error.find("HTTP 503"), std::string::npos) << busy.error;
  ToolOutcome refused = Invoke("cars.rent", "k-car", car);
  EXPECT_EQ(refused.kind, OutcomeKind::kFailed);
  EXPECT_FALSE(refused.retryable) << refused.error;
  ToolOutcome lost = Invoke("cars.rent", "k-car", car);
  EXPECT_EQ(lost.kind, OutcomeKind::kUnknown) << lost.error;
  EXPECT_NE(lost.error.find("no complete response"), std::string::npos) << lost.error;
  EXPECT_EQ(Effects("cars.rent", "k-car"), 0);
  ToolOutcome ok = Invoke("cars.rent", "k-car", car);
  EXPECT_EQ(ok.kind, OutcomeKind::kSucceeded) << ok.error;
  EXPECT_EQ(Effects("cars.rent", "k-car"), 1);
  EXPECT_EQ(
      Outcomes("cars", "rent", "k-car"),
      (std::vector<std::string>{"fault:fail", "fault:reject", "fault:lose_request", "applied"}));

  // Two-phase over HTTP: preview, a stale commit (412: the key is released),
  // a re-preview and the commit at the new version under the same key.
  const Json charge = {{"traveller", "Ana"}, {"amount_cents", 100}, {"currency", "EUR"}};
  Tool* pay = tools_.Find("payments.charge");
  ToolCall call;
  call.tool = "payments.charge";
  call.key = "k-pay";
  call.args = charge;
  PreviewOutcome p1 = pay->Preview(call);
  ASSERT_TRUE(p1.ok) << p1.error;
  EXPECT_EQ(p1.resource_version, "v1");
  EXPECT_NE(p1.summary.find("charge EUR 1.00 to Ana"), std::string::npos) << p1.summary;
  ToolOutcome stale = Invoke("payments.charge", "k-pay", charge, p1.resource_version);
  EXPECT_EQ(stale.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(stale.stale) << stale.error;
  PreviewOutcome p2 = pay->Preview(call);
  ASSERT_TRUE(p2.ok) << p2.error;
  EXPECT_EQ(p2.resource_version, "v2");
  ToolOutcome committed = Invoke("payments.charge", "k-pay", charge, p2.resource_version);
  EXPECT_EQ(committed.kind, OutcomeKind::kSucceeded) << committed.error;
  EXPECT_EQ(Effects("payments.charge", "k-pay"), 1);

  // Lookups: applied with the result, or a JSON 404 (not applied).
  LookupOutcome applied = pay->Lookup("k-pay");
  EXPECT_EQ(applied.kind, LookupKind::kApplied) << applied.error;
  EXPECT_EQ(applied.external_ref, committed.external_ref);
  LookupOutcome absent = pay->Lookup("saga/never:sent");
  EXPECT_EQ(absent.kind, LookupKind::kNotApplied) << absent.error;
}

TEST_F(HttpProvidersTest, BadFaultsAreRefused) {
  EXPECT_OK(ParseHttpFaultRule("cars.rent=drop_connection@2"));
  EXPECT_EQ(ParseHttpFaultRule("cars.rent=drop_connection@0").status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(ParseHttpFaultRule("cars.rent=explode").status().code(), Code::kInvalidArgument);
  HttpProviderOptions options;
  options.ledger_path = ledger_path_;
  options.faults.push_back(*ParseHttpFaultRule("cars.rent=reprice"));
  EXPECT_EQ(HttpProviders::Create(options).status().code(), Code::kInvalidArgument);
  options.faults = {*ParseHttpFaultRule("trains.book=fail")};
  EXPECT_EQ(HttpProviders::Create(options).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem::travel
