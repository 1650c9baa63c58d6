#include "saga/drive.h"

#include <deque>
#include <optional>
#include <string>

#include "compensation/rollback.h"
#include "compensation/undo.h"
#include "preview_commit/two_phase.h"
#include "saga/branches.h"
#include "saga/control_drive.h"
#include "saga/guard.h"
#include "saga/limits.h"
#include "saga/machines.h"
#include "saga/open_drive.h"
#include "saga/open_saga.h"
#include "saga/park.h"

#include "common/failpoint.h"

namespace idem {
namespace {

// Fires a saga event; terminal, parked and waiting states are committed
// here (the drive's last write), with the failpoints around the terminal
// commit; a move to another running state is staged.
Status FireSaga(SagaRun* run, SagaEvent event, std::deque<SagaCommand>* queue,
                const SagaFacts& facts = {}) {
  SagaMachine saga(run->state());
  auto cmds = saga.Fire(event, facts);
  if (!cmds.ok()) return cmds.status();
  const SagaState next = saga.state();
  const std::string event_name = std::string("saga_") + SagaStateName(next);
  for (SagaCommand c : *cmds) {
    if (c == SagaCommand::kRecordWaiting) {
      IDEM_RETURN_IF_ERROR(run->CommitSagaState(next, "",
                                                run->Entry("", event_name, Json::object()),
                                                /*ends_drive=*/true, SagaRun::Durable::kNow));
    } else if (c == SagaCommand::kRecordTerminal || c == SagaCommand::kRecordParked) {
      // Why it ended anywhere but succeeded: kept on the saga for `status`.
      std::string reason = next == SagaState::kSucceeded ? "" : run->park_reason();
      Json data = Json::object();
      if (!reason.empty()) data = ParkEntryData(reason);
      if (next == SagaState::kPaused) data["from"] = SagaStateName(run->state());  // for resume
      IDEM_FAILPOINT("saga.before_terminal");
      IDEM_RETURN_IF_ERROR(run->CommitSagaState(next, reason, run->Entry("", event_name, data),
                                                /*ends_drive=*/true, SagaRun::Durable::kNow));
      IDEM_FAILPOINT("saga.after_terminal");
    } else if (next != run->state()) {
      Json data = Json::object();
      std::string reason;
      if (next == SagaState::kCompensating) {
        reason = run->park_reason();
        data["reason"] = reason;
        Json skipped = Json::array();
        auto completed = run->CompletionOrder();
        if (!completed.ok()) return completed.status();
        for (int i :
             compensation::SkippedByRollback(run->record().steps, run->compensable(), *completed)) {
          skipped.push_back({{"step", run->record().steps[i].step_id},
                             {"reason", run->spec().steps[i].no_compensation_reason}});
        }
        data["not_compensated"] = skipped;
      }
      // Durable with the next write before a call.
      IDEM_RETURN_IF_ERROR(run->CommitSagaState(next, reason, run->Entry("", event_name, data),
                                                /*ends_drive=*/false,
                                                SagaRun::Durable::kWithNextFlush));
      queue->push_back(c);
    } else {
      queue->push_back(c);
    }
  }
  return Status::Ok();
}

// A planned step's arguments, into the drive. False: the step is decided
// without a call and its queue holds the record (over a bound it fails; a
// template without a value parks it).
Result<bool> ResolvePlanned(SagaRun* run, StepDrive* d) {
  auto args = run->ResolveStepArgs(d->index);
  if (!args.ok() && IsLimitRefusal(args.status())) {
    // Over a bound (saga/limits.h): refused before any call, so the
    // step fails and the saga rolls back what it did.
    d->st.error = args.status().message();
    IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kFailed));
    return false;  // queue holds kRecordFailed
  }
  if (!args.ok()) {
    // No drive will find the value: a person decides (saga/park.h).
    d->st.error = BlockedReason(TemplateParkCode(args.status()), args.status().message());
    IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kBlocked));
    return false;  // queue holds kParkStep
  }
  d->st.args = *args;
  d->st.args_fingerprint = Fingerprint(d->st.args);
  return true;
}

// A one-phase step's `submitted`, durable now or with the next flush (the
// `submitted` of branches that start together, saga/branches.h); the queue
// then holds its call.
Status Submit(SagaRun* run, StepDrive* d, SagaRun::Durable durable) {
  ++d->st.attempt;  // 1, or one more after a person asked for a retry
  IDEM_FAILPOINT("step.before_submitted");
  IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kSubmitted));
  return run->CommitStep(*d, "submitted",
                         {{"attempt", d->st.attempt},
                          {"key", d->key},
                          {"tool", d->spec->tool},
                          {"args_fingerprint", d->st.args_fingerprint}},
                         {}, durable);
}

