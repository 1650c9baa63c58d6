// Parallel steps (issue 13): the step graph a spec declares with "after",
// several forward steps in flight in one drive, and the rollback in reverse
// order of completion; on a real SQLite file and a real PostgreSQL database
// (the ctest fixture `postgres`), with leases.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "compensation/rollback.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/control_store.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

// How long a test waits for something that happens at once when the code is
// right (a deadlock or a missing overlap then fails instead of hanging).
constexpr milliseconds kPatience{10'000};

// ---- the step graph

ToolRegistry& Registry() {
  static ToolRegistry* registry = [] {
    auto* r = new ToolRegistry();
    for (const char* name : {"w.a", "w.undo"}) {
      ToolInfo info;
      info.name = name;
      info.effect = std::string(name) == "w.undo" ? EffectClass::kIdempotent : EffectClass::kWrite;
      info.honours_keys = true;
      (void)r->Register(std::make_unique<FunctionTool>(
          info, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); }));
    }
    return r;
  }();
  return *registry;
}

Json Step(const std::string& id, Json after = nullptr, Json args = Json::object()) {
  Json s = {{"id", id}, {"tool", "w.a"}, {"args", args}, {"compensate", {{"tool", "w.undo"}}}};
  if (!after.is_null()) s["after"] = after;
  return s;
}

TEST(StepGraphTest, WithoutAfterEachStepRunsAfterThePreviousOne) {
  Json doc = {{"name", "seq"}, {"steps", {Step("a"), Step("b"), Step("c")}}};
  ASSERT_OK_AND_ASSIGN(SagaSpec spec, ParseSpec(doc, Registry()));
  EXPECT_FALSE(spec.parallel);
  EXPECT_EQ(spec.steps[0].after, std::vector<int>{});
  EXPECT_EQ(spec.steps[1].after, std::vector<int>{0});
  EXPECT_EQ(spec.steps[2].after, std::vector<int>{1});
}

TEST(StepGraphTest, AfterListsTheParentsAndMayNameALaterStep) {
  Json doc = {{"name", "dag"},
              {"steps",
               {Step("pay", Json::array({"flight", "hotel"})), Step("flight", Json::array()),
                Step("hotel", Json::array())}}};
  ASSERT_OK_AND_ASSIGN(SagaSpec spec, ParseSpec(doc, Registry()));
  EXPECT_TRUE(spec.parallel);
  EXPECT_EQ(spec.steps[0].after, (std::vector<int>{1, 2}));
  EXPECT_TRUE(spec.steps[1].after.empty());
  EXPECT_TRUE(spec.steps[2].after.empty());
}

TEST(StepGraphTest, AStepMayUseTheResultOfAnAncestorThroughAnotherStep) {
  Json doc = {{"name", "dag"},
              {"steps",
               {Step("a"), Step("b", Json::array({"a"})),
                Step("c", Json::array({"b"}), {{"x", "${steps.a.result.id}"}})}}};
  EXPECT_OK(ParseSpec(doc, Registry()));
}

TEST(StepGraphTest, ErrorsNameThePlace) {
  auto error = [](Json steps) {
    auto r = ParseSpec(Json{{"name", "dag"}, {"steps", steps}}, Registry());
    return r.ok() ? std::string("parsed") : r.status().message();
  };
  EXPECT_EQ(error({Step("a"), Step("b", Json::array({"c"}))}),
            "steps[1].after[0]: unknown step \"c\"");
  EXPECT_EQ(error({Step("a"), Step("b", Json::array({"b"}))}),
            "steps[1].after[0]: step \"b\" cannot run after itself");
  EXPECT_EQ(error({Step("a"), Step("b", Json::array({"a", "a"}))}),
            "steps[1].after[1]: step \"a\" is listed twice");
  EXPECT_EQ(error({Step("a"), Step("b", Json::array({"a"})), Step("c")}),
            "steps[2].after: required, since other steps say \"after\": every step but the "
            "first says what it runs after (\"after\": [] for nothing)");
  EXPECT_EQ(error({Step("a", Json::array({"c"})), Step("b", Json::array({"a"})),
                   Step("c", Json::array({"b"}))}),
            "steps[0].after: cycle \"a\" -> \"b\" -> \"c\" -> \"a\"");
  EXPECT_EQ(error({Step("a"), Step("b", Json::array()),
                   Step("c", Json::array({"a"}), {{"x", "${steps.b.result.id}"}})}),
            "steps[2].args.x: step \"c\" may not use step \"b\", which does not run before it "
            "(list it in steps[2].after, or a step that runs after it)");
}

