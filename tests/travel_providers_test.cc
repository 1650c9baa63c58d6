// The travel example's simulated providers (examples/travel_booking): key
// deduplication and its absence, status lookups, fault injection, the
// dtm-style barrier (RELIABILITY.md rows 21-22), failpoints and concurrency,
// previews, resource versions and stale two-phase commits, each checked
// against a real SQLite ledger in a fresh temporary directory.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "examples/travel_booking/providers.h"
#include "tests/test_util.h"
#include "tools/tool.h"

#include "common/failpoint.h"
#include <unistd.h>

namespace idem::travel {
namespace {

namespace fs = std::filesystem;

const char* const kExpectedSyntax =
    " (expected TOOL=MODE[@N], MODE one of fail, fail_times(K), reject, lose_request, "
    "lose_response, delay(MS), reprice, decline)";

using test::TempDir;

ToolCall Call(const std::string& tool, const std::string& key, Json args = Json::object()) {
  ToolCall call;
  call.tool = tool;
  call.key = key;
  call.args = std::move(args);
  return call;
}

/// An action and the compensation that undoes it, with its reference field.
struct Pair {
  std::string action;
  std::string compensation;
  std::string ref_field;  ///< of the action's result
};

const std::vector<Pair>& Pairs() {
  static const std::vector<Pair> pairs = {
      {"flights.reserve", "flights.cancel", "reservation_id"},
      {"hotels.book", "hotels.cancel", "booking_id"},
      {"cars.rent", "cars.return", "rental_id"},
      {"payments.charge", "payments.refund", "charge_id"},
  };
  return pairs;
}

std::string ProviderOf(const std::string& tool) { return tool.substr(0, tool.find('.')); }
std::string OperationOf(const std::string& tool) { return tool.substr(tool.find('.') + 1); }

Json ArgsFor(const std::string& tool) {
  if (tool == "flights.reserve") {
    return {{"traveller", "Ana"}, {"from", "LIS"}, {"to", "NRT"}, {"date", "2026-12-01"}};
  }
  if (tool == "hotels.book") return {{"city", "Tokyo"}, {"check_in", "2026-12-01"}};
  if (tool == "cars.rent") return {{"city", "Tokyo"}, {"from", "2026-12-01"}};
  if (tool == "payments.charge") {
    return {{"traveller", "Ana"},
            {"amount_cents", 184000},
            {"currency", "EUR"},
            {"description", "trip LIS-NRT"}};
  }
  return Json::object();
}

class TravelProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    failpoint::DisarmAll();
    ASSERT_FALSE(dir_.path().empty());
    options_.ledger_path = dir_.path() + "/ledger.sqlite";
  }
  void TearDown() override { failpoint::DisarmAll(); }

  /// Registers the ten tools with `faults` (TOOL=MODE[@N]) and opens the
  /// ledger beside them. False (with a test failure) when anything fails.
  bool Register(const std::vector<std::string>& faults = {}) {
    for (const auto& text : faults) {
      Result<FaultRule> rule = ParseFaultRule(text);
      if (!rule.ok()) {
        ADD_FAILURE() << text << ": " << rule.status().ToString();
        return false;
      }
      options_.faults.push_back(*rule);
    }
    Status s = RegisterTravelTools(registry_, options_);
    if (!s.ok()) {
      ADD_FAILURE() << s.ToString();
      return false;
    }
    Result<std::shared_ptr<Ledger>> ledger = Ledger::Open(options_.ledger_path, /*create=*/false);
    if (!ledger.ok()) {
      ADD_FAILURE() << ledger.status().ToString();
      return false;
    }
    ledger_ = *ledger;
    return true;
  }

  Tool* Find(const std::string& name) {
    Tool* tool = registry_.Find(name);
    if (tool == nullptr) ADD_FAILURE() << "no tool " << name;
    return tool;
  }

  ToolOutcome Invoke(const std::string& tool, const std::string& key, Json args) {
    Tool* t = Find(tool);
    if (t == nullptr) return ToolOutcome::Unknown("test: no tool " + tool);
    return t->Invoke(Call(tool, key, std::move(args)));
  }
  ToolOutcome Invoke(const std::string& tool, const std::string& key) {
    return Invoke(tool, key, ArgsFor(tool));
  }

  LookupOutcome Lookup(const std::string& tool, const std::string& key) {
    Tool* t = Find(tool);
    if (t == nullptr) return LookupOutcome();
    return t->Lookup(key);
  }

  PreviewOutcome Preview(const std::string& tool, const std::string& key, Json args) {
    Tool* t = Find(tool);
    if (t == nullptr) return PreviewOutcome();
    return t->Preview(Call(tool, key, std::move(args)));
  }
  PreviewOutcome Preview(const std::string& tool, const std::string& key) {
    return Preview(tool, key, ArgsFor(tool));
  }

  /// The commit of a two-phase call: Invoke carrying the previewed version.
  ToolOutcome Commit(const std::string& tool, const std::string& key, const std::string& version,
                     Json args) {
    Tool* t = Find(tool);
    if (t == nullptr) return ToolOutcome::Unknown("test: no tool " + tool);
    ToolCall call = Call(tool, key, std::move(args));
    call.expected_version = version;
    return t->Invoke(call);
  }
  ToolOutcome Commit(const std::string& tool, const std::string& key, const std::string& version) {
    return Commit(tool, key, version, ArgsFor(tool));
  }

  std::string Version(const std::string& provider, const std::string& resource) {
    Result<std::string> v = ledger_->ResourceVersion(provider, resource);
    EXPECT_OK(v);
    return v.ok() ? *v : "";
  }

  /// Effect rows of `tool` under `key`; -1 when the ledger cannot say.
  int Effects(const std::string& tool, const std::string& key) {
    Result<int> n = ledger_->CountEffects(tool, key);
    EXPECT_OK(n);
    return n.ok() ? *n : -1;
  }
  /// Effect rows under `key`, any tool.
  int AllEffects(const std::string& key) {
    Result<int> n = ledger_->CountEffects(key);
    EXPECT_OK(n);
    return n.ok() ? *n : -1;
  }
  int Attempts(const std::string& tool, const std::string& key) {
    Result<int> n = ledger_->CountCalls(tool, key);
    EXPECT_OK(n);
    return n.ok() ? *n : -1;
  }
  bool Barred(const std::string& provider, const std::string& key) {
    Result<bool> b = ledger_->IsBarred(provider, key);
    EXPECT_OK(b);
    return b.ok() && *b;
  }

  /// The outcomes logged in `calls` for (provider, operation, key), in order.
  /// `operation` is "lookup" for status lookups.
  std::vector<std::string> Outcomes(const std::string& provider, const std::string& operation,
                                    const std::string& key) {
    std::vector<std::string> out;
    Result<std::vector<LedgerCall>> calls = ledger_->Calls();
    EXPECT_OK(calls);
    if (!calls.ok()) return out;
    for (const auto& c : *calls) {
      if (c.provider == provider && c.operation == operation && c.idempotency_key == key) {
        out.push_back(c.outcome);
      }
    }
    return out;
  }
  std::vector<std::string> Outcomes(const std::string& tool, const std::string& key) {
    return Outcomes(ProviderOf(tool), OperationOf(tool), key);
  }

  std::vector<LedgerEffect> EffectRows(const std::string& tool, const std::string& key) {
    std::vector<LedgerEffect> out;
    Result<std::vector<LedgerEffect>> effects = ledger_->Effects();
    EXPECT_OK(effects);
    if (!effects.ok()) return out;
    for (const auto& e : *effects) {
      if (e.provider == ProviderOf(tool) && e.operation == OperationOf(tool) &&
          e.idempotency_key == key) {
        out.push_back(e);
      }
    }
    return out;
  }

  std::vector<DuplicateEffect> Duplicates() {
    Result<std::vector<DuplicateEffect>> d = ledger_->Duplicates();
    EXPECT_OK(d);
    return d.ok() ? *d : std::vector<DuplicateEffect>{};
  }

  TempDir dir_;
  ProviderOptions options_;
  ToolRegistry registry_;
  std::shared_ptr<Ledger> ledger_;
};

using Strings = std::vector<std::string>;

// ---- the tools

TEST_F(TravelProviderTest, ToolsMatchTheReadmeTable) {
  ASSERT_TRUE(Register());
  struct Row {
    const char* name;
    EffectClass effect;
    bool honours_keys;
    bool has_status;
    bool has_preview;
  };
  const std::vector<Row> rows = {
      {"flights.reserve", EffectClass::kWrite, true, true, true},
      {"flights.cancel", EffectClass::kIdempotent, true, false, false},
      {"hotels.book", EffectClass::kWrite, false, true, false},
      {"hotels.cancel", EffectClass::kIdempotent, true, true, false},
      {"cars.rent", EffectClass::kWrite, false, false, false},
      {"cars.return", EffectClass::kIdempotent, true, false, false},
      {"payments.charge", EffectClass::kWrite, true, true, true},
      {"payments.refund", EffectClass::kIdempotent, true, false, false},
      {"transfers.book", EffectClass::kWrite, true, true, false},
      {"transfers.cancel", EffectClass::kIdempotent, true, false, false},
  };
  std::set<std::string> expected_names;
  for (const auto& row : rows) {
    SCOPED_TRACE(row.name);
    expected_names.insert(row.name);
    Tool* tool = Find(row.name);
    ASSERT_NE(tool, nullptr);
    EXPECT_EQ(tool->info().name, row.name);
    EXPECT_EQ(tool->info().effect, row.effect);
    EXPECT_EQ(tool->info().honours_keys, row.honours_keys);
    EXPECT_EQ(tool->info().has_status, row.has_status);
    EXPECT_EQ(tool->info().has_preview, row.has_preview);
  }
  // Only the slow provider finishes later (saga/completion.h).
  for (const auto& row : rows) {
    EXPECT_EQ(Find(row.name)->info().completion.accepts, std::string(row.name) == "transfers.book")
        << row.name;
  }
  EXPECT_EQ(Find("transfers.book")->info().completion.window_ms, 30 * 60'000);
  const Strings& names = TravelToolNames();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_names);
  EXPECT_EQ(names.size(), rows.size());
  EXPECT_EQ(registry_.List().size(), rows.size());
}

