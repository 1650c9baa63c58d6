// Open sagas (saga/open_saga.h, issue 14): begin, calls appended one at a
// time, commit, rollback, duplicates, two-phase calls, the idle policy and
// decisions, on a real SQLite file and a real PostgreSQL database (the ctest
// fixture `postgres`). The tools count their effects per key (a ledger), so
// "no second call" is asserted on what the provider saw.

#include "saga/open_saga.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "preview_commit/token.h"
#include "saga/approval_rights.h"
#include "saga/engine.h"
#include "saga/states.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include "effect/mutation.h"

namespace idem {
namespace {

class OpenSagaTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open());
    // flights.book: keyed; compensated by flights.cancel with the booking id.
    ToolInfo book = Info("flights.book", EffectClass::kWrite);
    book.open.compensate_tool = "flights.cancel";
    book.open.compensate_args = {{"booking", "${result.booking_id}"}, {"city", "${args.to}"}};
    Add(book, [this](const ToolCall& c) {
      if (c.args.value("to", "") == "nowhere") return ToolOutcome::Failed("no such city", false);
      return ToolOutcome::Succeeded({{"booking_id", "bk-" + std::to_string(Effect("book", c))}});
    });
    Add(Info("flights.cancel", EffectClass::kIdempotent), [this](const ToolCall& c) {
      std::lock_guard<std::mutex> lock(mu_);
      undone_.push_back(c.args.value("booking", "") + "@" + c.args.value("city", ""));
      return ToolOutcome::Succeeded(Json::object());
    });
    ToolInfo note = Info("notes.add", EffectClass::kWrite);
    note.open.no_compensation_reason = "a note is harmless";
    note.open.deduplicate_repeats = false;  // "repeats": "allow"
    Add(note, [this](const ToolCall& c) {
      return ToolOutcome::Succeeded({{"n", Effect("note", c)}});
    });
    Add(Info("search", EffectClass::kRead), [this](const ToolCall& c) {
      return ToolOutcome::Succeeded({{"hits", Effect("search", c)}});
    });
    Add(Info("mail.send", EffectClass::kIrreversible), [this](const ToolCall& c) {
      return ToolOutcome::Succeeded({{"sent", Effect("mail", c)}});
    });
    // pay.charge: two-phase with a person's approval.
    ToolInfo pay = Info("pay.charge", EffectClass::kWrite);
    pay.open.compensate_tool = "flights.cancel";
    pay.open.two_phase = true;
    pay.open.human_approval = true;
    auto preview = [](const ToolCall& c) {
      PreviewOutcome o;
      o.ok = true;
      o.summary = "charge " + c.args.dump();
      o.changes = c.args;
      return o;
    };
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        pay,
        [this](const ToolCall& c) {
          return ToolOutcome::Succeeded({{"charge", Effect("pay", c)}});
        },
        nullptr, preview)));
  }

  void Open() {
    store_.reset();
    if (GetParam() == "sqlite") {
      ASSERT_OK_AND_ASSIGN(store_, sqlite_.Open());
    } else {
      ASSERT_OK_AND_ASSIGN(store_, pg_.Open());
    }
  }

  static ToolInfo Info(const std::string& name, EffectClass c) {
    ToolInfo i;
    i.name = name;
    i.effect = c;
    i.honours_keys = true;
    return i;
  }
  void Add(const ToolInfo& info, FunctionTool::InvokeFn fn) {
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(info, std::move(fn))));
  }
  // A keyed provider's ledger: every call counted, an effect applied once
  // per key (a repeat answers the first effect's number).
  int Effect(const std::string& what, const ToolCall& c) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[what];
    auto it = applied_.find(c.key);
    if (it != applied_.end()) return it->second;
    return applied_[c.key] = ++effects_[what];
  }
  int Effects(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    return effects_[what];
  }
  int Calls(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[what];
  }

  EngineOptions Options() {
    EngineOptions o;
    o.clock = &clock_;
    o.signer = &signer_;
    o.use_leases = GetParam() != "sqlite";
    o.owner = "test";
    return o;
  }

  std::string Begin(Engine& e, std::vector<std::string> tools, int64_t idle_ms = 0,
                    OnIdle on_idle = OnIdle::kRollback) {
    BeginRequest br;
    br.intent_key = "trip-" + std::to_string(++begun_);
    br.tools = std::move(tools);
    br.metadata = {{"user", "ana"}};
    br.idle_timeout_ms = idle_ms;
    br.on_idle = on_idle;
    auto out = e.Begin(br);
    EXPECT_OK(out);
    return out.ok() ? out->saga_id : "";
  }

  CallAnswer Call(Engine& e, const std::string& saga, const std::string& call_id,
                  const std::string& tool, Json args, bool repeat = false) {
    CallRequest cr;
    cr.call_id = call_id;
    cr.tool = tool;
    cr.args = std::move(args);
    cr.repeat = repeat;
    auto out = e.Call(saga, cr);
    EXPECT_OK(out);
    return out.ok() ? *out : CallAnswer{};
  }

  std::string State(const std::string& id) {
    auto rec = store_->LoadSaga(id);
    return rec.ok() ? rec->summary.state : rec.status().ToString();
  }

  std::vector<storage::JournalEntry> Journal(const std::string& id) {
    auto j = store_->ReadJournal(id);
    EXPECT_OK(j);
    return j.ok() ? *j : std::vector<storage::JournalEntry>{};
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
  std::map<std::string, int> calls_;    // GUARDED_BY(mu_) by tool
  std::map<std::string, int> effects_;  // GUARDED_BY(mu_) effects applied, by tool
  std::map<std::string, int> applied_;  // GUARDED_BY(mu_) key -> its effect's number
  std::vector<std::string> undone_;     // GUARDED_BY(mu_)
  int begun_ = 0;
};

