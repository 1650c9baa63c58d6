// One test per row of the saga transition table (saga/saga_machine.cc), plus
// refusals.

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
};

class SagaRowTest : public ::testing::TestWithParam<Row> {};

TEST_P(SagaRowTest, MovesAndEmits) {
  const Row& r = GetParam();
  SagaMachine m(r.from);
  ASSERT_EQ(m.state(), r.from);
  auto cmds = m.Fire(r.event);
  ASSERT_OK(cmds);
  EXPECT_EQ(m.state(), r.to);
  EXPECT_EQ(*cmds, r.commands);
}

using S = SagaState;
using E = SagaEvent;
using C = SagaCommand;

INSTANTIATE_TEST_SUITE_P(
    Table, SagaRowTest,
    ::testing::Values(
        Row{S::kPending, E::kStarted, S::kRunning, {C::kRunNextStep}},
        Row{S::kPending, E::kCancelRequested, S::kCancelled, {C::kRecordTerminal}},
        Row{S::kRunning, E::kStepCompletedMore, S::kRunning, {C::kRunNextStep}},
        Row{S::kRunning, E::kStepCompletedLast, S::kSucceeded, {C::kRecordTerminal}},
        Row{S::kRunning, E::kStepFailedUndo, S::kCompensating, {C::kUndoNextStep}},
        Row{S::kRunning, E::kStepFailedNothing, S::kFailed, {C::kRecordTerminal}},
        Row{S::kRunning, E::kStepParked, S::kNeedsAttention, {C::kRecordParked}},
        Row{S::kRunning, E::kCancelRequested, S::kCompensating, {C::kUndoNextStep}},
        Row{S::kCompensating, E::kUndoCompletedMore, S::kCompensating, {C::kUndoNextStep}},
        Row{S::kCompensating, E::kUndoCompletedLast, S::kCompensated, {C::kRecordTerminal}},
        Row{S::kCompensating, E::kUndoParked, S::kNeedsAttention, {C::kRecordParked}},
        Row{S::kNeedsAttention, E::kOperatorResumed, S::kRunning, {C::kRunNextStep}},
        Row{S::kNeedsAttention, E::kOperatorResumedUndo, S::kCompensating, {C::kUndoNextStep}},
        Row{S::kRunning, E::kStepAwaitingApproval, S::kAwaitingApproval, {C::kRecordWaiting}},
        Row{S::kAwaitingApproval, E::kApprovalSettled, S::kRunning, {C::kRunNextStep}}),
    [](const auto& info) {
      return std::string(SagaStateName(info.param.from)) + "_" + SagaEventName(info.param.event);
    });

TEST(SagaMachineTest, RestoresEveryState) {
  for (int i = 0; i <= static_cast<int>(S::kNeedsAttention); ++i) {
    SagaMachine m(static_cast<S>(i));
    EXPECT_EQ(m.state(), static_cast<S>(i)) << SagaStateName(static_cast<S>(i));
  }
}

struct Refusal {
  SagaState from;
  SagaEvent event;
};

class SagaRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(SagaRefusalTest, IllegalTransitionIsRefusedAndStateKept) {
  const Refusal& r = GetParam();
  SagaMachine m(r.from);
  auto cmds = m.Fire(r.event);
  ASSERT_FALSE(cmds.ok());
  EXPECT_EQ(cmds.status().code(), Code::kIllegalTransition);
  EXPECT_EQ(m.state(), r.from);
}

INSTANTIATE_TEST_SUITE_P(Illegal, SagaRefusalTest,
                         ::testing::Values(Refusal{S::kSucceeded, E::kStepFailedUndo},
                                           Refusal{S::kCompensated, E::kStarted},
                                           Refusal{S::kPending, E::kStepCompletedLast},
                                           Refusal{S::kCompensating, E::kStepCompletedMore},
                                           Refusal{S::kNeedsAttention, E::kStarted},
                                           Refusal{S::kFailed, E::kUndoCompletedLast},
                                           Refusal{S::kRunning, E::kOperatorResumed},
                                           Refusal{S::kSucceeded, E::kOperatorResumedUndo},
                                           Refusal{S::kAwaitingApproval, E::kStepCompletedLast},
                                           Refusal{S::kPending, E::kApprovalSettled}),
                         [](const auto& info) {
                           return std::string(SagaStateName(info.param.from)) + "_" +
                                  SagaEventName(info.param.event);
                         });

}  // namespace
}  // namespace idem
