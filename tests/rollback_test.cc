// The rollback planner (compensation/rollback.h) on its own: which step a
// rollback visits next, what it passes over, and the compensation key. The
// steps are journal records as the engine keeps them; which ones have a
// compensation comes from a parsed spec, as in the engine.

#include "compensation/rollback.h"

#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"
#include "tools/tool.h"

namespace idem::compensation {
namespace {

const char* ActionName(UndoAction a) {
  switch (a) {
    case UndoAction::kResolveFirst:
      return "resolve first";
    case UndoAction::kCompensate:
      return "compensate";
    case UndoAction::kParked:
      return "parked";
  }
  return "?";
}

/// Matches a NextUndo answer: step `index`, with `action`.
MATCHER_P2(Visits, index, action,
           std::string("visits step ") + std::to_string(index) + " (" + ActionName(action) + ")") {
  if (!arg.has_value()) {
    *result_listener << "nothing is left to visit";
    return false;
  }
  *result_listener << "visits step " << arg->index << " (" << ActionName(arg->action) << ")";
  return arg->index == index && arg->action == action;
}

// A trip: reserve (write, undone by cancel), lookup (a read: nothing to
// undo), notify (irreversible, `"compensate": null` with a reason), charge
// (write, undone by refund).
class RollbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Add("flights.reserve", EffectClass::kWrite);
    Add("flights.cancel", EffectClass::kIdempotent);
    Add("weather.lookup", EffectClass::kRead);
    Add("email.send", EffectClass::kIrreversible);
    Add("payments.charge", EffectClass::kWrite);
    Add("payments.refund", EffectClass::kIdempotent);
    Json doc = {{"name", "trip"},
                {"steps",
                 {{{"id", "reserve"},
                   {"tool", "flights.reserve"},
                   {"compensate", {{"tool", "flights.cancel"}}}},
                  {{"id", "lookup"}, {"tool", "weather.lookup"}},
                  {{"id", "notify"},
                   {"tool", "email.send"},
                   {"compensate", nullptr},
                   {"reason", "an email cannot be unsent"},
                   {"approval", "none"}},
                  {{"id", "charge"},
                   {"tool", "payments.charge"},
                   {"compensate", {{"tool", "payments.refund"}}}}}}};
    ASSERT_OK_AND_ASSIGN(SagaSpec spec, ParseSpec(doc, tools_));
    // What the engine passes (saga/engine.cc): a step has a compensation
    // when its spec names one.
    for (const StepSpec& s : spec.steps) compensable_.push_back(s.compensate.has_value());
  }

  void Add(const std::string& name, EffectClass effect) {
    ToolInfo info;
    info.name = name;
    info.effect = effect;
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        info, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); })));
  }

  /// The four steps in `states`, keyed like the engine's.
  static std::vector<storage::StepRecord> Steps(const std::vector<std::string>& states) {
    static const char* const kIds[] = {"reserve", "lookup", "notify", "charge"};
    std::vector<storage::StepRecord> steps;
    for (size_t i = 0; i < states.size(); ++i) {
      storage::StepRecord st;
      st.saga_id = "sg_1";
      st.index = static_cast<int>(i);
      st.step_id = kIds[i];
      st.step_key = "sg_1/" + st.step_id;
      st.state = states[i];
      steps.push_back(st);
    }
    return steps;
  }

  /// Visits the steps as the engine does: the next item, then that step
  /// moves to `compensated` (its undo succeeded); returns the indexes
  /// compensated, in order, and sets `*stopped_at` to the first item that is
  /// not kCompensate (nullopt when the walk ended).
  static std::vector<int> CompensateAll(std::vector<storage::StepRecord> steps,
                                        const std::vector<bool>& compensable,
                                        std::optional<UndoItem>* stopped_at) {
    std::vector<int> order;
    std::optional<UndoItem> item;
    for (item = NextUndo(steps, compensable); item && item->action == UndoAction::kCompensate;
         item = NextUndo(steps, compensable)) {
      order.push_back(item->index);
      steps[item->index].state = "compensated";
    }
    *stopped_at = item;
    return order;
  }

  ToolRegistry tools_;
  std::vector<bool> compensable_;
};

TEST_F(RollbackTest, TheSpecSaysWhichStepsHaveACompensation) {
  EXPECT_EQ(compensable_, (std::vector<bool>{true, false, false, true}));
}

TEST_F(RollbackTest, UndoesSucceededStepsInReverseOrder) {
  auto steps = Steps({"succeeded", "succeeded", "succeeded", "succeeded"});
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(3, UndoAction::kCompensate));
  std::optional<UndoItem> stopped;
  EXPECT_EQ(CompensateAll(steps, compensable_, &stopped), (std::vector<int>{3, 0}));
  EXPECT_FALSE(stopped.has_value());
}

TEST_F(RollbackTest, ReverseOrderHoldsWhenEveryStepHasACompensation) {
  std::vector<bool> all(4, true);
  auto steps = Steps({"succeeded", "succeeded", "succeeded", "succeeded"});
  std::optional<UndoItem> stopped;
  EXPECT_EQ(CompensateAll(steps, all, &stopped), (std::vector<int>{3, 2, 1, 0}));
  EXPECT_FALSE(stopped.has_value());
}