TEST_P(OpenSagaTest, BeginCallCommit) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book", "search"});
  EXPECT_EQ(State(id), "open");
  CallAnswer a = Call(e, id, "call_1", "flights.book", {{"to", "lisbon"}});
  EXPECT_EQ(a.refusal, CallRefusal::kNone) << a.message;
  EXPECT_EQ(a.state, "succeeded");
  EXPECT_EQ(a.step_id, "c1");
  EXPECT_EQ(a.result["booking_id"], "bk-1");
  EXPECT_FALSE(a.deduplicated);
  EXPECT_EQ(State(id), "open");
  CallAnswer b = Call(e, id, "call_2", "search", {{"q", "hotels"}});
  EXPECT_EQ(b.state, "succeeded");
  EXPECT_EQ(b.step_id, "c2");
  ASSERT_OK_AND_ASSIGN(auto rec, e.Commit(id, "agent"));
  EXPECT_EQ(rec.summary.state, "succeeded");
  ASSERT_OK_AND_ASSIGN(auto effects, store_->ListEffects(id));
  ASSERT_EQ(effects.size(), 2u);
  EXPECT_EQ(effects[0].idempotency_key, id + "/c1");
  // A call after the commit is refused, and calls nothing.
  CallAnswer late = Call(e, id, "call_3", "search", {{"q", "x"}});
  EXPECT_EQ(late.refusal, CallRefusal::kSagaNotOpen);
  EXPECT_EQ(Calls("search"), 1);
}

TEST_P(OpenSagaTest, AFailedCallLeavesTheSagaOpenAndRollbackCompensatesInReverse) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book", "notes.add"});
  EXPECT_EQ(Call(e, id, "c-a", "flights.book", {{"to", "lisbon"}}).state, "succeeded");
  EXPECT_EQ(Call(e, id, "c-b", "flights.book", {{"to", "porto"}}).state, "succeeded");
  CallAnswer failed = Call(e, id, "c-c", "flights.book", {{"to", "nowhere"}});
  EXPECT_EQ(failed.state, "failed");
  EXPECT_EQ(failed.error, "no such city");
  EXPECT_EQ(State(id), "open");  // the agent decides
  ControlRequest r;
  r.who = "agent";
  ASSERT_OK_AND_ASSIGN(auto out, e.Rollback(id, r));
  EXPECT_EQ(out.saga.summary.state, "compensated");
  std::lock_guard<std::mutex> lock(mu_);
  // Templates over the action's result and arguments; the last first.
  EXPECT_EQ(undone_, (std::vector<std::string>{"bk-2@porto", "bk-1@lisbon"}));
}

