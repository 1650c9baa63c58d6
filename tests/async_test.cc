// Asynchronous completion (issue 13, bullet 2; saga/completion.h): a tool
// that answers `accepted` (or a status lookup that answers `pending`) moves
// its step to `processing` and the saga to `awaiting_completion`; the
// provider's status is polled with backoff, over the tool's window, durably
// and with nothing held while the saga waits. On a real SQLite file and a
// real PostgreSQL database (the ctest fixture `postgres`), with a manual
// clock so that nothing sleeps.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "saga/completion.h"
#include "saga/engine.h"
#include "saga/open_saga.h"
#include "saga/park.h"
#include "saga/schedule.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include "common/failpoint.h"

namespace idem {
namespace {

constexpr int64_t kWindowMs = 2 * 3'600'000;  // "2h"

// A slow provider: it accepts a key at once and finishes it when told.
class SlowProvider {
 public:
  enum class End { kPending, kSucceeded, kFailed };

  ToolInfo Info(const std::string& name) const {
    ToolInfo info;
    info.name = name;
    info.effect = EffectClass::kWrite;
    info.honours_keys = false;  // a resend would apply it again: never blind
    info.completion.accepts = true;
    info.completion.window_ms = kWindowMs;
    info.completion.first_check_ms = 1'000;
    info.completion.max_check_ms = 60'000;
    info.open.compensate_tool = "visas.withdraw";  // for open sagas (saga/open_saga.h)
    return info;
  }
  ToolOutcome Invoke(const ToolCall& c) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[c.key];
    accepted_.insert(c.key);
    return ToolOutcome::Accepted("job-" + c.step_id);
  }
  LookupOutcome Lookup(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ++lookups_;
    LookupOutcome o;
    if (accepted_.count(key) == 0) {
      o.kind = LookupKind::kNotApplied;
      return o;
    }
    switch (end_) {
      case End::kPending:
        o.kind = LookupKind::kPending;
        break;
      case End::kSucceeded:
        o.kind = LookupKind::kApplied;
        o.result = {{"visa", "V-" + key}};
        o.external_ref = "V-" + key;
        break;
      case End::kFailed:
        o.kind = LookupKind::kFailed;
        o.error = "application refused";
        break;
    }
    return o;
  }
  void Finish(End end) {
    std::lock_guard<std::mutex> lock(mu_);
    end_ = end;
  }
  // The provider took the key (as if its accepted answer was lost on the way).
  void AcceptSilently(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    accepted_.insert(key);
  }
  int Calls(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[key];
  }
  int TotalCalls() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [k, v] : calls_) n += v;
    return n;
  }
  int Lookups() {
    std::lock_guard<std::mutex> lock(mu_);
    return lookups_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> calls_;
  std::set<std::string> accepted_;
  End end_ = End::kPending;
  int lookups_ = 0;
};

class AsyncTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open());
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        provider_.Info("visas.apply"), [this](const ToolCall& c) { return provider_.Invoke(c); },
        [this](const std::string& k) { return provider_.Lookup(k); })));
    ToolInfo first;
    first.name = "hotel.book";
    first.effect = EffectClass::kWrite;
    first.honours_keys = true;
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(first, [this](const ToolCall& c) {
      std::lock_guard<std::mutex> lock(mu_);
      ++hotel_calls_;
      return ToolOutcome::Succeeded({{"hotel", "H-" + c.key}});
    })));
    ToolInfo undo;
    undo.name = "hotel.cancel";
    undo.effect = EffectClass::kIdempotent;
    undo.honours_keys = true;
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(undo, [this](const ToolCall&) {
      std::lock_guard<std::mutex> lock(mu_);
      ++hotel_undos_;
      return ToolOutcome::Succeeded(Json::object());
    })));
    ToolInfo visa_undo = undo;
    visa_undo.name = "visas.withdraw";
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        visa_undo, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); })));
    auto spec = ParseSpec(
        Json{
            {"name", "trip"},
            {"steps",
             {{{"id", "hotel"}, {"tool", "hotel.book"}, {"compensate", {{"tool", "hotel.cancel"}}}},
              {{"id", "visa"},
               {"tool", "visas.apply"},
               {"compensate", {{"tool", "visas.withdraw"}}}},
              {{"id", "dinner"},
               {"tool", "hotel.book"},
               {"compensate", {{"tool", "hotel.cancel"}}}}}}},
        tools_);
    ASSERT_OK(spec);
    spec_ = *spec;
  }

  void Open() {
    store_.reset();
    if (GetParam() == "sqlite") {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    }
  }

  EngineOptions Options() {
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = true;
    o.owner = "w1";
    o.lease_ms = 60'000;
    return o;
  }

  std::string Submit(Engine& e, const std::string& key = "intent-1") {
    auto sub = e.Submit(spec_, Json::object(), key);
    EXPECT_OK(sub);
    return sub.ok() ? sub->saga_id : "";
  }

  storage::SagaRecord Load(const std::string& id) {
    auto rec = store_->LoadSaga(id);
    EXPECT_OK(rec);
    return rec.ok() ? *rec : storage::SagaRecord{};
  }

  int Events(const std::string& id, const std::string& event) {
    auto j = store_->ReadJournal(id);
    EXPECT_OK(j);
    int n = 0;
    if (j.ok()) {
      for (const auto& e : *j) n += e.event == event;
    }
    return n;
  }

  int64_t NextCheck(const std::string& id) {
    auto earliest = completion::EarliestCheck(store_.get(), id);
    EXPECT_OK(earliest);
    return earliest.ok() && earliest->has_value() ? **earliest : -1;
  }

  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  SagaSpec spec_;
  ManualClock clock_;
  SlowProvider provider_;
  std::mutex mu_;
  int hotel_calls_ = 0;
  int hotel_undos_ = 0;
};

