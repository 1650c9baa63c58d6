// The engine against a real SQLite journal file and in-process tools whose
// providers keep a ledger of applied effects (RELIABILITY.md rows 5, 19-24).

#include "saga/engine.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "compensation/rollback.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

// A provider for tests: applies effects into a ledger, with scripted faults.
struct Provider {
  std::mutex mu;
  std::map<std::string, int> applied;                      // key -> effects applied
  std::map<std::string, int> calls;                        // key -> calls received
  std::vector<std::string> order;                          // tool names in call order
  std::map<std::string, std::vector<std::string>> script;  // tool -> outcomes to play
  std::map<std::string, int> version;                      // tool -> resource version
  std::map<std::string, int> previews;                     // tool -> previews asked

  // Next scripted outcome for `tool`: "ok", "fail" (retryable), "reject",
  // "lose" (apply, then unknown), "hang" (unknown, not applied).
  std::string Next(const std::string& tool) {
    auto& s = script[tool];
    if (s.empty()) return "ok";
    std::string o = s.front();
    s.erase(s.begin());
    return o;
  }
};

std::unique_ptr<Tool> MakeTool(Provider* p, const std::string& name, EffectClass c,
                               bool honours_keys, bool has_status, bool has_preview = false) {
  ToolInfo info;
  info.name = name;
  info.effect = c;
  info.honours_keys = honours_keys;
  auto invoke = [p, name, honours_keys](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->calls[call.key]++;
    p->order.push_back(name);
    std::string mode = p->Next(name);
    if (mode == "fail") return ToolOutcome::Failed("503 busy", true);
    if (mode == "reject") return ToolOutcome::Failed("409 sold out", false);
    if (mode == "hang") return ToolOutcome::Unknown("timed out");
    if (mode == "reprice") p->version[name]++;
    if (!call.expected_version.empty() &&
        call.expected_version != "v" + std::to_string(p->version[name])) {
      return ToolOutcome::Stale("version " + call.expected_version + " is stale");
    }
    if (!(honours_keys && p->applied[call.key] > 0)) p->applied[call.key]++;
    Json result = {{"ref", name + ":" + call.key}, {"args", call.args}};
    if (mode == "lose") return ToolOutcome::Unknown("response lost");
    return ToolOutcome::Succeeded(result, name + ":" + call.key);
  };
  FunctionTool::LookupFn lookup;
  if (has_status) {
    lookup = [p, name](const std::string& key) {
      std::lock_guard<std::mutex> lock(p->mu);
      LookupOutcome o;
      if (p->applied[key] > 0) {
        o.kind = LookupKind::kApplied;
        o.result = {{"ref", name + ":" + key}};
        o.external_ref = name + ":" + key;
      } else {
        o.kind = LookupKind::kNotApplied;
      }
      return o;
    };
  }
  FunctionTool::PreviewFn preview;
  if (has_preview) {
    preview = [p, name](const ToolCall& call) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->previews[name]++;
      PreviewOutcome o;
      o.ok = true;
      o.summary = name + " for " + call.args.dump();
      o.changes = call.args;
      o.resource_version = "v" + std::to_string(p->version[name]);
      return o;
    };
  }
  return std::make_unique<FunctionTool>(info, invoke, lookup, preview);
}

// Forwards to a real store and records, per committed transaction, the
// journal entries it carried ("step:event"), to check which writes share one.
class TransactionLog : public storage::Store {
 public:
  explicit TransactionLog(storage::Store* inner) : inner_(inner) {}
  std::vector<std::vector<std::string>> commits;

  Result<storage::CreateOutcome> CreateIntent(const storage::NewSaga& saga) override {
    auto out = inner_->CreateIntent(saga);
    if (out.ok() && out->created) commits.push_back({"intent"});
    return out;
  }
  Result<std::optional<storage::CreateOutcome>> FindIntent(const storage::NewSaga& saga) override {
    return inner_->FindIntent(saga);
  }
  Result<storage::SagaRecord> LoadSaga(const std::string& id) override {
    return inner_->LoadSaga(id);
  }
  Status Commit(const storage::WriteBatch& batch) override {
    Status s = inner_->Commit(batch);
    if (s.ok()) {
      last_commit_released = batch.release_lease;
      std::vector<std::string> events;
      if (batch.create) events.push_back("intent");
      for (const auto& e : batch.journal) events.push_back(e.step_id + ":" + e.event);
      commits.push_back(events);
    }
    return s;
  }
  Result<std::vector<storage::SagaSummary>> ListSagas(const storage::SagaFilter& f) override {
    return inner_->ListSagas(f);
  }
  Result<std::vector<storage::JournalEntry>> ReadJournal(const std::string& id) override {
    return inner_->ReadJournal(id);
  }
  Result<std::vector<storage::EffectRecord>> ListEffects(const std::string& id) override {
    return inner_->ListEffects(id);
  }
  int SchemaVersion() override { return inner_->SchemaVersion(); }
  Result<std::vector<storage::Lease>> ClaimSagas(const std::vector<std::string>& states,
                                                 const std::string& owner, int64_t lease_ms,
                                                 int limit) override {
    return inner_->ClaimSagas(states, owner, lease_ms, limit);
  }
  Result<storage::Lease> ClaimSaga(const std::string& id, const std::string& owner,
                                   int64_t lease_ms) override {
    ++claims;
    return inner_->ClaimSaga(id, owner, lease_ms);
  }
  Status RenewLease(const storage::Lease& lease, int64_t lease_ms) override {
    return inner_->RenewLease(lease, lease_ms);
  }
  Status ReleaseLease(const storage::Lease& lease) override {
    ++releases;
    return inner_->ReleaseLease(lease);
  }
  int releases = 0;
  int claims = 0;
  bool last_commit_released = false;