TEST_P(OpenSagaTest, ARepeatedCallIdAnswersTheRecordedResultAndCallsNothing) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book"});
  // Arguments with "${" are literals: the recorded fingerprint is the one
  // of the arguments as sent, not of their escaped form in the plan.
  const Json args = {{"to", "lisbon"}, {"note", "${not.a.template}"}};
  CallAnswer first = Call(e, id, "call_x", "flights.book", args);
  CallAnswer again = Call(e, id, "call_x", "flights.book", args);
  EXPECT_EQ(again.refusal, CallRefusal::kNone) << again.message;
  EXPECT_EQ(Calls("book"), 1);
  EXPECT_TRUE(again.deduplicated);
  EXPECT_EQ(again.duplicate_reason, "same call_id");
  EXPECT_EQ(again.result, first.result);
  EXPECT_EQ(again.step_id, "c1");
  EXPECT_EQ(again.args_fingerprint, Fingerprint(args));
}

// A call id names one intent: reused with other arguments or another tool
// it is refused and calls nothing, never answered with the earlier call's
// result (which would tell the model a call it never made succeeded).
TEST_P(OpenSagaTest, ACallIdReusedWithOtherArgumentsIsRefusedAndCallsNothing) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book", "notes.add"});
  const Json lisbon = {{"to", "lisbon"}};
  const Json rome = {{"to", "rome"}};
  Call(e, id, "call_x", "flights.book", lisbon);
  const size_t entries = Journal(id).size();
  CallAnswer other = Call(e, id, "call_x", "flights.book", rome);
  EXPECT_EQ(other.refusal, CallRefusal::kCallIdReused);
  EXPECT_STREQ(CallRefusalName(other.refusal), "call-id-reused");
  EXPECT_FALSE(other.deduplicated);
  EXPECT_TRUE(other.result.is_null());
  EXPECT_EQ(other.call_id, "call_x");
  EXPECT_EQ(other.args_fingerprint, Fingerprint(lisbon));
  EXPECT_EQ(other.request_fingerprint, Fingerprint(rome));
  EXPECT_NE(other.message.find(Fingerprint(lisbon)), std::string::npos) << other.message;
  EXPECT_NE(other.message.find(Fingerprint(rome)), std::string::npos) << other.message;
  EXPECT_NE(other.message.find("\"call_x\""), std::string::npos) << other.message;
  // `repeat` means a second effect under a new call id, never a reused one.
  CallAnswer repeated = Call(e, id, "call_x", "flights.book", rome, /*repeat=*/true);
  EXPECT_EQ(repeated.refusal, CallRefusal::kCallIdReused);
  // Another tool under the same id: refused too.
  CallAnswer tool = Call(e, id, "call_x", "notes.add", lisbon);
  EXPECT_EQ(tool.refusal, CallRefusal::kCallIdReused);
  EXPECT_EQ(tool.request_tool, "notes.add");
  EXPECT_EQ(Calls("book"), 1);
  EXPECT_EQ(Calls("note"), 0);
  EXPECT_EQ(Journal(id).size(), entries);  // nothing recorded
  EXPECT_EQ(State(id), "open");
  // An id bound by deduplication (the same write under a new id) is held
  // to its arguments as well.
  CallAnswer dup = Call(e, id, "call_y", "flights.book", lisbon);
  EXPECT_TRUE(dup.deduplicated);
  EXPECT_EQ(Call(e, id, "call_y", "flights.book", rome).refusal, CallRefusal::kCallIdReused);
  // The same call id with its own arguments still answers from the journal.
  EXPECT_EQ(Call(e, id, "call_x", "flights.book", lisbon).refusal, CallRefusal::kNone);
  EXPECT_EQ(Calls("book"), 1);
}

