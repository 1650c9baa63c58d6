// One test per row of the step transition table (saga/step_machine.cc), plus
// refusals: an event with no row is refused and leaves the state unchanged.

#include <gtest/gtest.h>

#include "saga/machines.h"
#include "tests/test_util.h"

namespace idem {
namespace {

struct Row {
  StepState from;
  StepEvent event;
  StepState to;
  std::vector<StepCommand> commands;
};

class StepRowTest : public ::testing::TestWithParam<Row> {};

TEST_P(StepRowTest, MovesAndEmits) {
  const Row& r = GetParam();
  StepMachine m(r.from);
  ASSERT_EQ(m.state(), r.from);
  auto cmds = m.Fire(r.event);
  ASSERT_OK(cmds);
  EXPECT_EQ(m.state(), r.to);
  EXPECT_EQ(*cmds, r.commands);
}

using S = StepState;
using E = StepEvent;
using C = StepCommand;

INSTANTIATE_TEST_SUITE_P(
    Table, StepRowTest,
    ::testing::Values(
        Row{S::kPlanned, E::kSubmitted, S::kSubmitted, {C::kCallTool}},
        Row{S::kPlanned, E::kFailedFinal, S::kFailed, {C::kRecordFailed}},
        Row{S::kSubmitted, E::kSucceeded, S::kSucceeded, {C::kRecordSucceeded}},
        Row{S::kSubmitted, E::kFailedRetryable, S::kSubmitted, {C::kScheduleRetry}},
        Row{S::kSubmitted, E::kFailedFinal, S::kFailed, {C::kRecordFailed}},
        Row{S::kSubmitted, E::kOutcomeUnknown, S::kUnknown, {C::kResolveOutcome}},
        Row{S::kUnknown, E::kResolvedApplied, S::kSucceeded, {C::kRecordSucceeded}},
        Row{S::kUnknown, E::kResolvedRetry, S::kSubmitted, {C::kScheduleRetry}},
        Row{S::kUnknown, E::kResolvedNotApplied, S::kFailed, {C::kRecordFailed}},
        Row{S::kUnknown, E::kUnresolvable, S::kNeedsAttention, {C::kParkStep}},
        Row{S::kSucceeded, E::kRollbackStarted, S::kCompensating, {C::kCallCompensation}},
        Row{S::kCompensating, E::kUndone, S::kCompensated, {C::kRecordUndone}},
        Row{S::kCompensating, E::kUndoFailedRetryable, S::kCompensating, {C::kScheduleUndoRetry}},
        Row{S::kCompensating, E::kUndoFailedFinal, S::kCompensationFailed, {C::kParkStep}},
        Row{S::kNeedsAttention, E::kOperatorApplied, S::kSucceeded, {C::kRecordSucceeded}},
        Row{S::kNeedsAttention, E::kOperatorNotApplied, S::kFailed, {C::kRecordFailed}},
        Row{S::kNeedsAttention, E::kOperatorRetry, S::kPlanned, {}},
        Row{S::kCompensationFailed, E::kOperatorUndone, S::kCompensated, {C::kRecordUndone}},
        Row{S::kCompensationFailed,
            E::kOperatorRetryUndo,
            S::kCompensating,
            {C::kCallCompensation}},
        Row{S::kPlanned, E::kPreviewRecorded, S::kPreviewed, {}},
        Row{S::kPreviewed, E::kApprovalRequested, S::kAwaitingApproval, {}},
        Row{S::kPreviewed, E::kTokenConsumed, S::kSubmitted, {C::kCallTool}},
        Row{S::kPreviewed, E::kExpiredRePreview, S::kPlanned, {}},
        Row{S::kPreviewed, E::kFailedFinal, S::kFailed, {C::kRecordFailed}},
        Row{S::kAwaitingApproval, E::kApproved, S::kSubmitted, {C::kCallTool}},
        Row{S::kAwaitingApproval, E::kRejected, S::kFailed, {C::kRecordFailed}},
        Row{S::kAwaitingApproval, E::kExpiredRePreview, S::kPlanned, {}},
        Row{S::kAwaitingApproval, E::kExpiredRollback, S::kFailed, {C::kRecordFailed}},
        Row{S::kSubmitted, E::kStaleRePreview, S::kPlanned, {}}),
    [](const auto& info) {
      return std::string(StepStateName(info.param.from)) + "_" + StepEventName(info.param.event);
    });

TEST(StepMachineTest, RestoresEveryState) {
  for (int i = 0; i <= static_cast<int>(S::kNeedsAttention); ++i) {
    StepMachine m(static_cast<S>(i));
    EXPECT_EQ(m.state(), static_cast<S>(i)) << StepStateName(static_cast<S>(i));
  }
}

struct Refusal {
  StepState from;
  StepEvent event;
};

class StepRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(StepRefusalTest, IllegalTransitionIsRefusedAndStateKept) {
  const Refusal& r = GetParam();
  StepMachine m(r.from);
  auto cmds = m.Fire(r.event);
  ASSERT_FALSE(cmds.ok());
  EXPECT_EQ(cmds.status().code(), Code::kIllegalTransition);
  EXPECT_NE(cmds.status().message().find(StepEventName(r.event)), std::string::npos);
  EXPECT_EQ(m.state(), r.from);
}

INSTANTIATE_TEST_SUITE_P(
    Illegal, StepRefusalTest,
    ::testing::Values(
        // A planned step cannot succeed without being submitted first.
        Refusal{S::kPlanned, E::kSucceeded},
        // Never compensate an unknown outcome before resolving it.
        Refusal{S::kUnknown, E::kRollbackStarted},
        // An unknown outcome cannot become a fresh, unkeyed call.
        Refusal{S::kUnknown, E::kSubmitted},
        // A failed step had no effect: nothing to compensate.
        Refusal{S::kFailed, E::kRollbackStarted},
        // Done means done.
        Refusal{S::kCompensated, E::kRollbackStarted}, Refusal{S::kSucceeded, E::kSubmitted},
        Refusal{S::kNeedsAttention, E::kSubmitted}, Refusal{S::kSubmitted, E::kUndone},
        Refusal{S::kCompensationFailed, E::kUndone},
        // Operators resolve parked steps only.
        Refusal{S::kSucceeded, E::kOperatorApplied}, Refusal{S::kUnknown, E::kOperatorNotApplied},
        Refusal{S::kNeedsAttention, E::kOperatorUndone},
        Refusal{S::kCompensated, E::kOperatorRetryUndo},
        // A commit needs its approval: from awaiting_approval only kApproved
        // leads to a call, and only a waiting step can be approved.
        Refusal{S::kAwaitingApproval, E::kTokenConsumed},
        Refusal{S::kAwaitingApproval, E::kSubmitted}, Refusal{S::kPlanned, E::kApproved},
        Refusal{S::kSucceeded, E::kApproved}, Refusal{S::kSubmitted, E::kRejected},
        Refusal{S::kPlanned, E::kTokenConsumed}),
    [](const auto& info) {
      return std::string(StepStateName(info.param.from)) + "_" + StepEventName(info.param.event);
    });

}  // namespace
}  // namespace idem
