#include <gtest/gtest.h>

#include "tools/open_policy.h"
#include "tools/tool.h"

namespace idem {
namespace {

ToolInfo Info(const std::string& name, EffectClass c) {
  ToolInfo i;
  i.name = name;
  i.effect = c;
  return i;
}

TEST(ToolRegistryTest, RegistersAndFinds) {
  ToolRegistry r;
  ASSERT_TRUE(
      r.Register(std::make_unique<FunctionTool>(Info("flights.reserve", EffectClass::kWrite),
                                                [](const ToolCall& c) {
                                                  return ToolOutcome::Succeeded({{"k", c.key}});
                                                }))
          .ok());
  Tool* t = r.Find("flights.reserve");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Invoke(ToolCall{"flights.reserve", "key-1", {}, 1, "s", "x", ""}).result["k"],
            "key-1");
  EXPECT_EQ(r.Find("flights.cancle"), nullptr);
}

TEST(ToolRegistryTest, RefusesDuplicatesAndBadNames) {
  ToolRegistry r;
  auto make = [](const std::string& n) {
    return std::make_unique<FunctionTool>(
        Info(n, EffectClass::kRead), [](const ToolCall&) { return ToolOutcome::Succeeded({}); });
  };
  ASSERT_TRUE(r.Register(make("a.b")).ok());
  EXPECT_EQ(r.Register(make("a.b")).code(), Code::kConflict);
  EXPECT_EQ(r.Register(make("")).code(), Code::kInvalidArgument);
  EXPECT_EQ(r.Register(make("a b")).code(), Code::kInvalidArgument);
}

TEST(FunctionToolTest, ThrowingFunctionIsAnUnknownOutcome) {
  FunctionTool t(Info("x", EffectClass::kWrite),
                 [](const ToolCall&) -> ToolOutcome { throw std::runtime_error("boom"); });
  ToolOutcome o = t.Invoke(ToolCall{});
  EXPECT_EQ(o.kind, OutcomeKind::kUnknown);
  EXPECT_NE(o.error.find("boom"), std::string::npos);
}

TEST(FunctionToolTest, HasStatusFollowsTheLookupFunction) {
  FunctionTool without(Info("x", EffectClass::kWrite),
                       [](const ToolCall&) { return ToolOutcome::Succeeded({}); });
  EXPECT_FALSE(without.info().has_status);
  EXPECT_EQ(without.Lookup("k").kind, LookupKind::kError);
  FunctionTool with(
      Info("y", EffectClass::kWrite), [](const ToolCall&) { return ToolOutcome::Succeeded({}); },
      [](const std::string&) {
        LookupOutcome o;
        o.kind = LookupKind::kNotApplied;
        return o;
      });
  EXPECT_TRUE(with.info().has_status);
  EXPECT_EQ(with.Lookup("k").kind, LookupKind::kNotApplied);
}

TEST(RetryPolicyTest, DefaultsByClass) {
  EXPECT_EQ(RetryPolicy::DefaultFor(EffectClass::kRead).max_attempts, 5);
  EXPECT_EQ(RetryPolicy::DefaultFor(EffectClass::kWrite).max_attempts, 2);
  EXPECT_EQ(RetryPolicy::MaxAttemptsCap(EffectClass::kWrite), 2);
  EXPECT_EQ(RetryPolicy::MaxAttemptsCap(EffectClass::kRead), 10);
}

TEST(RetryPolicyTest, FullJitterStaysUnderTheCappedCeiling) {
  RetryPolicy p{10, 100, 1000};
  std::mt19937_64 rng(42);
  for (int attempt = 2; attempt <= 10; ++attempt) {
    int64_t ceiling = std::min<int64_t>(1000, 100LL << (attempt - 2));
    bool saw_low = false;
    for (int i = 0; i < 200; ++i) {
      int64_t b = p.BackoffMs(attempt, rng);
      ASSERT_GE(b, 0);
      ASSERT_LE(b, ceiling);
      if (b < ceiling / 2) saw_low = true;
    }
    EXPECT_TRUE(saw_low) << "full jitter spreads down to zero";
  }
}

TEST(EffectClassTest, ParsesNames) {
  EXPECT_EQ(*ParseEffectClass("irreversible"), EffectClass::kIrreversible);
  EXPECT_FALSE(ParseEffectClass("writ").ok());
}

// "reason" goes with "compensate": null, and with "approval": "none" (why
// nobody approves an irreversible tool's calls); anywhere else it is refused.
TEST(OpenCallPolicyTest, AReasonSaysWhyNoCompensationOrWhyNoApproval) {
  OpenCallPolicy p;
  ASSERT_TRUE(
      ParseOpenCallPolicy({{"compensate", nullptr}, {"reason", "cannot unsend"}}, "tools[0]", &p)
          .ok());
  EXPECT_EQ(p.no_compensation_reason, "cannot unsend");
  EXPECT_EQ(p.no_approval_reason, "");
  OpenCallPolicy q;
  ASSERT_TRUE(ParseOpenCallPolicy({{"compensate", nullptr},
                                   {"approval", "none"},
                                   {"reason", "a receipt goes out whatever happens"}},
                                  "tools[1]", &q)
                  .ok());
  EXPECT_EQ(q.no_compensation_reason, "a receipt goes out whatever happens");
  EXPECT_EQ(q.no_approval_reason, "a receipt goes out whatever happens");
  OpenCallPolicy r;
  ASSERT_TRUE(
      ParseOpenCallPolicy(
          {{"compensate", {{"tool", "x.undo"}}}, {"approval", "none"}, {"reason", "small amounts"}},
          "tools[2]", &r)
          .ok());
  EXPECT_EQ(r.no_approval_reason, "small amounts");
  OpenCallPolicy bad;
  Status s = ParseOpenCallPolicy({{"compensate", {{"tool", "x.undo"}}}, {"reason", "why"}},
                                 "tools[3]", &bad);
  EXPECT_EQ(s.message(),
            "tools[3].reason: only with \"compensate\": null or \"approval\": \"none\"");
  s = ParseOpenCallPolicy({{"approval", "none"}, {"reason", ""}}, "tools[4]", &bad);
  EXPECT_EQ(s.message(), "tools[4].reason: expected a non-empty string");
}

}  // namespace
}  // namespace idem