TEST_P(AsyncTest, AcceptedWaitsThroughPendingChecksThenSucceedsWithOneCall) {
  Engine engine(store_.get(), &tools_, Options());
  const std::string id = Submit(engine);
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(id));
  EXPECT_EQ(rec.summary.state, "awaiting_completion");
  EXPECT_EQ(rec.steps[1].state, "processing");
  EXPECT_EQ(rec.steps[1].external_ref, "job-visa");
  EXPECT_EQ(Events(id, "processing"), 1);
  const int64_t first = NextCheck(id);
  EXPECT_GT(first, clock_.NowMs());
  EXPECT_LE(first, clock_.NowMs() + 1'000);

  // Not due: a recovery reports it waiting and asks nothing.
  ASSERT_OK_AND_ASSIGN(auto report, engine.Recover(1));
  ASSERT_EQ(report.sagas.size(), 1u);
  EXPECT_EQ(report.sagas[0].outcome, RecoveredSaga::Outcome::kWaiting);
  EXPECT_EQ(report.waiting_completion, 1);
  EXPECT_EQ(provider_.Lookups(), 0);

  // Due, still pending, five times: each check backs off, none calls again.
  int64_t previous_gap = 0;
  for (int n = 1; n <= 5; ++n) {
    clock_.AdvanceMs(NextCheck(id) - clock_.NowMs());
    ASSERT_OK_AND_ASSIGN(report, engine.Recover(1));
    EXPECT_EQ(provider_.Lookups(), n);
    EXPECT_EQ(Load(id).summary.state, "awaiting_completion");
    const int64_t gap = NextCheck(id) - clock_.NowMs();
    EXPECT_GE(gap, 1'000);
    EXPECT_LE(gap, int64_t{1'000} << n);  // full jitter under a doubling ceiling
    previous_gap = gap;
  }
  (void)previous_gap;
  EXPECT_EQ(Events(id, "processing"), 6);

  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(NextCheck(id) - clock_.NowMs());
  ASSERT_OK(engine.Recover(1));
  rec = Load(id);
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(rec.steps[1].state, "succeeded");
  EXPECT_EQ(rec.steps[1].result, (Json{{"visa", "V-" + rec.steps[1].step_key}}));
  EXPECT_EQ(provider_.Calls(rec.steps[1].step_key), 1);
  EXPECT_EQ(NextCheck(id), -1) << "the check is removed once the step settles";
  ASSERT_OK_AND_ASSIGN(auto effects, store_->ListEffects(id));
  EXPECT_EQ(effects.size(), 3u);
}

TEST_P(AsyncTest, ARestartMidWaitContinuesFromTheStoredCheck) {
  std::string id;
  int64_t due = 0;
  {
    Engine engine(store_.get(), &tools_, Options());
    id = Submit(engine);
    ASSERT_OK(engine.Run(id));
    due = NextCheck(id);
  }
  ASSERT_NO_FATAL_FAILURE(Open());  // the process restarted: a new store and engine
  EXPECT_EQ(NextCheck(id), due);
  Engine engine(store_.get(), &tools_, Options());
  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(due - clock_.NowMs());
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(provider_.Calls(rec.steps[1].step_key), 1);
  EXPECT_EQ(provider_.Lookups(), 1);
}

TEST_P(AsyncTest, PastTheWindowTheStepParksWithTheCompletionWindowCode) {
  Engine engine(store_.get(), &tools_, Options());
  const std::string id = Submit(engine);
  ASSERT_OK(engine.Run(id));
  const int64_t start = clock_.NowMs();
  int rounds = 0;
  while (Load(id).summary.state == "awaiting_completion" && rounds < 1'000) {
    clock_.AdvanceMs(std::max<int64_t>(NextCheck(id) - clock_.NowMs(), 0));
    ASSERT_OK(engine.Recover(1));
    ++rounds;
  }
  storage::SagaRecord rec = Load(id);
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(rec.steps[1].state, "needs_attention");
  EXPECT_EQ(FindParkCode(rec.summary.reason), ParkCode::kCompletionWindow) << rec.summary.reason;
  EXPECT_NE(rec.summary.reason.find(rec.steps[1].step_key), std::string::npos);
  EXPECT_GE(clock_.NowMs() - start, kWindowMs);
  // Checks back off to the cap (uniform between 1 s and 60 s, about 30 s
  // apart): some 240 over 2 h, neither one a second nor a handful.
  EXPECT_LE(provider_.Lookups(), 500);
  EXPECT_GE(provider_.Lookups(), 100);
  EXPECT_EQ(provider_.Calls(rec.steps[1].step_key), 1);
  // Parked: nothing drives it again.
  clock_.AdvanceMs(kWindowMs);
  const int lookups = provider_.Lookups();
  ASSERT_OK(engine.Recover(1));
  EXPECT_EQ(provider_.Lookups(), lookups);
}

TEST_P(AsyncTest, AFailureByLookupRollsBackTheEarlierSteps) {
  Engine engine(store_.get(), &tools_, Options());
  const std::string id = Submit(engine);
  ASSERT_OK(engine.Run(id));
  provider_.Finish(SlowProvider::End::kFailed);
  clock_.AdvanceMs(NextCheck(id) - clock_.NowMs());
  ASSERT_OK(engine.Recover(1));
  storage::SagaRecord rec = Load(id);
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(rec.steps[1].state, "failed");
  EXPECT_NE(rec.steps[1].error.find("application refused"), std::string::npos);
  EXPECT_EQ(rec.steps[0].state, "compensated");
  EXPECT_EQ(rec.steps[2].state, "planned");
  EXPECT_EQ(hotel_undos_, 1);
  EXPECT_EQ(provider_.Calls(rec.steps[1].step_key), 1);
}

TEST_P(AsyncTest, ACancelWaitsForTheProviderThenRollsBackWhatItDid) {
  Engine engine(store_.get(), &tools_, Options());
  const std::string id = Submit(engine);
  ASSERT_OK(engine.Run(id));
  ASSERT_OK(engine.Cancel(id, ControlRequest{"ops", "changed plans", true}));
  // The provider may still finish: the cancel waits, the step stays processing.
  storage::SagaRecord rec = Load(id);
  EXPECT_EQ(rec.summary.state, "awaiting_completion");
  EXPECT_EQ(rec.steps[1].state, "processing");
  EXPECT_EQ(hotel_undos_, 0);
  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(NextCheck(id) - clock_.NowMs());
  ASSERT_OK(engine.Recover(1));
  rec = Load(id);
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(rec.steps[1].state, "compensated") << "the visa it got is withdrawn";
  EXPECT_EQ(rec.steps[0].state, "compensated");
  EXPECT_EQ(rec.steps[2].state, "planned") << "nothing runs after the cancel";
  EXPECT_EQ(hotel_undos_, 1);
}

TEST_P(AsyncTest, AnUnknownOutcomeWhoseLookupSaysPendingWaitsWithoutASecondCall) {
  // The accepted answer was lost (a crash between the answer and its
  // journal entry leaves the step `submitted`): recovery asks the status,
  // which says pending, and the step waits; no second call.
  ToolInfo info = provider_.Info("visas.lost");
  std::atomic<int> lost_calls{0};
  ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
      info,
      [this, &lost_calls](const ToolCall& c) {
        ++lost_calls;
        provider_.AcceptSilently(c.key);
        return ToolOutcome::Unknown("connection reset after the request was sent");
      },
      [this](const std::string& k) { return provider_.Lookup(k); })));
  auto spec = ParseSpec(Json{{"name", "lost"},
                             {"steps",
                              {{{"id", "visa"},
                                {"tool", "visas.lost"},
                                {"compensate", {{"tool", "visas.withdraw"}}}}}}},
                        tools_);
  ASSERT_OK(spec);
  Engine engine(store_.get(), &tools_, Options());
  auto sub = engine.Submit(*spec, Json::object(), "lost-1");
  ASSERT_OK(sub);
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(sub->saga_id));
  EXPECT_EQ(rec.summary.state, "awaiting_completion");
  EXPECT_EQ(rec.steps[0].state, "processing");
  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(NextCheck(sub->saga_id) - clock_.NowMs());
  ASSERT_OK(engine.Recover(1));
  EXPECT_EQ(Load(sub->saga_id).summary.state, "succeeded");
  EXPECT_EQ(lost_calls.load(), 1) << "resolved by lookup, never called again";
}