TEST(StepGraphTest, NextUndoFollowsTheOrderOfCompletion) {
  std::vector<storage::StepRecord> steps(3);
  for (int i = 0; i < 3; ++i) steps[i].state = "succeeded";
  const std::vector<bool> all(3, true);
  // Completed 1, 0, 2: undone 2, 0, 1 (spec order would be 2, 1, 0).
  const std::vector<int> completed{1, 0, 2};
  std::vector<int> undone;
  while (auto item = compensation::NextUndo(steps, all, completed)) {
    ASSERT_EQ(item->action, compensation::UndoAction::kCompensate);
    undone.push_back(item->index);
    steps[item->index].state = "compensated";
  }
  EXPECT_EQ(undone, (std::vector<int>{2, 0, 1}));
  // An uncertain step is settled first, wherever it completed.
  for (auto& s : steps) s.state = "succeeded";
  steps[0].state = "unknown";
  auto first = compensation::NextUndo(steps, all, {1, 2});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->index, 0);
  EXPECT_EQ(first->action, compensation::UndoAction::kResolveFirst);
}

// ---- drives

// A latch the test opens, and a barrier of N arrivals that only lets its
// callers go once all N have arrived: three calls that block on it succeed
// only if they are in flight at the same time.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool ArriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    return cv_.wait_for(lock, kPatience, [&] { return arrived_ >= n_; });
  }
  int arrived() {
    std::lock_guard<std::mutex> lock(mu_);
    return arrived_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int arrived_ = 0;
};

class ParallelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "sqlite") {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    }
    // Undoes anything: records the step it undoes, in order.
    AddTool("undo", EffectClass::kIdempotent, true, [this](const ToolCall& c) {
      Record("undo:" + c.step_id);
      return ToolOutcome::Succeeded(Json::object());
    });
  }
  void TearDown() override {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

  // A write tool (keys as given), counted per key and recorded in call order.
  void AddTool(const std::string& name, EffectClass effect, bool honours_keys,
               FunctionTool::InvokeFn invoke, FunctionTool::LookupFn lookup = nullptr) {
    ToolInfo info;
    info.name = name;
    info.effect = effect;
    info.honours_keys = honours_keys;
    auto counted = [this, invoke](const ToolCall& call) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++calls_[call.key];
      }
      return invoke(call);
    };
    ASSERT_TRUE(tools_.Register(std::make_unique<FunctionTool>(info, counted, lookup)).ok());
  }
  void AddOk(const std::string& name, bool honours_keys = true) {
    AddTool(name, EffectClass::kWrite, honours_keys, [this](const ToolCall& c) {
      Record("call:" + c.step_id);
      return ToolOutcome::Succeeded({{"id", c.step_id}});
    });
  }

  void Record(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ledger_.push_back(what);
  }
  std::vector<std::string> Ledger(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& e : ledger_) {
      if (e.rfind(prefix, 0) == 0) out.push_back(e.substr(prefix.size()));
    }
    return out;
  }
  int Calls(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[key];
  }

  // The journal as the observer saw it become durable: "event step".
  bool Seen(const std::string& entry) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : durable_) {
      if (e == entry) return true;
    }
    return false;
  }
  // Waits until the observer saw `entry` durable (false after kPatience).
  bool AwaitDurable(const std::string& entry) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kPatience, [&] {
      for (const auto& e : durable_) {
        if (e == entry) return true;
      }
      return open_;
    }) && !open_;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool AwaitOpen() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kPatience, [&] { return open_; });
  }

  EngineOptions Options(const std::string& owner = "engine-a") {
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = true;
    o.owner = owner;
    o.lease_ms = 60'000;
    o.observer = [this](const storage::JournalEntry& e) {
      std::lock_guard<std::mutex> lock(mu_);
      durable_.push_back(e.event + (e.step_id.empty() ? "" : " " + e.step_id));
      cv_.notify_all();
    };
    return o;
  }

  // Steps {id, tool, after}; every step compensable by "undo".
  SagaSpec Spec(const std::vector<std::tuple<std::string, std::string, Json>>& steps) {
    Json list = Json::array();
    for (const auto& [id, tool, after] : steps) {
      Json s = {{"id", id}, {"tool", tool}, {"compensate", {{"tool", "undo"}}}};
      if (!after.is_null()) s["after"] = after;
      list.push_back(s);
    }
    auto spec = ParseSpec(Json{{"name", "par"}, {"steps", list}}, tools_);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    return spec.ok() ? *spec : SagaSpec{};
  }

  std::string Submit(Engine& e, const SagaSpec& spec) {
    auto sub = e.Submit(spec, Json::object(), test::RandomName("intent"));
    EXPECT_TRUE(sub.ok()) << sub.status().ToString();
    return sub.ok() ? sub->saga_id : "";
  }

  std::vector<storage::JournalEntry> Journal(const std::string& id) {
    auto j = store_->ReadJournal(id);
    EXPECT_TRUE(j.ok()) << j.status().ToString();
    return j.ok() ? *j : std::vector<storage::JournalEntry>{};
  }
  // Journal positions of "event step" entries (-1 when absent).
  int At(const std::vector<storage::JournalEntry>& j, const std::string& event,
         const std::string& step) {
    for (size_t i = 0; i < j.size(); ++i) {
      if (j[i].event == event && j[i].step_id == step) return static_cast<int>(i);
    }
    return -1;
  }
  std::string Key(const std::string& saga_id, const std::string& step) {
    return saga_id + "/" + step;
  }

  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  ManualClock clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;                 // GUARDED_BY(mu_)
  std::map<std::string, int> calls_;  // GUARDED_BY(mu_)
  std::vector<std::string> ledger_;   // GUARDED_BY(mu_)
  std::vector<std::string> durable_;  // GUARDED_BY(mu_)
};

TEST_P(ParallelTest, ThreeIndependentStepsAreInFlightAtOnceThenTheJoinRuns) {
  // Each of a, b, c returns only once all three have been called: run one
  // by one, the first would time out and fail the saga.
  Barrier barrier(3);
  std::vector<std::string> missing_submitted;
  std::string id;
  auto at_barrier = [&](const ToolCall& c) {
    // Every `submitted` of the three is durable before any tool is called.
    for (const char* s : {"a", "b", "c"}) {
      if (!Seen(std::string("submitted ") + s)) {
        std::lock_guard<std::mutex> lock(mu_);
        missing_submitted.push_back(c.step_id + " saw no submitted " + s);
      }
    }
    if (!barrier.ArriveAndWait()) return ToolOutcome::Failed("barrier: ran alone", false);
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  };
  AddTool("bar.a", EffectClass::kWrite, true, at_barrier);
  AddTool("bar.b", EffectClass::kWrite, false, at_barrier);  // no keys: outcome at once
  AddTool("bar.c", EffectClass::kWrite, true, at_barrier);
  // The join: its parents' outcomes are durable when it is called.
  std::vector<std::string> join_saw;
  AddTool("join", EffectClass::kWrite, true, [&](const ToolCall& c) {
    for (const char* s : {"a", "b", "c"}) {
      if (Seen(std::string("succeeded ") + s)) join_saw.push_back(s);
    }
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  });
  Engine e(store_.get(), &tools_, Options());
  id = Submit(e, Spec({{"a", "bar.a", Json::array()},
                       {"b", "bar.b", Json::array()},
                       {"c", "bar.c", Json::array()},
                       {"d", "join", Json::array({"a", "b", "c"})}}));
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "succeeded") << done.summary.reason;
  EXPECT_EQ(barrier.arrived(), 3);
  EXPECT_TRUE(missing_submitted.empty()) << missing_submitted.front();
  EXPECT_EQ(join_saw, (std::vector<std::string>{"a", "b", "c"}));
  auto j = Journal(id);
  for (const char* s : {"a", "b", "c"}) {
    EXPECT_EQ(Calls(Key(id, s)), 1) << s;
    EXPECT_LT(At(j, "succeeded", s), At(j, "submitted", "d")) << s;
  }
  EXPECT_EQ(Calls(Key(id, "d")), 1);
}