// The test-only switch (effect/mutation.h) puts the defect back, so that the
// simulation's checker can be shown to catch it.
TEST_P(OpenSagaTest, TheMutationSwitchPutsTheIgnoredArgumentsBack) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book"});
  CallAnswer first = Call(e, id, "call_x", "flights.book", {{"to", "lisbon"}});
  effect::SetMutation(effect::Mutation::kCallIdIgnoresArguments);
  CallAnswer again = Call(e, id, "call_x", "flights.book", {{"to", "rome"}});
  effect::SetMutation(effect::Mutation::kNone);
  EXPECT_EQ(again.refusal, CallRefusal::kNone);
  EXPECT_TRUE(again.deduplicated);
  EXPECT_EQ(again.result, first.result);
  EXPECT_EQ(Calls("book"), 1);
}

TEST_P(OpenSagaTest, TheSameWriteUnderANewCallIdIsDeduplicatedUnlessRepeat) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book", "search", "notes.add"});
  Call(e, id, "call_1", "flights.book", {{"to", "lisbon"}});
  CallAnswer dup = Call(e, id, "call_2", "flights.book", {{"to", "lisbon"}});
  EXPECT_TRUE(dup.deduplicated);
  EXPECT_EQ(dup.duplicate_of, "call_1");
  EXPECT_EQ(dup.duplicate_reason, "same tool and arguments");
  EXPECT_EQ(dup.call_id, "call_2");
  EXPECT_EQ(Calls("book"), 1);
  // The new id is bound to the step it was answered from: asked again, or
  // looked up, it answers the same, and it adds no second journal entry.
  auto looked_up = e.GetCall(id, "call_2");
  ASSERT_OK(looked_up);
  EXPECT_EQ(looked_up->step_id, "c1");
  EXPECT_EQ(looked_up->duplicate_of, "call_1");
  CallAnswer dup_again = Call(e, id, "call_2", "flights.book", {{"to", "lisbon"}});
  EXPECT_TRUE(dup_again.deduplicated);
  EXPECT_EQ(dup_again.step_id, "c1");
  EXPECT_EQ(Calls("book"), 1);
  // repeat: true means a second effect, under its own key.
  CallAnswer second = Call(e, id, "call_3", "flights.book", {{"to", "lisbon"}}, /*repeat=*/true);
  EXPECT_FALSE(second.deduplicated);
  EXPECT_EQ(second.step_id, "c2");
  EXPECT_EQ(Calls("book"), 2);
  // Reads are called again; a tool whose policy allows repeats too.
  Call(e, id, "s1", "search", {{"q", "a"}});
  Call(e, id, "s2", "search", {{"q", "a"}});
  EXPECT_EQ(Calls("search"), 2);
  Call(e, id, "n1", "notes.add", {{"t", "a"}});
  Call(e, id, "n2", "notes.add", {{"t", "a"}});
  EXPECT_EQ(Calls("note"), 2);
  int dedup_entries = 0;
  for (const auto& j : Journal(id)) dedup_entries += j.event == "call_deduplicated";
  EXPECT_EQ(dedup_entries, 1);
}

TEST_P(OpenSagaTest, AToolNotInTheListIsRefusedAndAnUncompensatedWriteCannotBeListed) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"search"});
  CallAnswer a = Call(e, id, "c1", "flights.book", {{"to", "x"}});
  EXPECT_EQ(a.refusal, CallRefusal::kToolNotAllowed);
  EXPECT_EQ(Calls("book"), 0);
  BeginRequest br;
  br.intent_key = "bad";
  br.tools = {"search", "mail.send"};
  EXPECT_THAT(e.Begin(br), test::StatusIs(Code::kInvalidArgument, "tools[1]"));
  br.tools = {"nope"};
  EXPECT_THAT(e.Begin(br), test::StatusIs(Code::kInvalidArgument, "unknown tool \"nope\""));
}