// ---- the slow provider (transfers.book)

const Json kTransferArgs = {{"traveller", "Ana"}, {"city", "Tokyo"}, {"date", "2026-12-01"}};

// It takes the call at once (accepted, a job id, when to ask), applies
// nothing until the job is ready, and answers a repeated key from its
// ledger: the same job, never a second one.
TEST_F(TravelProviderTest, TheSlowProviderAcceptsAndStaysPendingUntilItsJobIsReady) {
  options_.confirm_delay_ms = 600'000;  // not ready within the test
  ASSERT_TRUE(Register());
  ToolOutcome first = Invoke("transfers.book", "t1", kTransferArgs);
  ASSERT_EQ(first.kind, OutcomeKind::kAccepted) << first.error;
  EXPECT_EQ(first.external_ref.rfind("JOB-", 0), 0u) << first.external_ref;
  EXPECT_EQ(first.check_after_ms, 600'000);
  ToolOutcome again = Invoke("transfers.book", "t1", kTransferArgs);
  ASSERT_EQ(again.kind, OutcomeKind::kAccepted) << again.error;
  EXPECT_EQ(again.external_ref, first.external_ref);
  EXPECT_GT(again.check_after_ms, 590'000);
  LookupOutcome pending = Lookup("transfers.book", "t1");
  ASSERT_EQ(pending.kind, LookupKind::kPending) << pending.error;
  EXPECT_EQ(pending.external_ref, first.external_ref);
  EXPECT_GT(pending.check_after_ms, 590'000);
  EXPECT_EQ(Lookup("transfers.book", "never-sent").kind, LookupKind::kNotApplied);
  EXPECT_EQ(Effects("transfers.book", "t1"), 0);
  EXPECT_EQ(Outcomes("transfers.book", "t1"), (Strings{"accepted", "repeat"}));
}

// Once ready, the first lookup writes the one effect row and answers
// applied; later lookups and a repeated call answer that same result.
TEST_F(TravelProviderTest, TheSlowProvidersFirstLookupOnceReadyAppliesItOnce) {
  options_.confirm_delay_ms = 0;  // ready at once
  ASSERT_TRUE(Register());
  ASSERT_EQ(Invoke("transfers.book", "t1", kTransferArgs).kind, OutcomeKind::kAccepted);
  LookupOutcome done = Lookup("transfers.book", "t1");
  ASSERT_EQ(done.kind, LookupKind::kApplied) << done.error;
  EXPECT_EQ(done.result["pickup"], "Airport Tokyo");
  EXPECT_EQ(done.external_ref, done.result["transfer_id"]);
  LookupOutcome later = Lookup("transfers.book", "t1");
  ASSERT_EQ(later.kind, LookupKind::kApplied) << later.error;
  EXPECT_EQ(later.result, done.result);
  ToolOutcome repeat = Invoke("transfers.book", "t1", kTransferArgs);
  ASSERT_EQ(repeat.kind, OutcomeKind::kSucceeded) << repeat.error;
  EXPECT_EQ(repeat.result, done.result);
  EXPECT_EQ(Effects("transfers.book", "t1"), 1);
  EXPECT_EQ(Outcomes("transfers", "lookup", "t1"), (Strings{"confirmed", "applied"}));
  // Its undo finds the confirmed transfer (no null compensation).
  ToolOutcome undo =
      Invoke("transfers.cancel", "t1:compensate", {{"transfer_id", done.external_ref}});
  ASSERT_EQ(undo.kind, OutcomeKind::kSucceeded) << undo.error;
  EXPECT_EQ(undo.result["cancelled"], true);
  EXPECT_EQ(Effects("transfers.cancel", "t1:compensate"), 1);
}

// `decline`: taken, then refused by the provider: failed, with no effect.
// The fault is only for a tool that accepts.
TEST_F(TravelProviderTest, ADeclinedJobAnswersFailedWithNoEffect) {
  options_.confirm_delay_ms = 0;
  ASSERT_TRUE(Register({"transfers.book=decline"}));
  ASSERT_EQ(Invoke("transfers.book", "t1", kTransferArgs).kind, OutcomeKind::kAccepted);
  LookupOutcome refused = Lookup("transfers.book", "t1");
  ASSERT_EQ(refused.kind, LookupKind::kFailed) << refused.error;
  EXPECT_NE(refused.error.find("declined"), std::string::npos) << refused.error;
  EXPECT_EQ(Effects("transfers.book", "t1"), 0);
  ToolOutcome repeat = Invoke("transfers.book", "t1", kTransferArgs);
  EXPECT_EQ(repeat.kind, OutcomeKind::kFailed) << repeat.error;
  EXPECT_FALSE(repeat.retryable);

  ToolRegistry other;
  ProviderOptions o = options_;
  o.faults = {*ParseFaultRule("hotels.book=decline")};
  Status bad = RegisterTravelTools(other, o);
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("transfers.book"), std::string::npos) << bad.ToString();
  o.faults.clear();
  o.confirm_delay_ms = -1;
  EXPECT_EQ(RegisterTravelTools(other, o).code(), Code::kInvalidArgument);
}

TEST_F(TravelProviderTest, KeyHonouringActionsApplyARepeatedKeyOnce) {
  ASSERT_TRUE(Register());
  for (const std::string tool : {"flights.reserve", "payments.charge"}) {
    SCOPED_TRACE(tool);
    ToolOutcome first = Invoke(tool, "k1");
    ASSERT_EQ(first.kind, OutcomeKind::kSucceeded) << first.error;
    EXPECT_FALSE(first.external_ref.empty());
    ToolOutcome again = Invoke(tool, "k1");
    ASSERT_EQ(again.kind, OutcomeKind::kSucceeded) << again.error;
    EXPECT_EQ(again.result, first.result);
    EXPECT_EQ(again.external_ref, first.external_ref);
    EXPECT_EQ(Effects(tool, "k1"), 1);
    EXPECT_EQ(Attempts(tool, "k1"), 2);
    EXPECT_EQ(Outcomes(tool, "k1"), (Strings{"applied", "repeat"}));

    std::vector<LedgerEffect> rows = EffectRows(tool, "k1");
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].result, first.result);
    EXPECT_EQ(rows[0].args, ArgsFor(tool));

    // Another key is another effect.
    ToolOutcome other = Invoke(tool, "k2");
    ASSERT_EQ(other.kind, OutcomeKind::kSucceeded) << other.error;
    EXPECT_NE(other.external_ref, first.external_ref);
    EXPECT_EQ(Effects(tool, "k2"), 1);
  }
  EXPECT_TRUE(Duplicates().empty());
}

TEST_F(TravelProviderTest, CompensationsApplyARepeatedKeyOnce) {
  ASSERT_TRUE(Register());
  for (const Pair& p : Pairs()) {
    SCOPED_TRACE(p.compensation);
    ToolOutcome action = Invoke(p.action, "a1");
    ASSERT_EQ(action.kind, OutcomeKind::kSucceeded) << action.error;
    ToolOutcome undo = Invoke(p.compensation, "a1:compensate", Json::object());
    ASSERT_EQ(undo.kind, OutcomeKind::kSucceeded) << undo.error;
    EXPECT_FALSE(undo.result.contains("null_compensation"));
    // The undo names what it undid, taken from the action's result.
    EXPECT_EQ(undo.result[p.ref_field], action.external_ref);
    ToolOutcome again = Invoke(p.compensation, "a1:compensate", Json::object());
    ASSERT_EQ(again.kind, OutcomeKind::kSucceeded) << again.error;
    EXPECT_EQ(again.result, undo.result);
    EXPECT_EQ(again.external_ref, undo.external_ref);
    EXPECT_EQ(Effects(p.compensation, "a1:compensate"), 1);
    EXPECT_EQ(Outcomes(p.compensation, "a1:compensate"), (Strings{"applied", "repeat"}));
    EXPECT_FALSE(Barred(ProviderOf(p.action), "a1"));
  }
  EXPECT_TRUE(Duplicates().empty());
}

