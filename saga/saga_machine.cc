// The saga state machine: one Boost.MSM functor table, no I/O.
// Restored from a persisted state the same way as the step machine.

// clang-format off
#include "saga/msm_config.h"  // first: the one MSM configuration, before any Boost header
// clang-format on
#include "saga/machines.h"

namespace idem {
namespace {

using namespace machine_detail;  // NOLINT(google-build-using-namespace): table vocabulary

// ---- events: one struct per SagaEvent, carrying the facts it was fired with
namespace ev {
using Facts = SagaFacts;
struct Restore {
  SagaState target;
};
IDEM_SAGA_EVENTS(IDEM_MSM_EVENT_STRUCT)
}  // namespace ev

// ---- states: one per SagaState, named like its enumerator without the k
using StateEnum_ = SagaState;
IDEM_SAGA_STATES(IDEM_MSM_STATE_ALIAS)

// ---- actions: each emits one command
using RunNextStep = Emit<SagaCommand::kRunNextStep>;
using UndoNextStep = Emit<SagaCommand::kUndoNextStep>;
using RecordTerminal = Emit<SagaCommand::kRecordTerminal>;
using RecordParked = Emit<SagaCommand::kRecordParked>;
using RecordWaiting = Emit<SagaCommand::kRecordWaiting>;

// ---- guards: predicates of the facts the event carries
using HasMoreSteps = Holds<&SagaFacts::more_steps>;
using HasEffectsToUndo = Holds<&SagaFacts::effects_to_undo>;
using RollingBack = Holds<&SagaFacts::rolling_back>;
using IsOpen = Holds<&SagaFacts::open_saga>;
using ParkOnIdle = Holds<&SagaFacts::park_on_idle>;

/// Guard: both hold.
template <class A, class B>
struct Both {
  template <class Event, class Fsm, class Source, class Target>
  bool operator()(const Event& e, Fsm& fsm, Source& s, Target& t) {
    return A()(e, fsm, s, t) && B()(e, fsm, s, t);
  }
};

struct SagaMachineDef : MachineBase<SagaMachineDef, SagaState, SagaCommand> {
  using none = msmf::none;
  template <class Start, class Event, class Target, class Action, class Guard>
  using Row = msmf::Row<Start, Event, Target, Action, Guard>;

