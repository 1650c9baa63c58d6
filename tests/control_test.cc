// Durable cancel, pause and resume (issue 11, defect 3): requests recorded in
// the store and honoured by whichever engine drives the saga, on a real
// SQLite file and a real PostgreSQL database (the ctest fixture `postgres`).

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "preview_commit/phase.h"
#include "preview_commit/token.h"
#include "saga/engine.h"
#include "saga/run.h"
#include "saga/spec.h"
#include "storage/control_store.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

class ControlTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open());
    AddTool("a.do", true, [](const ToolCall& c) {
      return ToolOutcome::Succeeded({{"ref", "a:" + c.key}});
    });
    AddTool("undo", true, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); });
    // Blocks on a latch: a call in progress while another engine acts.
    AddTool("latch.do", true, [this](const ToolCall& c) {
      entered_ = true;
      while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return ToolOutcome::Succeeded({{"ref", "latch:" + c.key}});
    });
    // No keys, no status: an unknown outcome parks the saga.
    AddTool("lost.do", false, [](const ToolCall&) { return ToolOutcome::Unknown("timed out"); });
    ToolInfo pay;
    pay.name = "pay.charge";
    pay.effect = EffectClass::kWrite;
    pay.honours_keys = true;
    auto invoke = [this](const ToolCall& c) {
      Count(c.key);
      return ToolOutcome::Succeeded({{"ref", "pay:" + c.key}});
    };
    auto preview = [](const ToolCall& c) {
      PreviewOutcome o;
      o.ok = true;
      o.summary = "charge " + c.args.dump();
      o.changes = c.args;
      return o;
    };
    ASSERT_TRUE(
        tools_.Register(std::make_unique<FunctionTool>(pay, invoke, nullptr, preview)).ok());
  }
  void TearDown() override { release_ = true; }

  // A store on the test's journal: a SQLite file, or the PostgreSQL database.
  void Open() {
    store_.reset();
    if (GetParam() == "sqlite") {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    }
  }

  void Count(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[key];
  }
  int Calls(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[key];
  }

  void AddTool(const std::string& name, bool honours_keys, FunctionTool::InvokeFn invoke) {
    ToolInfo info;
    info.name = name;
    info.effect = EffectClass::kWrite;
    info.honours_keys = honours_keys;
    auto counted = [this, invoke](const ToolCall& call) {
      Count(call.key);
      return invoke(call);
    };
    ASSERT_TRUE(tools_.Register(std::make_unique<FunctionTool>(info, counted)).ok());
  }

  EngineOptions Options(const std::string& owner, std::atomic<bool>* stop = nullptr) {
    EngineOptions o;
    o.clock = &clock_;
    o.signer = &signer_;
    o.use_leases = true;  // engines share the store
    o.owner = owner;
    o.lease_ms = 60'000;
    o.stop = stop;
    return o;
  }

  // Steps `first` and `second`, both compensable; `second_extra` merged in.
  SagaSpec Spec(const std::string& first_tool, const std::string& second_tool,
                Json second_extra = Json::object()) {
    Json second = {{"id", "second"}, {"tool", second_tool}, {"compensate", {{"tool", "undo"}}}};
    for (auto& [k, v] : second_extra.items()) second[k] = v;
    Json doc = {
        {"name", "two"},
        {"steps",
         {{{"id", "first"}, {"tool", first_tool}, {"compensate", {{"tool", "undo"}}}}, second}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    return *spec;
  }

  std::string Submit(Engine& e, const SagaSpec& spec, const std::string& key = "intent-1") {
    auto sub = e.Submit(spec, Json::object(), key);
    EXPECT_TRUE(sub.ok()) << sub.status().ToString();
    return sub.ok() ? sub->saga_id : "";
  }

  void AwaitLatch() {
    for (int i = 0; i < 10'000 && !entered_.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(entered_.load()) << "the latched call never began";
  }

  std::string State(const std::string& id) {
    auto rec = store_->LoadSaga(id);
    return rec.ok() ? rec->summary.state : rec.status().ToString();
  }

  int Events(const std::string& id, const std::string& event) {
    auto j = store_->ReadJournal(id);
    EXPECT_TRUE(j.ok()) << j.status().ToString();
    int n = 0;
    for (const auto& e : j.ok() ? *j : std::vector<storage::JournalEntry>{}) n += e.event == event;
    return n;
  }

  bool HasPendingRequest(const std::string& id) {
    auto p = store_->Controls()->PendingControl(id);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() && p->has_value();
  }

  static ControlRequest By(const std::string& who, bool drive = true) {
    return ControlRequest{who, "", drive};
  }

  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  ManualClock clock_;
  preview_commit::KeyRing keys_ =
      preview_commit::KeyRing::ForTesting({{"k1", std::string(32, 'k')}}, "k1");
  preview_commit::TokenSigner signer_{&keys_, &clock_};
  std::mutex mu_;
  std::map<std::string, int> calls_;  // GUARDED_BY(mu_)
  std::atomic<bool> entered_{false};
  std::atomic<bool> release_{false};
};

TEST_P(ControlTest, ACancelRecordedByOneEngineIsHonouredByTheEngineDrivingTheSaga) {
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  const std::string id = Submit(a, Spec("latch.do", "a.do"));
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Run(id); });
  ASSERT_NO_FATAL_FAILURE(AwaitLatch());
  auto out = b.Cancel(id, ControlRequest{"ops", "customer called", true});
  release_ = true;
  driver.join();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->recorded);
  EXPECT_TRUE(out->pending) << "engine-a holds the lease: it carries the cancel out";
  EXPECT_EQ(out->saga.summary.state, "running");
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "compensated");
  EXPECT_EQ(done->summary.reason, "customer called");
  EXPECT_EQ(done->steps[0].state, "compensated") << "the call in progress finished, then undone";
  EXPECT_EQ(done->steps[1].state, "planned");
  EXPECT_EQ(Calls(done->steps[1].step_key), 0) << "the second step never ran";
  EXPECT_FALSE(HasPendingRequest(id)) << "settled once carried out";
  EXPECT_EQ(Events(id, "cancel_requested"), 1);
}