TEST_F(TravelProviderTest, RefundCarriesTheChargedAmount) {
  ASSERT_TRUE(Register());
  ToolOutcome charge = Invoke("payments.charge", "p1", {{"amount_cents", 12345}});
  ASSERT_EQ(charge.kind, OutcomeKind::kSucceeded) << charge.error;
  EXPECT_EQ(charge.result["amount_cents"], 12345);
  EXPECT_EQ(charge.result["currency"], "EUR");
  ToolOutcome refund = Invoke("payments.refund", "p1:compensate", Json::object());
  ASSERT_EQ(refund.kind, OutcomeKind::kSucceeded) << refund.error;
  EXPECT_EQ(refund.result["charge_id"], charge.external_ref);
  EXPECT_EQ(refund.result["amount_cents"], 12345);
  EXPECT_FALSE(refund.external_ref.empty());
  EXPECT_NE(refund.external_ref, charge.external_ref);
}

TEST_F(TravelProviderTest, HotelsBookAndCarsRentApplyARepeatedKeyTwice) {
  ASSERT_TRUE(Register());
  for (const std::string tool : {"hotels.book", "cars.rent"}) {
    SCOPED_TRACE(tool);
    ToolOutcome first = Invoke(tool, "dup");
    ToolOutcome second = Invoke(tool, "dup");
    ASSERT_EQ(first.kind, OutcomeKind::kSucceeded) << first.error;
    ASSERT_EQ(second.kind, OutcomeKind::kSucceeded) << second.error;
    EXPECT_FALSE(first.external_ref.empty());
    EXPECT_FALSE(second.external_ref.empty());
    EXPECT_NE(first.external_ref, second.external_ref);  // a second room, a second car
    EXPECT_EQ(Effects(tool, "dup"), 2);
    EXPECT_EQ(Outcomes(tool, "dup"), (Strings{"applied", "applied"}));
    std::vector<LedgerEffect> rows = EffectRows(tool, "dup");
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].result, first.result);
    EXPECT_EQ(rows[1].result, second.result);
    EXPECT_LT(rows[0].id, rows[1].id);
  }
  // The crash checker (travel-ledger --check) reads exactly this.
  std::vector<DuplicateEffect> dups = Duplicates();
  ASSERT_EQ(dups.size(), 2u);
  EXPECT_EQ(dups[0].provider, "hotels");
  EXPECT_EQ(dups[0].operation, "book");
  EXPECT_EQ(dups[0].idempotency_key, "dup");
  EXPECT_EQ(dups[0].count, 2);
  EXPECT_EQ(dups[1].provider, "cars");
  EXPECT_EQ(dups[1].operation, "rent");
  EXPECT_EQ(dups[1].idempotency_key, "dup");
  EXPECT_EQ(dups[1].count, 2);
  EXPECT_EQ(AllEffects("dup"), 4);

  // A third call is a third row.
  ASSERT_EQ(Invoke("cars.rent", "dup").kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(Effects("cars.rent", "dup"), 3);
}

TEST_F(TravelProviderTest, InvalidArgsAreRefusedWithNoEffect) {
  ASSERT_TRUE(Register());
  ToolOutcome bad_amount = Invoke("payments.charge", "p9", {{"amount_cents", "lots"}});
  EXPECT_EQ(bad_amount.kind, OutcomeKind::kFailed);
  EXPECT_FALSE(bad_amount.retryable);
  EXPECT_EQ(bad_amount.error, "payments.charge: amount_cents must be a non-negative integer");
  EXPECT_EQ(Effects("payments.charge", "p9"), 0);
  EXPECT_EQ(Attempts("payments.charge", "p9"), 1);

  ToolOutcome negative = Invoke("payments.charge", "p10", {{"amount_cents", -1}});
  EXPECT_EQ(negative.kind, OutcomeKind::kFailed);
  EXPECT_EQ(Effects("payments.charge", "p10"), 0);

  ToolOutcome not_object = Invoke("hotels.book", "h9", Json::array());
  EXPECT_EQ(not_object.kind, OutcomeKind::kFailed);
  EXPECT_FALSE(not_object.retryable);
  EXPECT_EQ(not_object.error, "hotels.book: args must be a JSON object");
  EXPECT_EQ(Effects("hotels.book", "h9"), 0);
  EXPECT_EQ(Outcomes("hotels.book", "h9"), (Strings{"error"}));
}

// ---- status lookups

