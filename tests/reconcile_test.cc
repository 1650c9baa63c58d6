// The drift job (issue 13, bullet 3; saga/reconcile.h): recorded effects of
// succeeded steps re-checked against the provider's status, and provider
// effects the journal does not know, each recorded once as a journal entry
// and counted by the metric. On a real SQLite file and a real PostgreSQL
// database (the ctest fixture `postgres`).

#include "saga/reconcile.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cli/reconcile.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include "observability/metrics.h"

namespace idem {
namespace {

// A provider whose ledger the test can edit behind idem's back.
class Ledger {
 public:
  ToolOutcome Apply(const ToolCall& c) {
    std::lock_guard<std::mutex> lock(mu_);
    effects_[c.key] = "R-" + std::to_string(effects_.size() + 1);
    return ToolOutcome::Succeeded({{"ref", effects_[c.key]}}, effects_[c.key]);
  }
  LookupOutcome Lookup(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ++lookups_;
    LookupOutcome o;
    auto it = effects_.find(key);
    o.kind = it == effects_.end() ? LookupKind::kNotApplied : LookupKind::kApplied;
    if (it != effects_.end()) o.result = {{"ref", it->second}};
    return o;
  }
  Result<std::vector<ProviderEffect>> List(int64_t) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ProviderEffect> out;
    for (const auto& [k, ref] : effects_) out.push_back({k, ref});
    return out;
  }
  void Erase(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    effects_.erase(key);
  }
  void Add(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    effects_[key] = "R-orphan";
  }
  int lookups() {
    std::lock_guard<std::mutex> lock(mu_);
    return lookups_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> effects_;
  int lookups_ = 0;
};

class ReconcileTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "sqlite") {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    }
    ToolInfo book;
    book.name = "rooms.book";
    book.effect = EffectClass::kWrite;
    book.honours_keys = true;
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        book, [this](const ToolCall& c) { return ledger_.Apply(c); },
        [this](const std::string& k) { return ledger_.Lookup(k); }, nullptr,
        [this](int64_t since) { return ledger_.List(since); })));
    ToolInfo blind;  // no status lookup: its effects cannot be re-checked
    blind.name = "notes.add";
    blind.effect = EffectClass::kIdempotent;
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        blind, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); })));
    ToolInfo undo;
    undo.name = "rooms.cancel";
    undo.effect = EffectClass::kIdempotent;
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        undo, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); })));
    auto spec = ParseSpec(
        Json{{"name", "stay"},
             {"steps",
              {{{"id", "room"}, {"tool", "rooms.book"}, {"compensate", {{"tool", "rooms.cancel"}}}},
               {{"id", "note"}, {"tool", "notes.add"}}}}},
        tools_);
    ASSERT_OK(spec);
    EngineOptions o;
    o.clock = &clock_;
    engine_ = std::make_unique<Engine>(store_.get(), &tools_, o);
    for (int i = 0; i < 3; ++i) {
      auto sub = engine_->Submit(*spec, Json::object(), "stay-" + std::to_string(i));
      ASSERT_OK(sub);
      ASSERT_OK_AND_ASSIGN(auto rec, engine_->Run(sub->saga_id));
      ASSERT_EQ(rec.summary.state, "succeeded");
      sagas_.push_back(rec);
    }
  }

  reconcile::DriftOptions Options() {
    reconcile::DriftOptions o;
    o.clock = &clock_;
    o.since_ms = clock_.NowMs() - 3'600'000;
    o.observer = [this](const storage::JournalEntry& e) { metrics_.Observe(e, store_.get()); };
    return o;
  }

  int DriftEntries(const std::string& saga_id) {
    auto j = store_->ReadJournal(saga_id);
    EXPECT_OK(j);
    int n = 0;
    if (j.ok()) {
      for (const auto& e : *j) n += e.event == "drift";
    }
    return n;
  }

  std::string Rendered() { return metrics_.Render(store_.get()); }

  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  ManualClock clock_;
  Ledger ledger_;
  std::unique_ptr<Engine> engine_;
  std::vector<storage::SagaRecord> sagas_;
  observability::Metrics metrics_;
};

