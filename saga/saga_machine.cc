// The saga state machine: one Boost.MSM functor table, no I/O.
// Restored from a persisted state the same way as the step machine.

// The tables have more rows than MPL's preprocessed default of 20.
#define BOOST_MPL_CFG_NO_PREPROCESSED_HEADERS
#define BOOST_MPL_LIMIT_VECTOR_SIZE 30
#define BOOST_MPL_LIMIT_MAP_SIZE 30
#include <boost/msm/back/state_machine.hpp>
#include <boost/msm/front/functor_row.hpp>
#include <boost/msm/front/state_machine_def.hpp>

#include "saga/machines.h"

namespace idem {
namespace {

namespace msm = boost::msm;
namespace msmf = boost::msm::front;
namespace mpl = boost::mpl;

// ---- events
struct Restore {
  SagaState target;
};
struct Started {};
struct StepCompletedMore {};
struct StepCompletedLast {};
struct StepFailedUndo {};
struct StepFailedNothing {};
struct StepParked {};
struct CancelRequested {};
struct UndoCompletedMore {};
struct UndoCompletedLast {};
struct UndoParked {};
struct OperatorResumed {};
struct OperatorResumedUndo {};
struct StepAwaitingApproval {};
struct ApprovalSettled {};

// ---- states
template <SagaState S>
struct SagaStateT : msmf::state<> {
  template <class Event, class Fsm>
  void on_entry(const Event&, Fsm& fsm) {
    fsm.current = S;
  }
};
struct Restoring : msmf::state<> {};
using Pending = SagaStateT<SagaState::kPending>;
using Running = SagaStateT<SagaState::kRunning>;
using AwaitingApproval = SagaStateT<SagaState::kAwaitingApproval>;
using SucceededS = SagaStateT<SagaState::kSucceeded>;
using Compensating = SagaStateT<SagaState::kCompensating>;
using Compensated = SagaStateT<SagaState::kCompensated>;
using FailedS = SagaStateT<SagaState::kFailed>;
using Cancelled = SagaStateT<SagaState::kCancelled>;
using NeedsAttention = SagaStateT<SagaState::kNeedsAttention>;

// ---- actions
template <SagaCommand C>
struct Emit {
  template <class Event, class Fsm, class Source, class Target>
  void operator()(const Event&, Fsm& fsm, Source&, Target&) {
    fsm.commands.push_back(C);
  }
};
using RunNextStep = Emit<SagaCommand::kRunNextStep>;
using UndoNextStep = Emit<SagaCommand::kUndoNextStep>;
using RecordTerminal = Emit<SagaCommand::kRecordTerminal>;
using RecordParked = Emit<SagaCommand::kRecordParked>;
using RecordWaiting = Emit<SagaCommand::kRecordWaiting>;

// ---- guards
template <SagaState S>
struct RestoresTo {
  template <class Event, class Fsm, class Source, class Target>
  bool operator()(const Event& e, Fsm&, Source&, Target&) {
    return e.target == S;
  }
};

struct SagaMachineDef : msmf::state_machine_def<SagaMachineDef> {
  using initial_state = Restoring;

  SagaState current = SagaState::kPending;
  std::vector<SagaCommand> commands;
  bool refused = false;

  using none = msmf::none;
  // clang-format off
  struct transition_table : mpl::vector<
  //          Start            Event              Target            Action          Guard
  //         +----------------+------------------+-----------------+---------------+--------------------------------------+
  msmf::Row < Restoring       , Restore          , Pending         , none          , RestoresTo<SagaState::kPending>          >,
  msmf::Row < Restoring       , Restore          , Running         , none          , RestoresTo<SagaState::kRunning>          >,
  msmf::Row < Restoring       , Restore          , AwaitingApproval, none          , RestoresTo<SagaState::kAwaitingApproval> >,
  msmf::Row < Restoring       , Restore          , SucceededS      , none          , RestoresTo<SagaState::kSucceeded>        >,
  msmf::Row < Restoring       , Restore          , Compensating    , none          , RestoresTo<SagaState::kCompensating>     >,
  msmf::Row < Restoring       , Restore          , Compensated     , none          , RestoresTo<SagaState::kCompensated>      >,
  msmf::Row < Restoring       , Restore          , FailedS         , none          , RestoresTo<SagaState::kFailed>           >,
  msmf::Row < Restoring       , Restore          , Cancelled       , none          , RestoresTo<SagaState::kCancelled>        >,
  msmf::Row < Restoring       , Restore          , NeedsAttention  , none          , RestoresTo<SagaState::kNeedsAttention>   >,
  //         +----------------+------------------+-----------------+---------------+--------------------------------------+
  msmf::Row < Pending         , Started          , Running         , RunNextStep   , none >,
  msmf::Row < Pending         , CancelRequested  , Cancelled       , RecordTerminal, none >,
  msmf::Row < Running         , StepCompletedMore, Running         , RunNextStep   , none >,
  msmf::Row < Running         , StepCompletedLast, SucceededS      , RecordTerminal, none >,
  msmf::Row < Running         , StepFailedUndo   , Compensating    , UndoNextStep  , none >,
  msmf::Row < Running         , StepFailedNothing, FailedS         , RecordTerminal, none >,
  msmf::Row < Running         , StepParked       , NeedsAttention  , RecordParked  , none >,
  msmf::Row < Running         , CancelRequested  , Compensating    , UndoNextStep  , none >,
  msmf::Row < Compensating    , UndoCompletedMore, Compensating    , UndoNextStep  , none >,
  msmf::Row < Compensating    , UndoCompletedLast, Compensated     , RecordTerminal, none >,
  msmf::Row < Compensating    , UndoParked       , NeedsAttention  , RecordParked  , none >,
  msmf::Row < NeedsAttention  , OperatorResumed  , Running         , RunNextStep   , none >,
  msmf::Row < NeedsAttention  , OperatorResumedUndo, Compensating  , UndoNextStep  , none >,
  msmf::Row < Running         , StepAwaitingApproval, AwaitingApproval, RecordWaiting, none >,
  msmf::Row < AwaitingApproval, ApprovalSettled  , Running         , RunNextStep   , none >
  > {};
  // clang-format on

