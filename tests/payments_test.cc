// Holds (saga/hold.h): authorize, then capture, against the simulated payment
// providers of examples/payments, on SQLite and on PostgreSQL. Each test
// reads the providers' ledger (a file of their own) and runs the ledger
// checker (payments::CheckLedger) over it. The crash tests kill a child
// process at each hold boundary and recover in the parent.
//
// The specs use "approval": "human" (one person with the role approver): the
// approval policies of y-policy (roles, quorum) are not merged on this branch.

#include <chrono>
#include <csignal>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "examples/payments/http_providers.h"
#include "examples/payments/providers.h"
#include "preview_commit/token.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"
#include "tools/http_tool.h"

#include "common/clock.h"
#include "common/failpoint.h"
#include <sys/wait.h>
#include <unistd.h>

namespace idem {
namespace {

using payments::LedgerOp;

constexpr int64_t kHour = 3600LL * 1000;

class PaymentsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ledger_path_ = dir_.File("ledger.sqlite");
    OpenStore();
    Register({});
  }
  void TearDown() override { failpoint::DisarmAll(); }

  void OpenStore() {
    store_.reset();
    if (GetParam() == "sqlite") {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    }
  }

  // The payment tools on a fresh registry, with `faults` and a hold that
  // lives `hold_lifetime_ms` at the provider; a "fails" step for rollbacks.
  void Register(std::vector<std::string> faults, int64_t hold_lifetime_ms = 7 * 24 * kHour) {
    tools_ = std::make_unique<ToolRegistry>();
    payments::ProviderOptions o;
    o.ledger_path = ledger_path_;
    o.clock = &clock_;
    o.hold_lifetime_ms = hold_lifetime_ms;
    o.faults = std::move(faults);
    ASSERT_OK(payments::RegisterPaymentTools(*tools_, o));
    ToolInfo fails{"shipping.book", EffectClass::kWrite, true, false, false};
    ASSERT_OK(tools_->Register(std::make_unique<FunctionTool>(fails, [](const ToolCall&) {
      return ToolOutcome::Failed("no courier for this address", false);
    })));
  }

  // The same tools over HTTP: the providers' server on an ephemeral port,
  // reached through examples/payments/tools.http.json.
  void RegisterHttp(std::vector<std::string> faults) {
    payments::ProviderOptions o;
    o.ledger_path = ledger_path_;
    o.clock = &clock_;
    o.faults = std::move(faults);
    ASSERT_OK_AND_ASSIGN(http_, payments::HttpPaymentProviders::Create(o));
    ASSERT_OK_AND_ASSIGN(int port, http_->Start("127.0.0.1", 0));
    std::string doc = test::ReadFile(IDEM_SOURCE_DIR "/examples/payments/tools.http.json");
    for (size_t at; (at = doc.find(":8092")) != std::string::npos;) {
      doc.replace(at, 5, ":" + std::to_string(port));
    }
    tools_ = std::make_unique<ToolRegistry>();
    ASSERT_OK(LoadHttpTools(doc, tools_.get()));
  }

  EngineOptions Options() {
    EngineOptions o;
    o.clock = &clock_;
    o.signer = &signer_;
    o.use_leases = true;
    o.lease_ms = lease_ms_;
    return o;
  }

  // The payment: authorize, capture after a person's approval, receipt;
  // with `ship`, a step after the capture that fails (a rollback after it).
  SagaSpec Spec(const std::string& lifetime = "7d", bool ship = false) {
    Json pay = {
        {"id", "pay"},
        {"tool", "payments.capture"},
        {"args",
         {{"hold_id", "${hold.hold_id}"}, {"amount", "${input.amount}"}, {"currency", "EUR"}}},
        {"hold",
         {{"tool", "payments.authorize"},
          {"args", {{"payment", "${input.payment}"}, {"amount", "${input.amount}"}}},
          {"lifetime", lifetime},
          {"void", {{"tool", "payments.void"}, {"args", {{"hold_id", "${hold.hold_id}"}}}}}}},
        {"approval", "human"},
        {"compensate",
         {{"tool", "payments.refund"},
          {"args", {{"capture_id", "${steps.pay.result.capture_id}"}}}}}};
    Json steps = Json::array({pay});
    if (ship) {
      steps.push_back({{"id", "ship"},
                       {"tool", "shipping.book"},
                       {"args", {{"payment", "${input.payment}"}}},
                       {"compensate", nullptr},
                       {"reason", "never booked"}});
    }
    steps.push_back({{"id", "receipt"},
                     {"tool", "receipts.send"},
                     {"args", {{"to", "ana@example.com"}, {"payment", "${input.payment}"}}},
                     {"compensate", nullptr},
                     {"reason", "an email cannot be unsent"},
                     {"approval", "none"}});
    auto spec = ParseSpec(Json{{"name", "payment"}, {"steps", steps}}, *tools_);
    EXPECT_OK(spec);
    return spec.ok() ? *spec : SagaSpec{};
  }