TEST_F(RollbackTest, SkipsStepsWithoutEffects) {
  // The failing step and the ones that never ran left nothing to undo.
  auto steps = Steps({"succeeded", "failed", "planned", "planned"});
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(0, UndoAction::kCompensate));
  // A two-phase step that only previewed, or waits for a person, did nothing.
  std::vector<bool> all(4, true);
  auto previewed = Steps({"succeeded", "previewed", "awaiting_approval", "failed"});
  EXPECT_THAT(NextUndo(previewed, all), Visits(0, UndoAction::kCompensate));
}

TEST_F(RollbackTest, PassesOverReadsAndListsThem) {
  auto steps = Steps({"failed", "succeeded", "planned", "planned"});
  EXPECT_EQ(NextUndo(steps, compensable_), std::nullopt);
  EXPECT_FALSE(HasEffectsToUndo(steps, compensable_));
  EXPECT_EQ(SkippedByRollback(steps, compensable_), (std::vector<int>{1}));
}

TEST_F(RollbackTest, PassesOverANullCompensationWithItsReasonAndListsIt) {
  auto steps = Steps({"succeeded", "succeeded", "succeeded", "failed"});
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(0, UndoAction::kCompensate))
      << "notify (compensate: null) and lookup (a read) are passed over";
  // Listed, last step first, so the journal drops nothing silently.
  EXPECT_EQ(SkippedByRollback(steps, compensable_), (std::vector<int>{2, 1}));
}

TEST_F(RollbackTest, ResolvesAnUncertainStepBeforeUndoingAnythingEarlier) {
  for (const char* uncertain : {"submitted", "unknown"}) {
    SCOPED_TRACE(uncertain);
    auto steps = Steps({"succeeded", "succeeded", "succeeded", uncertain});
    EXPECT_THAT(NextUndo(steps, compensable_), Visits(3, UndoAction::kResolveFirst));
    EXPECT_TRUE(HasEffectsToUndo(steps, compensable_));
  }
}

TEST_F(RollbackTest, AnUncertainStepIsResolvedEvenWithoutACompensation) {
  // notify has `"compensate": null`; its outcome must still be settled, not
  // passed over blind.
  auto steps = Steps({"succeeded", "succeeded", "unknown", "planned"});
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(2, UndoAction::kResolveFirst));
  // Once it resolved as never applied (failed), the walk goes on to reserve.
  steps[2].state = "failed";
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(0, UndoAction::kCompensate));
}

TEST_F(RollbackTest, LaterSucceededStepsAreUndoneBeforeAnEarlierUncertainOne) {
  std::vector<bool> all(4, true);
  auto steps = Steps({"succeeded", "submitted", "succeeded", "succeeded"});
  std::optional<UndoItem> stopped;
  EXPECT_EQ(CompensateAll(steps, all, &stopped), (std::vector<int>{3, 2}));
  EXPECT_THAT(stopped, Visits(1, UndoAction::kResolveFirst));
}

TEST_F(RollbackTest, AlreadyCompensatedStepsAreNotUndoneAgain) {
  auto steps = Steps({"succeeded", "succeeded", "succeeded", "compensated"});
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(0, UndoAction::kCompensate));
  steps[0].state = "compensated";
  EXPECT_EQ(NextUndo(steps, compensable_), std::nullopt);
  EXPECT_FALSE(HasEffectsToUndo(steps, compensable_));
}

TEST_F(RollbackTest, ACompensationInProgressIsVisitedAgain) {
  // A crash during an undo leaves the step compensating: the walk resumes
  // it (with the same compensation key) before anything earlier.
  auto steps = Steps({"succeeded", "succeeded", "succeeded", "compensating"});
  EXPECT_THAT(NextUndo(steps, compensable_), Visits(3, UndoAction::kCompensate));
}

TEST_F(RollbackTest, AParkedStepStopsTheWalkForAPerson) {
  for (const char* parked : {"needs_attention", "compensation_failed"}) {
    SCOPED_TRACE(parked);
    auto steps = Steps({"succeeded", "succeeded", "succeeded", parked});
    EXPECT_THAT(NextUndo(steps, compensable_), Visits(3, UndoAction::kParked));
  }
}

TEST_F(RollbackTest, AnEmptySagaHasNothingToUndo) {
  std::vector<storage::StepRecord> none;
  EXPECT_EQ(NextUndo(none, {}), std::nullopt);
  EXPECT_FALSE(HasEffectsToUndo(none, {}));
  EXPECT_TRUE(SkippedByRollback(none, {}).empty());
  // Nor does a saga none of whose steps ran.
  auto planned = Steps({"planned", "planned", "planned", "planned"});
  EXPECT_EQ(NextUndo(planned, compensable_), std::nullopt);
  EXPECT_TRUE(SkippedByRollback(planned, compensable_).empty());
}

TEST_F(RollbackTest, AStepBeyondTheCompensableListHasNoCompensation) {
  auto steps = Steps({"succeeded", "succeeded"});
  EXPECT_EQ(NextUndo(steps, {}), std::nullopt);
  EXPECT_EQ(SkippedByRollback(steps, {}), (std::vector<int>{1, 0}));
}

TEST(CompensationKeyTest, IsTheStepKeyWithASuffix) {
  EXPECT_EQ(CompensationKey("sg_1/reserve"), "sg_1/reserve:compensate");
  EXPECT_NE(CompensationKey("sg_1/reserve"), CompensationKey("sg_1/charge"));
}

}  // namespace
}  // namespace idem::compensation