 private:
  storage::Store* inner_;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = storage::OpenStore(dir_.File("journal.db"));
    ASSERT_OK(s);
    store_ = std::move(s).value();
    Add("a.do", EffectClass::kWrite, true, true);
    Add("a.undo", EffectClass::kIdempotent, true, false);
    Add("b.do", EffectClass::kWrite, true, true);
    Add("b.undo", EffectClass::kIdempotent, true, false);
    Add("c.do", EffectClass::kWrite, true, true);
    Add("c.undo", EffectClass::kIdempotent, true, false);
    Add("status_only.do", EffectClass::kWrite, false, true);
    Add("neither.do", EffectClass::kWrite, false, false);
    Add("keys_only.do", EffectClass::kWrite, true, false);
    Add("plain.undo", EffectClass::kWrite, false, false);
    Add("lookup.read", EffectClass::kRead, false, false);
    ASSERT_TRUE(
        tools_.Register(MakeTool(&provider_, "pay.charge", EffectClass::kWrite, true, true, true))
            .ok());
    ASSERT_TRUE(tools_
                    .Register(MakeTool(&provider_, "mail.send", EffectClass::kIrreversible, true,
                                       true, true))
                    .ok());
  }
  void Add(const std::string& name, EffectClass c, bool keys, bool status) {
    ASSERT_TRUE(tools_.Register(MakeTool(&provider_, name, c, keys, status)).ok());
  }

  // By default one process owns the journal (as the CLI on SQLite): no
  // leases. Tests of takeovers between workers ask for leases.
  Engine MakeEngine(bool use_leases = false) {
    EngineOptions o;
    o.clock = &clock_;
    o.signer = &signer_;
    o.use_leases = use_leases;
    o.observer = [this](const storage::JournalEntry& e) {
      events_.push_back(e.step_id + ":" + e.event);
    };
    return Engine(store_.get(), &tools_, o);
  }

  SagaSpec Spec(const std::string& second_tool = "b.do",
                const std::string& second_undo = "b.undo") {
    Json doc = {
        {"name", "three"},
        {"steps",
         {{{"id", "first"},
           {"tool", "a.do"},
           {"args", {{"who", "${input.who}"}}},
           {"compensate", {{"tool", "a.undo"}, {"args", {{"ref", "${steps.first.result.ref}"}}}}}},
          {{"id", "second"},
           {"tool", second_tool},
           {"args", {{"after", "${steps.first.result.ref}"}}},
           {"compensate", {{"tool", second_undo}, {"args", Json::object()}}}},
          {{"id", "third"},
           {"tool", "c.do"},
           {"args", {{"n", 3}}},
           {"compensate", {{"tool", "c.undo"}, {"args", Json::object()}}}}}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return *spec;
  }

  // Submits and runs `spec` with an engine writing through `log`.
  Result<storage::SagaRecord> RunLogged(TransactionLog* log, const SagaSpec& spec,
                                        bool use_leases = false) {
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = use_leases;
    o.owner = "engine-1";
    Engine e(log, &tools_, o);
    auto sub = e.Submit(spec, {{"who", "ana"}}, "intent-1");
    if (!sub.ok()) return sub.status();
    return e.Run(sub->saga_id);
  }

  storage::SagaRecord SubmitAndRun(const SagaSpec& spec, const std::string& key = "intent-1") {
    Engine e = MakeEngine();
    auto sub = e.Submit(spec, {{"who", "ana"}}, key);
    EXPECT_OK(sub);
    auto rec = e.Run(sub->saga_id);
    EXPECT_OK(rec);
    return *rec;
  }

  // Leaves a saga as a crash (or a worker that lost its lease) would: step
  // "first" succeeded with its effect applied, step "second" `submitted`
  // with `second_args`, the saga in `state`. Returns the two step records.
  std::pair<storage::StepRecord, storage::StepRecord> LeaveSecondSubmitted(
      const std::string& saga_id, const std::string& state, const std::string& reason = "",
      Json second_args = Json()) {
    auto rec = store_->LoadSaga(saga_id);
    EXPECT_OK(rec);
    storage::WriteBatch b;
    b.saga_id = saga_id;
    b.saga_state = state;
    b.saga_reason = reason;
    auto first = rec->steps[0];
    first.state = "succeeded";
    first.attempt = 1;
    first.args = {{"who", "ana"}};
    first.result = {{"ref", "a.do:" + first.step_key}};
    provider_.applied[first.step_key] = 1;
    auto second = rec->steps[1];
    second.state = "submitted";
    second.attempt = 1;
    second.args = std::move(second_args);
    b.steps = {first, second};
    Status s = store_->Commit(b);
    EXPECT_OK(s);
    return {first, second};
  }

  int Applied(const std::string& key) { return provider_.applied[key]; }
  int Calls(const std::string& key) { return provider_.calls[key]; }

  test::TempDir dir_{"idem_engine"};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  Provider provider_;
  ManualClock clock_;
  preview_commit::KeyRing keys_ =
      preview_commit::KeyRing::ForTesting({{"k1", std::string(32, 'k')}}, "k1");
  preview_commit::TokenSigner signer_{&keys_, &clock_};
  std::vector<std::string> events_;
};

// Staged writes: an outcome whose loss a recovery settles rides with the
// next `submitted`; a three-step saga of keyed tools commits 5 times.
TEST_F(EngineTest, OutcomesOfKeyedStepsShareTheNextSubmittedTransaction) {
  TransactionLog log(store_.get());
  auto rec = RunLogged(&log, Spec());
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  const std::vector<std::vector<std::string>> want = {{"intent"},
                                                      {":saga_started", "first:submitted"},
                                                      {"first:succeeded", "second:submitted"},
                                                      {"second:succeeded", "third:submitted"},
                                                      {"third:succeeded", ":saga_succeeded"}};
  EXPECT_EQ(log.commits, want);
}

// A synchronous caller (SubmitAndRun): the intent rides with the first
// step's `submitted`, so a three-step saga commits 4 times; with leases the
// saga is created leased to the engine (no claim) and released by the last
// write.
TEST_F(EngineTest, SubmitAndRunRecordsTheIntentWithTheFirstSubmittedIn4Commits) {
  for (bool use_leases : {false, true}) {
    SCOPED_TRACE(use_leases ? "with leases" : "without leases");
    TransactionLog log(store_.get());
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = use_leases;
    o.owner = "engine-1";
    std::vector<std::string> observed;
    o.observer = [&](const storage::JournalEntry& e) {
      observed.push_back(e.step_id + ":" + e.event);
    };
    Engine e(&log, &tools_, o);
    const std::string key = use_leases ? "leased" : "unleased";
    std::vector<SubmitResult> told;
    auto rec =
        e.SubmitAndRun(Spec(), {{"who", "ana"}}, key, std::nullopt, [&](const SubmitResult& sub) {
          // Told once the intent is durable, before step 1's call.
          EXPECT_EQ(Calls(sub.saga_id + "/first"), 0);
          auto now = store_->LoadSaga(sub.saga_id);
          EXPECT_OK(now);
          told.push_back(sub);
        });
    ASSERT_OK(rec);
    EXPECT_EQ(rec->summary.state, "succeeded");
    ASSERT_EQ(told.size(), 1u);
    EXPECT_EQ(told[0].saga_id, rec->summary.saga_id);
    EXPECT_TRUE(told[0].created);
    const std::vector<std::vector<std::string>> want = {
        {"intent", ":saga_started", "first:submitted"},
        {"first:succeeded", "second:submitted"},
        {"second:succeeded", "third:submitted"},
        {"third:succeeded", ":saga_succeeded"}};
    EXPECT_EQ(log.commits, want);
    EXPECT_EQ(log.claims, 0);
    EXPECT_EQ(log.releases, 0);
    EXPECT_EQ(log.last_commit_released, use_leases);
    // The observer hears `saga_created` first, as from Submit.
    ASSERT_FALSE(observed.empty());
    EXPECT_EQ(observed.front(), ":saga_created");
    for (const char* step : {"first", "second", "third"}) {
      EXPECT_EQ(Applied(rec->summary.saga_id + "/" + step), 1) << step;
    }
    if (use_leases) {
      auto other = store_->ClaimSaga(rec->summary.saga_id, "engine-2", 60'000);
      ASSERT_OK(other);
      EXPECT_EQ(other->epoch, 2) << "created at epoch 1, claimed once after";
    }

    // The same call again: the recorded outcome, nothing written or called.
    log.commits.clear();
    told.clear();
    auto again = e.SubmitAndRun(Spec(), {{"who", "ana"}}, key, std::nullopt,
                                [&](const SubmitResult& sub) { told.push_back(sub); });
    ASSERT_OK(again);
    EXPECT_EQ(again->summary.saga_id, rec->summary.saga_id);
    EXPECT_EQ(again->summary.state, "succeeded");
    ASSERT_EQ(told.size(), 1u);
    EXPECT_FALSE(told[0].created);
    EXPECT_TRUE(log.commits.empty());
    EXPECT_EQ(Calls(rec->summary.saga_id + "/first"), 1);
    // Other content under the key: kConflict, nothing run.
    auto other = e.SubmitAndRun(Spec(), {{"who", "bea"}}, key);
    EXPECT_EQ(other.status().code(), Code::kConflict) << other.status().ToString();
  }
}

// A drive refused at its first write because another caller recorded the
// key in between drives that caller's saga instead: one saga, one call per
// step, whoever wins.
TEST_F(EngineTest, SubmitAndRunsOfOneKeyAtOnceMakeOneSagaAndOneEffectPerStep) {
  for (int round = 0; round < 5; ++round) {
    const std::string key = "race-" + std::to_string(round);
    constexpr int kCallers = 4;
    std::vector<Result<storage::SagaRecord>> got(kCallers, Status::Internal("not run"));
    std::vector<std::thread> threads;
    for (int t = 0; t < kCallers; ++t) {
      threads.emplace_back([&, t] {
        EngineOptions o;
        o.clock = &clock_;
        o.use_leases = true;
        o.owner = "engine-" + std::to_string(t);
        Engine e(store_.get(), &tools_, o);
        got[t] = e.SubmitAndRun(Spec(), {{"who", "ana"}}, key);
      });
    }
    for (auto& th : threads) th.join();
    std::set<std::string> ids;
    for (const auto& r : got) {
      // The winner's outcome, or the loser told that the winner drives it.
      if (r.ok()) {
        ids.insert(r->summary.saga_id);
      } else {
        EXPECT_EQ(r.status().code(), Code::kAborted) << r.status().ToString();
      }
    }
    ASSERT_EQ(ids.size(), 1u);
    const std::string id = *ids.begin();
    storage::SagaFilter f;
    auto all = store_->ListSagas(f);
    ASSERT_OK(all);
    int of_key = 0;
    for (const auto& sum : *all) of_key += sum.intent_key == key ? 1 : 0;
    EXPECT_EQ(of_key, 1);
    auto rec = store_->LoadSaga(id);
    ASSERT_OK(rec);
    EXPECT_EQ(rec->summary.state, "succeeded");
    for (const char* step : {"first", "second", "third"}) {
      EXPECT_EQ(Applied(id + "/" + step), 1) << step;
      EXPECT_EQ(Calls(id + "/" + step), 1) << step;
    }
  }
}

// Under a lease, the drive's last write (the terminal state) gives the lease
// up in its own transaction: no separate release.
TEST_F(EngineTest, LeasedDriveGivesItsLeaseUpWithItsLastWrite) {
  TransactionLog log(store_.get());
  auto rec = RunLogged(&log, Spec(), /*use_leases=*/true);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  EXPECT_TRUE(log.last_commit_released);
  EXPECT_EQ(log.releases, 0);
  ASSERT_FALSE(log.commits.empty());
  EXPECT_EQ(log.commits.back().back(), ":saga_succeeded");
  auto other = store_->ClaimSaga(rec->summary.saga_id, "engine-2", 60'000);
  EXPECT_TRUE(other.ok()) << "the lease should be free: " << other.status().ToString();
}

// A tool with neither keys nor status: a lost outcome would park the saga,
// so it is committed on its own, at once.
TEST_F(EngineTest, OutcomeOfAToolWithoutKeysOrStatusIsCommittedAtOnce) {
  TransactionLog log(store_.get());
  auto rec = RunLogged(&log, Spec("neither.do"));
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  const std::vector<std::string> alone = {"second:succeeded"};
  EXPECT_NE(std::find(log.commits.begin(), log.commits.end(), alone), log.commits.end())
      << "second:succeeded should be a transaction of its own";
}

// A drive that stops between steps still makes what it staged durable.
TEST_F(EngineTest, AStoppedDriveFlushesTheOutcomeItStaged) {
  std::atomic<bool> stop{false};
  EngineOptions o;
  o.clock = &clock_;
  o.use_leases = false;
  o.stop = &stop;
  o.observer = [&](const storage::JournalEntry& e) {
    if (e.step_id == "first" && e.event == "submitted") stop = true;
  };
  Engine e(store_.get(), &tools_, o);
  auto sub = e.Submit(Spec(), {{"who", "ana"}}, "intent-1");
  ASSERT_OK(sub);
  auto rec = e.Run(sub->saga_id);
  EXPECT_EQ(rec.status().code(), Code::kAborted) << rec.status().ToString();
  auto stored = store_->LoadSaga(sub->saga_id);
  ASSERT_OK(stored);
  EXPECT_EQ(stored->steps[0].state, "succeeded");
  EXPECT_EQ(stored->steps[1].state, "planned");
  EXPECT_EQ(Calls(stored->steps[0].step_key), 1);
}

TEST_F(EngineTest, HappyPathRunsEveryStepOnceWithResolvedArguments) {
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "succeeded");
  for (const auto& st : rec.steps) {
    EXPECT_EQ(st.state, "succeeded") << st.step_id;
    EXPECT_EQ(st.attempt, 1);
    EXPECT_EQ(Applied(st.step_key), 1) << st.step_key;
    EXPECT_EQ(st.step_key, StepKey(rec.summary.saga_id, st.step_id));
  }
  EXPECT_EQ(rec.steps[0].args["who"], "ana");
  EXPECT_EQ(rec.steps[1].args["after"], "a.do:" + rec.steps[0].step_key);
  auto effects = store_->ListEffects(rec.summary.saga_id);
  ASSERT_OK(effects);
  ASSERT_EQ(effects->size(), 3u);
  // Journal-first: every step's `submitted` precedes its outcome.
  auto journal = store_->ReadJournal(rec.summary.saga_id);
  ASSERT_OK(journal);
  std::vector<std::string> seen;
  for (const auto& e : *journal) seen.push_back(e.step_id + ":" + e.event);
  std::vector<std::string> want = {":saga_created",   ":saga_started",    "first:submitted",
                                   "first:succeeded", "second:submitted", "second:succeeded",
                                   "third:submitted", "third:succeeded",  ":saga_succeeded"};
  EXPECT_EQ(seen, want);
}

TEST_F(EngineTest, RunningAFinishedSagaAgainCallsNothing) {
  auto rec = SubmitAndRun(Spec());
  size_t calls = provider_.order.size();
  Engine e = MakeEngine();
  auto again = e.Run(rec.summary.saga_id);
  ASSERT_OK(again);
  EXPECT_EQ(again->summary.state, "succeeded");
  EXPECT_EQ(provider_.order.size(), calls);
}

TEST_F(EngineTest, SubmitIsIdempotentPerIntentKey) {
  Engine e = MakeEngine();
  SagaSpec spec = Spec();
  auto a = e.Submit(spec, {{"who", "ana"}}, "k1");
  auto b = e.Submit(spec, {{"who", "ana"}}, "k1");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->created);
  EXPECT_FALSE(b->created);
  EXPECT_EQ(a->saga_id, b->saga_id);
  auto c = e.Submit(spec, {{"who", "bob"}}, "k1");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kConflict);
  auto all = store_->ListSagas({});
  ASSERT_OK(all);
  EXPECT_EQ(all->size(), 1u);
  EXPECT_EQ(e.Submit(spec, {{"who", "ana"}}, "").status().code(), Code::kInvalidArgument);
}