// The check between steps after a resent call: the resend's outcome is
// written at once, and on PostgreSQL the request is read with that write
// (Store::CommitReadingControl). A cancel filed while the resend was in
// flight is seen there, before the next step begins.
TEST_P(ControlTest, ACancelFiledDuringAResentCallIsCarriedOutBeforeTheNextStep) {
  std::atomic<int> calls{0};
  AddTool("flaky.do", true, [this, &calls](const ToolCall& c) {
    if (calls.fetch_add(1) == 0) return ToolOutcome::Unknown("timed out");
    entered_ = true;  // the resend, with the same key
    while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return ToolOutcome::Succeeded({{"ref", "flaky:" + c.key}});
  });
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  const std::string id = Submit(a, Spec("flaky.do", "a.do"));
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Run(id); });
  ASSERT_NO_FATAL_FAILURE(AwaitLatch());
  auto out = b.Cancel(id, ControlRequest{"ops", "during the resend", true});
  release_ = true;
  driver.join();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->pending);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(2, calls.load()) << "the call and its resend";
  EXPECT_EQ(done->summary.state, "compensated");
  EXPECT_EQ(done->summary.reason, "during the resend");
  EXPECT_EQ(done->steps[0].state, "compensated");
  EXPECT_EQ(Calls(done->steps[0].step_key), 2) << "both with the step's key";
  EXPECT_EQ(Calls(done->steps[1].step_key), 0) << "the second step never ran";
  EXPECT_FALSE(HasPendingRequest(id));
  EXPECT_EQ(Events(id, "cancel_requested"), 1);
}

