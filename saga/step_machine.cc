// The step state machine: one Boost.MSM functor table, no I/O.
//
// Restoring: the machine starts in `Restoring` and the constructor fires
// `Restore{state}`; one guarded row per state moves it there, so a machine
// can resume any persisted state without a back door into MSM's internals.

// The tables have more rows than MPL's preprocessed default of 20.
#define BOOST_MPL_CFG_NO_PREPROCESSED_HEADERS
#define BOOST_MPL_LIMIT_VECTOR_SIZE 50
#define BOOST_MPL_LIMIT_MAP_SIZE 50
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
  StepState target;
};
struct Submitted {};
struct Succeeded {};
struct FailedRetryable {};
struct FailedFinal {};
struct OutcomeUnknown {};
struct ResolvedApplied {};
struct ResolvedRetry {};
struct ResolvedNotApplied {};
struct Unresolvable {};
struct RollbackStarted {};
struct Undone {};
struct UndoFailedRetryable {};
struct UndoFailedFinal {};
struct OperatorApplied {};
struct OperatorNotApplied {};
struct OperatorRetry {};
struct OperatorUndone {};
struct OperatorRetryUndo {};
struct PreviewRecorded {};
struct ApprovalRequested {};
struct TokenConsumed {};
struct Approved {};
struct Rejected {};
struct ExpiredRePreview {};
struct ExpiredRollback {};
struct StaleRePreview {};

// ---- states: each records its id on entry
template <StepState S>
struct StepStateT : msmf::state<> {
  template <class Event, class Fsm>
  void on_entry(const Event&, Fsm& fsm) {
    fsm.current = S;
  }
};
struct Restoring : msmf::state<> {};
using Planned = StepStateT<StepState::kPlanned>;
using SubmittedS = StepStateT<StepState::kSubmitted>;
using Unknown = StepStateT<StepState::kUnknown>;
using SucceededS = StepStateT<StepState::kSucceeded>;
using Failed = StepStateT<StepState::kFailed>;
using Compensating = StepStateT<StepState::kCompensating>;
using Compensated = StepStateT<StepState::kCompensated>;
using CompensationFailed = StepStateT<StepState::kCompensationFailed>;
using NeedsAttention = StepStateT<StepState::kNeedsAttention>;
using Previewed = StepStateT<StepState::kPreviewed>;
using AwaitingApproval = StepStateT<StepState::kAwaitingApproval>;

// ---- actions: each emits one command
template <StepCommand C>
struct Emit {
  template <class Event, class Fsm, class Source, class Target>
  void operator()(const Event&, Fsm& fsm, Source&, Target&) {
    fsm.commands.push_back(C);
  }
};
using CallTool = Emit<StepCommand::kCallTool>;
using RecordSucceeded = Emit<StepCommand::kRecordSucceeded>;
using RecordFailed = Emit<StepCommand::kRecordFailed>;
using ScheduleRetry = Emit<StepCommand::kScheduleRetry>;
using ResolveOutcome = Emit<StepCommand::kResolveOutcome>;
using ParkStep = Emit<StepCommand::kParkStep>;
using CallCompensation = Emit<StepCommand::kCallCompensation>;
using ScheduleUndoRetry = Emit<StepCommand::kScheduleUndoRetry>;
using RecordUndone = Emit<StepCommand::kRecordUndone>;

// ---- guards
template <StepState S>
struct RestoresTo {
  template <class Event, class Fsm, class Source, class Target>
  bool operator()(const Event& e, Fsm&, Source&, Target&) {
    return e.target == S;
  }
};

struct StepMachineDef : msmf::state_machine_def<StepMachineDef> {
  using initial_state = Restoring;

  StepState current = StepState::kPlanned;
  std::vector<StepCommand> commands;
  bool refused = false;