TEST_F(EngineTest, PermanentFailureRollsBackInReverseOrder) {
  provider_.script["c.do"] = {"reject"};
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_NE(rec.summary.reason.find("409 sold out"), std::string::npos) << rec.summary.reason;
  EXPECT_EQ(rec.steps[0].state, "compensated");
  EXPECT_EQ(rec.steps[1].state, "compensated");
  EXPECT_EQ(rec.steps[2].state, "failed");
  std::vector<std::string> tail(provider_.order.end() - 2, provider_.order.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"b.undo", "a.undo"}));
  EXPECT_EQ(Applied(compensation::CompensationKey(rec.steps[0].step_key)), 1);
  EXPECT_EQ(Applied(compensation::CompensationKey(rec.steps[1].step_key)), 1);
  EXPECT_EQ(Applied(rec.steps[2].step_key), 0);
  EXPECT_EQ(Calls(rec.steps[2].step_key), 1) << "a permanent refusal is not retried";
}

TEST_F(EngineTest, FirstStepFailingLeavesNothingToUndo) {
  provider_.script["a.do"] = {"reject"};
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "failed");
  EXPECT_EQ(provider_.order, (std::vector<std::string>{"a.do"}));
}

TEST_F(EngineTest, TransientFailureRetriesWithTheSameKey) {
  provider_.script["b.do"] = {"fail"};
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(rec.steps[1].attempt, 2);
  EXPECT_EQ(Calls(rec.steps[1].step_key), 2);
  EXPECT_EQ(Applied(rec.steps[1].step_key), 1);
}

