// A person's decisions: Engine::Resolve (a parked step: applied,
// not_applied, retry; the undo decisions undone and retry_undo are the undo
// driver's, compensation/undo.h) and Engine::Decide (an approval: who may
// decide is saga/approval_rights.h, the decision is checked and recorded by
// preview_commit/two_phase.h). Each claims the saga's lease
// before it reads the saga, checks and writes under it, then drives the
// saga on with the same lease. The durable control requests (Cancel, Pause,
// Resume) are saga/control.cc.

#include <string>

#include "compensation/undo.h"
#include "preview_commit/two_phase.h"
#include "saga/approval_rights.h"
#include "saga/engine.h"
#include "saga/machines.h"
#include "saga/park.h"
#include "saga/run.h"
#include "saga/states.h"

#include "common/failpoint.h"

namespace idem {
namespace {

using storage::SagaRecord;
using storage::StepRecord;

// A lease claimed for a person's decision: released on every way out but
// the one that hands it to RunLeased (which releases it itself).
class ClaimedLease {
 public:
  ClaimedLease(storage::Store* store, storage::Lease lease)
      : store_(store), lease_(std::move(lease)) {}
  ~ClaimedLease() {
    if (!handed_ && lease_.epoch != 0) (void)store_->ReleaseLease(lease_);
  }
  ClaimedLease(const ClaimedLease&) = delete;
  ClaimedLease& operator=(const ClaimedLease&) = delete;
  const storage::Lease& lease() const { return lease_; }
  const storage::Lease& Hand() {
    handed_ = true;
    return lease_;
  }