// An irreversible tool is approved before it happens, as a spec step must
// be: two-phase with a person, or "approval": "none" with a reason said in
// its registry entry; otherwise an open saga cannot list it.
TEST_P(OpenSagaTest, AnIrreversibleToolNeedsAnApprovalOrASaidNoneToBeListed) {
  Engine e(store_.get(), &tools_, Options());
  ToolInfo unsaid = Info("sms.send", EffectClass::kIrreversible);
  unsaid.open.no_compensation_reason = "a text message cannot be unsent";
  Add(unsaid, [this](const ToolCall& c) {
    return ToolOutcome::Succeeded({{"n", Effect("sms", c)}});
  });
  ToolInfo said = Info("fax.send", EffectClass::kIrreversible);
  said.open.no_compensation_reason = "a fax cannot be unsent";
  said.open.no_approval_reason = "the customer asked for it";
  Add(said, [this](const ToolCall& c) {
    return ToolOutcome::Succeeded({{"n", Effect("fax", c)}});
  });
  BeginRequest br;
  br.intent_key = "irreversible";
  br.tools = {"search", "sms.send"};
  EXPECT_THAT(e.Begin(br),
              test::StatusIs(Code::kInvalidArgument,
                             "tools[1]: tool \"sms.send\" is irreversible: make its registry entry "
                             "two_phase with \"approval\": \"human\", or say \"approval\": "
                             "\"none\" with a \"reason\""));
  const std::string id = Begin(e, {"fax.send"});
  CallAnswer a = Call(e, id, "f1", "fax.send", {{"to", "+351"}});
  EXPECT_EQ(a.state, "succeeded") << a.message << a.error;
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(id));
  const Json& step = rec.spec["steps"][0];
  EXPECT_EQ(step["approval"], "none");
  EXPECT_EQ(step["reason"], "a fax cannot be unsent; the customer asked for it");
  EXPECT_EQ(Effects("fax"), 1);
}

TEST_P(OpenSagaTest, BeginIsIdempotentPerIntentKeyAndConflictsOnOtherContent) {
  Engine e(store_.get(), &tools_, Options());
  BeginRequest br;
  br.intent_key = "k";
  br.tools = {"search"};
  ASSERT_OK_AND_ASSIGN(auto one, e.Begin(br));
  ASSERT_OK_AND_ASSIGN(auto two, e.Begin(br));
  EXPECT_TRUE(one.created);
  EXPECT_FALSE(two.created);
  EXPECT_EQ(one.saga_id, two.saga_id);
  br.tools = {"search", "flights.book"};
  EXPECT_THAT(e.Begin(br), test::StatusIs(Code::kConflict));
}

TEST_P(OpenSagaTest, ATwoPhaseCallWaitsForApprovalThenTheSameCallIdAnswersSucceeded) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"pay.charge"});
  CallAnswer a = Call(e, id, "pay_1", "pay.charge", {{"eur", 90}});
  EXPECT_EQ(a.state, "awaiting_approval");
  EXPECT_EQ(State(id), "awaiting_approval");
  EXPECT_EQ(Calls("pay"), 0);
  // Commit is refused while it waits, naming the call.
  EXPECT_THAT(e.Commit(id, "agent"), test::StatusIs(Code::kFailedPrecondition, "c1"));
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(id));
  auto phase = rec.steps[0].phase;
  ASSERT_TRUE(phase.is_object());
  ApprovalDecision d;
  d.approve = true;
  d.who = "ana";
  ASSERT_OK(e.Decide(phase["token"].get<std::string>(), d));
  CallAnswer again = Call(e, id, "pay_1", "pay.charge", {{"eur", 90}});
  EXPECT_EQ(again.state, "succeeded");
  EXPECT_EQ(Calls("pay"), 1);
  EXPECT_EQ(State(id), "open");
  ASSERT_OK(e.Commit(id, "agent"));
}