TEST_F(EngineTest, WriteToolRetriesAtMostOnce) {
  provider_.script["b.do"] = {"fail", "fail", "fail"};
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(Calls(rec.steps[1].step_key), 2);
}

TEST_F(EngineTest, WriteToolWithoutKeysRetriesOnlyAfterAStatusCheck) {
  provider_.script["status_only.do"] = {"fail"};
  auto rec = SubmitAndRun(Spec("status_only.do"));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Calls(rec.steps[1].step_key), 2);
  EXPECT_EQ(Applied(rec.steps[1].step_key), 1);

  provider_.script["neither.do"] = {"fail"};
  auto rec2 = SubmitAndRun(Spec("neither.do"), "intent-2");
  EXPECT_EQ(rec2.summary.state, "compensated");
  EXPECT_EQ(Calls(rec2.steps[1].step_key), 1) << "no blind retry without keys or status";
}

TEST_F(EngineTest, UnknownOutcomeResolvedByStatusLookupWithoutRecall) {
  provider_.script["status_only.do"] = {"lose"};
  auto rec = SubmitAndRun(Spec("status_only.do"));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Calls(rec.steps[1].step_key), 1);
  EXPECT_EQ(Applied(rec.steps[1].step_key), 1);
  auto journal = store_->ReadJournal(rec.summary.saga_id);
  ASSERT_OK(journal);
  bool resolved = false;
  for (const auto& e : *journal) {
    if (e.step_id == "second" && e.event == "succeeded") {
      resolved = e.data.value("resolved_by", "") == "status_lookup";
    }
  }
  EXPECT_TRUE(resolved);
}

TEST_F(EngineTest, UnknownOutcomeNotAppliedIsResentWithTheSameKey) {
  provider_.script["status_only.do"] = {"hang"};
  auto rec = SubmitAndRun(Spec("status_only.do"));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Calls(rec.steps[1].step_key), 2);
  EXPECT_EQ(Applied(rec.steps[1].step_key), 1);
}

TEST_F(EngineTest, UnknownOutcomeWithoutKeysOrStatusParksWithZeroBlindRetries) {
  provider_.script["neither.do"] = {"lose"};
  auto rec = SubmitAndRun(Spec("neither.do"));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(rec.steps[1].state, "needs_attention");
  EXPECT_NE(rec.summary.reason.find("neither a status lookup nor idempotency keys"),
            std::string::npos)
      << rec.summary.reason;
  EXPECT_EQ(Calls(rec.steps[1].step_key), 1);
  EXPECT_EQ(Applied(rec.steps[1].step_key), 1);
  EXPECT_EQ(provider_.order.size(), 2u) << "nothing after the parked step ran, nothing undone";
  // Recovery leaves a parked saga alone.
  Engine e = MakeEngine();
  auto report = e.Recover();
  ASSERT_OK(report);
  EXPECT_EQ(report->resumed, 0);
}

TEST_F(EngineTest, UnknownOutcomeOfAKeyedToolIsResolvedByASameKeyRetry) {
  provider_.script["keys_only.do"] = {"lose"};
  auto rec = SubmitAndRun(Spec("keys_only.do"));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Calls(rec.steps[1].step_key), 2);
  EXPECT_EQ(Applied(rec.steps[1].step_key), 1) << "the provider deduplicated the key";
}

TEST_F(EngineTest, UnknownOutcomeOfAKeyedToolStillUnknownAfterItsRetriesParks) {
  provider_.script["keys_only.do"] = {"hang", "hang", "hang"};
  auto rec = SubmitAndRun(Spec("keys_only.do"));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(Calls(rec.steps[1].step_key), 2) << "bounded by the write policy";
}

TEST_F(EngineTest, CompensationRetriesTransientFailuresWithBackoffUnderOneKey) {
  provider_.script["c.do"] = {"reject"};
  provider_.script["b.undo"] = {"fail", "fail", "fail"};
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(rec.steps[1].comp_attempt, 4);
  std::string key = compensation::CompensationKey(rec.steps[1].step_key);
  EXPECT_EQ(Calls(key), 4);
  EXPECT_EQ(Applied(key), 1);
  EXPECT_GE(clock_.sleeps(), 3) << "each retry waited";
}