  std::string Submit(Engine& e, const SagaSpec& spec, int64_t amount = 120000) {
    auto sub =
        e.Submit(spec, {{"payment", "ORD-1"}, {"amount", amount}}, test::RandomName("intent"));
    EXPECT_OK(sub);
    return sub.ok() ? sub->saga_id : "";
  }

  storage::SagaRecord Load(const std::string& id) {
    auto rec = store_->LoadSaga(id);
    EXPECT_OK(rec);
    return rec.ok() ? *rec : storage::SagaRecord{};
  }
  static const storage::StepRecord& Step(const storage::SagaRecord& rec, const std::string& id) {
    for (const auto& s : rec.steps) {
      if (s.step_id == id) return s;
    }
    static const storage::StepRecord none;
    return none;
  }
  std::string Token(const std::string& saga_id) {
    return Step(Load(saga_id), "pay").phase.value("token", "");
  }
  Result<storage::SagaRecord> Decide(Engine& e, const std::string& saga_id, bool approve) {
    ApprovalDecision d;
    d.approve = approve;
    d.who = "maria";
    d.note = approve ? "ok" : "not this one";
    // "busy; try again" while another drive (a dead child's lease) holds it.
    for (int i = 0;; ++i) {
      auto r = e.Decide(Token(saga_id), d);
      if (r.ok() || r.status().code() != Code::kUnavailable || i == 50) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  std::vector<LedgerOp> Ops() {
    auto ledger = payments::Ledger::Open(ledger_path_);
    EXPECT_OK(ledger);
    auto ops = (*ledger)->Ops();
    EXPECT_OK(ops);
    return ops.ok() ? *ops : std::vector<LedgerOp>{};
  }
  int Count(const std::string& op) {
    int n = 0;
    for (const auto& o : Ops()) n += o.op == op;
    return n;
  }
  // The checker's verdict, every saga of the test finished.
  std::string Check() {
    auto f = payments::CheckLedger(Ops());
    std::string out;
    for (const auto& v : f.violations) out += v + "\n";
    return out;
  }
  std::vector<std::string> Events(const std::string& saga_id, const std::string& step) {
    std::vector<std::string> out;
    auto j = store_->ReadJournal(saga_id);
    EXPECT_OK(j);
    for (const auto& e : *j) {
      if (e.step_id == step) out.push_back(e.event);
    }
    return out;
  }

  test::TempDir dir_{"idem_payments"};
  test::SqliteTestStore sqlite_;
  test::PgTestStore pg_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<payments::HttpPaymentProviders> http_;
  std::unique_ptr<ToolRegistry> tools_;
  std::string ledger_path_;
  int64_t lease_ms_ = 60'000;
  ManualClock clock_;
  preview_commit::KeyRing keys_ =
      preview_commit::KeyRing::ForTesting({{"k1", std::string(32, 'p')}}, "k1");
  preview_commit::TokenSigner signer_{&keys_, &clock_};
};

TEST_P(PaymentsTest, AuthorizeApproveCapture) {
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec());
  ASSERT_OK_AND_ASSIGN(auto waiting, e.Run(id));
  EXPECT_EQ(waiting.summary.state, "awaiting_approval");
  // The hold is placed, journal-first, before anyone is asked.
  EXPECT_EQ(Count("authorize"), 1);
  EXPECT_EQ(Count("capture"), 0);
  EXPECT_EQ(Events(id, "pay_hold"), (std::vector<std::string>{"submitted", "succeeded"}));
  const auto& hold = Step(waiting, "pay_hold");
  EXPECT_EQ(hold.step_key, id + "/pay_hold");
  const std::string hold_id = hold.result.value("hold_id", "");
  ASSERT_FALSE(hold_id.empty());
  EXPECT_EQ(Step(waiting, "pay").state, "awaiting_approval");

  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, true));
  EXPECT_EQ(done.summary.state, "succeeded");
  EXPECT_EQ(Step(done, "pay").args["hold_id"], hold_id) << "${hold.hold_id} names the hold";
  std::vector<LedgerOp> ops = Ops();
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].op, "authorize");
  EXPECT_EQ(ops[1].op, "capture");
  EXPECT_EQ(ops[1].hold_id, hold_id);
  EXPECT_EQ(ops[2].op, "receipt");
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsTest, RejectVoidsTheHold) {
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec());
  ASSERT_OK(e.Run(id));
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, false));
  EXPECT_EQ(done.summary.state, "compensated");
  EXPECT_EQ(Count("authorize"), 1);
  EXPECT_EQ(Count("void"), 1);
  EXPECT_EQ(Count("capture"), 0);
  EXPECT_EQ(Count("receipt"), 0);
  auto ev = Events(id, "pay_hold");
  EXPECT_EQ(ev.back(), "compensated");
  EXPECT_EQ(Step(done, "pay_hold").state, "compensated");
  EXPECT_EQ(Check(), "");
}