TEST_P(ReconcileTest, NoDriftWhenTheProviderHoldsEveryEffect) {
  ASSERT_OK_AND_ASSIGN(auto report, reconcile::FindDrift(store_.get(), tools_, Options()));
  EXPECT_TRUE(report.drifts.empty());
  EXPECT_EQ(report.checked, 3);
  EXPECT_EQ(report.skipped, 3) << "notes.add has no status lookup";
  EXPECT_EQ(report.listed, 3);
  EXPECT_EQ(ledger_.lookups(), 3);
}

TEST_P(ReconcileTest, AnEffectTheProviderLostIsRecordedOnceWithItsJournalEntryAndMetric) {
  const storage::SagaRecord& lost = sagas_[1];
  ledger_.Erase(lost.steps[0].step_key);
  ASSERT_OK_AND_ASSIGN(auto report, reconcile::FindDrift(store_.get(), tools_, Options()));
  ASSERT_EQ(report.drifts.size(), 1u);
  EXPECT_EQ(report.drifts[0].finding.kind, "effect_missing");
  EXPECT_EQ(report.drifts[0].finding.key, lost.steps[0].step_key);
  EXPECT_EQ(report.drifts[0].finding.saga_id, lost.summary.saga_id);
  EXPECT_TRUE(report.drifts[0].recorded_now);
  EXPECT_EQ(DriftEntries(lost.summary.saga_id), 1);
  EXPECT_EQ(DriftEntries(sagas_[0].summary.saga_id), 0);
  EXPECT_NE(Rendered().find("idem_reconcile_drift_total{kind=\"effect_missing\"} 1"),
            std::string::npos)
      << Rendered();

  // Again: found again, recorded nothing new.
  ASSERT_OK_AND_ASSIGN(report, reconcile::FindDrift(store_.get(), tools_, Options()));
  ASSERT_EQ(report.drifts.size(), 1u);
  EXPECT_FALSE(report.drifts[0].recorded_now);
  EXPECT_EQ(DriftEntries(lost.summary.saga_id), 1);
  EXPECT_NE(Rendered().find("idem_reconcile_drift_total{kind=\"effect_missing\"} 1"),
            std::string::npos);
}

TEST_P(ReconcileTest, AProviderEffectTheJournalDoesNotKnowIsAnOrphan) {
  const std::string& saga = sagas_[2].summary.saga_id;
  ledger_.Add(saga + "/room-again");  // a key of a known saga, no effect in its journal
  ledger_.Add("sg_nobody/room");      // a key of no saga at all
  ASSERT_OK_AND_ASSIGN(auto report, reconcile::FindDrift(store_.get(), tools_, Options()));
  ASSERT_EQ(report.drifts.size(), 2u);
  for (const reconcile::Drift& d : report.drifts) {
    EXPECT_EQ(d.finding.kind, "orphan");
    EXPECT_TRUE(d.recorded_now);
  }
  EXPECT_EQ(DriftEntries(saga), 1);
  EXPECT_NE(Rendered().find("idem_reconcile_drift_total{kind=\"orphan\"} 2"), std::string::npos)
      << Rendered();
  ASSERT_OK_AND_ASSIGN(report, reconcile::FindDrift(store_.get(), tools_, Options()));
  EXPECT_EQ(report.drifts.size(), 2u);
  for (const reconcile::Drift& d : report.drifts) EXPECT_FALSE(d.recorded_now);
  EXPECT_EQ(DriftEntries(saga), 1);
}