// The requester of a call's effect is whoever made the call (recorded with
// it), and the saga's owner: neither approves it, whatever the surface.
TEST_P(OpenSagaTest, NeitherTheCallerNorTheSagasOwnerApprovesTheCall) {
  Engine e(store_.get(), &tools_, Options());
  BeginRequest br;
  br.intent_key = "ana:shop";  // begun by the principal ana (the server's key prefix)
  br.tools = {"pay.charge"};
  ASSERT_OK_AND_ASSIGN(auto begun, e.Begin(br));
  CallRequest cr;
  cr.call_id = "m1";
  cr.tool = "pay.charge";
  cr.args = {{"eur", 999}};
  cr.who = "mallory";  // an operator calling in ana's saga
  ASSERT_OK_AND_ASSIGN(auto a, e.Call(begun.saga_id, cr));
  ASSERT_EQ(a.state, "awaiting_approval");
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(begun.saga_id));
  EXPECT_EQ(rec.spec["open"]["calls"][0]["by"], "mallory");
  bool journaled = false;
  for (const auto& j : Journal(begun.saga_id)) {
    journaled |= j.event == "call_appended" && j.data.value("by", "") == "mallory";
  }
  EXPECT_TRUE(journaled);
  const std::string token = rec.steps[0].phase["token"].get<std::string>();
  for (const char* self : {"mallory", "Mallory", "ana"}) {
    ApprovalDecision d;
    d.approve = true;
    d.who = self;
    d.authenticated = true;
    d.roles = {"approver", "operator"};
    auto refused = e.Decide(token, d);
    ASSERT_FALSE(refused.ok()) << self;
    EXPECT_EQ(refused.status().message().rfind(kSelfApprovalMessage, 0), 0u)
        << refused.status().message();
  }
  EXPECT_EQ(Calls("pay"), 0);
  ApprovalDecision olga;
  olga.approve = true;
  olga.who = "olga";
  olga.authenticated = true;
  olga.roles = {"approver"};
  ASSERT_OK(e.Decide(token, olga));
  EXPECT_EQ(Call(e, begun.saga_id, "m1", "pay.charge", {{"eur", 999}}).state, "succeeded");
  EXPECT_EQ(Calls("pay"), 1);
}