// One drive of a forward step, until it ends or its commit went stale.
Result<StepEnd> DriveStepOnce(SagaRun* run, int index) {
  auto begun = run->BeginStep(index, /*rolling_back=*/false);
  if (!begun.ok()) return begun.status();
  StepDrive& d = *begun;
  const StepSpec& spec = *d.spec;
  switch (d.state()) {
    case StepState::kSucceeded:
      return StepEnd::kSucceeded;
    case StepState::kFailed:
      return StepEnd::kFailed;
    case StepState::kNeedsAttention:
      return StepEnd::kParked;
    case StepState::kPlanned: {
      auto resolved = ResolvePlanned(run, &d);
      if (!resolved.ok()) return resolved.status();
      if (!*resolved) break;               // the queue holds its record
      auto before = BeforeWrite(run, &d);  // its key, its guard (saga/guard.h)
      if (!before.ok()) return before.status();
      if (*before) return **before;
      if (spec.two_phase) {
        auto phase = preview_commit::AdvanceTwoPhase(run, &d);
        if (!phase.ok()) return phase.status();
        if (*phase == preview_commit::PhaseEnd::kWaiting) return StepEnd::kWaiting;
        break;
      }
      IDEM_RETURN_IF_ERROR(Submit(run, &d, SagaRun::Durable::kNow));
      IDEM_FAILPOINT("step.after_submitted");
      break;
    }
    case StepState::kSubmitted:
    case StepState::kUnknown:
    case StepState::kProcessing:  // its check is due (saga/completion.h)
      return run->SettleUncertain(&d);
    case StepState::kPreviewed:
    case StepState::kAwaitingApproval: {
      auto phase = preview_commit::AdvanceTwoPhase(run, &d);
      if (!phase.ok()) return phase.status();
      if (*phase == preview_commit::PhaseEnd::kWaiting) return StepEnd::kWaiting;
      break;
    }
    default:
      return Status::FailedPrecondition(std::string("step ") + d.st.step_id + " is " +
                                        StepStateName(d.state()) + ", not runnable");
  }
  return run->RunCommands(&d);
}

// A forward step, driven until it ends (a stale commit previews again).
Result<StepEnd> DriveStep(SagaRun* run, int index) {
  for (;;) {
    auto end = DriveStepOnce(run, index);
    if (!end.ok() || *end != StepEnd::kStale) return end;
  }
}

// A planned one-phase step, its `submitted` staged to start with others
// (saga/branches.h); nullopt for a step driven whole.
Result<std::optional<StepDrive>> StageStep(SagaRun* run, int index) {
  const StepSpec& spec = run->spec().steps[index];
  if (run->step_state(index) != StepState::kPlanned || spec.two_phase || spec.guard) {
    return std::optional<StepDrive>();  // a guard asks first (saga/guard.h)
  }
  auto begun = run->BeginStep(index, /*rolling_back=*/false);
  if (!begun.ok()) return begun.status();
  if (begun->key.empty()) return std::optional<StepDrive>();  // parks (saga/guard.h)
  auto resolved = ResolvePlanned(run, &*begun);
  if (!resolved.ok()) return resolved.status();
  if (*resolved) IDEM_RETURN_IF_ERROR(Submit(run, &*begun, SagaRun::Durable::kWithNextFlush));
  return std::optional<StepDrive>(std::move(*begun));
}