// A request read ahead (with the claim or the last write) answers the next
// check only while fresh (SagaRun::kPrefetchFreshMs) and only until it is
// settled; then the check reads the store again.
TEST_P(ControlTest, APrefetchedRequestAnswersOnlyWhileFreshUntilACallOrASettle) {
  Engine a(store_.get(), &tools_, Options("engine-a"));
  const SagaSpec spec = Spec("a.do", "a.do");
  const std::string id = Submit(a, spec);
  auto loaded = store_->LoadSaga(id);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  auto typed = LoadedSaga::From(*loaded);
  ASSERT_TRUE(typed.ok()) << typed.status().ToString();
  const EngineOptions options = Options("engine-a");  // the run keeps a pointer to it
  SagaRun run(store_.get(), &tools_, options, std::move(*typed), spec);
  ASSERT_TRUE(a.Pause(id, By("ops", /*drive=*/false)).ok());

  // Read ahead before the pause was filed: none, while fresh.
  run.PrefetchControl(std::nullopt);
  clock_.AdvanceMs(SagaRun::kPrefetchFreshMs);
  auto first = run.PendingControl();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->has_value()) << "fresh: the read ahead answers";
  auto second = run.PendingControl();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->has_value()) << "used once: the next check reads the store";

  run.PrefetchControl(std::nullopt);
  clock_.AdvanceMs(SagaRun::kPrefetchFreshMs + 1);
  auto stale = run.PendingControl();
  ASSERT_TRUE(stale.ok()) << stale.status().ToString();
  ASSERT_TRUE(stale->has_value()) << "older than kPrefetchFreshMs: read again";

  // A call to the outside world drops it, however fresh: a request filed
  // during the call is seen by the check after it.
  run.PrefetchControl(std::nullopt);
  {
    SagaRun::CallBoundary call(&run);
    call.Enter();
    call.Leave();
  }
  auto after_call = run.PendingControl();
  ASSERT_TRUE(after_call.ok()) << after_call.status().ToString();
  EXPECT_TRUE(after_call->has_value()) << "read ahead before the call: read again after it";

  // Settling the request drops a read ahead that still names it.
  run.PrefetchControl(*stale);
  ASSERT_TRUE(run.SettleControl((*stale)->request_id).ok());
  auto settled = run.PendingControl();
  ASSERT_TRUE(settled.ok()) << settled.status().ToString();
  EXPECT_FALSE(settled->has_value()) << "the settled request is gone from the store";
}

