// One test per row of the saga transition table (saga/saga_machine.cc), plus
// refusals. A guarded row is tested with the facts that satisfy its guard.

#include <gtest/gtest.h>

#include "saga/machines.h"
#include "tests/test_util.h"

namespace idem {
namespace {

struct Row {
  SagaState from;
  SagaEvent event;
  SagaState to;
  std::vector<SagaCommand> commands;
  SagaFacts facts = {};
};

// The facts a row's guard reads, for the test's name ("" when none hold).
std::string FactsSuffix(const SagaFacts& f) {
  std::string s;
  if (f.more_steps) s += "_if_more_steps";
  if (f.effects_to_undo) s += "_if_effects_to_undo";
  if (f.rolling_back) s += "_if_rolling_back";
  return s;
}

class SagaRowTest : public ::testing::TestWithParam<Row> {};

TEST_P(SagaRowTest, MovesAndEmits) {
  const Row& r = GetParam();
  SagaMachine m(r.from);
  ASSERT_EQ(m.state(), r.from);
  auto cmds = m.Fire(r.event, r.facts);
  ASSERT_OK(cmds);
  EXPECT_EQ(m.state(), r.to);
  EXPECT_EQ(*cmds, r.commands);
}

using S = SagaState;
using E = SagaEvent;
using C = SagaCommand;
const SagaFacts kMoreSteps = SagaFacts::WithMoreSteps(true);
const SagaFacts kEffectsToUndo = SagaFacts::WithEffectsToUndo(true);
const SagaFacts kRollingBack = SagaFacts::WithRollingBack(true);

INSTANTIATE_TEST_SUITE_P(
    Table, SagaRowTest,
    ::testing::Values(
        Row{S::kPending, E::kStarted, S::kRunning, {C::kRunNextStep}},
        Row{S::kPending, E::kCancelRequested, S::kCancelled, {C::kRecordTerminal}},
        Row{S::kRunning, E::kStepCompleted, S::kRunning, {C::kRunNextStep}, kMoreSteps},
        Row{S::kRunning, E::kStepCompleted, S::kSucceeded, {C::kRecordTerminal}},
        Row{S::kRunning, E::kStepFailed, S::kCompensating, {C::kUndoNextStep}, kEffectsToUndo},
        Row{S::kRunning, E::kStepFailed, S::kFailed, {C::kRecordTerminal}},
        Row{S::kRunning, E::kStepParked, S::kNeedsAttention, {C::kRecordParked}},
        Row{S::kRunning, E::kCancelRequested, S::kCompensating, {C::kUndoNextStep}},
        Row{S::kCompensating, E::kUndoCompleted, S::kCompensating, {C::kUndoNextStep}, kMoreSteps},
        Row{S::kCompensating, E::kUndoCompleted, S::kCompensated, {C::kRecordTerminal}},
        Row{S::kCompensating, E::kUndoParked, S::kNeedsAttention, {C::kRecordParked}},
        Row{S::kNeedsAttention, E::kOperatorResumed, S::kRunning, {C::kRunNextStep}},
        Row{S::kNeedsAttention,
            E::kOperatorResumed,
            S::kCompensating,
            {C::kUndoNextStep},
            kRollingBack},
        Row{S::kRunning, E::kStepAwaitingApproval, S::kAwaitingApproval, {C::kRecordWaiting}},
        Row{S::kAwaitingApproval, E::kApprovalSettled, S::kRunning, {C::kRunNextStep}},
        Row{S::kPending, E::kPauseRequested, S::kPaused, {C::kRecordParked}},
        Row{S::kRunning, E::kPauseRequested, S::kPaused, {C::kRecordParked}},
        Row{S::kCompensating, E::kPauseRequested, S::kPaused, {C::kRecordParked}},
        Row{S::kPaused, E::kResumed, S::kRunning, {C::kRunNextStep}},
        Row{S::kPaused, E::kResumed, S::kCompensating, {C::kUndoNextStep}, kRollingBack},
        Row{S::kPaused, E::kCancelRequested, S::kCompensating, {C::kUndoNextStep}, kEffectsToUndo},
        Row{S::kPaused, E::kCancelRequested, S::kCancelled, {C::kRecordTerminal}}),
    [](const auto& info) {
      return std::string(SagaStateName(info.param.from)) + "_" + SagaEventName(info.param.event) +
             FactsSuffix(info.param.facts);
    });

TEST(SagaMachineTest, RestoresEveryState) {
  for (int i = 0; i <= static_cast<int>(S::kPaused); ++i) {
    SagaMachine m(static_cast<S>(i));
    EXPECT_EQ(m.state(), static_cast<S>(i)) << SagaStateName(static_cast<S>(i));
  }
}

struct Refusal {
  SagaState from;
  SagaEvent event;
  SagaFacts facts = {};
};

class SagaRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(SagaRefusalTest, IllegalTransitionIsRefusedAndStateKept) {
  const Refusal& r = GetParam();
  SagaMachine m(r.from);
  auto cmds = m.Fire(r.event, r.facts);
  ASSERT_FALSE(cmds.ok());
  EXPECT_EQ(cmds.status().code(), Code::kIllegalTransition);
  EXPECT_EQ(m.state(), r.from);
}

INSTANTIATE_TEST_SUITE_P(
    Illegal, SagaRefusalTest,
    ::testing::Values(
        Refusal{S::kSucceeded, E::kStepFailed, kEffectsToUndo},
        Refusal{S::kCompensated, E::kStarted}, Refusal{S::kPending, E::kStepCompleted},
        Refusal{S::kCompensating, E::kStepCompleted, kMoreSteps},
        Refusal{S::kNeedsAttention, E::kStarted}, Refusal{S::kFailed, E::kUndoCompleted},
        Refusal{S::kRunning, E::kOperatorResumed},
        Refusal{S::kSucceeded, E::kOperatorResumed, kRollingBack},
        Refusal{S::kAwaitingApproval, E::kStepCompleted}, Refusal{S::kPending, E::kApprovalSettled},
        // Facts choose among a state's rows; they never open a row elsewhere.
        Refusal{S::kRunning, E::kUndoCompleted, kMoreSteps},
        Refusal{S::kRunning, E::kOperatorResumed, kRollingBack},
        // Pause and resume: only a saga a drive would move pauses; only a
        // paused one resumes; a paused one does not start.
        Refusal{S::kSucceeded, E::kPauseRequested}, Refusal{S::kNeedsAttention, E::kPauseRequested},
        Refusal{S::kAwaitingApproval, E::kPauseRequested}, Refusal{S::kRunning, E::kResumed},
        Refusal{S::kPaused, E::kStarted}, Refusal{S::kPaused, E::kPauseRequested},
        Refusal{S::kCompensated, E::kCancelRequested}),
    [](const auto& info) {
      return std::string(SagaStateName(info.param.from)) + "_" + SagaEventName(info.param.event) +
             FactsSuffix(info.param.facts);
    });

}  // namespace
}  // namespace idem