  using none = msmf::none;
  // clang-format off
  struct transition_table : mpl::vector<
  //          Start               Event                Target              Action             Guard
  //         +-------------------+--------------------+-------------------+------------------+----------------------------------------+
  msmf::Row < Restoring          , Restore            , Planned           , none             , RestoresTo<StepState::kPlanned>            >,
  msmf::Row < Restoring          , Restore            , Previewed         , none             , RestoresTo<StepState::kPreviewed>          >,
  msmf::Row < Restoring          , Restore            , AwaitingApproval  , none             , RestoresTo<StepState::kAwaitingApproval>   >,
  msmf::Row < Restoring          , Restore            , SubmittedS        , none             , RestoresTo<StepState::kSubmitted>          >,
  msmf::Row < Restoring          , Restore            , Unknown           , none             , RestoresTo<StepState::kUnknown>            >,
  msmf::Row < Restoring          , Restore            , SucceededS        , none             , RestoresTo<StepState::kSucceeded>          >,
  msmf::Row < Restoring          , Restore            , Failed            , none             , RestoresTo<StepState::kFailed>             >,
  msmf::Row < Restoring          , Restore            , Compensating      , none             , RestoresTo<StepState::kCompensating>       >,
  msmf::Row < Restoring          , Restore            , Compensated       , none             , RestoresTo<StepState::kCompensated>        >,
  msmf::Row < Restoring          , Restore            , CompensationFailed, none             , RestoresTo<StepState::kCompensationFailed> >,
  msmf::Row < Restoring          , Restore            , NeedsAttention    , none             , RestoresTo<StepState::kNeedsAttention>     >,
  //         +-------------------+--------------------+-------------------+------------------+----------------------------------------+
  msmf::Row < Planned            , Submitted          , SubmittedS        , CallTool         , none >,
  msmf::Row < Planned            , FailedFinal        , Failed            , RecordFailed     , none >,
  msmf::Row < SubmittedS         , Succeeded          , SucceededS        , RecordSucceeded  , none >,
  msmf::Row < SubmittedS         , FailedRetryable    , SubmittedS        , ScheduleRetry    , none >,
  msmf::Row < SubmittedS         , FailedFinal        , Failed            , RecordFailed     , none >,
  msmf::Row < SubmittedS         , OutcomeUnknown     , Unknown           , ResolveOutcome   , none >,
  msmf::Row < Unknown            , ResolvedApplied    , SucceededS        , RecordSucceeded  , none >,
  msmf::Row < Unknown            , ResolvedRetry      , SubmittedS        , ScheduleRetry    , none >,
  msmf::Row < Unknown            , ResolvedNotApplied , Failed            , RecordFailed     , none >,
  msmf::Row < Unknown            , Unresolvable       , NeedsAttention    , ParkStep         , none >,
  msmf::Row < SucceededS         , RollbackStarted    , Compensating      , CallCompensation , none >,
  msmf::Row < Compensating       , Undone             , Compensated       , RecordUndone     , none >,
  msmf::Row < Compensating       , UndoFailedRetryable, Compensating      , ScheduleUndoRetry, none >,
  msmf::Row < Compensating       , UndoFailedFinal    , CompensationFailed, ParkStep         , none >,
  //         +-------------------+--------------------+-------------------+------------------+----------------------------------------+
  msmf::Row < NeedsAttention     , OperatorApplied    , SucceededS        , RecordSucceeded  , none >,
  msmf::Row < NeedsAttention     , OperatorNotApplied , Failed            , RecordFailed     , none >,
  msmf::Row < NeedsAttention     , OperatorRetry      , Planned           , none             , none >,
  msmf::Row < CompensationFailed , OperatorUndone     , Compensated       , RecordUndone     , none >,
  msmf::Row < CompensationFailed , OperatorRetryUndo  , Compensating      , CallCompensation , none >,
  //         +-------------------+--------------------+-------------------+------------------+----------------------------------------+
  msmf::Row < Planned            , PreviewRecorded    , Previewed         , none             , none >,
  msmf::Row < Previewed          , ApprovalRequested  , AwaitingApproval  , none             , none >,
  msmf::Row < Previewed          , TokenConsumed      , SubmittedS        , CallTool         , none >,
  msmf::Row < Previewed          , ExpiredRePreview   , Planned           , none             , none >,
  msmf::Row < Previewed          , FailedFinal        , Failed            , RecordFailed     , none >,
  msmf::Row < AwaitingApproval   , Approved           , SubmittedS        , CallTool         , none >,
  msmf::Row < AwaitingApproval   , Rejected           , Failed            , RecordFailed     , none >,
  msmf::Row < AwaitingApproval   , ExpiredRePreview   , Planned           , none             , none >,
  msmf::Row < AwaitingApproval   , ExpiredRollback    , Failed            , RecordFailed     , none >,
  msmf::Row < SubmittedS         , StaleRePreview     , Planned           , none             , none >
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

using StepFsm = msm::back::state_machine<StepMachineDef>;

template <class Event>
Result<std::vector<StepCommand>> Process(StepFsm& fsm, const Event& event, StepEvent name) {
  fsm.commands.clear();
  fsm.refused = false;
  StepState before = fsm.current;
  fsm.process_event(event);
  if (fsm.refused) {
    return Status::IllegalTransition(std::string("step in state ") + StepStateName(before) +
                                     " does not accept " + StepEventName(name));
  }
  return fsm.commands;
}

}  // namespace

struct StepMachine::Impl {
  StepFsm fsm;
};

StepMachine::StepMachine(StepState state) : impl_(std::make_unique<Impl>()) {
  impl_->fsm.start();
  impl_->fsm.process_event(Restore{state});
}
StepMachine::~StepMachine() = default;
StepMachine::StepMachine(StepMachine&&) noexcept = default;
StepMachine& StepMachine::operator=(StepMachine&&) noexcept = default;

StepState StepMachine::state() const { return impl_->fsm.current; }

