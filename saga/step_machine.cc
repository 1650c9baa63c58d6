// The step state machine: one Boost.MSM functor table, no I/O.
//
// Restoring: the machine starts in `Restoring` and the constructor fires
// `Restore{state}`; one guarded row per state moves it there, so a machine
// can resume any persisted state without a back door into MSM's internals.

// clang-format off
#include "saga/msm_config.h"  // first: the one MSM configuration, before any Boost header
// clang-format on
#include <boost/mpl/joint_view.hpp>

#include "saga/machines.h"

namespace idem {
namespace {

using namespace machine_detail;  // NOLINT(google-build-using-namespace): table vocabulary

// ---- events: one struct per StepEvent, carrying the facts it was fired with
namespace ev {
using Facts = StepFacts;
struct Restore {
  StepState target;
};
IDEM_STEP_EVENTS(IDEM_MSM_EVENT_STRUCT)
}  // namespace ev

// ---- states: one per StepState, named like its enumerator without the k
using StateEnum_ = StepState;
IDEM_STEP_STATES(IDEM_MSM_STATE_ALIAS)

// ---- actions: each emits one command
using CallTool = Emit<StepCommand::kCallTool>;
using RecordSucceeded = Emit<StepCommand::kRecordSucceeded>;
using RecordFailed = Emit<StepCommand::kRecordFailed>;
using ScheduleRetry = Emit<StepCommand::kScheduleRetry>;
using ResolveOutcome = Emit<StepCommand::kResolveOutcome>;
using ParkStep = Emit<StepCommand::kParkStep>;
using CallCompensation = Emit<StepCommand::kCallCompensation>;
using ScheduleUndoRetry = Emit<StepCommand::kScheduleUndoRetry>;
using RecordUndone = Emit<StepCommand::kRecordUndone>;
using AwaitCompletion = Emit<StepCommand::kAwaitCompletion>;

// ---- guards: predicates of the facts the event carries
using RetryAllowed = Holds<&StepFacts::retry_allowed>;
using RePreviewOnExpiry = Holds<&StepFacts::re_preview>;

struct StepMachineDef : MachineBase<StepMachineDef, StepState, StepCommand> {
  using none = msmf::none;
  template <class Start, class Event, class Target, class Action, class Guard>
  using Row = msmf::Row<Start, Event, Target, Action, Guard>;

