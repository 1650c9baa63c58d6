// A person's decisions and a caller's cancel: Engine::Resolve (a parked step: applied,
// not_applied, retry; the undo decisions undone and retry_undo are the undo
// driver's, compensation/undo.h) and Engine::Decide (an approval, checked
// and recorded by preview_commit/two_phase.h). Each claims the saga's lease
// before it reads the saga, checks and writes under it, then drives the
// saga on with the same lease. Engine::Cancel, by the saga's state: a pending
// saga is cancelled at once, one awaiting approval is rejected (Decide), a
// running one (or one this engine drives now) gets a request its drive takes
// between steps (SagaRun::CancelWhen).

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "compensation/undo.h"
#include "preview_commit/two_phase.h"
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
  DriveMark driving(this, claims->saga_id);  // a Cancel here records a request
  auto rec = store_->LoadSaga(claims->saga_id);
  if (!rec.ok()) return rec.status();
  auto saga = LoadedSaga::From(std::move(rec).value());
  if (!saga.ok()) return saga.status();
  storage::WriteBatch b;
  auto recorded = preview_commit::RecordApproval(*claims, d, options_.clock->NowMs(), *saga, &b);
  if (!recorded.ok()) return recorded.status();
  switch (*recorded) {
    case preview_commit::ApprovalOutcome::kFinished:
      return std::move(saga->record);
    case preview_commit::ApprovalOutcome::kReplayed:
      return RunLeased(lease.Hand());  // finish what a crash interrupted
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

// ---- cancel

struct Engine::CancelBook {
  std::mutex mu;
  std::condition_variable cv;                                // a Cancel's write finished
  std::unordered_map<std::string, int> driving;              // GUARDED_BY(mu) saga -> drives
  std::unordered_map<std::string, std::thread::id> writing;  // GUARDED_BY(mu) a Cancel writes it
  std::unordered_map<std::string, std::string> requests;     // GUARDED_BY(mu) saga -> reason
};

std::shared_ptr<Engine::CancelBook> Engine::NewCancelBook() {
  return std::make_shared<CancelBook>();
}

void Engine::BeginDrive(const std::string& saga_id) {
  std::unique_lock<std::mutex> lock(cancels_->mu);
  // A Cancel's own rejection (Decide) drives on its thread.
  cancels_->cv.wait(lock, [&] {
    auto it = cancels_->writing.find(saga_id);
    return it == cancels_->writing.end() || it->second == std::this_thread::get_id();
  });
  ++cancels_->driving[saga_id];
}

void Engine::EndDrive(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(cancels_->mu);
  auto it = cancels_->driving.find(saga_id);
  if (it != cancels_->driving.end() && --it->second == 0) cancels_->driving.erase(it);
}

std::optional<std::string> Engine::TakeCancelRequest(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(cancels_->mu);
  auto it = cancels_->requests.find(saga_id);
  if (it == cancels_->requests.end()) return std::nullopt;
  std::string why = std::move(it->second);
  cancels_->requests.erase(it);
  return why;
}

namespace {

// Marks a saga as written by a Cancel until destruction: drives of it on
// other threads wait.
class CancelWrite {
 public:
  CancelWrite(std::mutex* mu, std::condition_variable* cv,
              std::unordered_map<std::string, std::thread::id>* writing, std::string saga_id)
      : mu_(mu), cv_(cv), writing_(writing), saga_id_(std::move(saga_id)) {}
  ~CancelWrite() {
    {
      std::lock_guard<std::mutex> lock(*mu_);
      writing_->erase(saga_id_);
    }
    cv_->notify_all();
  }
  CancelWrite(const CancelWrite&) = delete;
  CancelWrite& operator=(const CancelWrite&) = delete;

 private:
  std::mutex* mu_;
  std::condition_variable* cv_;
  std::unordered_map<std::string, std::thread::id>* writing_;
  std::string saga_id_;
};

}  // namespace

Result<CancelResult> Engine::Cancel(const std::string& saga_id, const CancelRequest& request) {
  if (request.who.empty()) return Status::InvalidArgument("cancel: who cancels is required");
  const std::string why = request.reason.empty() ? "cancelled by " + request.who : request.reason;
  CancelBook& book = *cancels_;
  {
    std::unique_lock<std::mutex> lock(book.mu);
    book.cv.wait(lock, [&] { return book.writing.count(saga_id) == 0; });
    if (book.driving.count(saga_id) > 0) {
      // This engine drives it: the drive rolls it back after the step in
      // progress, instead of a write here racing it.
      book.requests[saga_id] = why;
      lock.unlock();
      auto rec = store_->LoadSaga(saga_id);
      if (!rec.ok()) return rec.status();
      return CancelResult{std::move(rec).value(), true};
    }
    book.writing[saga_id] = std::this_thread::get_id();
  }
  CancelWrite writing(&book.mu, &book.cv, &book.writing, saga_id);
  auto rec = store_->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  auto state = ParseSagaState(rec->summary.state);
  if (!state) return Status::Internal("unknown saga state");
  switch (*state) {
    case SagaState::kPending: {
      SagaMachine m(SagaState::kPending);
      auto cmds = m.Fire(SagaEvent::kCancelRequested);
      if (!cmds.ok()) return cmds.status();
      auto claimed = Claim(saga_id);
      if (!claimed.ok()) {
        return Status::Unavailable("another worker holds the saga: " + claimed.status().message());
      }
      {
        ClaimedLease lease(store_, *claimed);
        if (claimed->epoch != 0) {
          // Claimed: the state cannot move under us any more; check it again.
          auto again = store_->LoadSaga(saga_id);
          if (!again.ok() || again->summary.state != SagaStateName(SagaState::kPending)) {
            return Status::Unavailable("the saga left the pending state; ask again");
          }
        }
        storage::WriteBatch b;
        b.saga_id = saga_id;
        b.saga_state = SagaStateName(m.state());
        b.saga_reason = why;
        storage::JournalEntry je;
        je.saga_id = saga_id;
        je.event = std::string("saga_") + SagaStateName(m.state());
        je.data = {{"reason", why}, {"by", request.who}};
        je.at_ms = options_.clock->NowMs();
        b.journal.push_back(std::move(je));
        IDEM_RETURN_IF_ERROR(CommitClaimed(lease.lease(), &b));
      }
      auto done = store_->LoadSaga(saga_id);
      if (!done.ok()) return done.status();
      return CancelResult{std::move(done).value(), false};
    }
    case SagaState::kAwaitingApproval: {
      // Rolling back a waiting saga is what rejecting its commit does.
      std::string token;
      for (const StepRecord& st : rec->steps) {
        auto phase = preview_commit::PhaseRecord::FromJson(st.phase);
        if (st.state == StepStateName(StepState::kAwaitingApproval) && phase) token = phase->token;
      }
      if (token.empty()) {
        return Status::FailedPrecondition("the saga waits, but no step holds a commit token");
      }
      ApprovalDecision d;
      d.approve = false;
      d.who = request.who;
      d.note = why;
      d.expected_saga_id = saga_id;
      auto out = Decide(token, d);
      if (!out.ok()) return out.status();
      return CancelResult{std::move(out).value(), false};
    }
    case SagaState::kRunning: {
      // Not driven by this engine right now (a worker elsewhere, or between
      // two drives here): its next drive here rolls it back.
      std::lock_guard<std::mutex> lock(book.mu);
      book.requests[saga_id] = why;
      return CancelResult{std::move(rec).value(), true};
    }
    case SagaState::kCompensating:
    case SagaState::kCancelled:
      return CancelResult{std::move(rec).value(), false};  // already rolling back, or cancelled
    default:
      return Status::FailedPrecondition(
          "the saga is " + rec->summary.state +
          "; only a pending saga or one awaiting approval can be cancelled");
  }
}

}  // namespace idem