TEST_P(ControlTest, PauseStopsBetweenStepsHoldsNoLeaseNothingMovesItAndResumeCompletes) {
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  const std::string id = Submit(a, Spec("latch.do", "a.do"));
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Run(id); });
  ASSERT_NO_FATAL_FAILURE(AwaitLatch());
  auto out = b.Pause(id, ControlRequest{"ops", "maintenance", true});
  release_ = true;
  driver.join();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->pending);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "paused");
  EXPECT_EQ(done->summary.reason, "paused by ops: maintenance");
  EXPECT_EQ(done->steps[0].state, "succeeded") << "the step in progress finished its protocol";
  EXPECT_EQ(done->steps[1].state, "planned");

  // No lease is held: anyone may claim it at once.
  auto probe = store_->ClaimSaga(id, "probe", 1000);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  ASSERT_TRUE(store_->ReleaseLease(*probe).ok());
  EXPECT_FALSE(NeedsDrive(*store_->LoadSaga(id), clock_.NowMs()));
  // Neither recovery nor a worker moves it.
  auto rec = b.Recover();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->resumed, 0);
  std::atomic<bool> stop{false};
  Engine w(store_.get(), &tools_, Options("worker", &stop));
  WorkerOptions wo;
  wo.concurrency = 2;
  wo.poll_ms = 5;
  std::thread worker([&] { (void)w.Work(wo); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  worker.join();
  EXPECT_EQ(State(id), "paused");
  EXPECT_EQ(Calls(done->steps[1].step_key), 0);

  // Pausing again is a no-op answer.
  auto again = b.Pause(id, By("ops"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->recorded);
  EXPECT_EQ(again->note, "the saga is paused already");
  EXPECT_EQ(Events(id, "pause_requested"), 1);

  auto resumed = b.Resume(id, By("ops"));
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_TRUE(resumed->recorded);
  EXPECT_FALSE(resumed->pending);
  EXPECT_EQ(resumed->saga.summary.state, "succeeded");
  EXPECT_EQ(Calls(resumed->saga.steps[1].step_key), 1);
  EXPECT_EQ(Calls(resumed->saga.steps[0].step_key), 1) << "nothing ran twice";
  EXPECT_FALSE(HasPendingRequest(id));
}

TEST_P(ControlTest, AResumeRecordedOnlyIsPickedUpByAWorker) {
  Engine a(store_.get(), &tools_, Options("engine-a"));
  const std::string id = Submit(a, Spec("a.do", "a.do"));
  auto paused = a.Pause(id, By("ops"));
  ASSERT_TRUE(paused.ok()) << paused.status().ToString();
  ASSERT_EQ(paused->saga.summary.state, "paused") << "nobody drove it: paused here";
  auto resumed = a.Resume(id, By("ops", /*drive=*/false));
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_TRUE(resumed->pending);
  EXPECT_EQ(State(id), "paused");
  std::atomic<bool> stop{false};
  Engine w(store_.get(), &tools_, Options("worker", &stop));
  WorkerOptions wo;
  wo.concurrency = 1;
  wo.poll_ms = 5;
  std::thread worker([&] { (void)w.Work(wo); });
  for (int i = 0; i < 2000 && State(id) != "succeeded"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  worker.join();
  EXPECT_EQ(State(id), "succeeded");
}

TEST_P(ControlTest, ACancelSurvivesARestartAndRecoveryRollsBack) {
  std::string id;
  std::string first_key;
  {
    std::atomic<bool> stop{false};
    Engine a(store_.get(), &tools_, Options("engine-a", &stop));
    id = Submit(a, Spec("latch.do", "a.do"));
    std::thread driver([&] { (void)a.Run(id); });
    ASSERT_NO_FATAL_FAILURE(AwaitLatch());
    stop = true;  // the drive ends after the step in progress
    release_ = true;
    driver.join();
    ASSERT_EQ(State(id), "running");
    first_key = store_->LoadSaga(id)->steps[0].step_key;
    auto out = a.Cancel(id, By("ops", /*drive=*/false));
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_TRUE(out->pending);
  }
  ASSERT_NO_FATAL_FAILURE(Open());  // the process restarts
  Engine c(store_.get(), &tools_, Options("engine-c"));
  EXPECT_TRUE(HasPendingRequest(id));
  auto rec = c.Recover();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  auto after = store_->LoadSaga(id);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->summary.state, "compensated");
  EXPECT_EQ(after->summary.reason, "cancelled by ops");
  EXPECT_EQ(after->steps[1].state, "planned");
  EXPECT_EQ(Calls(first_key + ":compensate"), 1);
  EXPECT_FALSE(HasPendingRequest(id));
}

TEST_P(ControlTest, ACancelOfASagaThatNeedsAttentionWaitsForTheResolveThenRollsBack) {
  Engine e(store_.get(), &tools_, Options("engine-a"));
  const std::string id = Submit(e, Spec("a.do", "lost.do"));
  ASSERT_EQ(e.Run(id)->summary.state, "needs_attention");
  auto out = e.Cancel(id, By("ops"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->recorded);
  EXPECT_TRUE(out->pending);
  EXPECT_NE(out->note.find("once a person resolves step second"), std::string::npos) << out->note;
  ASSERT_TRUE(e.Recover().ok());
  EXPECT_EQ(State(id), "needs_attention") << "nothing moves before the resolve";
  EXPECT_TRUE(HasPendingRequest(id));
  // The person says the charge did happen: without the cancel the saga
  // would succeed; with it, both steps are undone.
  Resolution r;
  r.step_id = "second";
  r.decision = Decision::kApplied;
  r.result = {{"ref", "found"}};
  r.who = "maria";
  auto resolved = e.Resolve(id, r);
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  EXPECT_EQ(resolved->summary.state, "compensated");
  EXPECT_EQ(resolved->steps[0].state, "compensated");
  EXPECT_EQ(resolved->steps[1].state, "compensated");
  EXPECT_FALSE(HasPendingRequest(id));
}

TEST_P(ControlTest, ACancelOfASagaAwaitingApprovalRollsBackAndItsTokenIsRefused) {
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  const std::string id =
      Submit(a, Spec("a.do", "pay.charge", {{"two_phase", true}, {"approval", "human"}}));
  auto waiting = a.Run(id);
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  ASSERT_EQ(waiting->summary.state, "awaiting_approval");
  auto phase = preview_commit::PhaseRecord::FromJson(waiting->steps[1].phase);
  ASSERT_TRUE(phase);
  const std::string token = phase->token;
  auto out = b.Cancel(id, ControlRequest{"ops", "trip called off", true});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->pending);
  EXPECT_EQ(out->saga.summary.state, "compensated");
  EXPECT_EQ(out->saga.steps[0].state, "compensated");
  EXPECT_EQ(out->saga.steps[1].phase["approval"]["decision"], "rejected");
  EXPECT_EQ(out->saga.steps[1].phase["approval"]["by"], "ops");
  // The token is void: approving it now is refused and calls nothing.
  ApprovalDecision yes;
  yes.approve = true;
  yes.who = "maria";
  auto late = a.Decide(token, yes);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(late.status().message(), "commit was already rejected by ops");
  EXPECT_EQ(Calls(out->saga.steps[1].step_key), 0) << "the commit was never made";
  EXPECT_EQ(State(id), "compensated");
}

TEST_P(ControlTest, RequestsAreIdempotentAndAFinishedSagaIsRefused) {
  Engine e(store_.get(), &tools_, Options("engine-a"));
  const std::string id = Submit(e, Spec("a.do", "a.do"));
  // Recorded only, twice each: one request.
  auto p1 = e.Pause(id, By("ops", false));
  auto p2 = e.Pause(id, By("ops", false));
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_TRUE(p1->recorded);
  EXPECT_FALSE(p2->recorded);
  EXPECT_EQ(Events(id, "pause_requested"), 1);
  // A resume withdraws the pending pause; resuming a saga that is not paused
  // is a no-op answer.
  auto r1 = e.Resume(id, By("ops", false));
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(r1->note, "the pending pause is withdrawn");
  auto c1 = e.Cancel(id, By("ops", false));
  auto c2 = e.Cancel(id, By("other", false));
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_TRUE(c1->recorded);
  EXPECT_FALSE(c2->recorded);
  EXPECT_EQ(Events(id, "cancel_requested"), 1);
  auto pause_after_cancel = e.Pause(id, By("ops", false));
  ASSERT_TRUE(pause_after_cancel.ok());
  EXPECT_EQ(pause_after_cancel->note, "a cancel is pending; the pause is not recorded");
  auto run = e.Run(id);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->summary.state, "cancelled");
  EXPECT_EQ(Calls(run->steps[0].step_key), 0);
  auto c3 = e.Cancel(id, By("ops"));
  ASSERT_TRUE(c3.ok()) << c3.status().ToString();
  EXPECT_FALSE(c3->recorded);
  EXPECT_EQ(c3->note, "the saga is cancelled already");
  EXPECT_EQ(Events(id, "cancel_requested"), 1);
  auto resume_done = e.Resume(id, By("ops"));
  ASSERT_FALSE(resume_done.ok());
  EXPECT_EQ(resume_done.status().code(), Code::kFailedPrecondition);

  const std::string ok = Submit(e, Spec("a.do", "a.do"), "intent-2");
  ASSERT_EQ(e.Run(ok)->summary.state, "succeeded");
  for (auto call : {&Engine::Cancel, &Engine::Pause, &Engine::Resume}) {
    auto refused = (e.*call)(ok, By("ops"));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("saga " + ok + " is succeeded"), std::string::npos)
        << refused.status().message();
  }
  EXPECT_EQ(e.Cancel("sg_absent", By("ops")).status().code(), Code::kNotFound);
  EXPECT_EQ(e.Pause(ok, By("")).status().code(), Code::kInvalidArgument);
}