TEST_P(ParallelTest, AJoinWaitsForItsSlowestParent) {
  // c is slow; a and b are done at once. d must not start before c succeeded.
  AddOk("fast");
  AddTool("slow", EffectClass::kWrite, true, [&](const ToolCall& c) {
    std::this_thread::sleep_for(milliseconds(200));
    Record("call:" + c.step_id);
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  });
  AddOk("join");
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec({{"a", "fast", Json::array()},
                                         {"b", "fast", Json::array()},
                                         {"c", "slow", Json::array()},
                                         {"d", "join", Json::array({"a", "b", "c"})}}));
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "succeeded") << done.summary.reason;
  auto calls = Ledger("call:");
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls.back(), "d") << "the join ran last";
  auto j = Journal(id);
  EXPECT_LT(At(j, "succeeded", "c"), At(j, "submitted", "d"));
}

TEST_P(ParallelTest, OneBranchFailsTheOthersFinishThenUndoInReverseOrderOfCompletion) {
  // c (no keys: its outcome durable at once) succeeds first; b fails once c
  // is durable; a succeeds only after b's failure is durable. Completed: c,
  // then a, so the rollback undoes a, then c (spec order would undo c first).
  AddTool("c.do", EffectClass::kWrite, false, [&](const ToolCall& c) {
    Record("call:" + c.step_id);
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  });
  AddTool("b.do", EffectClass::kWrite, true, [&](const ToolCall& c) {
    Record("call:" + c.step_id);
    if (!AwaitDurable("succeeded c")) return ToolOutcome::Failed("c never completed", false);
    return ToolOutcome::Failed("sold out", /*retryable=*/false);
  });
  AddTool("a.do", EffectClass::kWrite, false, [&](const ToolCall& c) {
    Record("call:" + c.step_id);
    if (!AwaitDurable("failed b")) return ToolOutcome::Failed("b never failed", false);
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  });
  AddOk("join");
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec({{"a", "a.do", nullptr},
                                         {"b", "b.do", Json::array()},
                                         {"c", "c.do", Json::array()},
                                         {"d", "join", Json::array({"a", "b", "c"})}}));
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "compensated") << done.summary.reason;
  EXPECT_EQ(done.summary.reason, "step b failed: sold out");
  EXPECT_EQ(Calls(Key(id, "d")), 0) << "nothing starts after a failure";
  EXPECT_EQ(Ledger("undo:"), (std::vector<std::string>{"a", "c"}));
  auto j = Journal(id);
  EXPECT_LT(At(j, "succeeded", "c"), At(j, "failed", "b"));
  EXPECT_LT(At(j, "failed", "b"), At(j, "succeeded", "a"));
  EXPECT_LT(At(j, "succeeded", "a"), At(j, "saga_compensating", ""))
      << "the branch in flight finished before the rollback began";
  EXPECT_LT(At(j, "compensated", "a"), At(j, "compensated", "c"));
}