TEST_F(TravelProviderTest, StatusLookupsAnswerAppliedAndNotApplied) {
  ASSERT_TRUE(Register());
  for (const std::string tool : {"flights.reserve", "hotels.book", "payments.charge"}) {
    SCOPED_TRACE(tool);
    EXPECT_EQ(Lookup(tool, "s1").kind, LookupKind::kNotApplied);
    ToolOutcome done = Invoke(tool, "s1");
    ASSERT_EQ(done.kind, OutcomeKind::kSucceeded) << done.error;
    LookupOutcome found = Lookup(tool, "s1");
    EXPECT_EQ(found.kind, LookupKind::kApplied) << found.error;
    EXPECT_EQ(found.result, done.result);
    EXPECT_EQ(found.external_ref, done.external_ref);
    EXPECT_EQ(Lookup(tool, "s2").kind, LookupKind::kNotApplied);
    // Lookups are logged, but are not attempts.
    EXPECT_EQ(Outcomes(ProviderOf(tool), "lookup", "s1"), (Strings{"not_applied", "applied"}));
    EXPECT_EQ(Outcomes(ProviderOf(tool), "lookup", "s2"), (Strings{"not_applied"}));
    EXPECT_EQ(Attempts(tool, "s1"), 1);
  }

  // hotels.cancel answers for its own key.
  ASSERT_EQ(Invoke("hotels.book", "h1").kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(Lookup("hotels.cancel", "h1:compensate").kind, LookupKind::kNotApplied);
  ToolOutcome cancel = Invoke("hotels.cancel", "h1:compensate", Json::object());
  ASSERT_EQ(cancel.kind, OutcomeKind::kSucceeded) << cancel.error;
  LookupOutcome cancelled = Lookup("hotels.cancel", "h1:compensate");
  EXPECT_EQ(cancelled.kind, LookupKind::kApplied);
  EXPECT_EQ(cancelled.result, cancel.result);
  // The booking itself is still applied: a cancel is a new effect, not a deletion.
  EXPECT_EQ(Lookup("hotels.book", "h1").kind, LookupKind::kApplied);
}

TEST_F(TravelProviderTest, LookupOfADuplicatedBookingAnswersTheFirst) {
  ASSERT_TRUE(Register());
  ToolOutcome first = Invoke("hotels.book", "h1");
  ToolOutcome second = Invoke("hotels.book", "h1");
  ASSERT_EQ(first.kind, OutcomeKind::kSucceeded);
  ASSERT_EQ(second.kind, OutcomeKind::kSucceeded);
  LookupOutcome found = Lookup("hotels.book", "h1");
  EXPECT_EQ(found.kind, LookupKind::kApplied);
  EXPECT_EQ(found.result, first.result);
  EXPECT_EQ(found.external_ref, first.external_ref);
}

TEST_F(TravelProviderTest, ToolsWithoutStatusAnswerLookupError) {
  ASSERT_TRUE(Register());
  for (const std::string tool : {"cars.rent", "flights.cancel", "cars.return", "payments.refund"}) {
    SCOPED_TRACE(tool);
    ToolOutcome done = Invoke(tool, "n1");
    ASSERT_EQ(done.kind, OutcomeKind::kSucceeded) << done.error;
    EXPECT_EQ(Effects(tool, "n1"), 1);
    EXPECT_EQ(Lookup(tool, "n1").kind, LookupKind::kError);
    EXPECT_TRUE(Outcomes(ProviderOf(tool), "lookup", "n1").empty());
  }
}

// ---- faults

TEST_F(TravelProviderTest, FailIsATransientRefusalWithNoEffect) {
  ASSERT_TRUE(Register({"flights.reserve=fail"}));
  for (int i = 1; i <= 3; ++i) {
    ToolOutcome o = Invoke("flights.reserve", "f1");
    EXPECT_EQ(o.kind, OutcomeKind::kFailed);
    EXPECT_TRUE(o.retryable);
    EXPECT_EQ(o.error,
              "injected fault: transient failure (flights.reserve call " + std::to_string(i) + ")");
  }
  EXPECT_EQ(Effects("flights.reserve", "f1"), 0);
  EXPECT_EQ(Outcomes("flights.reserve", "f1"), (Strings{"fault:fail", "fault:fail", "fault:fail"}));
  EXPECT_EQ(Lookup("flights.reserve", "f1").kind, LookupKind::kNotApplied);
  // Only the named tool is faulted.
  EXPECT_EQ(Invoke("hotels.book", "f1").kind, OutcomeKind::kSucceeded);
}

TEST_F(TravelProviderTest, FailTimesFailsTheFirstKCallsThenRunsNormally) {
  ASSERT_TRUE(Register({"payments.charge=fail_times(2)"}));
  ToolOutcome o1 = Invoke("payments.charge", "p1");
  ToolOutcome o2 = Invoke("payments.charge", "p1");
  ToolOutcome o3 = Invoke("payments.charge", "p1");
  ToolOutcome o4 = Invoke("payments.charge", "p1");
  EXPECT_EQ(o1.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(o1.retryable);
  EXPECT_EQ(o2.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(o2.retryable);
  ASSERT_EQ(o3.kind, OutcomeKind::kSucceeded) << o3.error;
  ASSERT_EQ(o4.kind, OutcomeKind::kSucceeded) << o4.error;
  EXPECT_EQ(o4.result, o3.result);
  EXPECT_EQ(Effects("payments.charge", "p1"), 1);
  EXPECT_EQ(Outcomes("payments.charge", "p1"),
            (Strings{"fault:fail", "fault:fail", "applied", "repeat"}));
}

TEST_F(TravelProviderTest, RejectIsAPermanentRefusalWithNoEffect) {
  ASSERT_TRUE(Register({"hotels.book=reject"}));
  ToolOutcome o = Invoke("hotels.book", "r1");
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_FALSE(o.retryable);
  EXPECT_EQ(o.error, "injected fault: permanent refusal (hotels.book call 1)");
  EXPECT_EQ(Effects("hotels.book", "r1"), 0);
  EXPECT_EQ(Outcomes("hotels.book", "r1"), (Strings{"fault:reject"}));
  EXPECT_EQ(Lookup("hotels.book", "r1").kind, LookupKind::kNotApplied);
}

TEST_F(TravelProviderTest, LoseRequestHasNoEffectAndAnswersUnknown) {
  ASSERT_TRUE(Register({"flights.reserve=lose_request", "cars.rent=lose_request"}));
  for (const std::string tool : {"flights.reserve", "cars.rent"}) {
    SCOPED_TRACE(tool);
    ToolOutcome o = Invoke(tool, "l1");
    EXPECT_EQ(o.kind, OutcomeKind::kUnknown);
    EXPECT_EQ(o.error, "request lost");
    EXPECT_EQ(Effects(tool, "l1"), 0);
    EXPECT_EQ(Outcomes(tool, "l1"), (Strings{"fault:lose_request"}));
  }
  EXPECT_EQ(Lookup("flights.reserve", "l1").kind, LookupKind::kNotApplied);
}

TEST_F(TravelProviderTest, LoseResponseCommitsTheEffectAndAnswersUnknown) {
  ASSERT_TRUE(Register({"flights.reserve=lose_response@1", "hotels.book=lose_response@1",
                        "cars.rent=lose_response@1"}));
  for (const std::string tool : {"flights.reserve", "hotels.book", "cars.rent"}) {
    SCOPED_TRACE(tool);
    ToolOutcome o = Invoke(tool, "x1");
    EXPECT_EQ(o.kind, OutcomeKind::kUnknown);
    EXPECT_EQ(o.error, "response lost");
    EXPECT_EQ(Effects(tool, "x1"), 1);
    EXPECT_EQ(Outcomes(tool, "x1"), (Strings{"applied;response_lost"}));
  }
  // The lookup finds what was committed, and a key-honouring retry replays it.
  LookupOutcome found = Lookup("flights.reserve", "x1");
  ASSERT_EQ(found.kind, LookupKind::kApplied);
  std::vector<LedgerEffect> rows = EffectRows("flights.reserve", "x1");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(found.result, rows[0].result);
  ToolOutcome retry = Invoke("flights.reserve", "x1");
  ASSERT_EQ(retry.kind, OutcomeKind::kSucceeded) << retry.error;
  EXPECT_EQ(retry.result, found.result);
  EXPECT_EQ(retry.external_ref, found.external_ref);
  EXPECT_EQ(Effects("flights.reserve", "x1"), 1);
  // A blind retry of the booking books a second room.
  ASSERT_EQ(Invoke("hotels.book", "x1").kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(Effects("hotels.book", "x1"), 2);
}

TEST_F(TravelProviderTest, DelayHoldsTheCallThenRunsIt) {
  constexpr int kDelayMs = 150;
  ASSERT_TRUE(Register({"flights.reserve=delay(" + std::to_string(kDelayMs) + ")"}));
  auto start = std::chrono::steady_clock::now();
  ToolOutcome o = Invoke("flights.reserve", "d1");
  auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  EXPECT_GE(elapsed, kDelayMs);
  EXPECT_EQ(Effects("flights.reserve", "d1"), 1);
  EXPECT_EQ(Outcomes("flights.reserve", "d1"), (Strings{"applied"}));
}

TEST_F(TravelProviderTest, AtNHitsOnlyTheNthCallOfThatTool) {
  ASSERT_TRUE(Register({"flights.reserve=fail@2", "hotels.book=lose_request@3"}));
  // Calls of other tools do not advance the count.
  ASSERT_EQ(Invoke("hotels.book", "h1").kind, OutcomeKind::kSucceeded);
  ASSERT_EQ(Invoke("hotels.book", "h2").kind, OutcomeKind::kSucceeded);

  ToolOutcome c1 = Invoke("flights.reserve", "a");
  ToolOutcome c2 = Invoke("flights.reserve", "b");
  ToolOutcome c3 = Invoke("flights.reserve", "b");
  ToolOutcome c4 = Invoke("flights.reserve", "c");
  EXPECT_EQ(c1.kind, OutcomeKind::kSucceeded) << c1.error;
  EXPECT_EQ(c2.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(c2.retryable);
  EXPECT_EQ(c2.error, "injected fault: transient failure (flights.reserve call 2)");
  EXPECT_EQ(c3.kind, OutcomeKind::kSucceeded) << c3.error;
  EXPECT_EQ(c4.kind, OutcomeKind::kSucceeded) << c4.error;
  EXPECT_EQ(Outcomes("flights.reserve", "b"), (Strings{"fault:fail", "applied"}));
  EXPECT_EQ(Effects("flights.reserve", "b"), 1);

  ToolOutcome h3 = Invoke("hotels.book", "h3");
  EXPECT_EQ(h3.kind, OutcomeKind::kUnknown);
  EXPECT_EQ(h3.error, "request lost");
  EXPECT_EQ(Effects("hotels.book", "h3"), 0);
  ToolOutcome h4 = Invoke("hotels.book", "h3");
  EXPECT_EQ(h4.kind, OutcomeKind::kSucceeded) << h4.error;
  EXPECT_EQ(Effects("hotels.book", "h3"), 1);
}

TEST_F(TravelProviderTest, StatusLookupsNeverFault) {
  ASSERT_TRUE(Register({"flights.reserve=reject", "hotels.book=lose_request"}));
  EXPECT_EQ(Lookup("flights.reserve", "k").kind, LookupKind::kNotApplied);
  EXPECT_EQ(Lookup("hotels.book", "k").kind, LookupKind::kNotApplied);
  // Lookups do not count as calls for @N either.
  EXPECT_EQ(Outcomes("flights", "lookup", "k"), (Strings{"not_applied"}));
}

TEST_F(TravelProviderTest, RegisterRefusesAFaultForAnUnknownTool) {
  options_.faults.push_back({"nope.x", "fail", 0, 0});
  Status s = RegisterTravelTools(registry_, options_);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "fault for unknown tool \"nope.x\"");
  EXPECT_EQ(registry_.Find("flights.reserve"), nullptr);
}

// ---- previews and versions (two-phase calls)

// The fare the flights provider quotes for ArgsFor("flights.reserve") at v1.
constexpr int64_t kLisNrtCents = 88'500;
constexpr int64_t kRepriceStepCents = 2'500;
const char* const kLisNrt = "LIS-NRT/2026-12-01";
const char* const kAnaAccount = "account/Ana";

TEST_F(TravelProviderTest, PreviewDescribesTheChargeAndHasNoEffect) {
  ASSERT_TRUE(Register());
  PreviewOutcome p = Preview("payments.charge", "c1");
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.summary, "charge EUR 1,840.00 to Ana (trip LIS-NRT)");
  EXPECT_EQ(p.resource_version, "v1");
  EXPECT_EQ(p.changes, (Json{{"operation", "charge"},
                             {"traveller", "Ana"},
                             {"amount_cents", 184000},
                             {"currency", "EUR"},
                             {"description", "trip LIS-NRT"},
                             {"resource", kAnaAccount},
                             {"version", "v1"}}));
  EXPECT_TRUE(p.error.empty());
  // No effect; logged as a preview, not as an attempt.
  EXPECT_EQ(Effects("payments.charge", "c1"), 0);
  EXPECT_EQ(AllEffects("c1"), 0);
  EXPECT_EQ(Attempts("payments.charge", "c1"), 0);
  EXPECT_EQ(Outcomes("payments", "preview", "c1"), (Strings{"previewed"}));
  EXPECT_EQ(Lookup("payments.charge", "c1").kind, LookupKind::kNotApplied);
  // A preview is repeatable and changes nothing.
  PreviewOutcome again = Preview("payments.charge", "c1");
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_EQ(again.summary, p.summary);
  EXPECT_EQ(again.changes, p.changes);
  EXPECT_EQ(again.resource_version, "v1");
  EXPECT_EQ(Version("payments", kAnaAccount), "v1");
  EXPECT_EQ(Effects("payments.charge", "c1"), 0);

  // Other amounts, currencies, travellers; no description.
  PreviewOutcome small = Preview("payments.charge", "c2",
                                 {{"traveller", "Bo"}, {"amount_cents", 5}, {"currency", "JPY"}});
  ASSERT_TRUE(small.ok) << small.error;
  EXPECT_EQ(small.summary, "charge JPY 0.05 to Bo");
  EXPECT_EQ(small.changes["resource"], "account/Bo");
  PreviewOutcome big =
      Preview("payments.charge", "c3", {{"traveller", "Ana"}, {"amount_cents", 123456789}});
  ASSERT_TRUE(big.ok) << big.error;
  EXPECT_EQ(big.summary, "charge EUR 1,234,567.89 to Ana");
}

TEST_F(TravelProviderTest, PreviewDescribesTheFlightAndHasNoEffect) {
  ASSERT_TRUE(Register());
  PreviewOutcome p = Preview("flights.reserve", "f1");
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.summary, "reserve LIS \u2192 NRT on 2026-12-01 for Ana, EUR 885.00");
  EXPECT_EQ(p.resource_version, "v1");
  EXPECT_EQ(p.changes["operation"], "reserve");
  EXPECT_EQ(p.changes["traveller"], "Ana");
  EXPECT_EQ(p.changes["flight"]["from"], "LIS");
  EXPECT_EQ(p.changes["flight"]["to"], "NRT");
  EXPECT_EQ(p.changes["flight"]["date"], "2026-12-01");
  EXPECT_EQ(p.changes["price"], (Json{{"amount_cents", kLisNrtCents}, {"currency", "EUR"}}));
  EXPECT_EQ(p.changes["resource"], kLisNrt);
  EXPECT_EQ(p.changes["version"], "v1");
  EXPECT_EQ(Effects("flights.reserve", "f1"), 0);
  EXPECT_EQ(Attempts("flights.reserve", "f1"), 0);
  EXPECT_EQ(Outcomes("flights", "preview", "f1"), (Strings{"previewed"}));

  Json round_trip = ArgsFor("flights.reserve");
  round_trip["return_date"] = "2026-12-08";
  PreviewOutcome rt = Preview("flights.reserve", "f2", round_trip);
  ASSERT_TRUE(rt.ok) << rt.error;
  EXPECT_EQ(rt.summary,
            "reserve LIS \u2192 NRT on 2026-12-01 (return 2026-12-08) for Ana, EUR 885.00");
  EXPECT_EQ(rt.changes["flight"]["return_date"], "2026-12-08");

  // The commit books what the preview showed.
  ToolOutcome o = Commit("flights.reserve", "f1", p.resource_version);
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  EXPECT_EQ(o.result["price"], p.changes["price"]);
  EXPECT_EQ(o.result["flight"], p.changes["flight"]);
}

TEST_F(TravelProviderTest, ToolsWithoutAPreviewAnswerNotOk) {
  ASSERT_TRUE(Register());
  for (const std::string tool : {"hotels.book", "cars.rent", "flights.cancel", "payments.refund"}) {
    SCOPED_TRACE(tool);
    EXPECT_FALSE(Find(tool)->info().has_preview);
    PreviewOutcome p = Preview(tool, "n1");
    EXPECT_FALSE(p.ok);
    EXPECT_EQ(p.error, "tool " + tool + " offers no preview");
    EXPECT_TRUE(Outcomes(ProviderOf(tool), "preview", "n1").empty());
  }
}

TEST_F(TravelProviderTest, PreviewRefusesBadArgsAndBarredKeys) {
  ASSERT_TRUE(Register());
  PreviewOutcome bad = Preview("payments.charge", "b1", {{"amount_cents", "lots"}});
  EXPECT_FALSE(bad.ok);
  EXPECT_FALSE(bad.retryable);
  EXPECT_EQ(bad.error, "payments.charge: amount_cents must be a non-negative integer");
  EXPECT_EQ(Outcomes("payments", "preview", "b1"), (Strings{"rejected"}));

  PreviewOutcome not_object = Preview("flights.reserve", "b2", Json::array());
  EXPECT_FALSE(not_object.ok);
  EXPECT_EQ(not_object.error, "flights.reserve: args must be a JSON object");
  EXPECT_EQ(Outcomes("flights", "preview", "b2"), (Strings{"error"}));

  // The compensation came first: a commit would be refused, and so is the preview.
  ASSERT_EQ(Invoke("payments.refund", "b3:compensate", Json::object()).kind,
            OutcomeKind::kSucceeded);
  PreviewOutcome barred = Preview("payments.charge", "b3");
  EXPECT_FALSE(barred.ok);
  EXPECT_FALSE(barred.retryable);
  EXPECT_EQ(barred.error, "action arrived after its compensation");
  EXPECT_EQ(Outcomes("payments", "preview", "b3"), (Strings{"refused_after_compensation"}));
  EXPECT_EQ(AllEffects("b3"), 0);
}

TEST_F(TravelProviderTest, CommitWithTheMatchingVersionApplies) {
  ASSERT_TRUE(Register());
  for (const std::string tool : {"payments.charge", "flights.reserve"}) {
    SCOPED_TRACE(tool);
    PreviewOutcome p = Preview(tool, "m1");
    ASSERT_TRUE(p.ok) << p.error;
    ToolOutcome o = Commit(tool, "m1", p.resource_version);
    ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
    EXPECT_FALSE(o.stale);
    EXPECT_FALSE(o.external_ref.empty());
    EXPECT_EQ(Effects(tool, "m1"), 1);
    EXPECT_EQ(Outcomes(tool, "m1"), (Strings{"applied"}));
    EXPECT_EQ(Outcomes(ProviderOf(tool), "preview", "m1"), (Strings{"previewed"}));
    // A commit does not move the version.
    EXPECT_EQ(Preview(tool, "m2").resource_version, "v1");
  }
  EXPECT_EQ(Version("payments", kAnaAccount), "v1");
  EXPECT_EQ(Version("flights", kLisNrt), "v1");
}

TEST_F(TravelProviderTest, CommitWithAnOldVersionIsStaleWithNoEffect) {
  ASSERT_TRUE(Register());
  PreviewOutcome p = Preview("payments.charge", "s1");
  ASSERT_TRUE(p.ok) << p.error;
  ASSERT_EQ(p.resource_version, "v1");
  // Someone else changes the account between the preview and the commit.
  Result<std::string> bumped = ledger_->BumpVersion("payments", kAnaAccount);
  ASSERT_OK(bumped);
  EXPECT_EQ(*bumped, "v2");
  ToolOutcome o = Commit("payments.charge", "s1", "v1");
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(o.stale);
  EXPECT_FALSE(o.retryable);
  EXPECT_EQ(o.error,
            "payments.charge: account/Ana changed since the preview: previewed at version v1, "
            "now v2; nothing was done, preview again");
  EXPECT_EQ(Effects("payments.charge", "s1"), 0);
  EXPECT_EQ(Outcomes("payments.charge", "s1"), (Strings{"stale"}));
  EXPECT_EQ(Lookup("payments.charge", "s1").kind, LookupKind::kNotApplied);
  // Any version but the current one is stale, and the refusal repeats.
  EXPECT_TRUE(Commit("payments.charge", "s1", "v3").stale);
  EXPECT_TRUE(Commit("payments.charge", "s1", "nonsense").stale);
  EXPECT_EQ(Effects("payments.charge", "s1"), 0);
  // Other travellers' accounts did not move.
  EXPECT_EQ(
      Preview("payments.charge", "s9", {{"traveller", "Bo"}, {"amount_cents", 1}}).resource_version,
      "v1");
  // Preview again, then commit with the new version.
  PreviewOutcome again = Preview("payments.charge", "s1");
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_EQ(again.resource_version, "v2");
  ToolOutcome ok = Commit("payments.charge", "s1", again.resource_version);
  ASSERT_EQ(ok.kind, OutcomeKind::kSucceeded) << ok.error;
  EXPECT_EQ(Effects("payments.charge", "s1"), 1);
  EXPECT_EQ(Outcomes("payments.charge", "s1"), (Strings{"stale", "stale", "stale", "applied"}));
}

TEST_F(TravelProviderTest, AMovedFlightIsRepricedAndAStaleCommitBooksNothing) {
  ASSERT_TRUE(Register());
  PreviewOutcome p = Preview("flights.reserve", "r1");
  ASSERT_TRUE(p.ok) << p.error;
  ASSERT_OK(ledger_->BumpVersion("flights", kLisNrt));
  ToolOutcome o = Commit("flights.reserve", "r1", p.resource_version);
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(o.stale);
  EXPECT_EQ(o.error,
            "flights.reserve: LIS-NRT/2026-12-01 changed since the preview: previewed at version "
            "v1, now v2; nothing was done, preview again");
  EXPECT_EQ(Effects("flights.reserve", "r1"), 0);
  // Another date is another resource.
  Json other = ArgsFor("flights.reserve");
  other["date"] = "2026-12-02";
  EXPECT_EQ(Preview("flights.reserve", "r2", other).resource_version, "v1");

  PreviewOutcome again = Preview("flights.reserve", "r1");
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_EQ(again.resource_version, "v2");
  EXPECT_EQ(again.changes["price"]["amount_cents"], kLisNrtCents + kRepriceStepCents);
  EXPECT_EQ(again.summary, "reserve LIS \u2192 NRT on 2026-12-01 for Ana, EUR 910.00");
  ToolOutcome ok = Commit("flights.reserve", "r1", "v2");
  ASSERT_EQ(ok.kind, OutcomeKind::kSucceeded) << ok.error;
  EXPECT_EQ(ok.result["price"], again.changes["price"]);
  EXPECT_EQ(Effects("flights.reserve", "r1"), 1);
}

TEST_F(TravelProviderTest, EmptyExpectedVersionIsAOnePhaseCallWithNoCheck) {
  ASSERT_TRUE(Register());
  ASSERT_OK(ledger_->BumpVersion("payments", kAnaAccount));
  ASSERT_OK(ledger_->BumpVersion("flights", kLisNrt));
  for (const std::string tool : {"payments.charge", "flights.reserve"}) {
    SCOPED_TRACE(tool);
    ToolOutcome o = Invoke(tool, "e1");
    ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
    EXPECT_EQ(Effects(tool, "e1"), 1);
  }
  // The one-phase flight is booked at the current fare.
  EXPECT_EQ(EffectRows("flights.reserve", "e1").at(0).result["price"]["amount_cents"],
            kLisNrtCents + kRepriceStepCents);
  // Tools that version nothing ignore an expected version.
  ToolOutcome hotel = Commit("hotels.book", "e2", "v7", ArgsFor("hotels.book"));
  ASSERT_EQ(hotel.kind, OutcomeKind::kSucceeded) << hotel.error;
}

TEST_F(TravelProviderTest, RepeatOfAnAppliedKeyReplaysWithoutAVersionCheck) {
  ASSERT_TRUE(Register());
  PreviewOutcome p = Preview("payments.charge", "d1");
  ASSERT_TRUE(p.ok) << p.error;
  ToolOutcome first = Commit("payments.charge", "d1", p.resource_version);
  ASSERT_EQ(first.kind, OutcomeKind::kSucceeded) << first.error;
  ASSERT_OK(ledger_->BumpVersion("payments", kAnaAccount));
  // The effect is applied: a retry of the same commit replays it.
  ToolOutcome again = Commit("payments.charge", "d1", p.resource_version);
  ASSERT_EQ(again.kind, OutcomeKind::kSucceeded) << again.error;
  EXPECT_FALSE(again.stale);
  EXPECT_EQ(again.result, first.result);
  EXPECT_EQ(again.external_ref, first.external_ref);
  EXPECT_EQ(Effects("payments.charge", "d1"), 1);
  EXPECT_EQ(Outcomes("payments.charge", "d1"), (Strings{"applied", "repeat"}));
  // A preview of an applied key says so and shows the stored result.
  PreviewOutcome done = Preview("payments.charge", "d1");
  ASSERT_TRUE(done.ok) << done.error;
  EXPECT_EQ(done.summary, "already done: charge EUR 1,840.00 to Ana (trip LIS-NRT)");
  EXPECT_EQ(done.changes["already_applied"], true);
  EXPECT_EQ(done.changes["result"], first.result);
  EXPECT_EQ(done.resource_version, "v2");
  EXPECT_EQ(Outcomes("payments", "preview", "d1"), (Strings{"previewed", "already_applied"}));
}

TEST_F(TravelProviderTest, RepriceMakesExactlyTheSelectedCommitStale) {
  ASSERT_TRUE(Register({"payments.charge=reprice@2"}));
  // Call 1: not selected.
  PreviewOutcome p1 = Preview("payments.charge", "k1");
  ASSERT_EQ(p1.resource_version, "v1");
  ToolOutcome c1 = Commit("payments.charge", "k1", "v1");
  ASSERT_EQ(c1.kind, OutcomeKind::kSucceeded) << c1.error;
  // Call 2: the account moves just before the commit is handled.
  PreviewOutcome p2 = Preview("payments.charge", "k2");
  ASSERT_EQ(p2.resource_version, "v1");
  ToolOutcome c2 = Commit("payments.charge", "k2", p2.resource_version);
  EXPECT_EQ(c2.kind, OutcomeKind::kFailed);
  EXPECT_TRUE(c2.stale);
  EXPECT_NE(c2.error.find("previewed at version v1, now v2"), std::string::npos) << c2.error;
  EXPECT_EQ(Effects("payments.charge", "k2"), 0);
  EXPECT_EQ(Version("payments", kAnaAccount), "v2");  // the bump is durable
  // What the engine does next: preview again (no fault, not counted), commit.
  PreviewOutcome p3 = Preview("payments.charge", "k2");
  ASSERT_TRUE(p3.ok) << p3.error;
  EXPECT_EQ(p3.resource_version, "v2");
  EXPECT_EQ(p3.summary, p2.summary);  // same charge, moved account
  ToolOutcome c3 = Commit("payments.charge", "k2", p3.resource_version);  // call 3
  ASSERT_EQ(c3.kind, OutcomeKind::kSucceeded) << c3.error;
  EXPECT_EQ(Effects("payments.charge", "k2"), 1);
  EXPECT_EQ(Outcomes("payments.charge", "k2"), (Strings{"stale", "applied"}));
  EXPECT_EQ(Outcomes("payments", "preview", "k2"), (Strings{"previewed", "previewed"}));
  // Call 4: not selected either.
  ToolOutcome c4 = Commit("payments.charge", "k4", "v2");
  ASSERT_EQ(c4.kind, OutcomeKind::kSucceeded) << c4.error;
  EXPECT_EQ(Version("payments", kAnaAccount), "v2");
  EXPECT_TRUE(Duplicates().empty());
}

TEST_F(TravelProviderTest, RepriceOfAFlightRaisesTheFareForTheRePreview) {
  ASSERT_TRUE(Register({"flights.reserve=reprice@1"}));
  PreviewOutcome p = Preview("flights.reserve", "fr");
  ASSERT_TRUE(p.ok) << p.error;
  // Previews are not counted: the first Invoke is still call 1.
  ASSERT_TRUE(Preview("flights.reserve", "fr").ok);
  ToolOutcome stale = Commit("flights.reserve", "fr", p.resource_version);
  EXPECT_TRUE(stale.stale) << stale.error;
  EXPECT_EQ(Effects("flights.reserve", "fr"), 0);
  PreviewOutcome again = Preview("flights.reserve", "fr");
  EXPECT_EQ(again.resource_version, "v2");
  EXPECT_NE(again.summary, p.summary);
  EXPECT_EQ(again.changes["price"]["amount_cents"], kLisNrtCents + kRepriceStepCents);
  ToolOutcome ok = Commit("flights.reserve", "fr", again.resource_version);
  ASSERT_EQ(ok.kind, OutcomeKind::kSucceeded) << ok.error;
  EXPECT_EQ(ok.result["price"], again.changes["price"]);
  EXPECT_EQ(Outcomes("flights.reserve", "fr"), (Strings{"stale", "applied"}));
}

TEST_F(TravelProviderTest, RepriceOnAOnePhaseCallMovesTheVersionAndApplies) {
  ASSERT_TRUE(Register({"payments.charge=reprice"}));
  for (int i = 1; i <= 3; ++i) {
    ToolOutcome o = Invoke("payments.charge", "o" + std::to_string(i));
    ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  }
  EXPECT_EQ(Version("payments", kAnaAccount), "v4");
  // Without @N every commit is stale: the preview is always one version behind.
  PreviewOutcome p = Preview("payments.charge", "o9");
  EXPECT_EQ(p.resource_version, "v4");
  EXPECT_TRUE(Commit("payments.charge", "o9", p.resource_version).stale);
  EXPECT_EQ(Effects("payments.charge", "o9"), 0);
}

TEST_F(TravelProviderTest, PreviewsNeverFaultNorCountForAtN) {
  ASSERT_TRUE(Register({"payments.charge=reject@1", "flights.reserve=lose_request"}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(Preview("payments.charge", "q1").ok);
    EXPECT_TRUE(Preview("flights.reserve", "q1").ok);
  }
  // The first Invoke is still call 1, and is the one rejected.
  ToolOutcome o = Commit("payments.charge", "q1", "v1");
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_EQ(o.error, "injected fault: permanent refusal (payments.charge call 1)");
  EXPECT_EQ(Commit("payments.charge", "q1", "v1").kind, OutcomeKind::kSucceeded);
}

TEST_F(TravelProviderTest, RegisterRefusesRepriceForAToolWithoutAPreview) {
  Result<FaultRule> rule = ParseFaultRule("hotels.book=reprice@1");
  ASSERT_OK(rule);
  options_.faults.push_back(*rule);
  Status s = RegisterTravelTools(registry_, options_);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "fault reprice for \"hotels.book\": the tool has no preview (reprice applies to "
            "flights.reserve and payments.charge)");
  EXPECT_EQ(registry_.Find("hotels.book"), nullptr);
}

TEST_F(TravelProviderTest, VersionsAreDurableAndSharedByRegistries) {
  ASSERT_TRUE(Register({"payments.charge=reprice@1"}));
  ASSERT_EQ(Invoke("payments.charge", "v1").kind, OutcomeKind::kSucceeded);
  // Another registration (another process, for the CLI) sees the moved account.
  ToolRegistry second;
  ASSERT_OK(RegisterTravelTools(second, ProviderOptions{options_.ledger_path, 0, {}}));
  PreviewOutcome p = second.Find("payments.charge")
                         ->Preview(Call("payments.charge", "v2", ArgsFor("payments.charge")));
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.resource_version, "v2");
  Result<std::shared_ptr<Ledger>> reopened = Ledger::Open(options_.ledger_path, false);
  ASSERT_OK(reopened);
  Result<std::string> v = (*reopened)->ResourceVersion("payments", kAnaAccount);
  ASSERT_OK(v);
  EXPECT_EQ(*v, "v2");
  EXPECT_EQ(Version("payments", "account/Nobody"), "v1");
}

TEST_F(TravelProviderTest, ConcurrentCommitsAreNeverAppliedAfterTheVersionMoved) {
  ASSERT_TRUE(Register());
  // Threads commit at v1 while another moves the account: each commit is
  // applied (checked before the move) or stale, in one transaction with its
  // check, so nothing is applied after the first stale refusal.
  constexpr int kCommitters = 4;
  constexpr int kCommitsEach = 10;
  std::atomic<int> applied{0}, stale{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kCommitters; ++t) {
    threads.emplace_back([&, t] {
      Tool* tool = registry_.Find("payments.charge");
      for (int i = 0; i < kCommitsEach; ++i) {
        ToolCall call = Call("payments.charge", "t" + std::to_string(t) + "-" + std::to_string(i),
                             ArgsFor("payments.charge"));
        call.expected_version = "v1";
        ToolOutcome o = tool->Invoke(call);
        if (o.kind == OutcomeKind::kSucceeded) {
          ++applied;
        } else if (o.stale) {
          ++stale;
        } else {
          ++other;
        }
      }
    });
  }
  std::thread mover([&] { EXPECT_OK(ledger_->BumpVersion("payments", kAnaAccount)); });
  for (auto& th : threads) th.join();
  mover.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(applied.load() + stale.load(), kCommitters * kCommitsEach);
  Result<std::vector<LedgerCall>> calls = ledger_->Calls();
  ASSERT_OK(calls);
  bool seen_stale = false;
  for (const auto& c : *calls) {
    if (c.operation != "charge") continue;
    if (c.outcome == "stale") {
      seen_stale = true;
    } else {
      EXPECT_FALSE(seen_stale) << c.idempotency_key << " applied after a stale refusal";
    }
  }
  Result<std::vector<LedgerEffect>> effects = ledger_->Effects();
  ASSERT_OK(effects);
  EXPECT_EQ(static_cast<int>(effects->size()), applied.load());
  EXPECT_EQ(Version("payments", kAnaAccount), "v2");
}

// ---- the barrier (RELIABILITY.md rows 21 and 22)

TEST_F(TravelProviderTest, NullCompensationAppliesNothingAndBarsTheAction) {
  ASSERT_TRUE(Register());
  for (const Pair& p : Pairs()) {
    SCOPED_TRACE(p.compensation);
    const std::string provider = ProviderOf(p.action);
    EXPECT_FALSE(Barred(provider, "A"));
    ToolOutcome undo = Invoke(p.compensation, "A:compensate", Json::object());
    ASSERT_EQ(undo.kind, OutcomeKind::kSucceeded) << undo.error;
    EXPECT_EQ(undo.result, (Json{{"null_compensation", true}}));
    EXPECT_EQ(Effects(p.compensation, "A:compensate"), 0);
    EXPECT_EQ(Outcomes(p.compensation, "A:compensate"), (Strings{"null_compensation"}));
    EXPECT_TRUE(Barred(provider, "A"));
    // A repeat is still a null compensation.
    ToolOutcome again = Invoke(p.compensation, "A:compensate", Json::object());
    ASSERT_EQ(again.kind, OutcomeKind::kSucceeded) << again.error;
    EXPECT_EQ(again.result, (Json{{"null_compensation", true}}));
    EXPECT_EQ(Effects(p.compensation, "A:compensate"), 0);
  }
  // The barrier is per provider.
  EXPECT_FALSE(Barred("flights", "B"));
  EXPECT_EQ(AllEffects("A:compensate"), 0);
}

TEST_F(TravelProviderTest, HangingActionIsRefusedWithNoEffect) {
  ASSERT_TRUE(Register());
  for (const Pair& p : Pairs()) {
    SCOPED_TRACE(p.action);
    ASSERT_EQ(Invoke(p.compensation, "H:compensate", Json::object()).kind, OutcomeKind::kSucceeded);
    for (int i = 0; i < 2; ++i) {
      ToolOutcome late = Invoke(p.action, "H");
      EXPECT_EQ(late.kind, OutcomeKind::kFailed);
      EXPECT_FALSE(late.retryable);
      EXPECT_EQ(late.error, "action arrived after its compensation");
    }
    EXPECT_EQ(Effects(p.action, "H"), 0);
    EXPECT_EQ(Outcomes(p.action, "H"),
              (Strings{"refused_after_compensation", "refused_after_compensation"}));
    if (Find(p.action)->info().has_status) {
      EXPECT_EQ(Lookup(p.action, "H").kind, LookupKind::kNotApplied);
    }
    // Other keys of the same provider are not barred.
    EXPECT_EQ(Invoke(p.action, "other").kind, OutcomeKind::kSucceeded);
    EXPECT_EQ(Effects(p.action, "other"), 1);
  }
  EXPECT_EQ(AllEffects("H"), 0);
  EXPECT_EQ(AllEffects("H:compensate"), 0);
}

TEST_F(TravelProviderTest, CompensationOfARefusedActionIsNull) {
  ASSERT_TRUE(Register({"payments.charge=reject"}));
  ASSERT_EQ(Invoke("payments.charge", "c1").kind, OutcomeKind::kFailed);
  ToolOutcome undo = Invoke("payments.refund", "c1:compensate", Json::object());
  ASSERT_EQ(undo.kind, OutcomeKind::kSucceeded) << undo.error;
  EXPECT_EQ(undo.result, (Json{{"null_compensation", true}}));
  EXPECT_EQ(Effects("payments.refund", "c1:compensate"), 0);
  EXPECT_TRUE(Barred("payments", "c1"));
}

TEST_F(TravelProviderTest, CompensationAfterTheActionIsNotNull) {
  ASSERT_TRUE(Register());
  ASSERT_EQ(Invoke("cars.rent", "R").kind, OutcomeKind::kSucceeded);
  ToolOutcome undo = Invoke("cars.return", "R:compensate", Json::object());
  ASSERT_EQ(undo.kind, OutcomeKind::kSucceeded) << undo.error;
  EXPECT_EQ(undo.result["returned"], true);
  EXPECT_EQ(Effects("cars.return", "R:compensate"), 1);
  EXPECT_FALSE(Barred("cars", "R"));
  EXPECT_EQ(Outcomes("cars.return", "R:compensate"), (Strings{"applied"}));
}

TEST_F(TravelProviderTest, CompensationKeyWithoutTheSuffixSkipsTheBarrier) {
  ASSERT_TRUE(Register());
  ToolOutcome undo = Invoke("flights.cancel", "plain", {{"reservation_id", "FL-X"}});
  ASSERT_EQ(undo.kind, OutcomeKind::kSucceeded) << undo.error;
  EXPECT_FALSE(undo.result.contains("null_compensation"));
  EXPECT_EQ(undo.result["reservation_id"], "FL-X");
  EXPECT_EQ(Effects("flights.cancel", "plain"), 1);
  EXPECT_FALSE(Barred("flights", "plain"));
  EXPECT_FALSE(Barred("flights", ""));
  EXPECT_EQ(Invoke("flights.reserve", "plain").kind, OutcomeKind::kSucceeded);
}

// ---- failpoints

TEST_F(TravelProviderTest, AfterApplyErrLeavesTheEffectCommittedAndAnswersUnknown) {
  ASSERT_TRUE(Register());
  ASSERT_TRUE(failpoint::Arm("provider.after_apply=err").ok());
  for (const std::string tool : {"flights.reserve", "hotels.book", "cars.rent"}) {
    SCOPED_TRACE(tool);
    ToolOutcome o = Invoke(tool, "fp1");
    EXPECT_EQ(o.kind, OutcomeKind::kUnknown);
    EXPECT_EQ(o.error, "injected error at provider.after_apply");
    EXPECT_EQ(Effects(tool, "fp1"), 1);
    EXPECT_EQ(Outcomes(tool, "fp1"), (Strings{"applied"}));
  }
  EXPECT_EQ(failpoint::HitCount("provider.after_apply"), 3);
  EXPECT_EQ(Lookup("flights.reserve", "fp1").kind, LookupKind::kApplied);
  EXPECT_EQ(Lookup("hotels.book", "fp1").kind, LookupKind::kApplied);

  // A repeat of a key-honouring action is no new effect: the site is not reached.
  ToolOutcome repeat = Invoke("flights.reserve", "fp1");
  EXPECT_EQ(repeat.kind, OutcomeKind::kSucceeded) << repeat.error;
  EXPECT_EQ(failpoint::HitCount("provider.after_apply"), 3);
  EXPECT_EQ(Effects("flights.reserve", "fp1"), 1);
  // Compensations use the other site.
  EXPECT_EQ(Invoke("flights.cancel", "fp1:compensate", Json::object()).kind,
            OutcomeKind::kSucceeded);
  EXPECT_EQ(failpoint::HitCount("provider.after_apply"), 3);
}

TEST_F(TravelProviderTest, AfterApplyErrAtNFiresOnlyOnTheNthEffect) {
  ASSERT_TRUE(Register());
  ASSERT_TRUE(failpoint::Arm("provider.after_apply=err@2").ok());
  ToolOutcome o1 = Invoke("hotels.book", "k1");
  ToolOutcome o2 = Invoke("flights.reserve", "k2");
  ToolOutcome o3 = Invoke("payments.charge", "k3");
  EXPECT_EQ(o1.kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(o2.kind, OutcomeKind::kUnknown);
  EXPECT_EQ(o3.kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(Effects("hotels.book", "k1"), 1);
  EXPECT_EQ(Effects("flights.reserve", "k2"), 1);
  EXPECT_EQ(Effects("payments.charge", "k3"), 1);
}

TEST_F(TravelProviderTest, AfterUndoErrLeavesTheUndoCommittedAndAnswersUnknown) {
  ASSERT_TRUE(Register());
  ASSERT_EQ(Invoke("flights.reserve", "u1").kind, OutcomeKind::kSucceeded);
  ASSERT_TRUE(failpoint::Arm("provider.after_undo=err").ok());
  ToolOutcome o = Invoke("flights.cancel", "u1:compensate", Json::object());
  EXPECT_EQ(o.kind, OutcomeKind::kUnknown);
  EXPECT_EQ(o.error, "injected error at provider.after_undo");
  EXPECT_EQ(Effects("flights.cancel", "u1:compensate"), 1);
  EXPECT_EQ(failpoint::HitCount("provider.after_undo"), 1);
  // A retry replays the committed undo without a second row.
  failpoint::DisarmAll();
  ToolOutcome retry = Invoke("flights.cancel", "u1:compensate", Json::object());
  EXPECT_EQ(retry.kind, OutcomeKind::kSucceeded) << retry.error;
  EXPECT_EQ(retry.result, EffectRows("flights.cancel", "u1:compensate").at(0).result);
  EXPECT_EQ(Effects("flights.cancel", "u1:compensate"), 1);
}

TEST_F(TravelProviderTest, KillAfterApplyLeavesTheEffectDurable) {
  const std::string path = options_.ledger_path;
  EXPECT_EXIT(
      {
        ToolRegistry registry;
        ProviderOptions options;
        options.ledger_path = path;
        if (!RegisterTravelTools(registry, options).ok()) _exit(8);
        if (!failpoint::Arm("provider.after_apply=kill").ok()) _exit(9);
        registry.Find("hotels.book")->Invoke(Call("hotels.book", "crash", ArgsFor("hotels.book")));
        _exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  ASSERT_TRUE(Register());
  EXPECT_EQ(Effects("hotels.book", "crash"), 1);
  EXPECT_EQ(Outcomes("hotels.book", "crash"), (Strings{"applied"}));
  EXPECT_EQ(Lookup("hotels.book", "crash").kind, LookupKind::kApplied);
  // The blind retry a recovery must not send shows as a duplicate.
  ASSERT_EQ(Invoke("hotels.book", "crash").kind, OutcomeKind::kSucceeded);
  std::vector<DuplicateEffect> dups = Duplicates();
  ASSERT_EQ(dups.size(), 1u);
  EXPECT_EQ(dups[0].idempotency_key, "crash");
  EXPECT_EQ(dups[0].count, 2);
}

// ---- concurrency

constexpr int kThreads = 8;
constexpr int kKeys = 20;

TEST_F(TravelProviderTest, EightThreadsOnTheSameKeysApplyEachKeyOnce) {
  ASSERT_TRUE(Register());
  const Strings tools = {"flights.reserve", "payments.charge"};
  std::mutex mu;
  std::map<std::string, std::set<std::string>> refs;  // tool/key -> refs seen
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; ++i) {
        // Each thread walks the keys from a different start.
        std::string key = "key" + std::to_string((i + t * 3) % kKeys);
        for (const auto& tool : tools) {
          ToolOutcome o = registry_.Find(tool)->Invoke(Call(tool, key, ArgsFor(tool)));
          std::lock_guard<std::mutex> lock(mu);
          if (o.kind != OutcomeKind::kSucceeded)
            errors.push_back(tool + " " + key + ": " + o.error);
          refs[tool + "/" + key].insert(o.external_ref);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  for (const auto& tool : tools) {
    for (int i = 0; i < kKeys; ++i) {
      std::string key = "key" + std::to_string(i);
      SCOPED_TRACE(tool + " " + key);
      EXPECT_EQ(Effects(tool, key), 1);
      EXPECT_EQ(Attempts(tool, key), kThreads);
      EXPECT_EQ(refs[tool + "/" + key].size(), 1u);  // every thread saw the same result
    }
  }
  EXPECT_TRUE(Duplicates().empty());
}

TEST_F(TravelProviderTest, TwoRegistriesOnOneLedgerApplyEachKeyOnce) {
  ASSERT_TRUE(Register());
  ToolRegistry second;
  ASSERT_OK(RegisterTravelTools(second, options_));  // its own connection
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    ToolRegistry& registry = t % 2 == 0 ? registry_ : second;
    threads.emplace_back([&registry, &failures] {
      for (int i = 0; i < kKeys; ++i) {
        std::string key = "shared" + std::to_string(i);
        ToolOutcome o = registry.Find("flights.reserve")
                            ->Invoke(Call("flights.reserve", key, ArgsFor("flights.reserve")));
        if (o.kind != OutcomeKind::kSucceeded) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < kKeys; ++i) {
    EXPECT_EQ(Effects("flights.reserve", "shared" + std::to_string(i)), 1) << i;
  }
  EXPECT_TRUE(Duplicates().empty());
}

TEST_F(TravelProviderTest, EightThreadsOnOneKeyBookEightRooms) {
  ASSERT_TRUE(Register());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      ToolOutcome o =
          registry_.Find("hotels.book")->Invoke(Call("hotels.book", "one", ArgsFor("hotels.book")));
      if (o.kind != OutcomeKind::kSucceeded) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(Effects("hotels.book", "one"), kThreads);
  std::vector<DuplicateEffect> dups = Duplicates();
  ASSERT_EQ(dups.size(), 1u);
  EXPECT_EQ(dups[0].count, kThreads);
}

// ---- fault rules

TEST(ProviderFaultRuleTest, ParsesValidRules) {
  struct Case {
    const char* text;
    const char* tool;
    const char* mode;
    int nth;
    int param;
  };
  const std::vector<Case> cases = {
      {"flights.reserve=fail", "flights.reserve", "fail", 0, 0},
      {"flights.reserve=fail@1", "flights.reserve", "fail", 1, 0},
      {"hotels.book=reject@12", "hotels.book", "reject", 12, 0},
      {"cars.return=fail_times(2)", "cars.return", "fail_times", 0, 2},
      {"hotels.book=lose_request@3", "hotels.book", "lose_request", 3, 0},
      {"payments.charge=lose_response", "payments.charge", "lose_response", 0, 0},
      {"flights.reserve=delay(5)@2", "flights.reserve", "delay", 2, 5},
      {"x=delay(250)", "x", "delay", 0, 250},
      {"payments.charge=reprice", "payments.charge", "reprice", 0, 0},
      {"flights.reserve=reprice@2", "flights.reserve", "reprice", 2, 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    Result<FaultRule> r = ParseFaultRule(c.text);
    ASSERT_OK(r);
    EXPECT_EQ(r->tool, c.tool);
    EXPECT_EQ(r->mode, c.mode);
    EXPECT_EQ(r->nth, c.nth);
    EXPECT_EQ(r->param, c.param);
  }
}

TEST(ProviderFaultRuleTest, RejectsBadRulesWithExactMessages) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x", "no TOOL="},
      {"=fail", "no TOOL="},
      {"a.b=", "no mode"},
      {"a.b=boom", "unknown mode \"boom\""},
      {"a.b=fail@0", "@N must be a positive integer"},
      {"a.b=fail@x", "@N must be a positive integer"},
      {"a.b=fail@", "@N must be a positive integer"},
      {"a.b=fail@-1", "@N must be a positive integer"},
      {"a.b=fail_times", "fail_times needs an argument, e.g. fail_times(2)"},
      {"a.b=delay", "delay needs an argument, e.g. delay(2)"},
      {"a.b=fail(2)", "mode fail takes no argument"},
      {"a.b=reject(1)@2", "mode reject takes no argument"},
      {"a.b=reprice(1)", "mode reprice takes no argument"},
      {"a.b=reprice@0", "@N must be a positive integer"},
      {"a.b=fail_times(2)@1", "fail_times(K) takes no @N"},
      {"a.b=delay(x)", "delay(...) needs a non-negative integer"},
      {"a.b=delay()", "delay(...) needs a non-negative integer"},
      {"a.b=fail_times(-1)", "fail_times(...) needs a non-negative integer"},
      {"a.b=delay(5", "unclosed parenthesis"},
  };
  for (const auto& [text, why] : cases) {
    SCOPED_TRACE(text);
    Result<FaultRule> r = ParseFaultRule(text);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "fault \"" + text + "\": " + why + kExpectedSyntax);
  }
}

}  // namespace
}  // namespace idem::travel