TEST_F(EngineTest, CompensationThatKeepsFailingParksTheSagaWithItsReason) {
  provider_.script["c.do"] = {"reject"};
  provider_.script["b.undo"] = std::vector<std::string>(50, "fail");
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(rec.steps[1].state, "compensation_failed");
  EXPECT_NE(rec.summary.reason.find("gave up after 5 attempts"), std::string::npos)
      << rec.summary.reason;
  std::string key = compensation::CompensationKey(rec.steps[1].step_key);
  EXPECT_EQ(Calls(key), 5) << "bounded: no hot loop";
  EXPECT_EQ(rec.steps[0].state, "succeeded") << "earlier undo waits for the person";
}

TEST_F(EngineTest, CompensationRefusedForGoodParksAtOnce) {
  provider_.script["c.do"] = {"reject"};
  provider_.script["b.undo"] = {"reject"};
  auto rec = SubmitAndRun(Spec());
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(Calls(compensation::CompensationKey(rec.steps[1].step_key)), 1);
}

TEST_F(EngineTest, RecoveryResolvesASubmittedStepThroughStatusWithoutRecall) {
  // Simulate a crash after the provider applied the effect and before the
  // journal recorded it: the step stands `submitted`.
  Engine e = MakeEngine();
  SagaSpec spec = Spec("status_only.do");
  auto sub = e.Submit(spec, {{"who", "ana"}}, "crash-1");
  ASSERT_OK(sub);
  auto [first, second] = LeaveSecondSubmitted(
      sub->saga_id, "running", "", {{"after", "a.do:" + StepKey(sub->saga_id, "first")}});
  provider_.applied[second.step_key] = 1;  // applied, answer lost in the crash

  auto report = e.Recover();
  ASSERT_OK(report);
  EXPECT_EQ(report->resumed, 1);
  EXPECT_TRUE(report->errors.empty());
  auto after = store_->LoadSaga(sub->saga_id);
  ASSERT_OK(after);
  EXPECT_EQ(after->summary.state, "succeeded");
  EXPECT_EQ(Calls(second.step_key), 0) << "resolved by lookup, never re-called";
  EXPECT_EQ(Applied(second.step_key), 1);
}

TEST_F(EngineTest, NullCompensationWhenTheUncertainActionNeverHappened) {
  // Rolling back finds a step `submitted` whose provider never applied it:
  // the undo endpoint is not called.
  Engine e = MakeEngine();
  SagaSpec spec = Spec("status_only.do");
  auto sub = e.Submit(spec, {{"who", "ana"}}, "null-1");
  ASSERT_OK(sub);
  auto [first, second] = LeaveSecondSubmitted(sub->saga_id, "compensating", "cancelled");

  auto run = e.Run(sub->saga_id);
  ASSERT_OK(run);
  EXPECT_EQ(run->summary.state, "compensated");
  EXPECT_EQ(run->steps[1].state, "failed");
  EXPECT_EQ(Calls(compensation::CompensationKey(second.step_key)), 0);
  EXPECT_EQ(Calls(second.step_key), 0);
  EXPECT_EQ(Applied(compensation::CompensationKey(first.step_key)), 1);
  bool null_comp = false;
  for (const auto& ev : events_) null_comp |= ev == "second:null_compensation";
  EXPECT_TRUE(null_comp);
}

// A template without a value parks the step for a person (saga/park.h):
// it used to fail the step, and every recovery of a rollback met it again.
TEST_F(EngineTest, UnresolvedTemplateParksTheStepBeforeAnyCall) {
  Json doc = {{"name", "t"},
              {"steps",
               {{{"id", "first"},
                 {"tool", "a.do"},
                 {"args", {{"who", "${input.missing}"}}},
                 {"compensate", {{"tool", "a.undo"}}}}}}};
  auto spec = ParseSpec(doc, tools_);
  ASSERT_OK(spec);
  auto rec = SubmitAndRun(*spec);
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(rec.steps[0].state, "needs_attention");
  EXPECT_NE(rec.steps[0].error.find("missing_value: "), std::string::npos) << rec.steps[0].error;
  EXPECT_NE(rec.steps[0].error.find("input.missing"), std::string::npos) << rec.steps[0].error;
  EXPECT_TRUE(provider_.order.empty());
}

TEST_F(EngineTest, OperatorResolvesAParkedStepAsAppliedAndTheSagaGoesOn) {
  provider_.script["neither.do"] = {"lose"};
  auto parked = SubmitAndRun(Spec("neither.do"));
  ASSERT_EQ(parked.summary.state, "needs_attention");
  Engine e = MakeEngine();
  Resolution r;
  r.step_id = "second";
  r.decision = Decision::kApplied;
  r.result = {{"ref", "checked-by-phone"}};
  r.who = "maria";
  r.note = "provider confirmed by phone";
  auto rec = e.Resolve(parked.summary.saga_id, r);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  EXPECT_EQ(rec->steps[1].result["ref"], "checked-by-phone");
  EXPECT_EQ(Calls(rec->steps[1].step_key), 1) << "no call after a person's word";
  auto journal = store_->ReadJournal(rec->summary.saga_id);
  ASSERT_OK(journal);
  bool recorded = false;
  for (const auto& j : *journal) {
    if (j.event == "operator_resolved") {
      recorded = j.data["by"] == "maria" && j.data["decision"] == "applied" &&
                 j.data["note"] == "provider confirmed by phone";
    }
  }
  EXPECT_TRUE(recorded);
}

TEST_F(EngineTest, OperatorSaysNotAppliedAndTheSagaRollsBack) {
  provider_.script["neither.do"] = {"hang"};
  auto parked = SubmitAndRun(Spec("neither.do"));
  ASSERT_EQ(parked.summary.state, "needs_attention");
  Engine e = MakeEngine();
  Resolution r{"second", Decision::kNotApplied, Json::object(), "maria", "no booking found"};
  auto rec = e.Resolve(parked.summary.saga_id, r);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "compensated");
  EXPECT_EQ(rec->steps[1].state, "failed");
  EXPECT_EQ(Applied(compensation::CompensationKey(rec->steps[0].step_key)), 1);
}

TEST_F(EngineTest, OperatorRetryCallsAgainWithTheSameKey) {
  provider_.script["neither.do"] = {"hang"};
  auto parked = SubmitAndRun(Spec("neither.do"));
  ASSERT_EQ(parked.summary.state, "needs_attention");
  Engine e = MakeEngine();
  Resolution r{"second", Decision::kRetry, Json::object(), "maria", ""};
  auto rec = e.Resolve(parked.summary.saga_id, r);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  EXPECT_EQ(rec->steps[1].attempt, 2);
  EXPECT_EQ(Calls(rec->steps[1].step_key), 2);
  EXPECT_EQ(Applied(rec->steps[1].step_key), 1);
}

