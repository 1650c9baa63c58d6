#include "saga/control_drive.h"

#include "compensation/rollback.h"
#include "preview_commit/phase.h"
#include "saga/states.h"

namespace idem {
namespace {

using storage::ControlRequest;

// A cancel of a saga waiting for approval rejects the waiting commit, as
// `reject` would: the drive then goes on with the rejection (a rollback).
Status RejectWaitingCommit(SagaRun* run, const ControlRequest& r) {
  for (int i = 0; i < run->step_count(); ++i) {
    if (run->step_state(i) != StepState::kAwaitingApproval) continue;
    auto phase = preview_commit::PhaseRecord::FromJson(run->record().steps[i].phase);
    if (!phase || phase->approval) continue;  // decided already: the drive goes on with it
    auto begun = run->BeginStep(i, /*rolling_back=*/false);
    if (!begun.ok()) return begun.status();
    const int64_t now = run->clock()->NowMs();
    const std::string note = ControlReason(r);
    phase->approval = preview_commit::ApprovalRecord{preview_commit::ApprovalRecord::kRejected,
                                                     r.by, note, now, ""};
    begun->st.phase = phase->ToJson();
    begun->st.updated_ms = now;
    return run->CommitEntries(
        *begun, {run->Entry(begun->st.step_id, preview_commit::ApprovalRecord::kRejected,
                            {{"by", r.by}, {"note", note}, {"request", r.request_id}})});
  }
  return Status::Ok();
}

// A step is processing: its provider may still finish it, so the rollback
// (or the pause) waits for its status to settle; it never assumes it did
// not happen.
bool WaitsForProvider(const SagaRun& run) {
  if (run.state() == SagaState::kAwaitingCompletion) return true;
  for (int i = 0; i < run.step_count(); ++i) {
    if (run.step_state(i) == StepState::kProcessing) return true;
  }
  return false;
}

}  // namespace

std::string ControlReason(const ControlRequest& r) {
  if (r.kind == "cancel") return r.reason.empty() ? "cancelled by " + r.by : r.reason;
  return "paused by " + r.by + (r.reason.empty() ? "" : ": " + r.reason);
}

Result<std::optional<ControlOrder>> JudgeControl(SagaRun* run) {
  auto pending = run->PendingControl();
  if (!pending.ok()) return pending.status();
  if (!pending->has_value()) return std::optional<ControlOrder>();
  ControlOrder order;
  order.request = **pending;
  const ControlRequest& r = order.request;
  const SagaState state = run->state();
  if (WaitsForProvider(*run) && r.kind != "resume") {
    // A step's provider may still finish it: cancel and pause wait until
    // its status settles (saga/completion.h), then apply.
    return std::optional<ControlOrder>();
  }
  const bool drivable = state == SagaState::kPending || state == SagaState::kRunning ||
                        state == SagaState::kPaused || state == SagaState::kOpen;
  bool apply = false;
  if (r.kind == "cancel") {
    if (state == SagaState::kNeedsAttention) return std::optional<ControlOrder>();  // the resolve
    if (state == SagaState::kAwaitingApproval) {
      IDEM_RETURN_IF_ERROR(RejectWaitingCommit(run, r));
      IDEM_RETURN_IF_ERROR(run->SettleControl(r.request_id));
      return std::optional<ControlOrder>();
    }
    apply = drivable;
    order.event = SagaEvent::kCancelRequested;
    if (state == SagaState::kPaused) {
      order.facts = SagaFacts::WithEffectsToUndo(
          compensation::HasEffectsToUndo(run->record().steps, run->compensable()));
    }
    order.reason = ControlReason(r);
  } else if (r.kind == "pause") {
    if (state == SagaState::kNeedsAttention || state == SagaState::kAwaitingApproval) {
      return std::optional<ControlOrder>();  // stops once a person let it go on
    }
    apply = state == SagaState::kPending || state == SagaState::kRunning ||
            state == SagaState::kCompensating || state == SagaState::kOpen;
    order.event = SagaEvent::kPauseRequested;
    order.reason = ControlReason(r);
  } else if (r.kind == "resume") {
    apply = state == SagaState::kPaused;
    order.event = SagaEvent::kResumed;
    if (apply) {
      auto rolling_back = run->PausedWhileRollingBack();
      if (!rolling_back.ok()) return rolling_back.status();
      order.facts = SagaFacts::WithRollingBack(*rolling_back);
    }
  }
  if (!apply) {
    // Moot in this state (already rolling back, paused, running, finished).
    IDEM_RETURN_IF_ERROR(run->SettleControl(r.request_id));
    return std::optional<ControlOrder>();
  }
  return std::optional<ControlOrder>(std::move(order));
}

}  // namespace idem