TEST_P(ParallelTest, AnUnknownBranchIsResolvedBeforeTheRollbackAndNotResent) {
  // a's outcome is unknown; its status lookup says the key was never
  // applied. Alone, a keyed resend would follow; with b failed, nothing is
  // resent: a ends failed (never applied) and only c is undone.
  std::atomic<int> lookups{0};
  AddTool(
      "a.do", EffectClass::kWrite, false,
      [&](const ToolCall& c) {
        Record("call:" + c.step_id);
        if (!AwaitDurable("failed b")) return ToolOutcome::Failed("b never failed", false);
        return ToolOutcome::Unknown("timed out");
      },
      [&](const std::string&) {
        ++lookups;
        LookupOutcome o;
        o.kind = LookupKind::kNotApplied;
        return o;
      });
  AddTool("b.do", EffectClass::kWrite, true,
          [&](const ToolCall&) { return ToolOutcome::Failed("sold out", false); });
  AddTool("c.do", EffectClass::kWrite, false, [&](const ToolCall& c) {
    Record("call:" + c.step_id);
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  });
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(
      e,
      Spec({{"a", "a.do", nullptr}, {"b", "b.do", Json::array()}, {"c", "c.do", Json::array()}}));
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "compensated") << done.summary.reason;
  EXPECT_EQ(Calls(Key(id, "a")), 1) << "no resend once a sibling failed";
  EXPECT_GE(lookups.load(), 1);
  EXPECT_EQ(done.steps[0].state, "failed");
  EXPECT_EQ(Ledger("undo:"), (std::vector<std::string>{"c"}));
  auto j = Journal(id);
  EXPECT_LT(At(j, "unknown", "a"), At(j, "failed", "a"));
  EXPECT_LT(At(j, "failed", "a"), At(j, "saga_compensating", ""));
}

TEST_P(ParallelTest, AnUnknownBranchFoundAppliedIsUndoneAfterTheRollbackResolvesIt) {
  // a's outcome is unknown and its status lookup says it was applied: a
  // succeeded (resolved, not called again), and the rollback after b's
  // failure undoes it.
  AddTool(
      "a.do", EffectClass::kWrite, false,
      [&](const ToolCall&) {
        if (!AwaitDurable("failed b")) return ToolOutcome::Failed("b never failed", false);
        return ToolOutcome::Unknown("timed out");
      },
      [&](const std::string&) {
        LookupOutcome o;
        o.kind = LookupKind::kApplied;
        o.result = {{"id", "a"}};
        return o;
      });
  AddTool("b.do", EffectClass::kWrite, true,
          [&](const ToolCall&) { return ToolOutcome::Failed("sold out", false); });
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec({{"a", "a.do", nullptr}, {"b", "b.do", Json::array()}}));
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "compensated") << done.summary.reason;
  EXPECT_EQ(Calls(Key(id, "a")), 1);
  EXPECT_EQ(Ledger("undo:"), (std::vector<std::string>{"a"}));
  auto j = Journal(id);
  EXPECT_LT(At(j, "unknown", "a"), At(j, "succeeded", "a"));
  EXPECT_LT(At(j, "succeeded", "a"), At(j, "compensated", "a"));
}

// Two branches blocked in their calls, a join after them; a control
// request arrives from another engine while both are in flight.
class ParallelControlTest : public ParallelTest {
 protected:
  void SetUpLatched() {
    auto latched = [this](const ToolCall& c) {
      Record("call:" + c.step_id);
      entered_.fetch_add(1);
      if (!AwaitOpen()) return ToolOutcome::Failed("latch never opened", false);
      return ToolOutcome::Succeeded({{"id", c.step_id}});
    };
    AddTool("latch", EffectClass::kWrite, true, latched);
    AddOk("join");
  }
  bool AwaitEntered(int n) {
    for (int i = 0; i < 10'000 && entered_.load() < n; ++i) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    return entered_.load() >= n;
  }
  SagaSpec LatchedSpec() {
    return Spec({{"a", "latch", nullptr},
                 {"b", "latch", Json::array()},
                 {"d", "join", Json::array({"a", "b"})}});
  }
  std::atomic<int> entered_{0};
};

TEST_P(ParallelControlTest, APauseWithBranchesInFlightLetsThemFinishAndStartsNothing) {
  SetUpLatched();
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  const std::string id = Submit(a, LatchedSpec());
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Run(id); });
  ASSERT_TRUE(AwaitEntered(2)) << "both branches in flight";
  auto paused = b.Pause(id, ControlRequest{"ops", "maintenance", true});
  Open();
  driver.join();
  ASSERT_TRUE(paused.ok()) << paused.status().ToString();
  EXPECT_TRUE(paused->pending) << "the driving engine carries it out";
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "paused");
  EXPECT_EQ(done->steps[0].state, "succeeded");
  EXPECT_EQ(done->steps[1].state, "succeeded");
  EXPECT_EQ(done->steps[2].state, "planned") << "nothing new started";
  EXPECT_EQ(Calls(Key(id, "d")), 0);

  auto resumed = b.Resume(id, ControlRequest{"ops", "", true});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->saga.summary.state, "succeeded");
  EXPECT_EQ(Calls(Key(id, "a")), 1);
  EXPECT_EQ(Calls(Key(id, "b")), 1);
  EXPECT_EQ(Calls(Key(id, "d")), 1);
}

