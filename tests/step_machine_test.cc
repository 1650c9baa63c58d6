// One test per row of the step transition table (saga/step_machine.cc), plus
// refusals: an event with no row is refused and leaves the state unchanged.
// A guarded row is tested with the facts that satisfy its guard.

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
  StepFacts facts = {};
};

// The facts a row's guard reads, for the test's name ("" when none hold).
std::string FactsSuffix(const StepFacts& f) {
  std::string s;
  if (f.retry_allowed) s += "_if_retry_allowed";
  if (f.re_preview) s += "_if_re_preview";
  return s;
}

class StepRowTest : public ::testing::TestWithParam<Row> {};

TEST_P(StepRowTest, MovesAndEmits) {
  const Row& r = GetParam();
  StepMachine m(r.from);
  ASSERT_EQ(m.state(), r.from);
  auto cmds = m.Fire(r.event, r.facts);
  ASSERT_OK(cmds);
  EXPECT_EQ(m.state(), r.to);
  EXPECT_EQ(*cmds, r.commands);
}

using S = StepState;
using E = StepEvent;
using C = StepCommand;
const StepFacts kRetryAllowed = StepFacts::WithRetryAllowed(true);
const StepFacts kRePreview = StepFacts::WithRePreview(true);

INSTANTIATE_TEST_SUITE_P(
    Table, StepRowTest,
    ::testing::Values(
        Row{S::kPlanned, E::kSubmitted, S::kSubmitted, {C::kCallTool}},
        Row{S::kPlanned, E::kFailed, S::kFailed, {C::kRecordFailed}},
        Row{S::kSubmitted, E::kSucceeded, S::kSucceeded, {C::kRecordSucceeded}},
        Row{S::kSubmitted, E::kFailed, S::kSubmitted, {C::kScheduleRetry}, kRetryAllowed},
        Row{S::kSubmitted, E::kFailed, S::kFailed, {C::kRecordFailed}},
        Row{S::kSubmitted, E::kOutcomeUnknown, S::kUnknown, {C::kResolveOutcome}},
        Row{S::kUnknown, E::kResolvedApplied, S::kSucceeded, {C::kRecordSucceeded}},
        Row{S::kUnknown, E::kResolvedRetry, S::kSubmitted, {C::kScheduleRetry}},
        Row{S::kUnknown, E::kResolvedNotApplied, S::kFailed, {C::kRecordFailed}},
        Row{S::kUnknown, E::kUnresolvable, S::kNeedsAttention, {C::kParkStep}},
        Row{S::kSucceeded, E::kRollbackStarted, S::kCompensating, {C::kCallCompensation}},
        Row{S::kCompensating, E::kUndone, S::kCompensated, {C::kRecordUndone}},
        Row{S::kCompensating,
            E::kUndoFailed,
            S::kCompensating,
            {C::kScheduleUndoRetry},
            kRetryAllowed},
        Row{S::kCompensating, E::kUndoFailed, S::kCompensationFailed, {C::kParkStep}},
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
        Row{S::kPreviewed, E::kExpired, S::kPlanned, {}},
        Row{S::kPreviewed, E::kFailed, S::kFailed, {C::kRecordFailed}},
        Row{S::kAwaitingApproval, E::kApproved, S::kSubmitted, {C::kCallTool}},
        Row{S::kAwaitingApproval, E::kRejected, S::kFailed, {C::kRecordFailed}},
        Row{S::kAwaitingApproval, E::kExpired, S::kPlanned, {}, kRePreview},
        Row{S::kAwaitingApproval, E::kExpired, S::kFailed, {C::kRecordFailed}},
        Row{S::kSubmitted, E::kStaleRePreview, S::kPlanned, {}},
        Row{S::kPlanned, E::kBlocked, S::kNeedsAttention, {C::kParkStep}},
        Row{S::kSubmitted, E::kBlocked, S::kNeedsAttention, {C::kParkStep}},
        Row{S::kUnknown, E::kBlocked, S::kNeedsAttention, {C::kParkStep}},
        Row{S::kSucceeded, E::kBlocked, S::kCompensationFailed, {C::kParkStep}},
        Row{S::kCompensating, E::kBlocked, S::kCompensationFailed, {C::kParkStep}}),
    [](const auto& info) {
      return std::string(StepStateName(info.param.from)) + "_" + StepEventName(info.param.event) +
             FactsSuffix(info.param.facts);
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
  StepFacts facts = {};
};

class StepRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(StepRefusalTest, IllegalTransitionIsRefusedAndStateKept) {
  const Refusal& r = GetParam();
  StepMachine m(r.from);
  auto cmds = m.Fire(r.event, r.facts);
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
        // A settled step is never blocked: nothing is left to drive in it.
        Refusal{S::kFailed, E::kBlocked}, Refusal{S::kCompensated, E::kBlocked},
        Refusal{S::kNeedsAttention, E::kBlocked},
        // A commit needs its approval: from awaiting_approval only kApproved
        // leads to a call, and only a waiting step can be approved.
        Refusal{S::kAwaitingApproval, E::kTokenConsumed},
        Refusal{S::kAwaitingApproval, E::kSubmitted}, Refusal{S::kPlanned, E::kApproved},
        Refusal{S::kSucceeded, E::kApproved}, Refusal{S::kSubmitted, E::kRejected},
        Refusal{S::kPlanned, E::kTokenConsumed},
        // Facts choose among a state's rows; they never open a row elsewhere.
        Refusal{S::kCompensated, E::kUndoFailed, kRetryAllowed},
        Refusal{S::kFailed, E::kFailed, kRetryAllowed},
        Refusal{S::kPlanned, E::kExpired, kRePreview}),
    [](const auto& info) {
      return std::string(StepStateName(info.param.from)) + "_" + StepEventName(info.param.event) +
             FactsSuffix(info.param.facts);
    });

}  // namespace
}  // namespace idem
