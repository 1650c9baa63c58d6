// Approval policies (saga/approval_policy.h, issue 19): by amount and role,
// quorum, two-person approval. On a real SQLite file and a real PostgreSQL
// database (the ctest fixture `postgres`); the payment tool keeps a ledger of
// the charges it applied per key, so "no commit" is asserted on what the
// provider saw.

#include "saga/approval_policy.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <gtest/gtest.h>

#include "compensation/rollback.h"
#include "preview_commit/token.h"
#include "preview_commit/two_phase.h"
#include "saga/approval_rights.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

// The contract's table (docs/architecture.md, Approval policies).
Json PolicyTable() {
  return {{"rules",
           {{{"when", "preview.changes.amount <= 10000"},
             {"pass", "at or below EUR 100.00: no person needed"}},
            {{"when", "preview.changes.amount <= 500000"}, {"role", "finance"}, {"quorum", 1}},
            {{"role", "finance"}, {"quorum", 2}}}}};
}

class ApprovalPolicyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open());
    auto add = [this](const std::string& name, EffectClass c, bool preview) {
      ToolInfo info;
      info.name = name;
      info.effect = c;
      info.honours_keys = true;
      info.has_preview = preview;
      FunctionTool::PreviewFn pv;
      if (preview) {
        pv = [](const ToolCall& call) {
          PreviewOutcome o;
          o.ok = true;
          o.summary = "charge " + call.args.dump();
          o.changes = call.args;
          return o;
        };
      }
      ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
          info,
          [this, name](const ToolCall& call) {
            std::lock_guard<std::mutex> lock(mu_);
            ++applied_[name + ":" + call.key];
            return ToolOutcome::Succeeded({{"ref", name + ":" + call.key}});
          },
          nullptr, pv)));
    };
    add("order.open", EffectClass::kWrite, false);
    add("order.close", EffectClass::kIdempotent, false);
    add("pay.charge", EffectClass::kWrite, true);
    add("pay.refund", EffectClass::kIdempotent, false);
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
    o.signer = &signer_;
    o.use_leases = GetParam() != "sqlite";
    o.owner = "test";
    return o;
  }

  // order (order.open), then pay (pay.charge, two-phase, `approval`).
  SagaSpec PaySpec(const Json& approval, Json extra = Json::object()) {
    Json pay = {{"id", "pay"},
                {"tool", "pay.charge"},
                {"args", {{"amount", "${input.amount}"}, {"currency", "EUR"}}},
                {"two_phase", true},
                {"approval", approval},
                {"compensate", {{"tool", "pay.refund"}}}};
    for (auto& [k, v] : extra.items()) pay[k] = v;
    Json doc = {
        {"name", "payment"},
        {"steps",
         {{{"id", "order"}, {"tool", "order.open"}, {"compensate", {{"tool", "order.close"}}}},
          pay}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return spec.ok() ? *spec : SagaSpec{};
  }

  // `owner`: the principal that submits it (the server's intent key prefix).
  storage::SagaRecord SubmitAndRun(Engine& e, const SagaSpec& spec, int64_t amount,
                                   const std::string& owner = "") {
    auto sub = e.Submit(spec, {{"amount", amount}},
                        (owner.empty() ? "" : owner + ":") + "pay-" + std::to_string(++submitted_));
    EXPECT_OK(sub);
    auto rec = e.Run(sub.ok() ? sub->saga_id : "");
    EXPECT_OK(rec);
    return rec.ok() ? *rec : storage::SagaRecord{};
  }

  static std::string TokenOf(const storage::SagaRecord& rec) {
    return rec.steps[1].phase.value("token", "");
  }

  // An authenticated person's decision (the server's caller, the CLI with a
  // credential): `who` and `roles` from the auth file.
  static ApprovalDecision As(const std::string& who, std::vector<std::string> roles,
                             bool approve = true) {
    ApprovalDecision d;
    d.approve = approve;
    d.who = who;
    d.authenticated = true;
    d.roles = std::move(roles);
    d.note = approve ? "checked the invoice" : "not our supplier";
    return d;
  }

  int Charges(const storage::SagaRecord& rec) {
    std::lock_guard<std::mutex> lock(mu_);
    return applied_["pay.charge:" + rec.steps[1].step_key];
  }
  int Applied(const std::string& tool_key) {
    std::lock_guard<std::mutex> lock(mu_);
    return applied_[tool_key];
  }

  std::vector<storage::JournalEntry> Events(const std::string& saga_id, const std::string& event) {
    auto j = store_->ReadJournal(saga_id);
    EXPECT_OK(j);
    std::vector<storage::JournalEntry> out;
    if (j.ok()) {
      for (auto& e : *j) {
        if (e.event == event) out.push_back(e);
      }
    }
    return out;
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
  std::map<std::string, int> applied_;  // GUARDED_BY(mu_) tool:key -> effects
  int submitted_ = 0;
};

TEST_P(ApprovalPolicyTest, BelowTheThresholdPassesAndJournalsWhy) {
  Engine e(store_.get(), &tools_, Options());
  auto rec = SubmitAndRun(e, PaySpec(PolicyTable()), 9'999);
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Charges(rec), 1);
  auto passed = Events(rec.summary.saga_id, "policy_passed");
  ASSERT_EQ(passed.size(), 1u);
  EXPECT_EQ(passed[0].step_id, "pay");
  EXPECT_EQ(passed[0].data["rule"], 0);
  EXPECT_EQ(passed[0].data["place"], "steps[1].approval.rules[0]");
  EXPECT_EQ(passed[0].data["when"], "preview.changes.amount <= 10000");
  EXPECT_EQ(passed[0].data["values"]["preview.changes.amount"], 9'999);
  EXPECT_EQ(passed[0].data["reason"], "at or below EUR 100.00: no person needed");
  EXPECT_TRUE(Events(rec.summary.saga_id, "awaiting_approval").empty());
}

TEST_P(ApprovalPolicyTest, AboveTheThresholdNeedsOneFinanceApprover) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 250'000);
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  EXPECT_EQ(Charges(waiting), 0);
  EXPECT_TRUE(Events(waiting.summary.saga_id, "policy_passed").empty());
  auto asked = Events(waiting.summary.saga_id, "awaiting_approval");
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].data["policy"]["rule"], 1);
  EXPECT_EQ(asked[0].data["policy"]["role"], "finance");
  EXPECT_EQ(asked[0].data["policy"]["quorum"], 1);

  // An `approver` without `finance` is refused, and nothing changes.
  auto refused = e.Decide(TokenOf(waiting), As("omar", {"approver"}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("this commit needs the role finance"),
            std::string::npos)
      << refused.status().message();
  EXPECT_EQ(store_->LoadSaga(waiting.summary.saga_id)->summary.state, "awaiting_approval");
  EXPECT_TRUE(Events(waiting.summary.saga_id, "approved").empty());

  auto done = e.Decide(TokenOf(waiting), As("maria", {"approver", "finance"}));
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  EXPECT_EQ(Charges(*done), 1);
  auto approved = Events(waiting.summary.saga_id, "approved");
  ASSERT_EQ(approved.size(), 1u);
  EXPECT_EQ(approved[0].data["by"], "maria");
  EXPECT_EQ(approved[0].data["role"], "finance");
  EXPECT_EQ(approved[0].data["note"], "checked the invoice");
  EXPECT_EQ(approved[0].data["count"], 1);
  EXPECT_EQ(approved[0].data["quorum"], 1);
}

TEST_P(ApprovalPolicyTest, TheLargestNeedTwoDistinctPeopleAndTheSamePersonTwiceIsRefused) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 900'000);
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  const std::string token = TokenOf(waiting);

  auto first = e.Decide(token, As("maria", {"finance"}));
  ASSERT_OK(first);
  EXPECT_EQ(first->summary.state, "awaiting_approval") << "one of two approvals";
  EXPECT_EQ(Charges(*first), 0);
  auto counted = Events(waiting.summary.saga_id, "approval_counted");
  ASSERT_EQ(counted.size(), 1u);
  EXPECT_EQ(counted[0].data["by"], "maria");
  EXPECT_EQ(counted[0].data["role"], "finance");
  EXPECT_EQ(counted[0].data["count"], 1);
  EXPECT_EQ(counted[0].data["quorum"], 2);

  // The same person again: refused, nothing changes.
  auto twice = e.Decide(token, As("maria", {"finance"}));
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), Code::kConflict);
  EXPECT_NE(twice.status().message().find("already approved by maria"), std::string::npos)
      << twice.status().message();
  EXPECT_EQ(Events(waiting.summary.saga_id, "approval_counted").size(), 1u);
  auto phase = store_->LoadSaga(waiting.summary.saga_id)->steps[1].phase;
  EXPECT_EQ(phase["approvals"].size(), 1u);
  EXPECT_EQ(Charges(waiting), 0);

  auto second = e.Decide(token, As("jonas", {"finance", "operator"}));
  ASSERT_OK(second);
  EXPECT_EQ(second->summary.state, "succeeded");
  EXPECT_EQ(Charges(*second), 1);
  auto submitted = Events(waiting.summary.saga_id, "submitted");
  ASSERT_FALSE(submitted.empty());
  EXPECT_EQ(submitted.back().data["approvals"], Json::array({"maria", "jonas"}));
}