TEST_P(OpenSagaTest, IdleTimeoutRollsBackOrPausesDurablyAcrossARestart) {
  std::string rolls, parks;
  {
    Engine e(store_.get(), &tools_, Options());
    rolls = Begin(e, {"flights.book"}, 60'000, OnIdle::kRollback);
    parks = Begin(e, {"flights.book"}, 60'000, OnIdle::kPark);
    Call(e, rolls, "c1", "flights.book", {{"to", "lisbon"}});
    Call(e, parks, "c1", "flights.book", {{"to", "porto"}});
    ASSERT_OK_AND_ASSIGN(auto report, e.Recover());
    EXPECT_TRUE(report.saga_ids.empty()) << "not due yet";
  }
  ASSERT_NO_FATAL_FAILURE(Open());  // a restart: a new store and engine, the deadline is durable
  clock_.AdvanceMs(61'000);
  Engine e(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(rolls));
  EXPECT_TRUE(NeedsDrive(rec, clock_.NowMs()));
  ASSERT_OK_AND_ASSIGN(auto report, e.Recover());
  EXPECT_EQ(report.saga_ids.size(), 2u);
  EXPECT_EQ(State(rolls), "compensated");
  EXPECT_EQ(State(parks), "paused");
  // A person resumes the parked one: it is open again and takes calls.
  ControlRequest r;
  r.who = "ops";
  ASSERT_OK(e.Resume(parks, r));
  EXPECT_EQ(State(parks), "open");
  EXPECT_EQ(Call(e, parks, "c2", "flights.book", {{"to", "faro"}}).state, "succeeded");
}

TEST_P(OpenSagaTest, CancelPauseAndResumeWorkOnAnOpenSaga) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book"});
  Call(e, id, "c1", "flights.book", {{"to", "lisbon"}});
  ControlRequest r;
  r.who = "ops";
  ASSERT_OK(e.Pause(id, r));
  EXPECT_EQ(State(id), "paused");
  EXPECT_EQ(Call(e, id, "c2", "flights.book", {{"to", "rome"}}).refusal, CallRefusal::kSagaNotOpen);
  ASSERT_OK(e.Resume(id, r));
  EXPECT_EQ(State(id), "open");
  ASSERT_OK_AND_ASSIGN(auto out, e.Cancel(id, r));
  EXPECT_EQ(out.saga.summary.state, "compensated");
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(undone_.size(), 1u);
}

TEST_P(OpenSagaTest, DecisionsAreJournaledWithTheCallAndShownInTheView) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"search"});
  CallRequest cr;
  cr.call_id = "call_abc";
  cr.tool = "search";
  cr.args = {{"q", "${input.secret}"}};  // data, never a template
  ASSERT_OK_AND_ASSIGN(cr.decision, ParseModelDecision({{"model", "gpt-4.1"},
                                                        {"message_id", "msg_1"},
                                                        {"call_id", "call_abc"},
                                                        {"prompt_sha256", std::string(64, 'a')},
                                                        {"reasoning", "the user asked for hotels"}},
                                                       "decision", 1024));
  ASSERT_OK_AND_ASSIGN(auto a, e.Call(id, cr));
  EXPECT_EQ(a.state, "succeeded");
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(id));
  EXPECT_EQ(rec.steps[0].args["q"], "${input.secret}");
  Json calls = OpenCallsView(rec, Journal(id));
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["call_id"], "call_abc");
  EXPECT_EQ(calls[0]["decision"]["model"], "gpt-4.1");
  EXPECT_EQ(calls[0]["decision"]["reasoning"], "the user asked for hotels");
  // Bounded text, a hash of 64 hex digits.
  EXPECT_THAT(ParseModelDecision({{"model", "m"}, {"prompt_sha256", "xyz"}}, "decision", 10),
              test::StatusIs(Code::kInvalidArgument, "decision.prompt_sha256"));
  EXPECT_THAT(
      ParseModelDecision(
          {{"model", "m"}, {"prompt_sha256", std::string(64, 'b')}, {"prompt", "12345678901"}},
          "decision", 10),
      test::StatusIs(Code::kInvalidArgument, "decision.prompt"));
}

INSTANTIATE_TEST_SUITE_P(Backends, OpenSagaTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

// Leases exist on PostgreSQL only (on SQLite one process drives at a time).
class OpenSagaLeaseTest : public OpenSagaTest {};

// `open rollback` while the process of the agent's last call still holds the
// saga's lease (it was SIGKILLed mid-call): the cancel is recorded, and the
// holder is gone, so nobody would carry it out. Recovery does once the lease
// has run out, without anyone asking again.
TEST_P(OpenSagaLeaseTest, ARollbackRecordedUnderADeadHoldersLeaseIsCarriedOutByRecovery) {
  Engine e(store_.get(), &tools_, Options());
  const std::string id = Begin(e, {"flights.book"});
  EXPECT_EQ(Call(e, id, "c1", "flights.book", {{"to", "lisbon"}}).state, "succeeded");
  ASSERT_OK(store_->ClaimSaga(id, "killed-agent", 300));  // never renewed nor released
  ControlRequest r;
  r.who = "person";
  r.reason = "the agent is gone";
  ASSERT_OK_AND_ASSIGN(auto out, e.Rollback(id, r));
  EXPECT_TRUE(out.pending) << out.note;
  EXPECT_EQ(out.saga.summary.state, "open");
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the dead lease runs out
  ASSERT_OK_AND_ASSIGN(auto report, e.Recover());
  EXPECT_EQ(report.saga_ids, std::vector<std::string>{id});
  EXPECT_EQ(State(id), "compensated");
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(undone_, std::vector<std::string>{"bk-1@lisbon"});
}

INSTANTIATE_TEST_SUITE_P(Backends, OpenSagaLeaseTest, ::testing::Values("postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