// An open saga's next call (saga/open_saga.h): its calls run one at a time,
// in the order they were appended, and a failed call is the agent's to
// judge: the next call goes on.
Status RunNextCall(SagaRun* run, std::deque<SagaCommand>* queue) {
  const int n = run->step_count();
  int i = 0;
  while (i < n && (run->step_state(i) == StepState::kSucceeded ||
                   run->step_state(i) == StepState::kFailed)) {
    ++i;
  }
  SagaFacts facts;
  facts.open_saga = true;
  if (i == n) return FireSaga(run, SagaEvent::kStepCompleted, queue, facts);
  auto end = DriveStep(run, i);
  if (!end.ok()) return end.status();
  const storage::StepRecord& st = run->record().steps[i];
  switch (*end) {
    case StepEnd::kSucceeded:
      facts.more_steps = i + 1 < n;
      return FireSaga(run, SagaEvent::kStepCompleted, queue, facts);
    case StepEnd::kFailed:
      run->set_park_reason("step " + st.step_id + " failed: " + st.error);
      facts.effects_to_undo =
          compensation::HasEffectsToUndo(run->record().steps, run->compensable());
      return FireSaga(run, SagaEvent::kStepFailed, queue, facts);
    case StepEnd::kParked:
      run->set_park_reason("step " + st.step_id + ": " + st.error);
      return FireSaga(run, SagaEvent::kStepParked, queue);
    case StepEnd::kWaiting:
      return FireSaga(run, SagaEvent::kStepAwaitingApproval, queue);
    case StepEnd::kProcessing:
      return FireSaga(run, SagaEvent::kStepProcessing, queue);
    case StepEnd::kStale:
      break;  // DriveStep drives a stale commit again
  }
  return Status::Internal("unreachable");
}

// kRunNextStep: the steps that are ready (one, or several at once where
// the step graph lets them: saga/branches.h), then the saga event for what
// they came to.
Status RunNextStep(SagaRun* run, std::deque<SagaCommand>* queue) {
  if (IsOpenPlan(run->spec().raw)) return RunNextCall(run, queue);
  const StepDrivers drivers{[run](int i) { return DriveStep(run, i); },
                            [run](int i) { return StageStep(run, i); }};
  auto round = RunReadySteps(run, drivers);
  if (!round.ok()) return round.status();
  const int n = run->step_count();
  switch (round->end) {
    case ForwardRound::kAllSucceeded:
      return FireSaga(run, SagaEvent::kStepCompleted, queue, SagaFacts::WithMoreSteps(false));
    case ForwardRound::kMore:
      return FireSaga(run, SagaEvent::kStepCompleted, queue, SagaFacts::WithMoreSteps(n > 0));
    case ForwardRound::kFailed: {
      const storage::StepRecord& st = run->record().steps[round->step];
      run->set_park_reason("step " + st.step_id + " failed: " + st.error);
      return FireSaga(run, SagaEvent::kStepFailed, queue,
                      SagaFacts::WithEffectsToUndo(
                          compensation::HasEffectsToUndo(run->record().steps, run->compensable())));
    }
    case ForwardRound::kParked: {
      const storage::StepRecord& st = run->record().steps[round->step];
      run->set_park_reason("step " + st.step_id + ": " + st.error);
      return FireSaga(run, SagaEvent::kStepParked, queue);
    }
    case ForwardRound::kWaiting:
      return FireSaga(run, SagaEvent::kStepAwaitingApproval, queue);
    case ForwardRound::kProcessing:
      return FireSaga(run, SagaEvent::kStepProcessing, queue);
  }
  return Status::Internal("unreachable");
}

// Carries out the saga's pending control request (saga/control_drive.h):
// the state change is durable before the request is settled. True: the
// queue holds what the drive does next (empty: the drive ends).
Result<bool> TakeControl(SagaRun* run, std::deque<SagaCommand>* queue) {
  auto order = JudgeControl(run);
  if (!order.ok()) return order.status();
  if (!order->has_value()) return false;
  if (!(*order)->reason.empty()) run->set_park_reason((*order)->reason);
  queue->clear();
  IDEM_RETURN_IF_ERROR(FireSaga(run, (*order)->event, queue, (*order)->facts));
  IDEM_RETURN_IF_ERROR(run->Flush());
  IDEM_RETURN_IF_ERROR(run->SettleControl((*order)->request.request_id));
  return true;
}

// A saga awaiting completion: a waiting step's check is due.
Result<bool> DueCompletion(SagaRun* run) {
  auto earliest = run->EarliestCheck();
  if (!earliest.ok()) return earliest.status();
  // A waiting saga without a check (none can be written without the other)
  // is driven: its step's lookup says where it stands.
  return !earliest->has_value() || **earliest <= run->clock()->NowMs();
}