TEST_P(ApprovalPolicyTest, ARejectionAfterOneApprovalEndsItAndRollsBack) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 900'000);
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  ASSERT_OK(e.Decide(TokenOf(waiting), As("maria", {"finance"})));
  auto rejected = e.Decide(TokenOf(waiting), As("jonas", {"finance"}, /*approve=*/false));
  ASSERT_OK(rejected);
  EXPECT_EQ(rejected->summary.state, "compensated");
  EXPECT_NE(rejected->steps[1].error.find("rejected by jonas: not our supplier"),
            std::string::npos);
  EXPECT_EQ(Charges(*rejected), 0);
  EXPECT_EQ(Applied("order.close:" + compensation::CompensationKey(rejected->steps[0].step_key)), 1)
      << "the order step was undone";
  auto entries = Events(waiting.summary.saga_id, "rejected");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].data["by"], "jonas");
  EXPECT_EQ(entries[0].data["role"], "finance");
  EXPECT_EQ(entries[0].data["note"], "not our supplier");
  // A third person after the rejection: refused.
  EXPECT_FALSE(e.Decide(TokenOf(waiting), As("lea", {"finance"})).ok());
}

TEST_P(ApprovalPolicyTest, ATokenExpiryWithOneOfTwoApprovalsLapsesThem) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(
      e, PaySpec(PolicyTable(), {{"approval_ttl", "15m"}, {"on_expiry", "re_preview"}}), 900'000);
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  ASSERT_OK(e.Decide(TokenOf(waiting), As("maria", {"finance"})));
  clock_.AdvanceMs(15 * 60 * 1000 + 1000);
  auto late = e.Decide(TokenOf(waiting), As("jonas", {"finance"}));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().message(), preview_commit::kExpiredTokenMessage);
  ASSERT_OK(e.Recover());
  auto again = store_->LoadSaga(waiting.summary.saga_id);
  ASSERT_OK(again);
  ASSERT_EQ(again->summary.state, "awaiting_approval") << "previewed again, a new round";
  EXPECT_NE(TokenOf(*again), TokenOf(waiting));
  EXPECT_EQ(again->steps[1].phase["approvals"].size(), 0u) << "maria's approval lapsed";
  // In the new round maria counts again, and one more approval is not enough.
  auto one = e.Decide(TokenOf(*again), As("jonas", {"finance"}));
  ASSERT_OK(one);
  EXPECT_EQ(one->summary.state, "awaiting_approval");
  auto two = e.Decide(TokenOf(*again), As("maria", {"finance"}));
  ASSERT_OK(two);
  EXPECT_EQ(two->summary.state, "succeeded");
  EXPECT_EQ(Charges(*two), 1);
}