TEST_F(EngineTest, OperatorRetriesAFailedCompensation) {
  provider_.script["c.do"] = {"reject"};
  provider_.script["b.undo"] = std::vector<std::string>(5, "fail");
  auto parked = SubmitAndRun(Spec());
  ASSERT_EQ(parked.summary.state, "needs_attention");
  Engine e = MakeEngine();
  Resolution r{"second", Decision::kRetryUndo, Json::object(), "ops", "provider is back"};
  auto rec = e.Resolve(parked.summary.saga_id, r);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "compensated");
  EXPECT_EQ(Applied(compensation::CompensationKey(rec->steps[1].step_key)), 1);
  EXPECT_EQ(Applied(compensation::CompensationKey(rec->steps[0].step_key)), 1);
}

TEST_F(EngineTest, ResolveRefusesWhatDoesNotFit) {
  auto done = SubmitAndRun(Spec());
  Engine e = MakeEngine();
  Resolution r{"second", Decision::kApplied, Json::object(), "maria", ""};
  EXPECT_EQ(e.Resolve(done.summary.saga_id, r).status().code(), Code::kFailedPrecondition);

  provider_.script["neither.do"] = {"lose"};
  auto parked = SubmitAndRun(Spec("neither.do"), "intent-2");
  Resolution wrong{"second", Decision::kUndone, Json::object(), "maria", ""};
  auto w = e.Resolve(parked.summary.saga_id, wrong);
  EXPECT_EQ(w.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("does not apply"), std::string::npos);
  Resolution nobody{"second", Decision::kApplied, Json::object(), "", ""};
  EXPECT_EQ(e.Resolve(parked.summary.saga_id, nobody).status().code(), Code::kInvalidArgument);
  Resolution missing{"nope", Decision::kApplied, Json::object(), "maria", ""};
  EXPECT_EQ(e.Resolve(parked.summary.saga_id, missing).status().code(), Code::kNotFound);
  auto still = store_->LoadSaga(parked.summary.saga_id);
  ASSERT_OK(still);
  EXPECT_EQ(still->summary.state, "needs_attention") << "refusals write nothing";
}

// A step left `submitted` by a worker that lost its lease: that worker may be
// frozen with its call still in flight (RELIABILITY.md row 7).
TEST_F(EngineTest, TakenOverStepOfAToolWithoutKeysIsParkedNotResent) {
  Engine e = MakeEngine(/*use_leases=*/true);
  SagaSpec spec = Spec("status_only.do");
  auto sub = e.Submit(spec, {{"who", "ana"}}, "takeover-1");
  ASSERT_OK(sub);
  // The other worker's call of "second" may still land.
  auto [first, second] = LeaveSecondSubmitted(sub->saga_id, "running");
  auto out = e.Run(sub->saga_id);
  ASSERT_OK(out);
  EXPECT_EQ(out->summary.state, "needs_attention");
  EXPECT_NE(out->steps[1].error.find("does not deduplicate keys"), std::string::npos)
      << out->steps[1].error;
  EXPECT_EQ(Calls(second.step_key), 0) << "no resend while the first call may land";
}

TEST_F(EngineTest, TakenOverStepOfAKeyedToolIsResentUnderItsKey) {
  Engine e = MakeEngine(/*use_leases=*/true);
  SagaSpec spec = Spec();  // b.do honours keys and has a status lookup
  auto sub = e.Submit(spec, {{"who", "ana"}}, "takeover-2");
  ASSERT_OK(sub);
  auto [first, second] = LeaveSecondSubmitted(
      sub->saga_id, "running", "", {{"after", "a.do:" + StepKey(sub->saga_id, "first")}});
  auto out = e.Run(sub->saga_id);
  ASSERT_OK(out);
  EXPECT_EQ(out->summary.state, "succeeded");
  EXPECT_EQ(Applied(second.step_key), 1) << "a late first call would be deduplicated";
}

TEST_F(EngineTest, ALeaseHeldByAnotherWorkerKeepsTheSagaFromThisOne) {
  Engine e = MakeEngine(/*use_leases=*/true);
  auto sub = e.Submit(Spec(), {{"who", "ana"}}, "held-1");
  ASSERT_OK(sub);
  auto held = store_->ClaimSaga(sub->saga_id, "other-worker", 60'000);
  ASSERT_OK(held);
  auto out = e.Run(sub->saga_id);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kAborted);
  EXPECT_TRUE(provider_.order.empty()) << "nothing called without the lease";
}