// The approval waits as long as the hold lives (approval_ttl defaults to
// hold.lifetime); an approval after that does not capture.
TEST_P(PaymentsTest, AnApprovalAfterTheHoldExpiredDoesNotCapture) {
  Register({}, kHour);
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec("1h"));
  ASSERT_OK(e.Run(id));
  clock_.AdvanceMs(2 * kHour);
  auto late = Decide(e, id, true);
  EXPECT_FALSE(late.ok()) << "the commit token expired with the hold";
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "compensated");
  EXPECT_EQ(Count("capture"), 0);
  EXPECT_EQ(Count("void"), 1);
  EXPECT_EQ(Check(), "");
}

// The provider's hold ends before the spec's declared lifetime: the commit
// token is cut to the hold's expires_at_ms, so a late approval is refused
// and the hold voided, not captured.
TEST_P(PaymentsTest, TheTokenNeverOutlivesTheProvidersHold) {
  Register({}, kHour);  // the provider holds 1 h; the spec says 7 d
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec("7d"));
  ASSERT_OK_AND_ASSIGN(auto waiting, e.Run(id));
  auto phase = Step(waiting, "pay").phase;
  EXPECT_LE(phase.value("expires_ms", int64_t{0}), clock_.NowMs() + kHour);
  clock_.AdvanceMs(kHour + 1);
  EXPECT_FALSE(Decide(e, id, true).ok());
  ASSERT_OK_AND_ASSIGN(auto done, e.Run(id));
  EXPECT_EQ(done.summary.state, "compensated");
  EXPECT_EQ(Count("capture"), 0);
  EXPECT_EQ(Count("void"), 1);
  EXPECT_EQ(Check(), "");
}

// A later step fails after the capture: the capture is refunded and the
// hold's void is passed over (a captured hold is not open).
TEST_P(PaymentsTest, RollbackAfterCaptureRefunds) {
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec("7d", /*ship=*/true));
  ASSERT_OK(e.Run(id));
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, true));
  EXPECT_EQ(done.summary.state, "compensated");
  EXPECT_EQ(Count("capture"), 1);
  EXPECT_EQ(Count("refund"), 1);
  EXPECT_EQ(Count("void"), 0);
  EXPECT_EQ(Count("receipt"), 0);
  auto j = *store_->ReadJournal(id);
  bool skipped = false;
  for (const auto& en : j) {
    if (en.step_id == "pay_hold" && en.event == "compensated")
      skipped = en.data.contains("skipped");
  }
  EXPECT_TRUE(skipped) << "the void of a captured hold is journaled as passed over";
  EXPECT_EQ(Check(), "");
}

