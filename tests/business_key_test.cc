// Business keys (saga/step_key.h): a step's idempotency key from a template
// over the input, so that two intents for one business action are one
// effect at a provider that honours keys.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "saga/step_key.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

// A payment provider that applies each key once (Idempotency-Key).
struct Payments {
  std::mutex mu;
  std::map<std::string, Json> charges;  // key -> the charge
  std::vector<std::string> calls;       // "<tool> <key>"
  std::vector<std::string> script;      // outcomes of the next charge calls: "fail", "lose"
  bool fail_ship = false;
};

void Register(Payments* p, ToolRegistry* tools) {
  ToolInfo charge{"payments.charge", EffectClass::kWrite, true, false, false};
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(charge, [p](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->calls.push_back("payments.charge " + call.key);
    std::string mode;
    if (!p->script.empty()) {
      mode = p->script.front();
      p->script.erase(p->script.begin());
    }
    if (mode == "fail") return ToolOutcome::Failed("503 busy", true);
    auto it = p->charges.find(call.key);
    if (it == p->charges.end()) {
      Json c = {{"charge_id", "ch_" + std::to_string(p->charges.size() + 1)},
                {"amount", call.args["amount"]}};
      it = p->charges.emplace(call.key, c).first;
    }
    if (mode == "lose") return ToolOutcome::Unknown("response lost");
    return ToolOutcome::Succeeded(it->second, it->second["charge_id"].get<std::string>());
  })));
  ToolInfo refund{"payments.refund", EffectClass::kIdempotent, true, false, false};
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(refund, [p](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->calls.push_back("payments.refund " + call.key);
    return ToolOutcome::Succeeded(Json::object());
  })));
  ToolInfo ship{"shipping.send", EffectClass::kWrite, true, false, false};
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(ship, [p](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->calls.push_back("shipping.send " + call.key);
    if (p->fail_ship) return ToolOutcome::Failed("address refused", false);
    return ToolOutcome::Succeeded(Json::object());
  })));
}

class BusinessKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Register(&payments_, &tools_);
    ASSERT_OK_AND_ASSIGN(store_, storage::OpenStore(dir_.File("journal.db")));
  }

  Engine MakeEngine() {
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = false;
    return Engine(store_.get(), &tools_, o);
  }

  SagaSpec Spec() {
    Json doc = {{"name", "order"},
                {"steps",
                 {{{"id", "charge"},
                   {"tool", "payments.charge"},
                   {"key", "charge:${input.order_id}"},
                   {"args", {{"amount", "${input.amount}"}}},
                   {"compensate",
                    {{"tool", "payments.refund"},
                     {"args", {{"charge_id", "${steps.charge.result.charge_id}"}}}}}},
                  {{"id", "ship"},
                   {"tool", "shipping.send"},
                   {"args", {{"order", "${input.order_id}"}}},
                   {"compensate", nullptr},
                   {"reason", "nothing to undo"}}}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return *spec;
  }

  int Calls(const std::string& line) {
    int n = 0;
    for (const auto& c : payments_.calls) n += c == line;
    return n;
  }

  test::TempDir dir_{"idem_business_key"};
  Payments payments_;
  ToolRegistry tools_;
  ManualClock clock_;
  std::unique_ptr<storage::Store> store_;
};

TEST_F(BusinessKeyTest, TwoIntentsForOneOrderAreOneEffect) {
  Engine e = MakeEngine();
  const Json input = {{"order_id", "A-1001"}, {"amount", 1840}};
  ASSERT_OK_AND_ASSIGN(auto a, e.Submit(Spec(), input, "agent-run-1"));
  ASSERT_OK_AND_ASSIGN(auto b, e.Submit(Spec(), input, "agent-run-2"));
  ASSERT_NE(a.saga_id, b.saga_id) << "two intents, two sagas";
  ASSERT_OK_AND_ASSIGN(auto ra, e.Run(a.saga_id));
  ASSERT_OK_AND_ASSIGN(auto rb, e.Run(b.saga_id));
  EXPECT_EQ(ra.summary.state, "succeeded");
  EXPECT_EQ(rb.summary.state, "succeeded");
  EXPECT_EQ(payments_.charges.size(), 1u) << "the provider saw one effect";
  EXPECT_EQ(Calls("payments.charge charge:A-1001"), 2);
  EXPECT_EQ(ra.steps[0].result, rb.steps[0].result);
  EXPECT_EQ(rb.steps[0].result["charge_id"], "ch_1");
  // Steps without a template keep <saga id>/<step id>.
  EXPECT_EQ(Calls("shipping.send " + StepKey(a.saga_id, "ship")), 1);
  // The rendered key is journaled with `submitted`.
  ASSERT_OK_AND_ASSIGN(auto j, store_->ReadJournal(b.saga_id));
  bool found = false;
  for (const auto& entry : j) {
    if (entry.step_id == "charge" && entry.event == "submitted") {
      EXPECT_EQ(entry.data["key"], "charge:A-1001");
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(BusinessKeyTest, AnotherOrderIsAnotherEffect) {
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto a, e.Submit(Spec(), {{"order_id", "A-1"}, {"amount", 5}}, "k1"));
  ASSERT_OK_AND_ASSIGN(auto b, e.Submit(Spec(), {{"order_id", "A-2"}, {"amount", 5}}, "k2"));
  ASSERT_OK(e.Run(a.saga_id));
  ASSERT_OK(e.Run(b.saga_id));
  EXPECT_EQ(payments_.charges.size(), 2u);
}

TEST_F(BusinessKeyTest, TheKeyStaysTheSameAcrossAttempts) {
  // A lost answer: the same-key resend (the tool honours keys) finds the charge.
  payments_.script = {"lose"};
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto a, e.Submit(Spec(), {{"order_id", "A-7"}, {"amount", 5}}, "k1"));
  ASSERT_OK_AND_ASSIGN(auto rec, e.Run(a.saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(Calls("payments.charge charge:A-7"), 2);
  EXPECT_EQ(payments_.charges.size(), 1u);
  // A retryable refusal: the keyed retry carries the same key.
  payments_.script = {"fail"};
  ASSERT_OK_AND_ASSIGN(auto b, e.Submit(Spec(), {{"order_id", "A-8"}, {"amount", 5}}, "k2"));
  ASSERT_OK_AND_ASSIGN(auto rec_b, e.Run(b.saga_id));
  EXPECT_EQ(rec_b.summary.state, "succeeded");
  EXPECT_EQ(Calls("payments.charge charge:A-8"), 2);
  ASSERT_OK_AND_ASSIGN(auto j, store_->ReadJournal(b.saga_id));
  int submitted = 0;
  for (const auto& entry : j) {
    if (entry.step_id == "charge" && entry.event == "submitted") {
      EXPECT_EQ(entry.data["key"], "charge:A-8");
      ++submitted;
    }
  }
  EXPECT_EQ(submitted, 2);
}

TEST_F(BusinessKeyTest, TheCompensationKeyFollows) {
  payments_.fail_ship = true;
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto a, e.Submit(Spec(), {{"order_id", "A-9"}, {"amount", 5}}, "k1"));
  ASSERT_OK_AND_ASSIGN(auto rec, e.Run(a.saga_id));
  EXPECT_EQ(rec.summary.state, "compensated");
  EXPECT_EQ(Calls("payments.refund charge:A-9:compensate"), 1);
}

TEST(StepKeyTest, RenderRefusesEmptyLongAndUnprintableKeys) {
  ToolRegistry tools;
  Payments p;
  Register(&p, &tools);
  Json doc = {{"name", "k"},
              {"steps",
               {{{"id", "charge"},
                 {"tool", "payments.charge"},
                 {"key", "${input.id}"},
                 {"compensate", nullptr},
                 {"reason", "test"}}}}};
  ASSERT_OK_AND_ASSIGN(auto spec, ParseSpec(doc, tools));
  EXPECT_THAT(RenderStepKey(spec, 0, "sg_1", {{"id", "A-1"}}), test::IsOkAndHolds("A-1"));
  EXPECT_THAT(RenderStepKey(spec, 0, "sg_1", {{"id", 42}}), test::IsOkAndHolds("42"));
  EXPECT_THAT(
      RenderStepKey(spec, 0, "sg_1", {{"id", ""}}),
      test::StatusIs(Code::kInvalidArgument, "steps[0].key: \"${input.id}\" renders an empty key"));
  EXPECT_THAT(RenderStepKey(spec, 0, "sg_1", {{"id", std::string(201, 'x')}}),
              test::StatusIs(Code::kInvalidArgument, "renders a key of 201 bytes (at most 200)"));
  EXPECT_THAT(RenderStepKey(spec, 0, "sg_1", {{"id", "two words"}}),
              test::StatusIs(Code::kInvalidArgument, "printable ASCII only"));
  EXPECT_THAT(RenderStepKey(spec, 0, "sg_1", {{"id", {{"a", 1}}}}),
              test::StatusIs(Code::kInvalidArgument, "renders object, not text"));
  EXPECT_THAT(RenderStepKey(spec, 0, "sg_1", Json::object()),
              test::StatusIs(Code::kInvalidArgument, "has no value"));
  // At submit, the same refusal: nothing is recorded.
  test::TempDir dir("idem_step_key");
  ASSERT_OK_AND_ASSIGN(auto store, storage::OpenStore(dir.File("journal.db")));
  EngineOptions o;
  o.use_leases = false;
  Engine e(store.get(), &tools, o);
  EXPECT_THAT(e.Submit(spec, {{"id", ""}}, "k1"),
              test::StatusIs(Code::kInvalidArgument, "steps[0].key"));
  ASSERT_OK_AND_ASSIGN(auto sagas, store->ListSagas(storage::SagaFilter{}));
  EXPECT_TRUE(sagas.empty());
}

TEST(StepKeyTest, CollisionRule) {
  ToolRegistry tools;
  Payments p;
  Register(&p, &tools);
  auto two = [&](const std::string& k1, const std::string& k2, bool compensate_first = false) {
    Json first = {{"id", "a"}, {"tool", "payments.charge"}, {"key", k1}};
    if (compensate_first) {
      first["compensate"] = {{"tool", "payments.refund"}};
    } else {
      first["compensate"] = nullptr;
      first["reason"] = "test";
    }
    Json doc = {{"name", "k"},
                {"steps",
                 {first,
                  {{"id", "b"},
                   {"tool", "payments.charge"},
                   {"key", k2},
                   {"compensate", nullptr},
                   {"reason", "test"}}}}};
    return ParseSpec(doc, tools).status();
  };
  EXPECT_OK(two("charge:${input.id}", "refund:${input.id}"));
  EXPECT_OK(two("${input.id}:charge", "${input.id}:refund"));
  EXPECT_OK(two("x", "y"));
  EXPECT_OK(two("a", "ab"));                       // two constants: only equal ones collide
  EXPECT_OK(two("a${input.id}", "b${input.id}"));  // prefixes differ
  EXPECT_OK(two("fixed", "charge:${input.id}"));   // the constant cannot start with "charge:"
  EXPECT_THAT(two("charge:${input.a}", "charge:${input.a}"),
              test::StatusIs(Code::kInvalidArgument, "is the same template as steps[0].key"));
  EXPECT_THAT(two("charge:${input.a}", "charge:${input.b}"),
              test::StatusIs(Code::kInvalidArgument, "may render the same key as steps[0].key"));
  EXPECT_THAT(two("c${input.a}", "charge:${input.a}"),
              test::StatusIs(Code::kInvalidArgument, "may render the same key"));
  EXPECT_THAT(two("charge:${input.a}", "charge:x"),
              test::StatusIs(Code::kInvalidArgument, "may render the same key"));
  EXPECT_THAT(two("${input.a}", "${input.b}-${input.c}"),
              test::StatusIs(Code::kInvalidArgument, "may render the same key"));
  EXPECT_THAT(two("order-1", "order-1:compensate", true),
              test::StatusIs(Code::kInvalidArgument, "(as its compensation key)"));
  EXPECT_THAT(two("${input.a}", "${steps.a.result.id}"),
              test::StatusIs(Code::kInvalidArgument, "a key may reference only the input"));
}

}  // namespace
}  // namespace idem