  template <class Fsm, class Event>
  void no_transition(const Event&, Fsm&, int) {
    refused = true;
  }
  template <class Fsm, class Event>
  void exception_caught(const Event&, Fsm&, std::exception&) {
    refused = true;
  }
};

using SagaFsm = msm::back::state_machine<SagaMachineDef>;

template <class Event>
Result<std::vector<SagaCommand>> Process(SagaFsm& fsm, const Event& event, SagaEvent name) {
  fsm.commands.clear();
  fsm.refused = false;
  SagaState before = fsm.current;
  fsm.process_event(event);
  if (fsm.refused) {
    return Status::IllegalTransition(std::string("saga in state ") + SagaStateName(before) +
                                     " does not accept " + SagaEventName(name));
  }
  return fsm.commands;
}

}  // namespace

struct SagaMachine::Impl {
  SagaFsm fsm;
};

SagaMachine::SagaMachine(SagaState state) : impl_(std::make_unique<Impl>()) {
  impl_->fsm.start();
  impl_->fsm.process_event(Restore{state});
}
SagaMachine::~SagaMachine() = default;
SagaMachine::SagaMachine(SagaMachine&&) noexcept = default;
SagaMachine& SagaMachine::operator=(SagaMachine&&) noexcept = default;

SagaState SagaMachine::state() const { return impl_->fsm.current; }

Result<std::vector<SagaCommand>> SagaMachine::Fire(SagaEvent event) {
  SagaFsm& f = impl_->fsm;
  switch (event) {
    case SagaEvent::kStarted:
      return Process(f, Started{}, event);
    case SagaEvent::kStepCompletedMore:
      return Process(f, StepCompletedMore{}, event);
    case SagaEvent::kStepCompletedLast:
      return Process(f, StepCompletedLast{}, event);
    case SagaEvent::kStepFailedUndo:
      return Process(f, StepFailedUndo{}, event);
    case SagaEvent::kStepFailedNothing:
      return Process(f, StepFailedNothing{}, event);
    case SagaEvent::kStepParked:
      return Process(f, StepParked{}, event);
    case SagaEvent::kCancelRequested:
      return Process(f, CancelRequested{}, event);
    case SagaEvent::kUndoCompletedMore:
      return Process(f, UndoCompletedMore{}, event);
    case SagaEvent::kUndoCompletedLast:
      return Process(f, UndoCompletedLast{}, event);
    case SagaEvent::kUndoParked:
      return Process(f, UndoParked{}, event);
    case SagaEvent::kOperatorResumed:
      return Process(f, OperatorResumed{}, event);
    case SagaEvent::kOperatorResumedUndo:
      return Process(f, OperatorResumedUndo{}, event);
    case SagaEvent::kStepAwaitingApproval:
      return Process(f, StepAwaitingApproval{}, event);
    case SagaEvent::kApprovalSettled:
      return Process(f, ApprovalSettled{}, event);
  }
  return Status::IllegalTransition("unknown saga event");
}

const char* SagaEventName(SagaEvent e) {
  switch (e) {
    case SagaEvent::kStarted:
      return "started";
    case SagaEvent::kStepCompletedMore:
      return "step_completed_more";
    case SagaEvent::kStepCompletedLast:
      return "step_completed_last";
    case SagaEvent::kStepFailedUndo:
      return "step_failed_undo";
    case SagaEvent::kStepFailedNothing:
      return "step_failed_nothing";
    case SagaEvent::kStepParked:
      return "step_parked";
    case SagaEvent::kCancelRequested:
      return "cancel_requested";
    case SagaEvent::kUndoCompletedMore:
      return "undo_completed_more";
    case SagaEvent::kUndoCompletedLast:
      return "undo_completed_last";
    case SagaEvent::kUndoParked:
      return "undo_parked";
    case SagaEvent::kOperatorResumed:
      return "operator_resumed";
    case SagaEvent::kOperatorResumedUndo:
      return "operator_resumed_undo";
    case SagaEvent::kStepAwaitingApproval:
      return "step_awaiting_approval";
    case SagaEvent::kApprovalSettled:
      return "approval_settled";
  }
  return "?";
}

const char* SagaCommandName(SagaCommand c) {
  switch (c) {
    case SagaCommand::kRunNextStep:
      return "run_next_step";
    case SagaCommand::kUndoNextStep:
      return "undo_next_step";
    case SagaCommand::kRecordTerminal:
      return "record_terminal";
    case SagaCommand::kRecordParked:
      return "record_parked";
    case SagaCommand::kRecordWaiting:
      return "record_waiting";
  }
  return "?";
}

}  // namespace idem