  // clang-format off
  struct base_rows : mpl::vector<
  //     Start             , Event                 , Target            , Action           , Guard
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  IDEM_STEP_STATES(IDEM_MSM_RESTORE_ROW)  // Restoring --Restore{s}--> s, one row per state
  // ---- forward: call the tool and settle its outcome
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < Planned            , ev::Submitted         , Submitted         , CallTool         , none                     >,
  Row < Planned            , ev::Failed            , Failed            , RecordFailed     , none                     >,
  Row < Submitted          , ev::Succeeded         , Succeeded         , RecordSucceeded  , none                     >,
  Row < Submitted          , ev::Failed            , Submitted         , ScheduleRetry    , RetryAllowed             >,
  Row < Submitted          , ev::Failed            , Failed            , RecordFailed     , Not<RetryAllowed>        >,
  Row < Submitted          , ev::OutcomeUnknown    , Unknown           , ResolveOutcome   , none                     >,
  Row < Submitted          , ev::StaleRePreview    , Planned           , none             , none                     >,
  Row < Unknown            , ev::ResolvedApplied   , Succeeded         , RecordSucceeded  , none                     >,
  Row < Unknown            , ev::ResolvedRetry     , Submitted         , ScheduleRetry    , none                     >,
  Row < Unknown            , ev::ResolvedNotApplied, Failed            , RecordFailed     , none                     >,
  Row < Unknown            , ev::Unresolvable      , NeedsAttention    , ParkStep         , none                     >,
  // ---- two-phase: preview, approval, commit
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < Planned            , ev::PreviewRecorded   , Previewed         , none             , none                     >,
  Row < Previewed          , ev::ApprovalRequested , AwaitingApproval  , none             , none                     >,
  Row < Previewed          , ev::TokenConsumed     , Submitted         , CallTool         , none                     >,
  Row < Previewed          , ev::Expired           , Planned           , none             , none                     >,
  Row < Previewed          , ev::Failed            , Failed            , RecordFailed     , none                     >,
  Row < AwaitingApproval   , ev::Approved          , Submitted         , CallTool         , none                     >,
  Row < AwaitingApproval   , ev::Rejected          , Failed            , RecordFailed     , none                     >,
  Row < AwaitingApproval   , ev::Expired           , Planned           , none             , RePreviewOnExpiry        >,
  Row < AwaitingApproval   , ev::Expired           , Failed            , RecordFailed     , Not<RePreviewOnExpiry>   >,
  // ---- a person resolves a parked step
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < NeedsAttention     , ev::OperatorApplied   , Succeeded         , RecordSucceeded  , none                     >,
  Row < NeedsAttention     , ev::OperatorNotApplied, Failed            , RecordFailed     , none                     >,
  Row < NeedsAttention     , ev::OperatorRetry     , Planned           , none             , none                     >,
  // ---- compensation: undo a succeeded step during a rollback
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < Succeeded          , ev::RollbackStarted   , Compensating      , CallCompensation , none                     >,
  Row < Compensating       , ev::Undone            , Compensated       , RecordUndone     , none                     >,
  Row < Compensating       , ev::UndoFailed        , Compensating      , ScheduleUndoRetry, RetryAllowed             >,
  Row < Compensating       , ev::UndoFailed        , CompensationFailed, ParkStep         , Not<RetryAllowed>        >,
  Row < CompensationFailed , ev::OperatorUndone    , Compensated       , RecordUndone     , none                     >,
  Row < CompensationFailed , ev::OperatorRetryUndo , Compensating      , CallCompensation , none                     >,
  // ---- blocked: the drive cannot get past this step (saga/park.h); a person must look
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < Planned            , ev::Blocked           , NeedsAttention    , ParkStep         , none                     >,
  Row < Submitted          , ev::Blocked           , NeedsAttention    , ParkStep         , none                     >,
  Row < Unknown            , ev::Blocked           , NeedsAttention    , ParkStep         , none                     >,
  Row < Succeeded          , ev::Blocked           , CompensationFailed, ParkStep         , none                     >,
  Row < Compensating       , ev::Blocked           , CompensationFailed, ParkStep         , none                     >,
  // ---- guarded: the step's guard found the effect (saga/guard.h); no call
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < Planned            , ev::GuardSatisfied    , Succeeded         , none             , none                     >
  > {};
  // MPL vectors hold at most 50 rows: further groups are tables of their own,
  // joined below.
  struct completion_rows : mpl::vector<
  // ---- asynchronous completion: the provider finishes later (saga/completion.h)
  //    +------------------+-----------------------+-------------------+------------------+--------------------------+
  Row < Submitted          , ev::Accepted          , Processing        , AwaitCompletion  , none                     >,
  Row < Unknown            , ev::ResolvedPending   , Processing        , AwaitCompletion  , none                     >,
  Row < Processing         , ev::ResolvedPending   , Processing        , AwaitCompletion  , none                     >,
  Row < Processing         , ev::ResolvedApplied   , Succeeded         , RecordSucceeded  , none                     >,
  Row < Processing         , ev::ResolvedRetry     , Submitted         , ScheduleRetry    , none                     >,
  Row < Processing         , ev::ResolvedNotApplied, Failed            , RecordFailed     , none                     >,
  Row < Processing         , ev::Unresolvable      , NeedsAttention    , ParkStep         , none                     >,
  Row < Processing         , ev::Blocked           , NeedsAttention    , ParkStep         , none                     >
  > {};
  // clang-format on
  using transition_table = mpl::joint_view<base_rows, completion_rows>;
};

using StepFsm = msm::back::state_machine<StepMachineDef>;

}  // namespace

struct StepMachine::Impl {
  StepFsm fsm;
};

StepMachine::StepMachine(StepState state) : impl_(std::make_unique<Impl>()) {
  impl_->fsm.start();
  impl_->fsm.process_event(ev::Restore{state});
}
StepMachine::~StepMachine() = default;
StepMachine::StepMachine(StepMachine&&) noexcept = default;
StepMachine& StepMachine::operator=(StepMachine&&) noexcept = default;

StepState StepMachine::state() const { return impl_->fsm.current; }

Result<std::vector<StepCommand>> StepMachine::Fire(StepEvent event, const StepFacts& facts) {
  auto process = [&](const auto& e) {
    return Process(impl_->fsm, e, "step", StepStateName, StepEventName(event));
  };
  IDEM_MSM_DISPATCH(StepEvent, IDEM_STEP_EVENTS, event, facts, process);
  return Status::IllegalTransition("unknown step event");
}

const char* StepEventName(StepEvent e) {
  IDEM_ENUM_NAME(StepEvent, IDEM_STEP_EVENTS, e);
  return "?";
}

const char* StepCommandName(StepCommand c) {
  IDEM_ENUM_NAME(StepCommand, IDEM_STEP_COMMANDS, c);
  return "?";
}

}  // namespace idem