// The drive's first commands, by the saga's state (none: nothing to drive).
Status FirstCommands(SagaRun* run, std::deque<SagaCommand>* queue) {
  switch (run->state()) {
    case SagaState::kPending: {
      SagaMachine saga(run->state());
      auto cmds = saga.Fire(SagaEvent::kStarted);
      if (!cmds.ok()) return cmds.status();
      // Durable with the first step's `submitted`.
      IDEM_RETURN_IF_ERROR(
          run->CommitSagaState(saga.state(), "", run->Entry("", "saga_started", Json::object()),
                               /*ends_drive=*/false, SagaRun::Durable::kWithNextFlush));
      IDEM_FAILPOINT("saga.after_start");
      queue->assign(cmds->begin(), cmds->end());
      break;
    }
    case SagaState::kRunning:
      queue->push_back(SagaCommand::kRunNextStep);
      break;
    case SagaState::kCompensating:
      queue->push_back(SagaCommand::kUndoNextStep);
      break;
    case SagaState::kAwaitingApproval:
      // Go on once the approval is decided or has expired; else nothing to do.
      if (!preview_commit::ApprovalSettled(*run, run->clock()->NowMs())) return Status::Ok();
      IDEM_RETURN_IF_ERROR(FireSaga(run, SagaEvent::kApprovalSettled, queue));
      break;
    case SagaState::kAwaitingCompletion: {
      // Go on once a waiting step's check is due; else nothing to do.
      auto due = DueCompletion(run);
      if (!due.ok()) return due.status();
      if (*due) IDEM_RETURN_IF_ERROR(FireSaga(run, SagaEvent::kCompletionDue, queue));
      break;
    }
    case SagaState::kOpen: {
      // Nothing to drive until the next call, unless it idled past its timeout.
      auto idle = OpenIdleEvent(*run);
      if (!idle) return Status::Ok();
      run->set_park_reason(idle->reason);
      IDEM_RETURN_IF_ERROR(FireSaga(run, SagaEvent::kIdleTimedOut, queue, idle->facts));
      break;
    }
    default:
      return Status::Ok();  // terminal, parked or waiting: nothing to drive
  }
  return Status::Ok();
}

Status DriveStates(SagaRun* run) {
  std::deque<SagaCommand> queue;
  auto taken = TakeControl(run, &queue);  // a cancel, pause or resume first
  if (!taken.ok()) return taken.status();
  // True while the request was just read and found none, and no step was
  // driven since: the first command needs no second read.
  bool checked = false;
  if (!*taken) {
    IDEM_RETURN_IF_ERROR(FirstCommands(run, &queue));
    checked = true;
  }

  while (!queue.empty()) {
    if (run->Stopping()) return Status::Aborted("stopping: saga left between steps");
    if (!checked) {
      taken = TakeControl(run, &queue);  // between steps
      if (!taken.ok()) return taken.status();
      if (*taken) continue;
    }
    checked = false;
    SagaCommand cmd = queue.front();
    queue.pop_front();
    switch (cmd) {
      case SagaCommand::kRunNextStep: {
        IDEM_RETURN_IF_ERROR(RunNextStep(run, &queue));
        break;
      }
      case SagaCommand::kUndoNextStep: {
        auto event = compensation::UndoNextStep(run);
        if (!event.ok()) return event.status();
        if (*event) {
          IDEM_RETURN_IF_ERROR(FireSaga(run, (*event)->event, &queue, (*event)->facts));
        } else {
          queue.push_back(SagaCommand::kUndoNextStep);  // resolved: look again
        }
        break;
      }
      default:  // FireSaga commits terminal and parked states itself
        return Status::Internal(std::string("unexpected saga command ") + SagaCommandName(cmd));
    }
  }
  return Status::Ok();
}

// A write the store refused for another reason than a lost lease or a busy
// store would be refused again by every drive: the saga parks (saga/park.h)
// with what was durable before it, and the drive's error says so.
Status ParkAfterStoreRefusal(SagaRun* run, const Status& error) {
  const Status& refused = run->store_refusal();
  // A saga whose create was refused was never recorded: nothing to park.
  if (refused.ok() || refused.code() == Code::kAborted || refused.code() == Code::kUnavailable ||
      run->unborn()) {
    return error;
  }
  Status parked = run->ParkAfterFault(
      BlockedReason(ParkCode::kStoreError,
                    "the store refused the drive's write: " + refused.message()),
      /*rewind=*/true);
  if (parked.ok()) return Status::Ok();  // ended parked, like any other park
  return Status(error.code(), error.message() + " (not parked: " + parked.message() + ")");
}

}  // namespace

Status DriveSaga(SagaRun* run) {
  Status s = DriveStates(run);
  // What was staged is valid progress even when the drive stopped early
  // (stopping, a lost lease refuses it, a tool not registered).
  Status flushed = run->Flush();
  Status out = s.ok() ? flushed : s;
  if (!out.ok()) out = ParkAfterStoreRefusal(run, out);
  return out;
}

}  // namespace idem
