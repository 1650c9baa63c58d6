// The durable control requests: Engine::Cancel, Pause and Resume. Each
// checks the saga's state, records the request in the store
// (storage/control_store.h, with its journal entry), then, when asked to and
// nobody else drives the saga, drives it here: the drive carries the request
// out before it starts (saga/control_drive.h). A saga driven elsewhere (a
// lease another process holds, or a drive of this engine right now) is left
// to that drive, which reads the store between steps.

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "saga/engine.h"
#include "saga/states.h"

#include "common/json_util.h"

namespace idem {
namespace {

using storage::SagaRecord;

Status Refused(const SagaRecord& rec, const std::string& what) {
  return Status::FailedPrecondition("saga " + rec.summary.saga_id + " is " + rec.summary.state +
                                    "; " + what);
}

std::string WaitsForStep(const SagaRecord& rec) {
  for (const storage::StepRecord& st : rec.steps) {
    if (st.state == StepStateName(StepState::kNeedsAttention) ||
        st.state == StepStateName(StepState::kCompensationFailed)) {
      return st.step_id;
    }
  }
  return "";
}

// The saga and its typed state.
Result<std::pair<SagaRecord, SagaState>> LoadWithState(storage::Store* store,
                                                       const std::string& saga_id) {
  auto rec = store->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  auto state = ParseSagaState(rec->summary.state);
  if (!state) return Status::Internal("saga " + saga_id + ": unknown state " + rec->summary.state);
  return std::make_pair(std::move(rec).value(), *state);
}

// The answer to a recorded request: carried out here when `drive` and
// nobody else drives the saga (`drive_if_free`), else recorded for the
// process that does; `still_pending` judges the saga as it then stands.
Result<ControlResult> Answer(storage::Store* store, const std::string& saga_id, bool drive,
                             const std::function<Result<bool>(SagaRecord*)>& drive_if_free,
                             ControlResult result, const std::string& done,
                             const std::function<bool(const SagaRecord&)>& still_pending,
                             const std::string& pending_note) {
  if (drive) {
    SagaRecord driven;
    auto here = drive_if_free(&driven);
    if (!here.ok()) return here.status();
    if (*here) {
      result.saga = std::move(driven);
      result.note = done + result.saga.summary.state;
      return result;
    }
  }
  auto now = store->LoadSaga(saga_id);
  if (!now.ok()) return now.status();
  result.saga = std::move(now).value();
  result.pending = still_pending(result.saga);
  result.note = result.pending ? pending_note : done + result.saga.summary.state;
  return result;
}

}  // namespace

Result<storage::ControlOutcome> Engine::Record(const std::string& saga_id, const char* kind,
                                               const ControlRequest& request) {
  storage::ControlStore* controls = store_->Controls();
  if (controls == nullptr) {
    return Status::FailedPrecondition(std::string(kind) + ": this store keeps no control requests");
  }
  storage::ControlRequest r;
  r.saga_id = saga_id;
  r.request_id = NewId("ctl_");
  r.kind = kind;
  r.by = request.who;
  r.reason = request.reason;
  r.requested_ms = options_.clock->NowMs();
  auto out = controls->RequestControl(r);
  if (out.ok() && out->recorded && options_.observer) {
    storage::JournalEntry e;
    e.saga_id = saga_id;
    e.event = r.kind + "_requested";
    e.data = {{"by", r.by}, {"reason", r.reason}, {"request", r.request_id}};
    e.at_ms = r.requested_ms;
    options_.observer(e);
  }
  return out;
}

Result<bool> Engine::DriveIfFree(const std::string& saga_id, SagaRecord* out) {
  if (DrivenHere(saga_id)) return false;
  auto lease = Claim(saga_id);
  if (!lease.ok()) {
    if (lease.status().code() == Code::kAborted) return false;  // another process drives it
    return lease.status();
  }
  auto rec = RunLeased(*lease);
  if (!rec.ok()) return rec.status();
  *out = std::move(rec).value();
  return true;
}

Result<ControlResult> Engine::Cancel(const std::string& saga_id, const ControlRequest& request) {
  if (request.who.empty()) return Status::InvalidArgument("cancel: who cancels is required");
  auto loaded = LoadWithState(store_, saga_id);
  if (!loaded.ok()) return loaded.status();
  std::optional<SagaRecord> rec = std::move(loaded->first);
  const std::optional<SagaState> state = loaded->second;
  ControlResult result;
  if (*state == SagaState::kCancelled || *state == SagaState::kCompensating) {
    result.saga = std::move(*rec);
    result.note = *state == SagaState::kCancelled ? "the saga is cancelled already"
                                                  : "the saga is rolling back already";
    return result;
  }
  if (IsTerminal(*state)) {
    // Twice is once: a saga rolled back after a cancel answers as it stands.
    auto journal = store_->ReadJournal(saga_id);
    if (!journal.ok()) return journal.status();
    for (const storage::JournalEntry& e : *journal) {
      if (e.event == "cancel_requested") {
        result.saga = std::move(*rec);
        result.note = "the cancel was carried out: the saga is " + result.saga.summary.state;
        return result;
      }
    }
    return Refused(*rec, "a finished saga cannot be cancelled");
  }
  auto recorded = Record(saga_id, "cancel", request);
  if (!recorded.ok()) return recorded.status();
  result.recorded = recorded->recorded;
  if (*state == SagaState::kNeedsAttention) {
    const std::string step = WaitsForStep(*rec);
    result.saga = std::move(*rec);
    result.pending = true;
    result.note =
        "cancel recorded: the saga needs attention; it rolls back once a person "
        "resolves " +
        (step.empty() ? std::string("the parked step") : "step " + step) + " (idem resolve)";
    return result;
  }
  return Answer(
      store_, saga_id, request.drive,
      [this, &saga_id](SagaRecord* out) { return DriveIfFree(saga_id, out); }, std::move(result),
      "cancelled: the saga is ", [](const SagaRecord&) { return true; },
      "cancel recorded: the process driving the saga rolls it back after the step in progress");
}

Result<ControlResult> Engine::Pause(const std::string& saga_id, const ControlRequest& request) {
  if (request.who.empty()) return Status::InvalidArgument("pause: who pauses is required");
  auto loaded = LoadWithState(store_, saga_id);
  if (!loaded.ok()) return loaded.status();
  std::optional<SagaRecord> rec = std::move(loaded->first);
  const std::optional<SagaState> state = loaded->second;
  ControlResult result;
  if (*state == SagaState::kPaused) {
    result.saga = std::move(*rec);
    result.note = "the saga is paused already";
    return result;
  }
  if (IsTerminal(*state)) return Refused(*rec, "a finished saga cannot be paused");
  if (*state == SagaState::kAwaitingApproval || *state == SagaState::kNeedsAttention) {
    return Refused(*rec, "it waits for a person and runs nothing until then");
  }
  auto recorded = Record(saga_id, "pause", request);
  if (!recorded.ok()) return recorded.status();
  result.recorded = recorded->recorded;
  if (!recorded->recorded && recorded->pending.kind == "cancel") {
    result.saga = std::move(*rec);
    result.pending = true;
    result.note = "a cancel is pending; the pause is not recorded";
    return result;
  }
  return Answer(
      store_, saga_id, request.drive,
      [this, &saga_id](SagaRecord* out) { return DriveIfFree(saga_id, out); }, std::move(result),
      "the saga is ",
      [](const SagaRecord& r) { return r.summary.state != SagaStateName(SagaState::kPaused); },
      "pause recorded: the process driving the saga stops it after the step in progress");
}

Result<ControlResult> Engine::Resume(const std::string& saga_id, const ControlRequest& request) {
  if (request.who.empty()) return Status::InvalidArgument("resume: who resumes is required");
  auto loaded = LoadWithState(store_, saga_id);
  if (!loaded.ok()) return loaded.status();
  std::optional<SagaRecord> rec = std::move(loaded->first);
  const std::optional<SagaState> state = loaded->second;
  if (IsTerminal(*state)) return Refused(*rec, "a finished saga cannot be resumed");
  ControlResult result;
  storage::ControlStore* controls = store_->Controls();
  std::optional<storage::ControlRequest> pending;
  if (controls != nullptr) {
    auto p = controls->PendingControl(saga_id);
    if (!p.ok()) return p.status();
    pending = std::move(p).value();
  }
  const bool pause_pending = pending && pending->kind == "pause";
  if (*state != SagaState::kPaused && !pause_pending) {
    result.saga = std::move(*rec);
    result.note = "the saga is not paused; nothing to resume";
    return result;
  }
  auto recorded = Record(saga_id, "resume", request);
  if (!recorded.ok()) return recorded.status();
  result.recorded = recorded->recorded;
  if (!recorded->recorded && recorded->pending.kind == "cancel") {
    result.saga = std::move(*rec);
    result.pending = true;
    result.note = "a cancel is pending; the resume is not recorded";
    return result;
  }
  if (*state != SagaState::kPaused) {
    result.saga = std::move(*rec);
    result.note = "the pending pause is withdrawn";
    return result;
  }
  return Answer(
      store_, saga_id, request.drive,
      [this, &saga_id](SagaRecord* out) { return DriveIfFree(saga_id, out); }, std::move(result),
      "resumed: the saga is ",
      [](const SagaRecord& r) { return r.summary.state == SagaStateName(SagaState::kPaused); },
      "resume recorded: the next drive of the saga resumes it");
}

}  // namespace idem