TEST_P(ApprovalPolicyTest, ARestartBetweenTheTwoApprovalsKeepsTheFirst) {
  std::string saga_id, token;
  {
    Engine e(store_.get(), &tools_, Options());
    auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 900'000);
    ASSERT_EQ(waiting.summary.state, "awaiting_approval");
    saga_id = waiting.summary.saga_id;
    token = TokenOf(waiting);
    ASSERT_OK(e.Decide(token, As("maria", {"finance"})));
  }
  ASSERT_NO_FATAL_FAILURE(Open());  // a new process: a new store and engine on the same journal
  Engine e(store_.get(), &tools_, Options());
  ASSERT_OK(e.Recover());
  auto rec = store_->LoadSaga(saga_id);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "awaiting_approval");
  ASSERT_EQ(rec->steps[1].phase["approvals"].size(), 1u);
  EXPECT_EQ(rec->steps[1].phase["approvals"][0]["by"], "maria");
  EXPECT_EQ(e.Decide(token, As("maria", {"finance"})).status().code(), Code::kConflict);
  auto done = e.Decide(token, As("jonas", {"finance"}));
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  EXPECT_EQ(Charges(*done), 1);
}

TEST_P(ApprovalPolicyTest, ASagaDefaultPolicyAppliesToTwoPhaseStepsWithoutTheirOwn) {
  Json doc = {
      {"name", "payment"},
      {"approval", PolicyTable()},
      {"steps",
       {{{"id", "order"}, {"tool", "order.open"}, {"compensate", {{"tool", "order.close"}}}},
        {{"id", "pay"},
         {"tool", "pay.charge"},
         {"args", {{"amount", "${input.amount}"}}},
         {"two_phase", true},
         {"compensate", {{"tool", "pay.refund"}}}}}}};
  auto spec = ParseSpec(doc, tools_);
  ASSERT_OK(spec);
  EXPECT_EQ(spec->steps[0].approval, Approval::kNone) << "not two-phase";
  ASSERT_EQ(spec->steps[1].approval, Approval::kPolicy);
  EXPECT_EQ(spec->steps[1].policy->place, "approval");
  Engine e(store_.get(), &tools_, Options());
  EXPECT_EQ(SubmitAndRun(e, *spec, 5).summary.state, "succeeded");
  EXPECT_EQ(SubmitAndRun(e, *spec, 20'000).summary.state, "awaiting_approval");
}

TEST_P(ApprovalPolicyTest, ConditionsOverArgsAndInputAndMissingPathsFallThrough) {
  Json policy = {{"rules",
                  {{{"when", "args.currency == \"EUR\" and input.vip == true"},
                    {"pass", "a VIP's euro payment"}},
                   {{"when", "preview.changes.nothing_here < 5"}, {"pass", "never holds"}},
                   {{"role", "finance"}}}}};
  Engine e(store_.get(), &tools_, Options());
  SagaSpec spec = PaySpec(policy);
  auto vip = e.Submit(spec, {{"amount", 7}, {"vip", true}}, "vip-1");
  ASSERT_OK(vip);
  auto rec = e.Run(vip->saga_id);
  ASSERT_OK(rec);
  EXPECT_EQ(rec->summary.state, "succeeded");
  auto other = e.Submit(spec, {{"amount", 7}, {"vip", "yes"}}, "vip-2");  // a type mismatch
  ASSERT_OK(other);
  auto waiting = e.Run(other->saga_id);
  ASSERT_OK(waiting);
  EXPECT_EQ(waiting->summary.state, "awaiting_approval");
  auto asked = Events(other->saga_id, "awaiting_approval");
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].data["policy"]["rule"], 2);
}