  // clang-format off
  struct transition_table : mpl::vector<
  //     Start           , Event                   , Target          , Action        , Guard
  //    +----------------+-------------------------+-----------------+---------------+-----------------------+
  IDEM_SAGA_STATES(IDEM_MSM_RESTORE_ROW)  // Restoring --Restore{s}--> s, one row per state
  //    +----------------+-------------------------+-----------------+---------------+-----------------------+
  Row < Pending          , ev::Started             , Running         , RunNextStep   , none                  >,
  Row < Pending          , ev::CancelRequested     , Cancelled       , RecordTerminal, none                  >,
  Row < Running          , ev::StepCompleted       , Running         , RunNextStep   , HasMoreSteps          >,
  Row < Running          , ev::StepCompleted       , Succeeded       , RecordTerminal, Both<Not<HasMoreSteps>, Not<IsOpen>> >,
  Row < Running          , ev::StepFailed          , Compensating    , UndoNextStep  , Both<HasEffectsToUndo, Not<IsOpen>> >,
  Row < Running          , ev::StepFailed          , Failed          , RecordTerminal, Both<Not<HasEffectsToUndo>, Not<IsOpen>> >,
  Row < Running          , ev::StepParked          , NeedsAttention  , RecordParked  , none                  >,
  Row < Running          , ev::CancelRequested     , Compensating    , UndoNextStep  , none                  >,
  Row < Running          , ev::StepAwaitingApproval, AwaitingApproval, RecordWaiting , none                  >,
  Row < AwaitingApproval , ev::ApprovalSettled     , Running         , RunNextStep   , none                  >,
  Row < Running          , ev::StepProcessing      , AwaitingCompletion, RecordWaiting, none                  >,
  Row < AwaitingCompletion, ev::CompletionDue      , Running         , RunNextStep   , none                  >,
  // ---- rollback
  //    +----------------+-------------------------+-----------------+---------------+-----------------------+
  Row < Compensating     , ev::UndoCompleted       , Compensating    , UndoNextStep  , HasMoreSteps          >,
  Row < Compensating     , ev::UndoCompleted       , Compensated     , RecordTerminal, Not<HasMoreSteps>     >,
  Row < Compensating     , ev::UndoParked          , NeedsAttention  , RecordParked  , none                  >,
  // ---- a person resolved the parked step: go on the way the saga was going
  //    +----------------+-------------------------+-----------------+---------------+-----------------------+
  Row < NeedsAttention   , ev::OperatorResumed     , Running         , RunNextStep   , Not<RollingBack>      >,
  Row < NeedsAttention   , ev::OperatorResumed     , Compensating    , UndoNextStep  , RollingBack           >,
  // ---- a person paused the saga (between steps; no lease held), then resumed or cancelled it
  //    +----------------+-------------------------+-----------------+---------------+-----------------------+
  Row < Pending          , ev::PauseRequested      , Paused          , RecordParked  , none                  >,
  Row < Running          , ev::PauseRequested      , Paused          , RecordParked  , none                  >,
  Row < Compensating     , ev::PauseRequested      , Paused          , RecordParked  , none                  >,
  Row < Paused           , ev::Resumed             , Running         , RunNextStep   , Not<RollingBack>      >,
  Row < Paused           , ev::Resumed             , Compensating    , UndoNextStep  , RollingBack           >,
  Row < Paused           , ev::CancelRequested     , Compensating    , UndoNextStep  , HasEffectsToUndo      >,
  Row < Paused           , ev::CancelRequested     , Cancelled       , RecordTerminal, Not<HasEffectsToUndo> >,
  // ---- an open saga (saga/open_saga.h): calls appended one at a time; a call's end leaves it open
  //    +----------------+-------------------------+-----------------+---------------+-----------------------+
  Row < Running          , ev::StepCompleted       , Open            , RecordWaiting , Both<Not<HasMoreSteps>, IsOpen> >,
  Row < Running          , ev::StepFailed          , Open            , RecordWaiting , IsOpen                >,
  Row < Open             , ev::CallAppended        , Running         , RunNextStep   , none                  >,
  Row < Open             , ev::CommitRequested     , Succeeded       , RecordTerminal, none                  >,
  Row < Open             , ev::CancelRequested     , Compensating    , UndoNextStep  , none                  >,
  Row < Open             , ev::PauseRequested      , Paused          , RecordParked  , none                  >,
  Row < Open             , ev::IdleTimedOut        , Compensating    , UndoNextStep  , Not<ParkOnIdle>       >,
  Row < Open             , ev::IdleTimedOut        , Paused          , RecordParked  , ParkOnIdle            >
  > {};
  // clang-format on
};

using SagaFsm = msm::back::state_machine<SagaMachineDef>;

}  // namespace

struct SagaMachine::Impl {
  SagaFsm fsm;
};

SagaMachine::SagaMachine(SagaState state) : impl_(std::make_unique<Impl>()) {
  impl_->fsm.start();
  impl_->fsm.process_event(ev::Restore{state});
}
SagaMachine::~SagaMachine() = default;
SagaMachine::SagaMachine(SagaMachine&&) noexcept = default;
SagaMachine& SagaMachine::operator=(SagaMachine&&) noexcept = default;

SagaState SagaMachine::state() const { return impl_->fsm.current; }

Result<std::vector<SagaCommand>> SagaMachine::Fire(SagaEvent event, const SagaFacts& facts) {
  auto process = [&](const auto& e) {
    return Process(impl_->fsm, e, "saga", SagaStateName, SagaEventName(event));
  };
  IDEM_MSM_DISPATCH(SagaEvent, IDEM_SAGA_EVENTS, event, facts, process);
  return Status::IllegalTransition("unknown saga event");
}

const char* SagaEventName(SagaEvent e) {
  IDEM_ENUM_NAME(SagaEvent, IDEM_SAGA_EVENTS, e);
  return "?";
}

const char* SagaCommandName(SagaCommand c) {
  IDEM_ENUM_NAME(SagaCommand, IDEM_SAGA_COMMANDS, c);
  return "?";
}

}  // namespace idem