// The authorization's answer is lost: idem asks the provider's status lookup
// under the same key and takes the hold it placed; it never authorizes again.
TEST_P(PaymentsTest, AnUncertainAuthorizeIsResolvedByLookup) {
  Register({"payments.authorize=lose_response@1"});
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec());
  ASSERT_OK_AND_ASSIGN(auto waiting, e.Run(id));
  EXPECT_EQ(waiting.summary.state, "awaiting_approval");
  EXPECT_EQ(Count("authorize"), 1) << "one hold";
  auto ledger = payments::Ledger::Open(ledger_path_);
  ASSERT_OK(ledger);
  EXPECT_EQ(*(*ledger)->CountCalls("authorize", id + "/pay_hold"), 1) << "never a second call";
  auto ev = Events(id, "pay_hold");
  EXPECT_EQ(ev, (std::vector<std::string>{"submitted", "unknown", "succeeded"}));
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, true));
  EXPECT_EQ(done.summary.state, "succeeded");
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsTest, OverHttpAuthorizeApproveCapture) {
  RegisterHttp({});
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec());
  ASSERT_OK_AND_ASSIGN(auto waiting, e.Run(id));
  EXPECT_EQ(waiting.summary.state, "awaiting_approval");
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, true));
  EXPECT_EQ(done.summary.state, "succeeded");
  EXPECT_EQ(Count("authorize"), 1);
  EXPECT_EQ(Count("capture"), 1);
  EXPECT_EQ(Count("receipt"), 1);
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsTest, OverHttpALostAuthorizeAnswerIsResolvedByLookup) {
  RegisterHttp({"payments.authorize=lose_response@1"});
  Engine e(store_.get(), tools_.get(), Options());
  std::string id = Submit(e, Spec());
  ASSERT_OK_AND_ASSIGN(auto waiting, e.Run(id));
  EXPECT_EQ(waiting.summary.state, "awaiting_approval");
  EXPECT_EQ(Count("authorize"), 1) << "one hold";
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, false));
  EXPECT_EQ(done.summary.state, "compensated");
  EXPECT_EQ(Count("void"), 1);
  EXPECT_EQ(Count("capture"), 0);
  EXPECT_EQ(Check(), "");
}

// ---- the ledger checker itself: each rule fails on a ledger that breaks it

TEST(PaymentsLedgerCheckTest, EachRuleFailsOnALedgerThatBreaksIt) {
  auto op = [](std::string o, std::string key, std::string hold, std::string ref,
               std::string payment) {
    LedgerOp x;
    x.op = std::move(o);
    x.key = std::move(key);
    x.hold_id = std::move(hold);
    x.ref = std::move(ref);
    x.payment = std::move(payment);
    return x;
  };
  const LedgerOp auth = op("authorize", "s1/pay_hold", "H1", "H1", "P1");
  const LedgerOp cap = op("capture", "s1/pay", "H1", "C1", "P1");
  EXPECT_TRUE(payments::CheckLedger({auth, cap}).ok());
  auto two = payments::CheckLedger({auth, cap, op("capture", "s1/pay2", "H1", "C2", "P1")});
  EXPECT_FALSE(two.ok());
  auto after_void =
      payments::CheckLedger({auth, op("void", "s1/pay_hold:compensate", "H1", "", "P1"), cap});
  ASSERT_FALSE(after_void.ok());
  EXPECT_NE(after_void.violations[0].find("after its void"), std::string::npos);
  EXPECT_FALSE(payments::CheckLedger({op("void", "k", "H9", "", "P9")}).ok());
  EXPECT_FALSE(payments::CheckLedger({auth, cap, op("refund", "r", "H1", "C7", "P1")}).ok());
  EXPECT_FALSE(payments::CheckLedger({auth}).ok()) << "an open hold of a finished saga";
  EXPECT_TRUE(payments::CheckLedger({auth}, {"s1"}).ok()) << "its saga still runs";
  EXPECT_FALSE(payments::CheckLedger({auth, auth, cap}).ok()) << "one key applied twice";
}

// ---- crash tests: a child drives the saga and is killed at a hold
// boundary; the parent recovers. One authorization, at most one capture,
// never a capture after a void.

constexpr int64_t kCrashLeaseMs = 1000;

class PaymentsCrashTest : public PaymentsTest {
 protected:
  void SetUp() override {
    PaymentsTest::SetUp();
    lease_ms_ = kCrashLeaseMs;
  }