// A decision that counts toward a role or a quorum comes from a person who
// proved who they are: the CLI's `--as maria --role finance`, taken on its
// word, once let one local user fill a two-person quorum as `--as a` and
// `--as b`.
TEST_P(ApprovalPolicyTest, AnUnauthenticatedDecisionNeverCountsTowardAPolicy) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 900'000);
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  for (const char* who : {"a", "b"}) {
    ApprovalDecision d = As(who, {"finance"});
    d.authenticated = false;
    auto refused = e.Decide(TokenOf(waiting), d);
    ASSERT_FALSE(refused.ok()) << who;
    EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(refused.status().message().rfind(kUnauthenticatedMessage, 0), 0u)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find("2 distinct finance approval(s)"), std::string::npos)
        << refused.status().message();
  }
  EXPECT_TRUE(Events(waiting.summary.saga_id, "approval_counted").empty());
  EXPECT_EQ(Charges(waiting), 0);
  // Two authenticated people fill it; the journal says they were.
  ASSERT_OK(e.Decide(TokenOf(waiting), As("maria", {"finance"})));
  auto done = e.Decide(TokenOf(waiting), As("jonas", {"finance"}));
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  auto approved = Events(waiting.summary.saga_id, "approved");
  ASSERT_EQ(approved.size(), 1u);
  EXPECT_EQ(approved[0].data["authenticated"], true);
}