// A step keyed by the business (`"key": "room:${input.order}"`) sends that
// key: the drift check asks the provider about it, and the provider's
// listing of it is no orphan. A step a guard's read found done made no call:
// the provider rightly knows nothing of its saga/step key.
TEST_P(ReconcileTest, BusinessKeysAndGuardedStepsAreNoDrift) {
  ToolInfo find;
  find.name = "rooms.find";
  find.effect = EffectClass::kRead;
  ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(find, [](const ToolCall&) {
    return ToolOutcome::Succeeded({{"found", true}, {"booking", {{"ref", "R-front-desk"}}}});
  })));
  auto spec = ParseSpec(
      Json{
          {"name", "order"},
          {"steps",
           {{{"id", "room"},
             {"tool", "rooms.book"},
             {"key", "room:${input.order}"},
             {"compensate", {{"tool", "rooms.cancel"}}}},
            {{"id", "held"},
             {"tool", "rooms.book"},
             {"guard", {{"tool", "rooms.find"}, {"exists_when", "/found"}, {"result", "/booking"}}},
             {"compensate", {{"tool", "rooms.cancel"}}}}}}},
      tools_);
  ASSERT_OK(spec);
  auto sub = engine_->Submit(*spec, Json{{"order", "A-1001"}}, "order-A-1001");
  ASSERT_OK(sub);
  ASSERT_OK_AND_ASSIGN(auto rec, engine_->Run(sub->saga_id));
  ASSERT_EQ(rec.summary.state, "succeeded");
  ASSERT_OK_AND_ASSIGN(auto report, reconcile::FindDrift(store_.get(), tools_, Options()));
  for (const reconcile::Drift& d : report.drifts) {
    ADD_FAILURE() << d.finding.kind << " " << d.finding.tool << " " << d.finding.key << ": "
                  << d.finding.detail;
  }
  EXPECT_TRUE(report.errors.empty());
  EXPECT_EQ(report.checked, 4) << "three stays and the business-keyed room";
  EXPECT_EQ(report.listed, 4);
  EXPECT_EQ(DriftEntries(sub->saga_id), 0);

  // The business key is the one asked: lost at the provider, it is drift.
  ledger_.Erase("room:A-1001");
  ASSERT_OK_AND_ASSIGN(report, reconcile::FindDrift(store_.get(), tools_, Options()));
  ASSERT_EQ(report.drifts.size(), 1u);
  EXPECT_EQ(report.drifts[0].finding.kind, "effect_missing");
  EXPECT_EQ(report.drifts[0].finding.key, "room:A-1001");
}

// `serve|worker --reconcile-every`: the background job runs a round at once
// and then every interval; the drift it finds is journaled and counted.
TEST_P(ReconcileTest, TheBackgroundJobFindsADriftWithItsJournalEntryAndMetric) {
  const storage::SagaRecord& lost = sagas_[0];
  ledger_.Erase(lost.steps[0].step_key);
  cli::ReconcileFlags flags;
  flags.every = "1h";
  flags.since = "1d";
  ASSERT_OK_AND_ASSIGN(
      auto job, cli::BackgroundReconciler::Start(
                    flags, &tools_, store_.get(), &clock_,
                    [this](const storage::JournalEntry& e) { metrics_.Observe(e, store_.get()); }));
  for (int i = 0; i < 1000 && job->rounds() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(job->rounds(), 1) << "no round within 10 s";
  job.reset();  // stops its thread
  EXPECT_EQ(DriftEntries(lost.summary.saga_id), 1);
  EXPECT_NE(Rendered().find("idem_reconcile_drift_total{kind=\"effect_missing\"} 1"),
            std::string::npos)
      << Rendered();
}

TEST(ReconcileFlagsTest, ABadIntervalIsRefusedNamingTheFlag) {
  ToolRegistry tools;
  test::SqliteTestStore sqlite;
  ASSERT_OK_AND_ASSIGN(auto store, sqlite.Open());
  cli::ReconcileFlags flags;
  flags.every = "often";
  auto job = cli::BackgroundReconciler::Start(flags, &tools, store.get(), SystemClock::Get(), {});
  EXPECT_THAT(job.status(), test::StatusIs(Code::kInvalidArgument, "--reconcile-every"));
  flags.every = "0s";
  job = cli::BackgroundReconciler::Start(flags, &tools, store.get(), SystemClock::Get(), {});
  EXPECT_THAT(job.status(), test::StatusIs(Code::kInvalidArgument, "--reconcile-every"));
}

INSTANTIATE_TEST_SUITE_P(Backends, ReconcileTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
