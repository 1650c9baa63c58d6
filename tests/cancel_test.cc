// Engine::Cancel per saga state, against a real SQLite journal, and
// NeedsDrive (the sweeper's and recovery's question).

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "preview_commit/token.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

class CancelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, storage::OpenStore(dir_.File("journal.db")));
    AddTool("a.do", EffectClass::kWrite, true, [](const ToolCall& c) {
      return ToolOutcome::Succeeded({{"ref", "a:" + c.key}});
    });
    AddTool("undo", EffectClass::kIdempotent, true,
            [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); });
    // Blocks until released: a call in progress.
    AddTool("slow.do", EffectClass::kWrite, true, [this](const ToolCall& c) {
      entered_ = true;
      while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return ToolOutcome::Succeeded({{"ref", "slow:" + c.key}});
    });
    // No keys, no status: an unknown outcome parks the saga.
    AddTool("lost.do", EffectClass::kWrite, false,
            [](const ToolCall&) { return ToolOutcome::Unknown("timed out"); });
    ToolInfo pay;
    pay.name = "pay.charge";
    pay.effect = EffectClass::kWrite;
    pay.honours_keys = true;
    auto invoke = [this](const ToolCall& c) {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_[c.key];
      return ToolOutcome::Succeeded({{"ref", "pay:" + c.key}});
    };
    auto preview = [](const ToolCall& c) {
      PreviewOutcome o;
      o.ok = true;
      o.summary = "charge " + c.args.dump();
      o.changes = c.args;
      o.resource_version = "v0";
      return o;
    };
    ASSERT_TRUE(
        tools_.Register(std::make_unique<FunctionTool>(pay, invoke, nullptr, preview)).ok());
  }
  void TearDown() override { release_ = true; }

  void AddTool(const std::string& name, EffectClass c, bool honours_keys,
               FunctionTool::InvokeFn invoke) {
    ToolInfo info;
    info.name = name;
    info.effect = c;
    info.honours_keys = honours_keys;
    auto counted = [this, invoke](const ToolCall& call) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++calls_[call.key];
      }
      return invoke(call);
    };
    ASSERT_TRUE(tools_.Register(std::make_unique<FunctionTool>(info, counted)).ok());
  }

  EngineOptions Options(bool use_leases = false, const std::string& owner = "") {
    EngineOptions o;
    o.clock = &clock_;
    o.signer = &signer_;
    o.use_leases = use_leases;
    o.owner = owner;
    return o;
  }

  // Steps `first` (first_tool) and `second` (second_tool), both compensable;
  // `second_extra` is merged into the second step.
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

  std::vector<storage::JournalEntry> Journal(const std::string& id) {
    auto j = store_->ReadJournal(id);
    EXPECT_TRUE(j.ok()) << j.status().ToString();
    return j.ok() ? *j : std::vector<storage::JournalEntry>{};
  }

  int Calls(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[key];
  }

  static CancelRequest By(const std::string& who) { return CancelRequest{who, ""}; }

  test::TempDir dir_{"idem_cancel"};
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

TEST_F(CancelTest, APendingSagaIsCancelledAtOnceWithWhoAndWhy) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec("a.do", "a.do"));
  auto out = e.Cancel(id, By("agent-1"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->pending);
  EXPECT_EQ(out->saga.summary.state, "cancelled");
  EXPECT_EQ(out->saga.summary.reason, "cancelled by agent-1");
  auto journal = Journal(id);
  ASSERT_FALSE(journal.empty());
  EXPECT_EQ(journal.back().event, "saga_cancelled");
  EXPECT_EQ(journal.back().data, Json({{"reason", "cancelled by agent-1"}}));
  // Who asked, and why, is the request's entry before it (durable requests).
  ASSERT_GE(journal.size(), 2u);
  EXPECT_EQ(journal[journal.size() - 2].event, "cancel_requested");
  EXPECT_EQ(journal[journal.size() - 2].data["by"], "agent-1");
  // Nothing is left to drive, and nothing was called.
  auto run = e.Run(id);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->summary.state, "cancelled");
  EXPECT_EQ(Calls(out->saga.steps[0].step_key), 0);
  // Cancelling again answers the saga as it stands.
  auto again = e.Cancel(id, CancelRequest{"agent-1", "changed my mind"});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->pending);
  EXPECT_EQ(again->saga.summary.reason, "cancelled by agent-1");
  EXPECT_EQ(Journal(id).size(), journal.size()) << "nothing written the second time";
}

TEST_F(CancelTest, ASagaAwaitingApprovalIsRolledBackByRejectingItsCommit) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id =
      Submit(e, Spec("a.do", "pay.charge", {{"two_phase", true}, {"approval", "human"}}));
  auto waiting = e.Run(id);
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  ASSERT_EQ(waiting->summary.state, "awaiting_approval");
  auto out = e.Cancel(id, By("agent-1"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->pending);
  EXPECT_EQ(out->saga.summary.state, "compensated");
  EXPECT_EQ(out->saga.steps[0].state, "compensated");
  EXPECT_EQ(out->saga.steps[1].phase["approval"]["decision"], "rejected");
  EXPECT_EQ(out->saga.steps[1].phase["approval"]["by"], "agent-1");
  EXPECT_EQ(out->saga.steps[1].phase["approval"]["note"], "cancelled by agent-1");
  EXPECT_EQ(Calls(out->saga.steps[1].step_key), 0) << "the commit was never made";
}