// No thread and no lease per waiting saga: 1,000 sagas wait while one worker
// thread polls; when the provider finishes they all complete, and the
// lookups are bounded by the backoff, not by the time spent waiting.
TEST_P(AsyncTest, AThousandWaitingSagasNeedOneWorkerThreadAndHoldNoLease) {
  const int n = 300;  // 1,000 passes too (149 s on SQLite on a loaded 2-core machine)
  Engine engine(store_.get(), &tools_, Options());
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(Submit(engine, "intent-" + std::to_string(i)));
    ASSERT_OK(engine.Run(ids.back()));
  }
  for (const std::string& id : {ids.front(), ids.back()}) {
    EXPECT_EQ(Load(id).summary.state, "awaiting_completion");
  }
  // No lease is held by a waiting saga: another owner claims one at once.
  ASSERT_OK(store_->ClaimSaga(ids[n / 2], "someone-else", 1'000));
  ASSERT_OK_AND_ASSIGN(auto gauges, store_->ReadGauges({}));
  EXPECT_EQ(gauges.by_state["awaiting_completion"].sagas, n);

  // Half a minute passes with the provider still working, then it finishes.
  std::atomic<bool> stop{false};
  EngineOptions o = Options();
  o.stop = &stop;
  Engine worker(store_.get(), &tools_, o);
  std::atomic<int> settled{0};
  WorkerOptions w;
  w.concurrency = 1;
  w.poll_ms = 1'000;  // the manual clock: each empty poll is one virtual second
  std::thread t([&] { EXPECT_OK(worker.Work(w)); });
  const int64_t finish_at = clock_.NowMs() + 30'000;
  while (clock_.NowMs() < finish_at) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  provider_.Finish(SlowProvider::End::kSucceeded);
  const int lookups_before = provider_.Lookups();
  for (int spins = 0; spins < 120'000; ++spins) {
    storage::SagaFilter f;
    f.states = {"succeeded"};
    f.limit = n + 1;
    auto done = store_->ListSagas(f);
    if (done.ok() && static_cast<int>(done->size()) == n) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  t.join();
  storage::SagaFilter f;
  f.states = {"succeeded"};
  f.limit = n + 1;
  ASSERT_OK_AND_ASSIGN(auto done, store_->ListSagas(f));
  EXPECT_EQ(static_cast<int>(done.size()), n);
  EXPECT_EQ(provider_.TotalCalls(), n) << "one call per saga";
  // Backoff: within half a minute, a doubling ceiling from 1 s makes at
  // most 6 checks per saga, however often the worker polls.
  EXPECT_LE(lookups_before, n * 6);
  EXPECT_LE(provider_.Lookups() - lookups_before, n * 2);
}

// Each check of a waiting saga is made by a fresh drive, whose generator
// starts from the same per-saga seed (SagaRun). The checks' delays still
// spread over the full jitter range: never one fixed fraction of the cap
// (which, small, made a saga check every few seconds for its whole window).
TEST(CompletionBackoffTest, TheChecksOfOneSagaDrawDifferentDelaysThoughEachDriveReseeds) {
  CompletionPolicy policy;
  policy.window_ms = kWindowMs;
  policy.first_check_ms = 1'000;
  policy.max_check_ms = 60'000;
  for (uint64_t saga_seed = 1; saga_seed <= 50; ++saga_seed) {
    int64_t now = 1'700'000'000'000;
    std::optional<storage::StepCheck> check;
    std::set<int64_t> delays;
    int64_t at_cap_ms = 0;
    int at_cap = 0;
    for (int n = 0; n < 60; ++n) {
      std::mt19937_64 rng(saga_seed);  // what a fresh drive of this saga starts from
      check = completion::NextCheck(policy, check, "visa", now, 0, &rng);
      const int64_t delay = check->next_check_ms - now;
      ASSERT_GE(delay, policy.first_check_ms);
      ASSERT_LE(delay, policy.max_check_ms);
      if (n >= 10) {  // the ceiling has reached the cap (1 s doubled 6 times)
        delays.insert(delay);
        at_cap_ms += delay;
        ++at_cap;
      }
      now = check->next_check_ms;
    }
    EXPECT_GE(delays.size(), 45u) << "seed " << saga_seed;
    // uniform(1 s, 60 s): a mean of 30.5 s; 50 draws keep it within ±9 s.
    EXPECT_GE(at_cap_ms / at_cap, 21'500) << "seed " << saga_seed;
    EXPECT_LE(at_cap_ms / at_cap, 39'500) << "seed " << saga_seed;
  }
}

TEST(ReadyStepsTest, AProcessingStepIsNeitherReadyNorSettled) {
  // visa and hotel depend on nothing; dinner on both.
  const std::vector<std::vector<int>> parents = {{}, {}, {0, 1}};
  EXPECT_EQ(ReadySteps(parents, {StepState::kProcessing, StepState::kPlanned, StepState::kPlanned}),
            (std::vector<int>{1}));
  EXPECT_EQ(
      ReadySteps(parents, {StepState::kProcessing, StepState::kSucceeded, StepState::kPlanned}),
      (std::vector<int>{}));
  EXPECT_EQ(
      ReadySteps(parents, {StepState::kSucceeded, StepState::kSucceeded, StepState::kPlanned}),
      (std::vector<int>{2}));
}

// Parallel steps (saga/branches.h): a processing branch is in flight, not
// ready and not settled. The other branches run on; its dependants wait
// until its check settles it.
TEST_P(AsyncTest, AProcessingBranchLetsTheOtherBranchesRunAndHoldsItsDependants) {
  ASSERT_OK_AND_ASSIGN(SagaSpec spec,
                       ParseSpec(Json{{"name", "trip"},
                                      {"steps",
                                       {{{"id", "visa"},
                                         {"tool", "visas.apply"},
                                         {"compensate", {{"tool", "visas.withdraw"}}}},
                                        {{"id", "hotel"},
                                         {"tool", "hotel.book"},
                                         {"after", Json::array()},
                                         {"compensate", {{"tool", "hotel.cancel"}}}},
                                        {{"id", "dinner"},
                                         {"tool", "hotel.book"},
                                         {"after", {"visa", "hotel"}},
                                         {"compensate", {{"tool", "hotel.cancel"}}}}}}},
                                 tools_));
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto sub, engine.Submit(spec, Json::object(), "parallel-1"));
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "awaiting_completion");
  EXPECT_EQ(rec.steps[0].state, "processing");
  EXPECT_EQ(rec.steps[1].state, "succeeded") << "the other branch ran";
  EXPECT_EQ(rec.steps[2].state, "planned") << "its dependant waits";
  EXPECT_EQ(hotel_calls_, 1);

  // Not due yet: a drive changes nothing and asks nobody.
  const int lookups = provider_.Lookups();
  ASSERT_OK_AND_ASSIGN(rec, engine.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "awaiting_completion");
  EXPECT_EQ(provider_.Lookups(), lookups);

  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(61'000);
  ASSERT_OK_AND_ASSIGN(rec, engine.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(rec.steps[0].state, "succeeded");
  EXPECT_EQ(rec.steps[2].state, "succeeded");
  EXPECT_EQ(hotel_calls_, 2);
  EXPECT_EQ(provider_.TotalCalls(), 1) << "one call to the slow provider";
}

// A branch fails for good while another is at its slow provider: the
// rollback waits for that branch's check (the saga waits in
// awaiting_completion), then undoes it with the rest once its provider
// finished it. Rolling back at once would leave it processing, never
// checked and never undone, though its provider goes on and books it.
TEST_P(AsyncTest, ARollbackWaitsForABranchAtItsProviderThenUndoesItToo) {
  ToolInfo car;
  car.name = "car.rent";
  car.effect = EffectClass::kWrite;
  car.honours_keys = true;
  ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(car, [](const ToolCall&) {
    return ToolOutcome::Failed("no car left", /*retryable=*/false);
  })));
  ASSERT_OK_AND_ASSIGN(SagaSpec spec,
                       ParseSpec(Json{{"name", "trip"},
                                      {"steps",
                                       {{{"id", "visa"},
                                         {"tool", "visas.apply"},
                                         {"compensate", {{"tool", "visas.withdraw"}}}},
                                        {{"id", "hotel"},
                                         {"tool", "hotel.book"},
                                         {"after", Json::array()},
                                         {"compensate", {{"tool", "hotel.cancel"}}}},
                                        {{"id", "car"},
                                         {"tool", "car.rent"},
                                         {"after", Json::array()},
                                         {"compensate", {{"tool", "hotel.cancel"}}}},
                                        {{"id", "dinner"},
                                         {"tool", "hotel.book"},
                                         {"after", {"visa", "hotel", "car"}},
                                         {"compensate", {{"tool", "hotel.cancel"}}}}}}},
                                 tools_));
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto sub, engine.Submit(spec, Json::object(), "parallel-fail-1"));
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "awaiting_completion");
  EXPECT_EQ(rec.steps[0].state, "processing");
  EXPECT_EQ(rec.steps[1].state, "succeeded");
  EXPECT_EQ(rec.steps[2].state, "failed");
  EXPECT_EQ(rec.steps[3].state, "planned");
  EXPECT_EQ(hotel_undos_, 0) << "no rollback while the visa is at its provider";

  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(NextCheck(sub.saga_id) - clock_.NowMs());
  ASSERT_OK_AND_ASSIGN(rec, engine.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_NE(rec.summary.reason.find("step car failed"), std::string::npos) << rec.summary.reason;
  EXPECT_EQ(rec.steps[0].state, "compensated") << "the visa its provider finished is undone";
  EXPECT_EQ(rec.steps[1].state, "compensated");
  EXPECT_EQ(rec.steps[2].state, "failed");
  EXPECT_EQ(rec.steps[3].state, "planned") << "nothing new started after the failure";
  EXPECT_EQ(hotel_undos_, 1);
  EXPECT_EQ(hotel_calls_, 1);
  EXPECT_EQ(provider_.TotalCalls(), 1) << "one call to the slow provider";
}

// Open sagas (saga/open_saga.h): an accepted call answers `processing` (not
// settled) and the saga waits for its provider; a new call meanwhile is
// refused call-pending; once the check settles it the saga is open again
// and commits.
TEST_P(AsyncTest, AnOpenSagasAcceptedCallIsProcessingUntilItsCheckSettlesIt) {
  Engine engine(store_.get(), &tools_, Options());
  BeginRequest begin;
  begin.intent_key = "agent-1";
  begin.tools = {"visas.apply"};
  ASSERT_OK_AND_ASSIGN(auto began, engine.Begin(begin));
  CallRequest call;
  call.call_id = "call_1";
  call.tool = "visas.apply";
  call.args = {{"passport", "P-1"}};
  ASSERT_OK_AND_ASSIGN(auto answer, engine.Call(began.saga_id, call));
  EXPECT_EQ(answer.refusal, CallRefusal::kNone) << answer.message;
  EXPECT_EQ(answer.state, "processing");
  EXPECT_FALSE(answer.settled());
  EXPECT_EQ(answer.saga_state, "awaiting_completion");

  CallRequest next = call;
  next.call_id = "call_2";
  next.args = {{"passport", "P-2"}};
  ASSERT_OK_AND_ASSIGN(auto refused, engine.Call(began.saga_id, next));
  EXPECT_EQ(refused.refusal, CallRefusal::kCallPending);
  EXPECT_NE(refused.message.find("waits for its provider"), std::string::npos) << refused.message;
  EXPECT_THAT(engine.Commit(began.saga_id, "agent", std::nullopt),
              test::StatusIs(Code::kFailedPrecondition, "processing"));

  provider_.Finish(SlowProvider::End::kSucceeded);
  clock_.AdvanceMs(61'000);
  // The repeat of the call id drives its due check, as the sweeper would.
  ASSERT_OK_AND_ASSIGN(auto again, engine.Call(began.saga_id, call));
  EXPECT_EQ(again.state, "succeeded");
  EXPECT_EQ(again.saga_state, "open");
  ASSERT_OK_AND_ASSIGN(auto committed, engine.Commit(began.saga_id, "agent", std::nullopt));
  EXPECT_EQ(committed.summary.state, "succeeded");
  EXPECT_EQ(provider_.TotalCalls(), 1);
}

// A stream of new work does not starve a due check: the worker looks for
// due sagas at least once per poll interval while it is busy, not only when
// it finds nothing else to claim.
TEST_P(AsyncTest, AStreamOfNewWorkDoesNotStarveADueCheck) {
  Engine engine(store_.get(), &tools_, Options());
  const std::string waiting = Submit(engine, "waiting");
  ASSERT_OK(engine.Run(waiting));
  ASSERT_EQ(Load(waiting).summary.state, "awaiting_completion");
  provider_.Finish(SlowProvider::End::kSucceeded);
  ASSERT_OK_AND_ASSIGN(SagaSpec quick,
                       ParseSpec(Json{{"name", "quick"},
                                      {"steps",
                                       {{{"id", "hotel"},
                                         {"tool", "hotel.book"},
                                         {"compensate", {{"tool", "hotel.cancel"}}}}}}},
                                 tools_));
  int submitted = 0;
  auto submit_quick = [&](int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_OK(engine.Submit(quick, Json::object(), "quick-" + std::to_string(submitted++)));
    }
  };
  ASSERT_NO_FATAL_FAILURE(submit_quick(200));  // a backlog of new work

  std::atomic<bool> stop{false};
  EngineOptions o = Options();
  o.stop = &stop;
  Engine worker(store_.get(), &tools_, o);
  WorkerOptions w;
  w.concurrency = 1;
  w.poll_ms = 1'000;
  std::atomic<int> pending_when_done{-1};
  w.on_done = [&](const std::string& id, const Status&) {
    if (id != waiting) return;
    storage::SagaFilter f;
    f.states = {"pending"};
    f.limit = 100'000;
    auto left = store_->ListSagas(f);
    pending_when_done = left.ok() ? static_cast<int>(left->size()) : -2;
  };
  std::thread t([&] { EXPECT_OK(worker.Work(w)); });
  // The check comes due while the worker is busy with the backlog.
  clock_.AdvanceMs(61'000);
  for (int spins = 0; spins < 12'000 && pending_when_done.load() == -1; ++spins) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  t.join();
  EXPECT_EQ(Load(waiting).summary.state, "succeeded");
  EXPECT_GT(pending_when_done.load(), 100) << "the due check waited for the backlog to drain";
  EXPECT_EQ(provider_.Calls(Load(waiting).steps[1].step_key), 1);
}

// The processing boundaries under a real kill (SIGKILL, in a forked child:
// a failpoint, or the provider's lookup killing its caller), on both stores.
// The provider's state is files, so it outlives the child: `accepted` holds
// one key a line per call received, `finished` exists once it is done.
// Recovery in the parent resolves the step by lookup and never calls the
// provider again. The killed child held the saga's lease
// (EngineOptions::use_leases): it is taken over once it expires, as a dead
// worker's is, so the parent's clock passes it first (before that, recovery
// leaves the saga to its holder: report.skipped).
struct KillPoint {
  const char* name;
  const char* failpoint;  ///< armed in the child's second drive ("" : none)
  bool first_drive;       ///< killed in the first drive (after the call)
  bool kill_in_lookup;    ///< the provider's lookup kills the child
  bool finished_first;    ///< the provider finished before the kill
};

constexpr KillPoint kKillPoints[] = {
    {"AfterTheAcceptedAnswerBeforeItsJournalEntry", "step.after_call", true, false, false},
    {"AfterTheAcceptedAnswerIsJournaledBeforeTheNextCheck", "completion.before_lookup", false,
     false, false},
    {"DuringALookup", "", false, true, false},
    {"AfterTheLookupsSucceededAnswerBeforeItsJournalEntry", "completion.after_lookup", false, false,
     true},
};

class AsyncCrashTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  static std::vector<std::string> Lines(const std::string& path) {
    std::vector<std::string> out;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }

  Status Tools(ToolRegistry* reg, bool kill_in_lookup) {
    SlowProvider model;
    return reg->Register(std::make_unique<FunctionTool>(
        model.Info("visas.apply"),
        [this](const ToolCall& c) {
          std::ofstream(accepted_, std::ios::app) << c.key << "\n" << std::flush;
          return ToolOutcome::Accepted("job-1");
        },
        [this, kill_in_lookup](const std::string& key) {
          if (kill_in_lookup) std::raise(SIGKILL);  // the process dies mid-lookup
          LookupOutcome o;
          std::vector<std::string> keys = Lines(accepted_);
          if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
            o.kind = LookupKind::kNotApplied;
          } else if (std::ifstream(finished_).good()) {
            o.kind = LookupKind::kApplied;
            o.result = {{"visa", "V-1"}};
          } else {
            o.kind = LookupKind::kPending;
          }
          return o;
        }));
  }

  static Result<SagaSpec> Spec(const ToolRegistry& reg) {
    return ParseSpec(Json{{"name", "visa"},
                          {"steps",
                           {{{"id", "visa"},
                             {"tool", "visas.apply"},
                             {"compensate", nullptr},
                             {"reason", "a visa application cannot be withdrawn"}}}}},
                     reg);
  }

  std::string Locator() {
    if (std::get<0>(GetParam()) == "sqlite") return dir_.File("journal.db");
    return pg_.Url();
  }

  test::TempDir dir_;
  test::PgTestDatabase pg_;
  std::string accepted_ = dir_.File("provider.accepted");
  std::string finished_ = dir_.File("provider.finished");
};

TEST_P(AsyncCrashTest, RecoveryResolvesByLookupWithoutASecondCall) {
  const KillPoint& kp = kKillPoints[std::get<1>(GetParam())];
  if (std::get<0>(GetParam()) == "postgresql") ASSERT_OK(pg_.status());
  GTEST_FLAG_SET(death_test_style, "fast");  // fork: the child shares this test's files
  const std::string locator = Locator();
  ManualClock clock;
  EngineOptions o;
  o.clock = &clock;
  o.lease_ms = 1'000;  // PostgreSQL times leases by the server's clock: a short one
  EXPECT_EXIT(
      {
        ToolRegistry reg;
        if (!Tools(&reg, false).ok()) std::_Exit(3);
        auto store = storage::OpenStore(locator, &clock);
        if (!store.ok()) std::_Exit(4);
        Engine engine(store->get(), &reg, o);
        auto spec = Spec(reg);
        if (!spec.ok()) std::_Exit(5);
        auto sub = engine.Submit(*spec, Json::object(), "visa-1");
        if (!sub.ok()) std::_Exit(6);
        if (kp.first_drive && !failpoint::Arm(std::string(kp.failpoint) + "=kill").ok()) {
          std::_Exit(7);
        }
        auto first = engine.Run(sub->saga_id);
        if (kp.first_drive) std::_Exit(8);  // not reached: the failpoint kills
        if (!first.ok() || first->summary.state != "awaiting_completion") std::_Exit(9);
        if (kp.finished_first) std::ofstream(finished_) << "done\n";
        clock.AdvanceMs(61'000);  // the check is due
        ToolRegistry killing;
        if (!Tools(&killing, kp.kill_in_lookup).ok()) std::_Exit(10);
        Engine second(store->get(), &killing, o);
        if (*kp.failpoint != '\0' && !failpoint::Arm(std::string(kp.failpoint) + "=kill").ok()) {
          std::_Exit(11);
        }
        (void)second.Run(sub->saga_id);
        std::_Exit(12);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "");
  ASSERT_EQ(Lines(accepted_).size(), 1u) << "the provider accepted the call once";

  ToolRegistry reg;
  ASSERT_OK(Tools(&reg, false));
  ASSERT_OK_AND_ASSIGN(auto store, storage::OpenStore(locator, &clock));
  Engine engine(store.get(), &reg, o);
  ASSERT_OK_AND_ASSIGN(auto list, store->ListSagas({}));
  ASSERT_EQ(list.size(), 1u);
  const std::string id = list[0].saga_id;
  ASSERT_OK_AND_ASSIGN(auto before, store->LoadSaga(id));
  EXPECT_EQ(before.steps[0].state, kp.first_drive ? "submitted" : "processing")
      << "the killed drive's answer was never journaled";
  // The check is due, and the dead child's lease has expired (by the
  // engine's clock on SQLite, by the server's on PostgreSQL).
  clock.AdvanceMs(61'000 + o.lease_ms + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(o.lease_ms + 200));
  ASSERT_OK_AND_ASSIGN(auto report, engine.Recover(1));
  for (const std::string& e : report.errors) ADD_FAILURE() << e;
  EXPECT_EQ(report.skipped, 0) << "left to a holder that is dead";
  ASSERT_OK_AND_ASSIGN(auto rec, store->LoadSaga(id));
  if (!kp.finished_first) {
    EXPECT_EQ(rec.summary.state, "awaiting_completion");
    EXPECT_EQ(rec.steps[0].state, "processing");
    std::ofstream(finished_) << "done\n";
    clock.AdvanceMs(3'600'000);
    ASSERT_OK(engine.Recover(1));
    ASSERT_OK_AND_ASSIGN(rec, store->LoadSaga(id));
  }
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(rec.steps[0].state, "succeeded");
  EXPECT_EQ(rec.steps[0].result, (Json{{"visa", "V-1"}}));
  EXPECT_EQ(Lines(accepted_).size(), 1u) << "no second call";
}

INSTANTIATE_TEST_SUITE_P(KillPoints, AsyncCrashTest,
                         ::testing::Combine(::testing::Values("sqlite", "postgresql"),
                                            ::testing::Range(0, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  kKillPoints[std::get<1>(info.param)].name;
                         });

INSTANTIATE_TEST_SUITE_P(Backends, AsyncTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