  // Runs `act` on a fresh engine in a child with `failpoints` armed; true
  // when the child died of SIGKILL. The parent's store is closed meanwhile.
  template <typename Act>
  bool InChildUntilKilled(const std::string& failpoints, Act act) {
    store_.reset();
    pid_t pid = fork();
    if (pid == 0) {
      failpoint::DisarmAll();  // counts from here: the parent's hits were copied
      if (!failpoint::Arm(failpoints).ok()) _exit(90);
      auto store = GetParam() == "sqlite" ? sqlite_.Open() : pg_.Open();
      if (!store.ok()) _exit(91);
      store_ = std::move(*store);
      {
        Engine e(store_.get(), tools_.get(), Options());
        act(e);
      }
      store_.reset();
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    OpenStore();
    // Leases expire on the store's clock: wait out the dead child's.
    std::this_thread::sleep_for(std::chrono::milliseconds(kCrashLeaseMs + 200));
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }

  std::string SubmitOnly() {
    Engine e(store_.get(), tools_.get(), Options());
    return Submit(e, Spec());
  }
  void RunToApproval(const std::string& id) {
    Engine e(store_.get(), tools_.get(), Options());
    auto rec = e.Run(id);
    ASSERT_OK(rec);
    ASSERT_EQ(rec->summary.state, "awaiting_approval");
  }
  // Recovers until the saga is no longer left to a lease holder.
  storage::SagaRecord Recover(const std::string& id) {
    Engine e(store_.get(), tools_.get(), Options());
    for (int i = 0; i < 50; ++i) {
      auto report = e.Recover();
      EXPECT_OK(report);
      if (!report.ok() || report->skipped == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return Load(id);
  }
};

TEST_P(PaymentsCrashTest, KilledAfterTheAuthorizesSubmitted) {
  std::string id = SubmitOnly();
  ASSERT_TRUE(
      InChildUntilKilled("step.after_submitted=kill@1", [&](Engine& e) { (void)e.Run(id); }));
  EXPECT_EQ(Count("authorize"), 0) << "killed before the call";
  auto rec = Recover(id);
  EXPECT_EQ(rec.summary.state, "awaiting_approval");
  EXPECT_EQ(Count("authorize"), 1);
  Engine e(store_.get(), tools_.get(), Options());
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, true));
  EXPECT_EQ(done.summary.state, "succeeded");
  EXPECT_EQ(Count("authorize"), 1);
  EXPECT_EQ(Count("capture"), 1);
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsCrashTest, KilledAfterTheAuthorizesAnswerBeforeItsJournalEntry) {
  std::string id = SubmitOnly();
  ASSERT_TRUE(InChildUntilKilled("step.after_call=kill@1", [&](Engine& e) { (void)e.Run(id); }));
  EXPECT_EQ(Count("authorize"), 1) << "the provider placed the hold";
  auto rec = Recover(id);
  EXPECT_EQ(rec.summary.state, "awaiting_approval");
  EXPECT_EQ(Count("authorize"), 1) << "resolved by lookup: no second hold";
  Engine e(store_.get(), tools_.get(), Options());
  ASSERT_OK_AND_ASSIGN(auto done, Decide(e, id, true));
  EXPECT_EQ(done.summary.state, "succeeded");
  EXPECT_EQ(Count("capture"), 1);
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsCrashTest, KilledAfterTheApprovalBeforeTheCapture) {
  std::string id = SubmitOnly();
  RunToApproval(id);
  ASSERT_TRUE(InChildUntilKilled("approval.after_commit=kill",
                                 [&](Engine& e) { (void)Decide(e, id, true); }));
  EXPECT_EQ(Count("capture"), 0);
  auto rec = Recover(id);
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Count("capture"), 1);
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsCrashTest, KilledDuringTheCapture) {
  std::string id = SubmitOnly();
  RunToApproval(id);
  // The provider applied the capture; the process dies before it answers.
  ASSERT_TRUE(InChildUntilKilled("provider.after_apply=kill@1",
                                 [&](Engine& e) { (void)Decide(e, id, true); }));
  EXPECT_EQ(Count("capture"), 1);
  auto rec = Recover(id);
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Count("capture"), 1) << "resolved by lookup, not captured again";
  EXPECT_EQ(Check(), "");
}

TEST_P(PaymentsCrashTest, KilledDuringTheVoid) {
  std::string id = SubmitOnly();
  RunToApproval(id);
  ASSERT_TRUE(InChildUntilKilled("compensation.after_call=kill@1",
                                 [&](Engine& e) { (void)Decide(e, id, false); }));
  EXPECT_EQ(Count("void"), 1) << "the provider voided the hold";
  auto rec = Recover(id);
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(Count("void"), 1);
  EXPECT_EQ(Count("capture"), 0);
  EXPECT_EQ(Check(), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, PaymentsTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Backends, PaymentsCrashTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