Result<std::vector<StepCommand>> StepMachine::Fire(StepEvent event) {
  StepFsm& f = impl_->fsm;
  switch (event) {
    case StepEvent::kSubmitted:
      return Process(f, Submitted{}, event);
    case StepEvent::kSucceeded:
      return Process(f, Succeeded{}, event);
    case StepEvent::kFailedRetryable:
      return Process(f, FailedRetryable{}, event);
    case StepEvent::kFailedFinal:
      return Process(f, FailedFinal{}, event);
    case StepEvent::kOutcomeUnknown:
      return Process(f, OutcomeUnknown{}, event);
    case StepEvent::kResolvedApplied:
      return Process(f, ResolvedApplied{}, event);
    case StepEvent::kResolvedRetry:
      return Process(f, ResolvedRetry{}, event);
    case StepEvent::kResolvedNotApplied:
      return Process(f, ResolvedNotApplied{}, event);
    case StepEvent::kUnresolvable:
      return Process(f, Unresolvable{}, event);
    case StepEvent::kRollbackStarted:
      return Process(f, RollbackStarted{}, event);
    case StepEvent::kUndone:
      return Process(f, Undone{}, event);
    case StepEvent::kUndoFailedRetryable:
      return Process(f, UndoFailedRetryable{}, event);
    case StepEvent::kUndoFailedFinal:
      return Process(f, UndoFailedFinal{}, event);
    case StepEvent::kOperatorApplied:
      return Process(f, OperatorApplied{}, event);
    case StepEvent::kOperatorNotApplied:
      return Process(f, OperatorNotApplied{}, event);
    case StepEvent::kOperatorRetry:
      return Process(f, OperatorRetry{}, event);
    case StepEvent::kOperatorUndone:
      return Process(f, OperatorUndone{}, event);
    case StepEvent::kOperatorRetryUndo:
      return Process(f, OperatorRetryUndo{}, event);
    case StepEvent::kPreviewRecorded:
      return Process(f, PreviewRecorded{}, event);
    case StepEvent::kApprovalRequested:
      return Process(f, ApprovalRequested{}, event);
    case StepEvent::kTokenConsumed:
      return Process(f, TokenConsumed{}, event);
    case StepEvent::kApproved:
      return Process(f, Approved{}, event);
    case StepEvent::kRejected:
      return Process(f, Rejected{}, event);
    case StepEvent::kExpiredRePreview:
      return Process(f, ExpiredRePreview{}, event);
    case StepEvent::kExpiredRollback:
      return Process(f, ExpiredRollback{}, event);
    case StepEvent::kStaleRePreview:
      return Process(f, StaleRePreview{}, event);
  }
  return Status::IllegalTransition("unknown step event");
}

const char* StepEventName(StepEvent e) {
  switch (e) {
    case StepEvent::kSubmitted:
      return "submitted";
    case StepEvent::kSucceeded:
      return "succeeded";
    case StepEvent::kFailedRetryable:
      return "failed_retryable";
    case StepEvent::kFailedFinal:
      return "failed_final";
    case StepEvent::kOutcomeUnknown:
      return "outcome_unknown";
    case StepEvent::kResolvedApplied:
      return "resolved_applied";
    case StepEvent::kResolvedRetry:
      return "resolved_retry";
    case StepEvent::kResolvedNotApplied:
      return "resolved_not_applied";
    case StepEvent::kUnresolvable:
      return "unresolvable";
    case StepEvent::kRollbackStarted:
      return "rollback_started";
    case StepEvent::kUndone:
      return "undone";
    case StepEvent::kUndoFailedRetryable:
      return "undo_failed_retryable";
    case StepEvent::kUndoFailedFinal:
      return "undo_failed_final";
    case StepEvent::kOperatorApplied:
      return "operator_applied";
    case StepEvent::kOperatorNotApplied:
      return "operator_not_applied";
    case StepEvent::kOperatorRetry:
      return "operator_retry";
    case StepEvent::kOperatorUndone:
      return "operator_undone";
    case StepEvent::kOperatorRetryUndo:
      return "operator_retry_undo";
    case StepEvent::kPreviewRecorded:
      return "preview_recorded";
    case StepEvent::kApprovalRequested:
      return "approval_requested";
    case StepEvent::kTokenConsumed:
      return "token_consumed";
    case StepEvent::kApproved:
      return "approved";
    case StepEvent::kRejected:
      return "rejected";
    case StepEvent::kExpiredRePreview:
      return "expired_re_preview";
    case StepEvent::kExpiredRollback:
      return "expired_rollback";
    case StepEvent::kStaleRePreview:
      return "stale_re_preview";
  }
  return "?";
}

const char* StepCommandName(StepCommand c) {
  switch (c) {
    case StepCommand::kCallTool:
      return "call_tool";
    case StepCommand::kRecordSucceeded:
      return "record_succeeded";
    case StepCommand::kRecordFailed:
      return "record_failed";
    case StepCommand::kScheduleRetry:
      return "schedule_retry";
    case StepCommand::kResolveOutcome:
      return "resolve_outcome";
    case StepCommand::kParkStep:
      return "park_step";
    case StepCommand::kCallCompensation:
      return "call_compensation";
    case StepCommand::kScheduleUndoRetry:
      return "schedule_undo_retry";
    case StepCommand::kRecordUndone:
      return "record_undone";
  }
  return "?";
}

}  // namespace idem