// An idle worker waits on its WorkSignal: notified of new work, it claims
// at once instead of at its next poll (a minute here), and NotifyAll ends
// its wait when the pool stops.
TEST_F(EngineTest, AnIdleWorkerNotifiedOfNewWorkClaimsItBeforeItsNextPoll) {
  std::atomic<bool> stop{false};
  EngineOptions o;
  o.clock = &clock_;
  o.use_leases = true;
  o.owner = "worker-1";
  o.stop = &stop;
  Engine worker(store_.get(), &tools_, o);
  WorkSignal wake;
  WorkerOptions wo;
  wo.concurrency = 1;
  wo.poll_ms = 60'000;
  wo.wake = &wake;
  std::thread t([&] { EXPECT_OK(worker.Work(wo)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it found nothing: waits

  Engine e = MakeEngine(/*use_leases=*/true);
  auto sub = e.Submit(Spec(), {{"who", "ana"}}, "woken-1");
  ASSERT_OK(sub);
  wake.Notify();
  std::string state;
  for (int i = 0; i < 1000 && state != "succeeded"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto rec = store_->LoadSaga(sub->saga_id);
    ASSERT_OK(rec);
    state = rec->summary.state;
  }
  EXPECT_EQ(state, "succeeded") << "the worker slept its poll instead of claiming";

  stop = true;
  wake.NotifyAll();
  t.join();  // at once: a wait of its poll would hold it a minute
  EXPECT_EQ(Applied(sub->saga_id + "/first"), 1);
}

TEST(WorkSignalTest, ANotifyIsKeptForTheNextWaitAndTimesOutOtherwise) {
  WorkSignal s;
  EXPECT_FALSE(s.WaitFor(1));
  s.Notify();
  EXPECT_TRUE(s.WaitFor(60'000));  // taken at once
  EXPECT_FALSE(s.WaitFor(1));      // one wake-up per Notify
  for (int i = 0; i < 2 * WorkSignal::kMaxPending; ++i) s.Notify();
  int taken = 0;
  while (s.WaitFor(0)) ++taken;
  EXPECT_EQ(taken, WorkSignal::kMaxPending) << "a burst keeps at most kMaxPending";
  s.NotifyAll();
  EXPECT_TRUE(s.WaitFor(60'000));
  EXPECT_TRUE(s.WaitFor(60'000)) << "after NotifyAll every wait returns at once";
}

// ---- two-phase steps and approval (RELIABILITY.md rows 13-18)

class TwoPhaseTest : public EngineTest {
 protected:
  // first (a.do) then pay (pay.charge, two-phase, with the given extras).
  SagaSpec PaySpec(Json extra) {
    Json pay = {{"id", "pay"},
                {"tool", "pay.charge"},
                {"args", {{"amount", 100}, {"after", "${steps.first.result.ref}"}}},
                {"two_phase", true},
                {"compensate", {{"tool", "b.undo"}}}};
    for (auto& [k, v] : extra.items()) pay[k] = v;
    Json doc = {{"name", "pay"},
                {"steps",
                 {{{"id", "first"},
                   {"tool", "a.do"},
                   {"args", Json::object()},
                   {"compensate", {{"tool", "a.undo"}}}},
                  pay}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return *spec;
  }
  std::string TokenOf(const storage::SagaRecord& rec) { return rec.steps[1].phase["token"]; }
  ApprovalDecision Approve(const std::string& who = "maria") {
    ApprovalDecision d;
    d.approve = true;
    d.who = who;
    d.note = "looks right";
    return d;
  }
  int PayCalls(const storage::SagaRecord& rec) { return Calls(rec.steps[1].step_key); }
};

TEST_F(TwoPhaseTest, WithoutApprovalPreviewsThenCommitsWithTheVersion) {
  auto rec = SubmitAndRun(PaySpec(Json::object()));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(provider_.previews["pay.charge"], 1);
  EXPECT_EQ(PayCalls(rec), 1);
  EXPECT_EQ(rec.steps[1].phase["preview"]["resource_version"], "v0");
  std::vector<std::string> pay_events;
  for (const auto& e : events_) {
    if (e.rfind("pay:", 0) == 0) pay_events.push_back(e);
  }
  EXPECT_EQ(pay_events,
            (std::vector<std::string>{"pay:previewed", "pay:submitted", "pay:succeeded"}));
}

TEST_F(TwoPhaseTest, HumanApprovalWaitsWithoutCallingThenCommitsOnce) {
  auto waiting = SubmitAndRun(PaySpec({{"approval", "human"}}));
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  EXPECT_EQ(waiting.steps[1].state, "awaiting_approval");
  EXPECT_EQ(PayCalls(waiting), 0);
  // Another "process": a fresh engine on the same journal.
  Engine other = MakeEngine();
  auto done = other.Decide(TokenOf(waiting), Approve());
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  EXPECT_EQ(PayCalls(*done), 1);
  EXPECT_EQ(Applied(done->steps[1].step_key), 1);
  EXPECT_EQ(done->steps[1].phase["approval"]["by"], "maria");
  auto journal = store_->ReadJournal(done->summary.saga_id);
  ASSERT_OK(journal);
  bool recorded = false;
  for (const auto& e : *journal) {
    if (e.event == "approved")
      recorded = e.data["by"] == "maria" && e.data["note"] == "looks right";
  }
  EXPECT_TRUE(recorded);

  // A replay after the commit returns the recorded result, no second effect.
  auto replay = other.Decide(TokenOf(waiting), Approve());
  ASSERT_OK(replay);
  EXPECT_EQ(replay->summary.state, "succeeded");
  EXPECT_EQ(replay->steps[1].result, done->steps[1].result);
  EXPECT_EQ(PayCalls(*done), 1);
}

TEST_F(TwoPhaseTest, RejectionRollsBackWithoutCalling) {
  auto waiting = SubmitAndRun(PaySpec({{"approval", "human"}}));
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  Engine other = MakeEngine();
  ApprovalDecision d;
  d.who = "maria";
  EXPECT_EQ(other.Decide(TokenOf(waiting), d).status().code(), Code::kInvalidArgument)
      << "a rejection needs a reason";
  d.note = "too expensive";
  auto rec = other.Decide(TokenOf(waiting), d);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "compensated");
  EXPECT_EQ(rec->steps[1].state, "failed");
  EXPECT_NE(rec->steps[1].error.find("rejected by maria: too expensive"), std::string::npos);
  EXPECT_EQ(PayCalls(*rec), 0);
  EXPECT_EQ(Applied(compensation::CompensationKey(rec->steps[0].step_key)), 1);
  // Approving after the rejection is refused.
  EXPECT_EQ(other.Decide(TokenOf(waiting), Approve()).status().code(), Code::kFailedPrecondition);
}

TEST_F(TwoPhaseTest, ExpiredApprovalIsRefusedThenRolledBackByRecovery) {
  auto waiting = SubmitAndRun(PaySpec({{"approval", "human"}, {"approval_ttl", "15m"}}));
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  Engine e = MakeEngine();
  clock_.AdvanceMs(15 * 60 * 1000 - 1000);  // exp - 1 s: a recovery pass changes nothing
  ASSERT_OK(e.Recover());
  EXPECT_EQ(store_->LoadSaga(waiting.summary.saga_id)->summary.state, "awaiting_approval");
  clock_.AdvanceMs(2000);  // exp + 1 s
  auto late = e.Decide(TokenOf(waiting), Approve());
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().message(), preview_commit::kExpiredTokenMessage);
  EXPECT_EQ(PayCalls(waiting), 0);
  ASSERT_OK(e.Recover());
  auto rec = store_->LoadSaga(waiting.summary.saga_id);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "compensated");
  EXPECT_NE(rec->steps[1].error.find("approval expired"), std::string::npos);
  EXPECT_EQ(PayCalls(*rec), 0);
}

TEST_F(TwoPhaseTest, ExpiredApprovalCanPreviewAgain) {
  auto waiting = SubmitAndRun(
      PaySpec({{"approval", "human"}, {"approval_ttl", 60}, {"on_expiry", "re_preview"}}));
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  clock_.AdvanceMs(61'000);
  Engine e = MakeEngine();
  ASSERT_OK(e.Recover());
  auto again = store_->LoadSaga(waiting.summary.saga_id);
  ASSERT_OK(again);
  EXPECT_EQ(again->summary.state, "awaiting_approval");
  EXPECT_EQ(provider_.previews["pay.charge"], 2);
  EXPECT_NE(TokenOf(*again), TokenOf(waiting));
  auto old = e.Decide(TokenOf(waiting), Approve());
  EXPECT_FALSE(old.ok()) << "the first token expired";
  auto done = e.Decide(TokenOf(*again), Approve());
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  EXPECT_EQ(PayCalls(*done), 1);
}

TEST_F(TwoPhaseTest, ForgedTokensAreRefusedUniformlyAndChangeNothing) {
  auto waiting = SubmitAndRun(PaySpec({{"approval", "human"}}));
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  std::string good = TokenOf(waiting);
  Engine e = MakeEngine();
  std::vector<std::string> bad = {"", "idem1..", good.substr(0, good.size() - 1), good + "A",
                                  "idem2" + good.substr(5)};
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x01;
  bad.push_back(flipped);
  preview_commit::KeyRing other_keys =
      preview_commit::KeyRing::ForTesting({{"k1", std::string(32, 'x')}}, "k1");
  preview_commit::TokenSigner other_signer(&other_keys, &clock_);
  auto forged = other_signer.Mint(waiting.summary.saga_id, "pay",
                                  waiting.steps[1].phase["args_fingerprint"], 60'000);
  ASSERT_OK(forged);
  bad.push_back(*forged);
  for (const std::string& t : bad) {
    auto r = e.Decide(t, Approve());
    ASSERT_FALSE(r.ok()) << t;
    EXPECT_EQ(r.status().message(), preview_commit::kInvalidTokenMessage) << t;
  }
  auto rec = store_->LoadSaga(waiting.summary.saga_id);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "awaiting_approval");
  EXPECT_TRUE(rec->steps[1].phase["approval"].is_null());
  EXPECT_EQ(PayCalls(*rec), 0);
}

TEST_F(TwoPhaseTest, TokenOutsideItsBindingIsRefused) {
  auto a = SubmitAndRun(PaySpec({{"approval", "human"}}), "intent-a");
  auto b = SubmitAndRun(PaySpec({{"approval", "human"}}), "intent-b");
  Engine e = MakeEngine();
  ApprovalDecision other_step = Approve();
  other_step.expected_step_id = "first";
  EXPECT_EQ(e.Decide(TokenOf(a), other_step).status().message(),
            preview_commit::kMismatchedTokenMessage);
  ApprovalDecision other_saga = Approve();
  other_saga.expected_saga_id = b.summary.saga_id;
  EXPECT_EQ(e.Decide(TokenOf(a), other_saga).status().message(),
            preview_commit::kMismatchedTokenMessage);
  // Arguments changed after the preview.
  auto rec = store_->LoadSaga(a.summary.saga_id);
  ASSERT_OK(rec);
  storage::WriteBatch w;
  w.saga_id = a.summary.saga_id;
  auto step = rec->steps[1];
  step.args["amount"] = 999;
  w.steps = {step};
  ASSERT_OK(store_->Commit(w));
  EXPECT_EQ(e.Decide(TokenOf(a), Approve()).status().message(),
            preview_commit::kMismatchedTokenMessage);
  EXPECT_EQ(PayCalls(a) + PayCalls(b), 0);
}

TEST_F(TwoPhaseTest, StaleCommitPreviewsAgainAndAsksThePersonAgain) {
  provider_.script["pay.charge"] = {"reprice"};
  auto waiting = SubmitAndRun(PaySpec({{"approval", "human"}}));
  Engine e = MakeEngine();
  auto after = e.Decide(TokenOf(waiting), Approve());
  ASSERT_OK(after);
  EXPECT_EQ(after->summary.state, "awaiting_approval") << "never a blind commit";
  EXPECT_EQ(Applied(after->steps[1].step_key), 0);
  EXPECT_EQ(after->steps[1].phase["preview"]["resource_version"], "v1");
  EXPECT_NE(e.Decide(TokenOf(waiting), Approve()).status().message().find("superseded"),
            std::string::npos);
  auto done = e.Decide(TokenOf(*after), Approve());
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  EXPECT_EQ(Applied(done->steps[1].step_key), 1);
}

TEST_F(TwoPhaseTest, StaleCommitRollsBackWhenThePolicySaysSo) {
  provider_.script["pay.charge"] = {"reprice"};
  auto rec = SubmitAndRun(PaySpec({{"on_stale", "rollback"}}));
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(Applied(rec.steps[1].step_key), 0);
}

// Several processes share a journal through leases (one engine each here,
// as on PostgreSQL; the CLI on SQLite holds a file lock instead): without
// either, two drivers of one saga are outside the engine's contract.
TEST_F(TwoPhaseTest, TwoProcessesApprovingAtOnceMakeOneEffect) {
  auto waiting = SubmitAndRun(PaySpec({{"approval", "human"}}));
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      Engine e = MakeEngine(/*use_leases=*/true);
      auto r = e.Decide(TokenOf(waiting), Approve());
      if (r.ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(ok.load(), 1);
  auto rec = store_->LoadSaga(waiting.summary.saga_id);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  EXPECT_EQ(Applied(rec->steps[1].step_key), 1);
  EXPECT_EQ(PayCalls(*rec), 1) << "the token was spent once";
}

TEST_F(TwoPhaseTest, IrreversibleToolWithAPreviewIsAlwaysTwoPhase) {
  Json doc = {{"name", "mail"},
              {"steps",
               {{{"id", "send"},
                 {"tool", "mail.send"},
                 {"args", {{"to", "ana"}}},
                 {"compensate", nullptr},
                 {"reason", "a sent email cannot be unsent"},
                 {"approval", "none"}}}}};
  auto spec = ParseSpec(doc, tools_);
  ASSERT_OK(spec);
  EXPECT_TRUE(spec->steps[0].two_phase);
  auto rec = SubmitAndRun(*spec);
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(provider_.previews["mail.send"], 1);
}

// An irreversible step is approved before it happens: a person (or a
// policy) approves its commit, or the step says nobody does and why. A
// one-phase commit that nobody approves, unsaid, is refused by the checker.
TEST_F(TwoPhaseTest, AnIrreversibleStepNeedsAnApprovalOrASaidNone) {
  Json step = {{"id", "send"},
               {"tool", "mail.send"},
               {"args", {{"to", "ana"}}},
               {"compensate", nullptr},
               {"reason", "a sent email cannot be unsent"}};
  auto unsaid = ParseSpec(Json{{"name", "mail"}, {"steps", {step}}}, tools_);
  ASSERT_FALSE(unsaid.ok());
  EXPECT_EQ(unsaid.status().message(),
            "steps[0]: tool \"mail.send\" is irreversible: make the step two_phase with an "
            "approval, or say \"approval\": \"none\" with a \"reason\"");
  step["approval"] = "human";
  auto human = ParseSpec(Json{{"name", "mail"}, {"steps", {step}}}, tools_);
  ASSERT_OK(human);
  auto rec = SubmitAndRun(*human);
  EXPECT_EQ(rec.summary.state, "awaiting_approval") << "a person approves the send first";
  EXPECT_EQ(provider_.previews["mail.send"], 1);
}

TEST_F(TwoPhaseTest, SpecChecksTwoPhaseFields) {
  auto bad = [&](Json step, const std::string& want) {
    Json doc = {{"name", "x"}, {"steps", {step}}};
    auto spec = ParseSpec(doc, tools_);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().message(), want);
  };
  Json base = {{"id", "s"}, {"tool", "a.do"}, {"compensate", {{"tool", "a.undo"}}}};
  Json s1 = base;
  s1["two_phase"] = true;
  bad(s1, "steps[0].two_phase: tool \"a.do\" offers no preview");
  Json s2 = base;
  s2["approval"] = "human";
  bad(s2,
      "steps[0].approval: \"human\" needs a two-phase step (\"two_phase\": true, on a tool "
      "with a preview)");
  Json s3 = base;
  s3["tool"] = "pay.charge";
  s3["two_phase"] = true;
  s3["approval"] = "human";
  s3["approval_ttl"] = "31d";
  bad(s3, "steps[0].approval_ttl: expected seconds or a duration like \"15m\", from 1s up to 30d");
  Json s4 = base;
  s4["tool"] = "pay.charge";
  s4["two_phase"] = true;
  s4["on_expiry"] = "rollback";
  bad(s4, "steps[0].on_expiry: only applies with \"approval\": \"human\"");
}

}  // namespace
}  // namespace idem