TEST_P(ControlTest, APausedCompensatingSagaResumesItsRollback) {
  Engine a(store_.get(), &tools_, Options("engine-a"));
  Engine b(store_.get(), &tools_, Options("engine-b"));
  // A rollback whose first undo blocks on a latch; a pause during it stops
  // the rollback before the next undo.
  AddTool("undo.latch", true, [this](const ToolCall&) {
    entered_ = true;
    while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return ToolOutcome::Succeeded(Json::object());
  });
  Json doc = {{"name", "undo-latch"},
              {"steps",
               {{{"id", "first"}, {"tool", "a.do"}, {"compensate", {{"tool", "undo"}}}},
                {{"id", "second"}, {"tool", "a.do"}, {"compensate", {{"tool", "undo.latch"}}}},
                {{"id", "third"}, {"tool", "lost.do"}, {"compensate", {{"tool", "undo"}}}}}}};
  auto spec = ParseSpec(doc, tools_);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string sid = Submit(a, *spec, "intent-undo");
  ASSERT_EQ(a.Run(sid)->summary.state, "needs_attention");
  Resolution r;
  r.step_id = "third";
  r.decision = Decision::kNotApplied;
  r.who = "maria";
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = a.Resolve(sid, r); });  // fails the step: rollback
  ASSERT_NO_FATAL_FAILURE(AwaitLatch());
  auto out = b.Pause(sid, By("ops"));
  release_ = true;
  driver.join();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "paused");
  EXPECT_EQ(done->steps[1].state, "compensated");
  EXPECT_EQ(done->steps[0].state, "succeeded") << "the next undo waits";
  auto resumed = b.Resume(sid, By("ops"));
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->saga.summary.state, "compensated");
  EXPECT_EQ(resumed->saga.steps[0].state, "compensated");
}

INSTANTIATE_TEST_SUITE_P(Backends, ControlTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