TEST_F(CancelTest, ARunningSagaThisEngineDrivesRollsBackAfterTheStepInProgress) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec("slow.do", "a.do"));
  Result<storage::SagaRecord> done = Status::Internal("not run");
  std::thread driver([&] { done = e.Run(id); });
  for (int i = 0; i < 5000 && !entered_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(entered_.load()) << "the first step's call never began";
  auto out = e.Cancel(id, By("agent-1"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->pending);
  EXPECT_EQ(out->saga.summary.state, "running") << "recorded, not written";
  release_ = true;
  driver.join();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "compensated");
  EXPECT_EQ(done->summary.reason, "cancelled by agent-1");
  EXPECT_EQ(done->steps[0].state, "compensated") << "the step in progress finished, then undone";
  EXPECT_EQ(done->steps[1].state, "planned") << "the second step never ran";
  EXPECT_EQ(Calls(done->steps[1].step_key), 0);
}

TEST_F(CancelTest, ARunningSagaNotDrivenNowRollsBackOnItsNextDrive) {
  std::atomic<bool> stop{false};
  EngineOptions o = Options();
  o.stop = &stop;
  Engine e(store_.get(), &tools_, o);
  const std::string id = Submit(e, Spec("slow.do", "a.do"));
  std::thread driver([&] { (void)e.Run(id); });
  for (int i = 0; i < 5000 && !entered_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;  // the drive stops after the step in progress
  release_ = true;
  driver.join();
  ASSERT_EQ(store_->LoadSaga(id)->summary.state, "running");
  stop = false;
  // Recorded only: the next drive (here, or any other process's) rolls it back.
  auto out = e.Cancel(id, CancelRequest{"agent-1", "", /*drive=*/false});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->pending);
  auto done = e.Run(id);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->summary.state, "compensated");
  EXPECT_EQ(done->summary.reason, "cancelled by agent-1");
  EXPECT_EQ(Calls(done->steps[1].step_key), 0);
}

// Changed on purpose (durable cancel, issue 11): a saga that needs attention
// keeps the cancel until a person resolves the step (tests/control_test.cc
// follows it to the rollback).
TEST_F(CancelTest, ASagaThatNeedsAttentionKeepsTheCancelUntilItIsResolved) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec("lost.do", "a.do"));
  auto parked = e.Run(id);
  ASSERT_TRUE(parked.ok()) << parked.status().ToString();
  ASSERT_EQ(parked->summary.state, "needs_attention");
  const size_t before = Journal(id).size();
  auto out = e.Cancel(id, By("agent-1"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->pending);
  EXPECT_EQ(out->note,
            "cancel recorded: the saga needs attention; it rolls back once a person resolves "
            "step first (idem resolve)");
  EXPECT_EQ(store_->LoadSaga(id)->summary.state, "needs_attention");
  EXPECT_EQ(Journal(id).size(), before + 1) << "the request's entry only";
}

TEST_F(CancelTest, AFinishedSagaIsRefused) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec("a.do", "a.do"));
  ASSERT_EQ(e.Run(id)->summary.state, "succeeded");
  auto out = e.Cancel(id, By("agent-1"));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition);
}

// Changed on purpose (durable cancel, issue 11): the request is recorded for
// the lease holder to honour instead of refused as busy.
TEST_F(CancelTest, APendingSagaLeasedByAnotherWorkerKeepsTheRequestForIt) {
  Engine e(store_.get(), &tools_, Options(true, "engine-1"));
  const std::string id = Submit(e, Spec("a.do", "a.do"));
  auto other = store_->ClaimSaga(id, "engine-2", 60'000);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto out = e.Cancel(id, By("agent-1"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->recorded);
  EXPECT_TRUE(out->pending);
  EXPECT_EQ(store_->LoadSaga(id)->summary.state, "pending");
  ASSERT_TRUE(store_->ReleaseLease(*other).ok());
  auto now = e.Cancel(id, By("agent-1"));
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_FALSE(now->recorded) << "the same cancel, once";
  EXPECT_EQ(now->saga.summary.state, "cancelled");
}

TEST_F(CancelTest, WhoCancelsIsRequired) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Submit(e, Spec("a.do", "a.do"));
  auto out = e.Cancel(id, By(""));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(store_->LoadSaga(id)->summary.state, "pending");
}

TEST_F(CancelTest, NeedsDriveSaysWhetherADriveWouldMoveTheSaga) {
  Engine e(store_.get(), &tools_, Options());
  const std::string pending = Submit(e, Spec("a.do", "a.do"), "p");
  EXPECT_TRUE(NeedsDrive(*store_->LoadSaga(pending), clock_.NowMs()));
  ASSERT_EQ(e.Run(pending)->summary.state, "succeeded");
  EXPECT_FALSE(NeedsDrive(*store_->LoadSaga(pending), clock_.NowMs()));

  const std::string waiting =
      Submit(e,
             Spec("a.do", "pay.charge",
                  {{"two_phase", true}, {"approval", "human"}, {"approval_ttl", "15m"}}),
             "w");
  auto rec = e.Run(waiting);
  ASSERT_EQ(rec->summary.state, "awaiting_approval");
  EXPECT_FALSE(NeedsDrive(*rec, clock_.NowMs())) << "undecided and not expired";
  EXPECT_TRUE(NeedsDrive(*rec, clock_.NowMs() + 16 * 60 * 1000)) << "expired";
}

}  // namespace
}  // namespace idem