 private:
  storage::Store* store_;
  storage::Lease lease_;
  bool handed_ = false;
};

StepEvent OperatorEvent(Decision d) {
  switch (d) {
    case Decision::kApplied:
      return StepEvent::kOperatorApplied;
    case Decision::kNotApplied:
      return StepEvent::kOperatorNotApplied;
    case Decision::kRetry:
      return StepEvent::kOperatorRetry;
    case Decision::kUndone:
      return StepEvent::kOperatorUndone;
    case Decision::kRetryUndo:
      return StepEvent::kOperatorRetryUndo;
  }
  return StepEvent::kOperatorNotApplied;
}

bool InRollback(StepState s) {
  return s == StepState::kCompensating || s == StepState::kCompensated ||
         s == StepState::kCompensationFailed;
}

}  // namespace

Result<SagaRecord> Engine::Resolve(const std::string& saga_id, const Resolution& r) {
  if (r.who.empty()) return Status::InvalidArgument("resolve: who decided is required (--as NAME)");
  // Read, check and write under the saga's lease: a decision taken on a
  // read made before the claim could write over another driver's progress.
  auto claimed = ClaimForDecision(saga_id);
  if (!claimed.ok()) return claimed.status();
  ClaimedLease lease(store_, *claimed);
  auto rec = store_->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  auto saga = LoadedSaga::From(std::move(rec).value());
  if (!saga.ok()) return saga.status();
  const SagaRecord& record = saga->record;
  if (saga->state != SagaState::kNeedsAttention) {
    return Status::FailedPrecondition("saga " + saga_id + " is " + record.summary.state +
                                      ", not needs_attention");
  }
  int index = -1;
  for (size_t i = 0; i < record.steps.size(); ++i) {
    if (record.steps[i].step_id == r.step_id) index = static_cast<int>(i);
  }
  if (index < 0) return Status::NotFound("saga " + saga_id + " has no step \"" + r.step_id + "\"");
  StepRecord st = record.steps[index];
  StepMachine m(saga->steps[index]);
  auto cmds = m.Fire(OperatorEvent(r.decision));
  if (!cmds.ok()) {
    return Status::FailedPrecondition("step " + r.step_id + " is " + st.state + ": decision \"" +
                                      DecisionName(r.decision) + "\" does not apply");
  }
  int64_t now = options_.clock->NowMs();
  storage::WriteBatch b;
  b.saga_id = saga_id;
  st.state = StepStateName(m.state());
  st.updated_ms = now;
  storage::JournalEntry je;
  je.saga_id = saga_id;
  je.step_id = st.step_id;
  je.event = "operator_resolved";
  je.data = {{"by", r.who}, {"decision", DecisionName(r.decision)}, {"note", r.note}};
  je.at_ms = now;
  b.journal.push_back(je);
  switch (r.decision) {
    case Decision::kApplied: {
      // Never leave a later step or a compensation without its values.
      if (auto spec = CachedSpec(record.spec); spec.ok() && index < int(spec->steps.size())) {
        IDEM_RETURN_IF_ERROR(CheckResolvedValues(*spec, record, index, r.result));
      }
      st.result = r.result;
      st.error.clear();
      storage::EffectRecord eff{saga_id,     st.step_id, "action", st.tool,
                                st.step_key, r.result,   "",       now};
      b.effects.push_back(eff);
      break;
    }
    case Decision::kNotApplied:
      st.error =
          "resolved by " + r.who + ": not applied" + (r.note.empty() ? "" : " (" + r.note + ")");
      break;
    case Decision::kRetry:
      st.error.clear();
      break;
    case Decision::kUndone:
    case Decision::kRetryUndo: {
      auto spec = CachedSpec(record.spec);
      std::string comp_tool = st.tool;
      if (spec.ok() && index < static_cast<int>(spec->steps.size()) &&
          spec->steps[index].compensate) {
        comp_tool = spec->steps[index].compensate->tool;
      }
      IDEM_RETURN_IF_ERROR(compensation::ApplyUndoDecision(r, comp_tool, now, &st, &b));
      break;
    }
  }
  b.steps.push_back(st);
  // Undo on if a rollback had begun, else go on forward (a step now failed
  // starts the rollback from there).
  bool rolling_back = false;
  for (size_t i = 0; i < saga->steps.size(); ++i) {
    rolling_back |= InRollback(static_cast<int>(i) == index ? m.state() : saga->steps[i]);
  }
  SagaMachine machine(SagaState::kNeedsAttention);
  auto scmds = machine.Fire(SagaEvent::kOperatorResumed, SagaFacts::WithRollingBack(rolling_back));
  if (!scmds.ok()) return scmds.status();
  b.saga_state = SagaStateName(machine.state());
  b.saga_reason = record.summary.reason;
  storage::JournalEntry resumed = je;
  resumed.step_id.clear();
  resumed.event = std::string("saga_") + SagaStateName(machine.state());
  resumed.data = {{"resumed_by", r.who}};
  b.journal.push_back(resumed);
  IDEM_RETURN_IF_ERROR(CommitClaimed(lease.lease(), &b));
  return RunLeased(lease.Hand());
}

Result<SagaRecord> Engine::Decide(const std::string& token, const ApprovalDecision& d) {
  if (options_.signer == nullptr) {
    return Status::FailedPrecondition("no token signer is configured");
  }
  if (d.who.empty())
    return Status::InvalidArgument("approval: who decides is required (--as NAME)");
  if (!d.approve && d.note.empty()) {
    return Status::InvalidArgument("rejection: a reason is required (--reason TEXT)");
  }
  // MAC, version, key and expiry first: nothing else is trusted before.
  auto claims = options_.signer->Open(token);
  if (!claims.ok()) return claims.status();
  if ((!d.expected_saga_id.empty() && d.expected_saga_id != claims->saga_id) ||
      (!d.expected_step_id.empty() && d.expected_step_id != claims->step_id)) {
    return Status::FailedPrecondition(std::string(preview_commit::kMismatchedTokenMessage));
  }
  // Read, check and write under the saga's lease (see Resolve).
  auto claimed = ClaimForDecision(claims->saga_id);
  if (!claimed.ok()) return claimed.status();
  ClaimedLease lease(store_, *claimed);
  DriveMark driving(this, claims->saga_id);  // a control request here is left to this drive
  auto rec = store_->LoadSaga(claims->saga_id);
  if (!rec.ok()) return rec.status();
  auto saga = LoadedSaga::From(std::move(rec).value());
  if (!saga.ok()) return saga.status();
  // Who may decide (saga/approval_rights.h): the same rules for the CLI,
  // the REST API and the web UI.
  for (const StepRecord& st : saga->record.steps) {
    if (st.step_id == claims->step_id) IDEM_RETURN_IF_ERROR(CheckDecider(saga->record, st, d));
  }
  storage::WriteBatch b;
  auto recorded = preview_commit::RecordApproval(*claims, d, options_.clock->NowMs(), *saga, &b);
  if (!recorded.ok()) return recorded.status();
  switch (*recorded) {
    case preview_commit::ApprovalOutcome::kFinished:
      return std::move(saga->record);
    case preview_commit::ApprovalOutcome::kReplayed:
      return RunLeased(lease.Hand());  // finish what a crash interrupted
    case preview_commit::ApprovalOutcome::kCounted: {
      // An approval short of the quorum: recorded; the commit waits on.
      IDEM_RETURN_IF_ERROR(CommitClaimed(lease.lease(), &b));
      IDEM_FAILPOINT("approval.after_counted");
      return store_->LoadSaga(claims->saga_id);
    }
    case preview_commit::ApprovalOutcome::kRecorded:
      break;
  }
  // The decision is written under the saga's lease like any other write,
  // and the same lease then drives the commit.
  IDEM_RETURN_IF_ERROR(CommitClaimed(lease.lease(), &b));
  IDEM_FAILPOINT("approval.after_commit");
  auto out = RunLeased(lease.Hand());
  if (!out.ok() && out.status().code() == Code::kConflict) {
    // Another process spent the token first: report what it recorded.
    return store_->LoadSaga(claims->saga_id);
  }
  return out;
}

}  // namespace idem