TEST_P(ParallelControlTest, ACancelWithBranchesInFlightUndoesBothAndStartsNothing) {
  SetUpLatched();
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  const std::string id = Submit(a, LatchedSpec());
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Run(id); });
  ASSERT_TRUE(AwaitEntered(2)) << "both branches in flight";
  auto cancelled = b.Cancel(id, ControlRequest{"ops", "trip called off", true});
  Open();
  driver.join();
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "compensated");
  EXPECT_EQ(Calls(Key(id, "d")), 0);
  auto undone = Ledger("undo:");
  std::sort(undone.begin(), undone.end());
  EXPECT_EQ(undone, (std::vector<std::string>{"a", "b"}));
}

TEST_P(ParallelControlTest, TheLeaseIsRenewedWhileBranchesAreInFlight) {
  // A lease of 600 ms, branches blocked for 3 lease lengths: the renewals go
  // on, so another engine cannot take the saga over, and nothing runs twice.
  SetUpLatched();
  EngineOptions short_lease = Options("engine-a");
  short_lease.clock = SystemClock::Get();
  short_lease.lease_ms = 600;
  Engine a(store_.get(), &tools_, short_lease);
  EngineOptions other = Options("engine-b");
  other.clock = SystemClock::Get();
  Engine b(store_.get(), &tools_, other);
  const std::string id = Submit(a, LatchedSpec());
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Run(id); });
  ASSERT_TRUE(AwaitEntered(2)) << "both branches in flight";
  std::this_thread::sleep_for(milliseconds(1800));
  auto taken = b.Run(id);
  EXPECT_FALSE(taken.ok() && taken->summary.state == "succeeded")
      << "another engine drove a saga whose lease was kept";
  Open();
  driver.join();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "succeeded") << done->summary.reason;
  EXPECT_EQ(Calls(Key(id, "a")), 1);
  EXPECT_EQ(Calls(Key(id, "b")), 1);
  EXPECT_EQ(Calls(Key(id, "d")), 1);
}

TEST_P(ParallelTest, MaxParallelStepsOfOneRunsThemOneAfterAnother) {
  std::atomic<int> in_flight{0};
  std::atomic<int> most{0};
  auto counted = [&](const ToolCall& c) {
    int now = ++in_flight;
    most = std::max(most.load(), now);
    std::this_thread::sleep_for(milliseconds(20));
    --in_flight;
    return ToolOutcome::Succeeded({{"id", c.step_id}});
  };
  AddTool("x", EffectClass::kWrite, true, counted);
  EngineOptions o = Options();
  o.max_parallel_steps = 1;
  Engine e(store_.get(), &tools_, o);
  const std::string id =
      Submit(e, Spec({{"a", "x", nullptr}, {"b", "x", Json::array()}, {"c", "x", Json::array()}}));
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "succeeded");
  EXPECT_EQ(most.load(), 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, ParallelTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Backends, ParallelControlTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