// One person under two spellings is one person: the second is "already
// approved", and the quorum still waits for someone else.
TEST_P(ApprovalPolicyTest, NamesThatFoldAlikeAreOnePersonTowardTheQuorum) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 900'000);
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  ASSERT_OK(e.Decide(TokenOf(waiting), As("maria", {"finance"})));
  for (const std::string& twin : {std::string("Maria"), std::string("MARIA"),
                                  std::string("\xEF\xBD\x8D"
                                              "aria")}) {  // fullwidth m
    auto twice = e.Decide(TokenOf(waiting), As(twin, {"finance"}));
    ASSERT_FALSE(twice.ok()) << twin;
    EXPECT_EQ(twice.status().code(), Code::kConflict) << twin;
    EXPECT_NE(twice.status().message().find("already approved by"), std::string::npos)
        << twice.status().message();
  }
  EXPECT_EQ(Events(waiting.summary.saga_id, "approval_counted").size(), 1u);
  EXPECT_EQ(Charges(waiting), 0);
  auto done = e.Decide(TokenOf(waiting), As("jonas", {"finance"}));
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
}

// Whoever asked for a commit never decides on it, however the name is
// spelled and whatever the surface: the engine refuses it.
TEST_P(ApprovalPolicyTest, TheRequesterNeverDecidesOnItsOwnCommit) {
  Engine e(store_.get(), &tools_, Options());
  auto waiting = SubmitAndRun(e, PaySpec(PolicyTable()), 250'000, "ana");
  ASSERT_EQ(waiting.summary.state, "awaiting_approval");
  for (const std::string& self : {std::string("ana"), std::string("ANA")}) {
    auto own = e.Decide(TokenOf(waiting), As(self, {"finance"}));
    ASSERT_FALSE(own.ok()) << self;
    EXPECT_EQ(own.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(own.status().message().rfind(kSelfApprovalMessage, 0), 0u) << own.status().message();
    auto rejected = e.Decide(TokenOf(waiting), As(self, {"finance"}, /*approve=*/false));
    EXPECT_EQ(rejected.status().message().rfind(kSelfApprovalMessage, 0), 0u) << self;
  }
  EXPECT_EQ(Charges(waiting), 0);
  // "approval": "human": the same, for an authenticated approver or a name
  // given on the command line's word; a server without auth (any_role) has
  // nobody in particular to compare.
  auto human = SubmitAndRun(e, PaySpec("human"), 100, "ana");
  ASSERT_EQ(human.summary.state, "awaiting_approval");
  EXPECT_EQ(e.Decide(TokenOf(human), As("Ana", {"approver"}))
                .status()
                .message()
                .rfind(kSelfApprovalMessage, 0),
            0u);
  ApprovalDecision word;
  word.approve = true;
  word.who = "ana";
  EXPECT_EQ(e.Decide(TokenOf(human), word).status().message().rfind(kSelfApprovalMessage, 0), 0u);
  // An authenticated person without the role approver: refused too.
  auto no_role = e.Decide(TokenOf(human), As("omar", {"finance"}));
  EXPECT_EQ(no_role.status().message().rfind(preview_commit::kRoleMissingMessage, 0), 0u)
      << no_role.status().message();
  ApprovalDecision anonymous;
  anonymous.approve = true;
  anonymous.who = "ana";
  anonymous.any_role = true;
  auto done = e.Decide(TokenOf(human), anonymous);
  ASSERT_OK(done);
  EXPECT_EQ(done->summary.state, "succeeded");
  auto approved = Events(human.summary.saga_id, "approved");
  ASSERT_EQ(approved.size(), 1u);
  EXPECT_EQ(approved[0].data["authenticated"], false);
}

INSTANTIATE_TEST_SUITE_P(Backends, ApprovalPolicyTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

// ---- the spec checker and the evaluator (no store)

TEST(ApprovalPolicyParseTest, RefusesWhatTheContractRefusesNamingThePlace) {
  auto refused = [](const Json& policy) {
    auto r = ParseApprovalPolicy(policy, "steps[3].approval");
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_EQ(refused({{"rules", {{{"when", "args.a > 1"}, {"pass", "x"}}}}}),
            "steps[3].approval.rules[0].when: the last rule must have no \"when\": a commit that "
            "matches no rule would have no policy");
  EXPECT_EQ(refused({{"rules", {{{"role", "finance"}, {"pass", "x"}}}}}),
            "steps[3].approval.rules[0]: a rule has \"pass\" or \"role\", not both");
  EXPECT_EQ(refused({{"rules", {{{"role", "finance"}, {"quorum", 0}}}}}),
            "steps[3].approval.rules[0].quorum: 0 is below the minimum of 1");
  EXPECT_EQ(refused({{"rules", {{{"pass", "x"}}, {{"role", "finance"}, {"quorum", 11}}}}}),
            "steps[3].approval.rules[1].quorum: 11 is above the maximum of 10");
  EXPECT_NE(refused({{"rules", {{{"when", "amount > 1"}, {"pass", "x"}}, {{"role", "f"}}}}})
                .find("steps[3].approval.rules[0].when: path \"amount\" must start with args., "
                      "input. or preview."),
            std::string::npos);
  EXPECT_NE(
      refused({{"rules", {{{"when", "args.a > 1 or args.b > 2"}, {"pass", "x"}}, {{"role", "f"}}}}})
          .find("no \"or\""),
      std::string::npos);
  EXPECT_NE(refused({{"rules", {{{"when", "args.a => 1"}, {"pass", "x"}}, {{"role", "f"}}}}})
                .find("rules[0].when"),
            std::string::npos);
  EXPECT_NE(refused({{"rules", {{{"when", "preview.cost > 1"}, {"pass", "x"}}, {{"role", "f"}}}}})
                .find("a preview has summary, changes.<path> and resource_version"),
            std::string::npos);
  EXPECT_EQ(refused({{"rules", {{{"role", "Finance!"}}}}}),
            "steps[3].approval.rules[0].role: expected a role name ([a-z][a-z0-9_.-]{0,63}), got "
            "\"Finance!\"");
  EXPECT_EQ(refused({{"rules", {{{"role", "finance"}}}}}), "accepted");
}

TEST(ApprovalPolicyEvalTest, TheFirstRuleThatHoldsDecides) {
  auto policy = ParseApprovalPolicy(PolicyTable(), "approval");
  ASSERT_OK(policy);
  auto rule_for = [&](const Json& amount) {
    return EvaluatePolicy(*policy, {{"preview", {{"changes", {{"amount", amount}}}}}}).rule;
  };
  EXPECT_EQ(rule_for(10'000), 0);
  EXPECT_EQ(rule_for(10'001), 1);
  EXPECT_EQ(rule_for(500'000), 1);
  EXPECT_EQ(rule_for(500'000.5), 2);
  EXPECT_EQ(rule_for("100"), 2) << "a string is not a number: the rule does not hold";
  EXPECT_EQ(rule_for(nullptr), 2);
  EXPECT_EQ(EvaluatePolicy(*policy, Json::object()).rule, 2) << "no value: the last rule";
}

}  // namespace
}  // namespace idem
