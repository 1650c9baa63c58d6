#include "saga/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "compensation/rollback.h"
#include "saga/machines.h"
#include "saga/states.h"

#include "common/failpoint.h"

namespace idem {
namespace {

using storage::JournalEntry;
using storage::SagaRecord;
using storage::StepRecord;
using storage::WriteBatch;

enum class StepEnd { kSucceeded, kFailed, kParked, kWaiting };
enum class PhaseEnd { kContinue, kWaiting };

// Previews of one step before it gives up (stale commits, expired tokens).
constexpr int kMaxPreviews = 5;

// Total attempts allowed when each resend follows a status lookup that
// confirmed the key was not applied (see ResolveUnknown).
constexpr int kMaxConfirmedAbsentAttempts = 5;
enum class UndoEnd { kUndone, kParked };

// Drives one saga. Holds the in-memory copy of its record, which every
// Commit keeps equal to what the store holds.
class SagaRun {
 public:
  SagaRun(storage::Store* store, const ToolRegistry* tools, const EngineOptions& options,
          SagaRecord record, SagaSpec spec)
      : store_(store),
        tools_(tools),
        options_(options),
        rec_(std::move(record)),
        spec_(std::move(spec)),
        rng_(options.seed ^ std::hash<std::string>()(rec_.summary.saga_id)) {
    for (const StepSpec& s : spec_.steps) compensable_.push_back(s.compensate.has_value());
    park_reason_ = rec_.summary.reason;  // a resumed rollback keeps its cause
  }

  Status Drive();
  const SagaRecord& record() const { return rec_; }
  /// Fences every write on `epoch`; `lost` turns true when the lease keeper
  /// fails to renew (no tool is called after that).
  void Fence(int64_t epoch, const std::atomic<bool>* lost) {
    fence_epoch_ = epoch;
    lease_lost_ = lost;
  }
  /// True once the drive's last write gave the lease up with it (a
  /// terminal, parked or waiting saga state under a lease).
  bool released() const { return released_; }
  /// The saga's previous driver may still be alive (a shared store with
  /// leases): a step it left `submitted` may have a call still in flight.
  void MarkTakenOver() { taken_over_ = true; }
  /// Asked between steps of a running saga: a reason turns it into a
  /// rollback (the step in progress has finished).
  void CancelWhen(std::function<std::optional<std::string>()> requested) {
    cancel_requested_ = std::move(requested);
  }

 private:
  // ---- journal
  JournalEntry Entry(const std::string& step_id, const std::string& event, Json data) {
    JournalEntry e;
    e.saga_id = rec_.summary.saga_id;
    e.step_id = step_id;
    e.event = event;
    e.data = std::move(data);
    e.at_ms = options_.clock->NowMs();
    return e;
  }
  // Writes are staged, then flushed in one transaction. Commit is
  // Stage + Flush; a batch staged alone becomes durable with the next
  // flush, which comes before any call to the outside world (every
  // `submitted` is flushed at once), before a drive ends, and at terminal
  // states. Only writes whose loss a recovery settles without a person are
  // staged alone (see OutcomeDurability).
  Status Commit(WriteBatch batch);
  void Stage(WriteBatch batch);
  Status Flush();
  enum class Durable { kNow, kWithNextFlush };
  /// Whether losing a record of the tool's call in a crash leaves only what
  /// the `submitted` before it did: a state a status lookup or a same-key
  /// resend settles without a person.
  static bool SettledWithoutAPerson(const ToolInfo& info) {
    return info.honours_keys || info.has_status;
  }
  /// A step's `succeeded` (a compensation's `compensated`) may wait for the
  /// next flush when it is settled without a person and the first attempt: a
  /// lost later one could spend the attempt that ends the step.
  static Durable OutcomeDurability(const ToolInfo& info, int attempt) {
    return attempt == 1 && SettledWithoutAPerson(info) ? Durable::kWithNextFlush : Durable::kNow;
  }
  /// `unknown` changes nothing a recovery would do differently from the
  /// `submitted` before it (the resend's own `submitted` is flushed before
  /// it is sent).
  static Durable UnknownDurability(const ToolInfo& info) {
    return SettledWithoutAPerson(info) ? Durable::kWithNextFlush : Durable::kNow;
  }
  Status CommitStep(const StepRecord& st, const std::string& event, Json data,
                    std::vector<storage::EffectRecord> effects = {},
                    Durable durable = Durable::kNow);

  // ---- saga level
  Status DriveStates();
  Status FireSaga(SagaEvent event, std::deque<SagaCommand>* queue, const SagaFacts& facts = {});
  Status RunNextStep(std::deque<SagaCommand>* queue);
  Status UndoNextStep(std::deque<SagaCommand>* queue);

  // ---- step level
  Result<StepEnd> DriveStep(int index, bool rolling_back);
  Result<PhaseEnd> AdvanceTwoPhase(int index, Tool* tool, StepRecord* st, StepMachine* m,
                                   std::deque<StepCommand>* queue);
  Status FireStep(StepMachine* m, StepRecord* st, std::deque<StepCommand>* queue, StepEvent e,
                  const StepFacts& facts = {});
  Status CommitEntries(const StepRecord& st, std::vector<JournalEntry> entries,
                       const std::string& consume_nonce = "");
  Result<UndoEnd> DriveUndo(int index);
  Result<Json> ResolveArgs(int index, const Json& templ, const std::string& where);
  Json Context() const;
  StepFacts ClassifyFailure(const StepSpec& spec, Tool* tool, const StepRecord& st,
                            const ToolOutcome& outcome, bool rolling_back);
  StepEvent ResolveUnknown(const StepSpec& spec, Tool* tool, StepRecord* st, ToolOutcome* out,
                           bool rolling_back, bool inherited);

  storage::Store* store_;
  const ToolRegistry* tools_;
  const EngineOptions& options_;
  SagaRecord rec_;
  SagaSpec spec_;
  std::vector<bool> compensable_;
  std::mt19937_64 rng_;
  std::string park_reason_;
  int64_t fence_epoch_ = 0;
  const std::atomic<bool>* lease_lost_ = nullptr;
  bool taken_over_ = false;
  WriteBatch staged_;  // written to rec_ already, not yet to the store
  bool has_staged_ = false;
  bool released_ = false;
  std::function<std::optional<std::string>()> cancel_requested_;

  // Before any call to the outside world: the lease must still be ours.
  Status CheckLease() const {
    if (lease_lost_ != nullptr && lease_lost_->load()) {
      return Status::Aborted("lease lost: another worker may drive saga " + rec_.summary.saga_id);
    }
    return Status::Ok();
  }
  bool Stopping() const { return options_.stop != nullptr && options_.stop->load(); }
};

Status SagaRun::Commit(WriteBatch batch) {
  Stage(std::move(batch));
  return Flush();
}

void SagaRun::Stage(WriteBatch batch) {
  for (StepRecord& st : batch.steps) {
    rec_.steps[st.index] = st;
    auto same = std::find_if(staged_.steps.begin(), staged_.steps.end(),
                             [&](const StepRecord& s) { return s.index == st.index; });
    if (same != staged_.steps.end()) {
      *same = std::move(st);
    } else {
      staged_.steps.push_back(std::move(st));
    }
  }
  if (batch.saga_state) {
    rec_.summary.state = *batch.saga_state;
    rec_.summary.reason = batch.saga_reason;
    staged_.saga_state = std::move(batch.saga_state);
    staged_.saga_reason = std::move(batch.saga_reason);
  }
  for (JournalEntry& e : batch.journal) staged_.journal.push_back(std::move(e));
  for (storage::EffectRecord& e : batch.effects) staged_.effects.push_back(std::move(e));
  staged_.release_lease |= batch.release_lease;
  if (!batch.consume_token.empty()) {
    // One token per batch; every batch that spends one is flushed at once.
    staged_.consume_token = std::move(batch.consume_token);
    staged_.consume_token_step = std::move(batch.consume_token_step);
  }
  has_staged_ = true;
}

Status SagaRun::Flush() {
  if (!has_staged_) return Status::Ok();
  if (released_) return Status::Internal("a write after the drive gave its lease up");
  WriteBatch batch = std::move(staged_);
  staged_ = WriteBatch();
  has_staged_ = false;
  batch.saga_id = rec_.summary.saga_id;
  batch.fence_epoch = fence_epoch_;
  IDEM_RETURN_IF_ERROR(store_->Commit(batch));
  released_ = batch.release_lease;
  if (options_.observer) {
    for (const JournalEntry& e : batch.journal) options_.observer(e);
  }
  return Status::Ok();
}

Status SagaRun::CommitStep(const StepRecord& st, const std::string& event, Json data,
                           std::vector<storage::EffectRecord> effects, Durable durable) {
  StepRecord copy = st;
  copy.updated_ms = options_.clock->NowMs();
  WriteBatch b;
  b.steps.push_back(copy);
  b.journal.push_back(Entry(st.step_id, event, std::move(data)));
  b.effects = std::move(effects);
  if (durable == Durable::kWithNextFlush) {
    Stage(std::move(b));
    return Status::Ok();
  }
  return Commit(std::move(b));
}

Status SagaRun::Drive() {
  Status s = DriveStates();
  // What was staged is valid progress even when the drive stopped early
  // (stopping, a lost lease refuses it, a tool not registered).
  Status flushed = Flush();
  return s.ok() ? flushed : s;
}

Status SagaRun::DriveStates() {
  auto state = ParseSagaState(rec_.summary.state);
  if (!state) return Status::Internal("saga has an unknown state \"" + rec_.summary.state + "\"");
  SagaMachine saga(*state);
  std::deque<SagaCommand> queue;
  switch (*state) {
    case SagaState::kPending: {
      auto cmds = saga.Fire(SagaEvent::kStarted);
      if (!cmds.ok()) return cmds.status();
      WriteBatch b;
      b.saga_state = SagaStateName(saga.state());
      b.journal.push_back(Entry("", "saga_started", Json::object()));
      Stage(std::move(b));  // durable with the first step's `submitted`
      IDEM_FAILPOINT("saga.after_start");
      queue.assign(cmds->begin(), cmds->end());
      break;
    }
    case SagaState::kRunning:
      queue.push_back(SagaCommand::kRunNextStep);
      break;
    case SagaState::kCompensating:
      queue.push_back(SagaCommand::kUndoNextStep);
      break;
    case SagaState::kAwaitingApproval: {
      // Go on once the approval is decided or has expired; else nothing to do.
      bool settled = false;
      for (const StepRecord& st : rec_.steps) {
        if (st.state != StepStateName(StepState::kAwaitingApproval)) continue;
        settled = st.phase.is_object() &&
                  (st.phase.contains("approval") ||
                   options_.clock->NowMs() >= st.phase.value("expires_ms", int64_t{0}));
      }
      if (!settled) return Status::Ok();
      IDEM_RETURN_IF_ERROR(FireSaga(SagaEvent::kApprovalSettled, &queue));
      break;
    }
    default:
      return Status::Ok();  // terminal, parked or waiting: nothing to drive
  }

  while (!queue.empty()) {
    if (Stopping()) return Status::Aborted("stopping: saga left between steps");
    SagaCommand cmd = queue.front();
    queue.pop_front();
    switch (cmd) {
      case SagaCommand::kRunNextStep: {
        std::optional<std::string> cancel;
        if (cancel_requested_) cancel = cancel_requested_();
        if (cancel) {
          park_reason_ = *cancel;
          IDEM_RETURN_IF_ERROR(FireSaga(SagaEvent::kCancelRequested, &queue));
          break;
        }
        IDEM_RETURN_IF_ERROR(RunNextStep(&queue));
        break;
      }
      case SagaCommand::kUndoNextStep:
        IDEM_RETURN_IF_ERROR(UndoNextStep(&queue));
        break;
      default:  // FireSaga commits terminal and parked states itself
        return Status::Internal(std::string("unexpected saga command ") + SagaCommandName(cmd));
    }
  }
  return Status::Ok();
}

// Fires a saga event; terminal and parked states are committed here, with
// the failpoints around the terminal commit.
Status SagaRun::FireSaga(SagaEvent event, std::deque<SagaCommand>* queue, const SagaFacts& facts) {
  auto current = ParseSagaState(rec_.summary.state);
  if (!current) return Status::Internal("saga has an unknown state");
  SagaMachine saga(*current);
  auto cmds = saga.Fire(event, facts);
  if (!cmds.ok()) return cmds.status();
  std::string next = SagaStateName(saga.state());
  for (SagaCommand c : *cmds) {
    if (c == SagaCommand::kRecordWaiting) {
      WriteBatch b;
      b.saga_state = next;
      b.journal.push_back(Entry("", "saga_" + next, Json::object()));
      b.release_lease = fence_epoch_ != 0;  // the drive ends here
      IDEM_RETURN_IF_ERROR(Commit(std::move(b)));
    } else if (c == SagaCommand::kRecordTerminal || c == SagaCommand::kRecordParked) {
      WriteBatch b;
      b.saga_state = next;
      // Why it ended anywhere but succeeded: kept on the saga for `status`.
      b.saga_reason = next == SagaStateName(SagaState::kSucceeded) ? "" : park_reason_;
      Json data = Json::object();
      if (!b.saga_reason.empty()) data["reason"] = b.saga_reason;
      b.journal.push_back(Entry("", "saga_" + next, data));
      b.release_lease = fence_epoch_ != 0;  // the drive ends here
      IDEM_FAILPOINT("saga.before_terminal");
      IDEM_RETURN_IF_ERROR(Commit(std::move(b)));
      IDEM_FAILPOINT("saga.after_terminal");
    } else if (next != rec_.summary.state) {
      WriteBatch b;
      b.saga_state = next;
      Json data = Json::object();
      if (next == "compensating") {
        data["reason"] = park_reason_;
        Json skipped = Json::array();
        for (int i : compensation::SkippedByRollback(rec_.steps, compensable_)) {
          skipped.push_back(
              {{"step", rec_.steps[i].step_id}, {"reason", spec_.steps[i].no_compensation_reason}});
        }
        data["not_compensated"] = skipped;
        b.saga_reason = park_reason_;
      }
      b.journal.push_back(Entry("", "saga_" + next, data));
      Stage(std::move(b));  // durable with the next write before a call
      queue->push_back(c);
    } else {
      queue->push_back(c);
    }
  }
  return Status::Ok();
}

Status SagaRun::RunNextStep(std::deque<SagaCommand>* queue) {
  int n = static_cast<int>(rec_.steps.size());
  int i = 0;
  while (i < n && rec_.steps[i].state == "succeeded") ++i;
  if (i == n) return FireSaga(SagaEvent::kStepCompleted, queue, SagaFacts::WithMoreSteps(false));
  auto end = DriveStep(i, /*rolling_back=*/false);
  if (!end.ok()) return end.status();
  switch (*end) {
    case StepEnd::kSucceeded:
      return FireSaga(SagaEvent::kStepCompleted, queue, SagaFacts::WithMoreSteps(i + 1 < n));
    case StepEnd::kFailed:
      park_reason_ = "step " + rec_.steps[i].step_id + " failed: " + rec_.steps[i].error;
      return FireSaga(
          SagaEvent::kStepFailed, queue,
          SagaFacts::WithEffectsToUndo(compensation::HasEffectsToUndo(rec_.steps, compensable_)));
    case StepEnd::kParked:
      park_reason_ = "step " + rec_.steps[i].step_id + ": " + rec_.steps[i].error;
      return FireSaga(SagaEvent::kStepParked, queue);
    case StepEnd::kWaiting:
      return FireSaga(SagaEvent::kStepAwaitingApproval, queue);
  }
  return Status::Internal("unreachable");
}

Status SagaRun::UndoNextStep(std::deque<SagaCommand>* queue) {
  auto item = compensation::NextUndo(rec_.steps, compensable_);
  if (!item) return FireSaga(SagaEvent::kUndoCompleted, queue, SagaFacts::WithMoreSteps(false));
  int i = item->index;
  if (item->action == compensation::UndoAction::kResolveFirst) {
    auto end = DriveStep(i, /*rolling_back=*/true);
    if (!end.ok()) return end.status();
    if (*end == StepEnd::kParked) {
      park_reason_ = "rollback: step " + rec_.steps[i].step_id + ": " + rec_.steps[i].error;
      return FireSaga(SagaEvent::kUndoParked, queue);
    }
    if (*end == StepEnd::kFailed) {
      // Resolved as never applied: a null compensation, no undo call.
      WriteBatch b;
      b.journal.push_back(Entry(rec_.steps[i].step_id, "null_compensation",
                                {{"reason", "the action never took effect"}}));
      IDEM_RETURN_IF_ERROR(Commit(std::move(b)));
    }
    // Succeeded or failed: look again (it may now need its compensation).
    queue->push_back(SagaCommand::kUndoNextStep);
    return Status::Ok();
  }
  if (item->action == compensation::UndoAction::kParked) {
    park_reason_ = "rollback: step " + rec_.steps[i].step_id + ": " + rec_.steps[i].error;
    return FireSaga(SagaEvent::kUndoParked, queue);
  }
  auto end = DriveUndo(i);
  if (!end.ok()) return end.status();
  if (*end == UndoEnd::kParked) {
    park_reason_ =
        "compensation of step " + rec_.steps[i].step_id + " failed: " + rec_.steps[i].error;
    return FireSaga(SagaEvent::kUndoParked, queue);
  }
  bool more = compensation::NextUndo(rec_.steps, compensable_).has_value();
  return FireSaga(SagaEvent::kUndoCompleted, queue, SagaFacts::WithMoreSteps(more));
}

Json SagaRun::Context() const {
  Json steps = Json::object();
  for (const StepRecord& st : rec_.steps) {
    steps[st.step_id] = {{"args", st.args}, {"result", st.result}};
  }
  return {{"input", rec_.input}, {"steps", steps}};
}

Result<Json> SagaRun::ResolveArgs(int index, const Json& templ, const std::string& where) {
  return ResolveTemplates(templ, Context(), where);
}

// A definite failure: keyed retry where policy and the tool allow it.
// Write tools retry at most once, and only when the tool honours keys or a
// status lookup confirms the key was not applied.
StepFacts SagaRun::ClassifyFailure(const StepSpec& spec, Tool* tool, const StepRecord& st,
                                   const ToolOutcome& outcome, bool rolling_back) {
  if (rolling_back || !outcome.retryable || st.attempt >= spec.retry.max_attempts) {
    return StepFacts::WithRetryAllowed(false);
  }
  const ToolInfo& info = tool->info();
  bool write = info.effect == EffectClass::kWrite || info.effect == EffectClass::kIrreversible;
  if (!write || info.honours_keys) return StepFacts::WithRetryAllowed(true);
  if (info.has_status) {
    LookupOutcome look = tool->Lookup(st.step_key);
    if (look.kind == LookupKind::kNotApplied) return StepFacts::WithRetryAllowed(true);
  }
  return StepFacts::WithRetryAllowed(false);
}

// An unknown outcome: status lookup, else a same-key retry where the tool
// honours keys, else a person. Never a fresh call.
StepEvent SagaRun::ResolveUnknown(const StepSpec& spec, Tool* tool, StepRecord* st,
                                  ToolOutcome* out, bool rolling_back, bool inherited) {
  const ToolInfo& info = tool->info();
  bool attempts_left = st->attempt < std::max(spec.retry.max_attempts, 2);
  if (info.has_status) {
    std::string last_error;
    for (int n = 1; n <= options_.lookup_attempts; ++n) {
      LookupOutcome look = tool->Lookup(st->step_key);
      if (look.kind == LookupKind::kApplied) {
        *out = ToolOutcome::Succeeded(look.result, look.external_ref);
        out->error = "resolved_by_status";
        return StepEvent::kResolvedApplied;
      }
      if (look.kind == LookupKind::kNotApplied && inherited && !info.honours_keys) {
        // Another worker submitted this step and lost its lease; it may be
        // frozen with its call still on the way. The provider does not
        // deduplicate keys, so "not applied yet" is no proof: a resend could
        // book twice. A person decides (resolve --decision retry/...).
        st->error = "taken over from a worker whose call to " + info.name +
                    " may still land, and the tool does not deduplicate keys: check key " +
                    st->step_key;
        return StepEvent::kUnresolvable;
      }
      if (look.kind == LookupKind::kNotApplied) {
        // The provider says the key never took effect, so a same-key resend
        // cannot duplicate it. Attempts burnt by crashes between `submitted`
        // and the call must not end the saga: allow resends up to a hard cap.
        bool resend_ok = attempts_left || st->attempt < kMaxConfirmedAbsentAttempts;
        if (!rolling_back && resend_ok) return StepEvent::kResolvedRetry;
        st->error = "status lookup: key " + st->step_key + " was not applied";
        return StepEvent::kResolvedNotApplied;
      }
      last_error = look.error;
      if (n < options_.lookup_attempts) {
        options_.clock->SleepMs(options_.lookup_backoff.BackoffMs(n + 1, rng_));
      }
    }
    st->error = "outcome unknown; status lookup kept failing: " + last_error;
    return StepEvent::kUnresolvable;
  }
  if (info.honours_keys || info.effect == EffectClass::kRead ||
      info.effect == EffectClass::kIdempotent) {
    if (attempts_left) return StepEvent::kResolvedRetry;
    st->error = "outcome still unknown after " + std::to_string(st->attempt) +
                " same-key attempts: " + out->error;
    return StepEvent::kUnresolvable;
  }
  st->error = "outcome unknown (" + out->error + ") and tool " + info.name +
              " has neither a status lookup nor idempotency keys: a person must check key " +
              st->step_key;
  return StepEvent::kUnresolvable;
}

Result<StepEnd> SagaRun::DriveStep(int index, bool rolling_back) {
  StepRecord st = rec_.steps[index];
  const StepSpec& spec = spec_.steps[index];
  Tool* tool = tools_->Find(spec.tool);
  if (tool == nullptr)
    return Status::FailedPrecondition("tool \"" + spec.tool + "\" is not registered");
  auto parsed = ParseStepState(st.state);
  if (!parsed) return Status::Internal("step has an unknown state \"" + st.state + "\"");
  StepMachine m(*parsed);

  std::deque<StepCommand> queue;
  ToolOutcome outcome;
  // The uncertain call was made by a previous driver that may still be
  // alive (see MarkTakenOver), not by this drive.
  bool inherited =
      taken_over_ && (m.state() == StepState::kSubmitted || m.state() == StepState::kUnknown);
  auto fire = [&](StepEvent e, const StepFacts& facts = {}) -> Status {
    auto cmds = m.Fire(e, facts);
    if (!cmds.ok()) return cmds.status();
    st.state = StepStateName(m.state());
    queue.insert(queue.end(), cmds->begin(), cmds->end());
    return Status::Ok();
  };

  switch (m.state()) {
    case StepState::kSucceeded:
      return StepEnd::kSucceeded;
    case StepState::kFailed:
      return StepEnd::kFailed;
    case StepState::kNeedsAttention:
      return StepEnd::kParked;
    case StepState::kPlanned: {
      auto args = ResolveArgs(index, spec.args, "steps[" + std::to_string(index) + "].args");
      if (!args.ok()) {
        st.error = args.status().message();
        IDEM_RETURN_IF_ERROR(fire(StepEvent::kFailed));
        break;  // queue holds kRecordFailed
      }
      st.args = *args;
      st.args_fingerprint = Fingerprint(st.args);
      if (spec.two_phase) {
        auto phase = AdvanceTwoPhase(index, tool, &st, &m, &queue);
        if (!phase.ok()) return phase.status();
        if (*phase == PhaseEnd::kWaiting) return StepEnd::kWaiting;
        break;
      }
      ++st.attempt;  // 1, or one more after a person asked for a retry
      IDEM_FAILPOINT("step.before_submitted");
      IDEM_RETURN_IF_ERROR(fire(StepEvent::kSubmitted));
      IDEM_RETURN_IF_ERROR(CommitStep(st, "submitted",
                                      {{"attempt", st.attempt},
                                       {"key", st.step_key},
                                       {"tool", spec.tool},
                                       {"args_fingerprint", st.args_fingerprint}}));
      IDEM_FAILPOINT("step.after_submitted");
      break;
    }
    case StepState::kSubmitted: {
      // Found after a crash: the call may have happened.
      outcome = ToolOutcome::Unknown("recovered: submitted without a recorded outcome");
      IDEM_RETURN_IF_ERROR(fire(StepEvent::kOutcomeUnknown));
      IDEM_RETURN_IF_ERROR(CommitStep(st, "unknown", {{"reason", outcome.error}}, {},
                                      UnknownDurability(tool->info())));
      IDEM_FAILPOINT("unknown.after_recorded");
      break;
    }
    case StepState::kUnknown:
      outcome = ToolOutcome::Unknown("recovered: outcome unknown");
      queue.push_back(StepCommand::kResolveOutcome);
      break;
    case StepState::kPreviewed:
    case StepState::kAwaitingApproval: {
      auto phase = AdvanceTwoPhase(index, tool, &st, &m, &queue);
      if (!phase.ok()) return phase.status();
      if (*phase == PhaseEnd::kWaiting) return StepEnd::kWaiting;
      break;
    }
    default:
      return Status::FailedPrecondition(std::string("step ") + st.step_id + " is " + st.state +
                                        ", not runnable");
  }

  while (!queue.empty()) {
    StepCommand cmd = queue.front();
    queue.pop_front();
    switch (cmd) {
      case StepCommand::kCallTool: {
        ToolCall call{spec.tool,  st.step_key, st.args, st.attempt, rec_.summary.saga_id,
                      st.step_id, ""};
        if (spec.two_phase && st.phase.is_object()) {
          call.expected_version =
              st.phase.value("preview", Json::object()).value("resource_version", "");
        }
        IDEM_RETURN_IF_ERROR(Flush());  // normally done by `submitted`
        IDEM_RETURN_IF_ERROR(CheckLease());
        inherited = false;  // from here on the uncertainty is this drive's own
        outcome = tool->Invoke(call);
        IDEM_FAILPOINT("step.after_call");
        if (outcome.kind == OutcomeKind::kFailed && outcome.stale && spec.two_phase &&
            spec.on_stale == Fallback::kRePreview && !rolling_back) {
          // The previewed resource moved: never a blind commit. Preview again
          // (and, with approval, ask the person again).
          st.error = outcome.error;
          IDEM_RETURN_IF_ERROR(fire(StepEvent::kStaleRePreview));
          IDEM_RETURN_IF_ERROR(CommitStep(st, "stale", {{"error", outcome.error}}));
          return DriveStep(index, rolling_back);
        }
        switch (outcome.kind) {
          case OutcomeKind::kSucceeded:
            IDEM_RETURN_IF_ERROR(fire(StepEvent::kSucceeded));
            break;
          case OutcomeKind::kFailed:
            st.error = outcome.error;
            IDEM_RETURN_IF_ERROR(
                fire(StepEvent::kFailed, ClassifyFailure(spec, tool, st, outcome, rolling_back)));
            break;
          case OutcomeKind::kUnknown:
            st.error = outcome.error;
            IDEM_RETURN_IF_ERROR(fire(StepEvent::kOutcomeUnknown));
            IDEM_RETURN_IF_ERROR(CommitStep(st, "unknown", {{"reason", outcome.error}}, {},
                                            UnknownDurability(tool->info())));
            IDEM_FAILPOINT("unknown.after_recorded");
            break;
        }
        break;
      }
      case StepCommand::kResolveOutcome: {
        StepEvent e = ResolveUnknown(spec, tool, &st, &outcome, rolling_back, inherited);
        IDEM_RETURN_IF_ERROR(fire(e));
        break;
      }
      case StepCommand::kScheduleRetry: {
        // Back off after the provider refused; a resend that only settles
        // an uncertain outcome (lookup said not applied, or a keyed tool
        // after a crash) has nothing to wait for.
        int64_t wait =
            outcome.kind == OutcomeKind::kFailed ? spec.retry.BackoffMs(st.attempt + 1, rng_) : 0;
        options_.clock->SleepMs(wait);
        ++st.attempt;
        IDEM_RETURN_IF_ERROR(CommitStep(st, "submitted",
                                        {{"attempt", st.attempt},
                                         {"key", st.step_key},
                                         {"retry_after_ms", wait},
                                         {"previous_error", st.error}}));
        IDEM_FAILPOINT("step.after_submitted");
        queue.push_back(StepCommand::kCallTool);
        break;
      }
      case StepCommand::kRecordSucceeded: {
        st.result = outcome.result;
        st.external_ref = outcome.external_ref;
        bool by_status = outcome.error == "resolved_by_status";
        st.error.clear();
        storage::EffectRecord eff;
        eff.saga_id = rec_.summary.saga_id;
        eff.step_id = st.step_id;
        eff.kind = "action";
        eff.tool = spec.tool;
        eff.idempotency_key = st.step_key;
        eff.result = st.result;
        eff.external_ref = st.external_ref;
        eff.at_ms = options_.clock->NowMs();
        Json data = {{"attempt", st.attempt}, {"result", st.result}};
        if (!st.external_ref.empty()) data["external_ref"] = st.external_ref;
        if (by_status) data["resolved_by"] = "status_lookup";
        IDEM_RETURN_IF_ERROR(
            CommitStep(st, "succeeded", data, {eff}, OutcomeDurability(tool->info(), st.attempt)));
        IDEM_FAILPOINT("step.after_outcome");
        return StepEnd::kSucceeded;
      }
      case StepCommand::kRecordFailed: {
        IDEM_RETURN_IF_ERROR(
            CommitStep(st, "failed", {{"attempt", st.attempt}, {"error", st.error}}));
        IDEM_FAILPOINT("step.after_outcome");
        return StepEnd::kFailed;
      }
      case StepCommand::kParkStep: {
        IDEM_RETURN_IF_ERROR(CommitStep(st, "needs_attention", {{"reason", st.error}}));
        return StepEnd::kParked;
      }
      default:
        return Status::Internal(std::string("unexpected step command ") + StepCommandName(cmd));
    }
  }
  return Status::Internal("step drive ended without an outcome");
}

Status SagaRun::FireStep(StepMachine* m, StepRecord* st, std::deque<StepCommand>* queue,
                         StepEvent e, const StepFacts& facts) {
  auto cmds = m->Fire(e, facts);
  if (!cmds.ok()) return cmds.status();
  st->state = StepStateName(m->state());
  queue->insert(queue->end(), cmds->begin(), cmds->end());
  return Status::Ok();
}

Status SagaRun::CommitEntries(const StepRecord& st, std::vector<JournalEntry> entries,
                              const std::string& consume_nonce) {
  StepRecord copy = st;
  copy.updated_ms = options_.clock->NowMs();
  WriteBatch b;
  b.steps.push_back(copy);
  b.journal = std::move(entries);
  b.consume_token = consume_nonce;
  if (!consume_nonce.empty()) b.consume_token_step = st.step_id;
  return Commit(std::move(b));
}

// Two-phase steps, from planned (arguments resolved), previewed or
// awaiting_approval: preview, mint the commit token, wait for a person where
// the spec asks, then spend the token in the same transaction as `submitted`.
// kContinue leaves the next command (kCallTool or kRecordFailed) in `queue`.
Result<PhaseEnd> SagaRun::AdvanceTwoPhase(int index, Tool* tool, StepRecord* st, StepMachine* m,
                                          std::deque<StepCommand>* queue) {
  const StepSpec& spec = spec_.steps[index];
  const std::string& saga_id = rec_.summary.saga_id;
  auto fail = [&](const std::string& why) -> Result<PhaseEnd> {
    st->error = why;
    IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kFailed));
    return PhaseEnd::kContinue;
  };
  for (int round = 0; round < 2 * kMaxPreviews + 2; ++round) {
    const Json phase = st->phase.is_object() ? st->phase : Json::object();
    const int64_t expires = phase.value("expires_ms", int64_t{0});
    switch (m->state()) {
      case StepState::kPlanned: {
        int previews = phase.value("previews", 0) + 1;
        if (previews > kMaxPreviews) {
          return fail("gave up after " + std::to_string(kMaxPreviews) +
                      " previews: the preview kept going stale or expiring");
        }
        if (options_.signer == nullptr) {
          return Status::FailedPrecondition("step " + st->step_id +
                                            " is two-phase but no token signer is configured");
        }
        ToolCall call{spec.tool, st->step_key, st->args, previews, saga_id, st->step_id, ""};
        PreviewOutcome pv = tool->Preview(call);
        for (int n = 2; !pv.ok && pv.retryable && n <= spec.retry.max_attempts + 2; ++n) {
          options_.clock->SleepMs(spec.retry.BackoffMs(n, rng_));
          pv = tool->Preview(call);  // a preview has no effect: asking again is safe
        }
        IDEM_FAILPOINT("preview.after_call");
        if (!pv.ok) return fail("preview failed: " + pv.error);
        bool human = spec.approval == Approval::kHuman;
        int64_t ttl = human ? spec.approval_ttl_ms : options_.commit_token_ttl_ms;
        preview_commit::TokenClaims claims;
        auto token =
            options_.signer->Mint(saga_id, st->step_id, st->args_fingerprint, ttl, &claims);
        if (!token.ok()) return token.status();
        Json preview = {{"summary", pv.summary},
                        {"changes", pv.changes},
                        {"resource_version", pv.resource_version}};
        st->phase = {{"preview", preview},
                     {"token", *token},
                     {"nonce", claims.nonce},
                     {"expires_ms", claims.expires_at_ms},
                     {"args_fingerprint", st->args_fingerprint},
                     {"previews", previews}};
        IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kPreviewRecorded));
        std::vector<JournalEntry> entries;
        entries.push_back(Entry(st->step_id, "previewed",
                                {{"summary", pv.summary},
                                 {"resource_version", pv.resource_version},
                                 {"preview", previews}}));
        if (human) {
          IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kApprovalRequested));
          entries.push_back(
              Entry(st->step_id, "awaiting_approval",
                    {{"summary", pv.summary}, {"expires_at", FormatTimeMs(claims.expires_at_ms)}}));
        }
        IDEM_RETURN_IF_ERROR(CommitEntries(*st, std::move(entries)));
        IDEM_FAILPOINT("preview.after_journal");
        break;
      }
      case StepState::kPreviewed: {
        if (options_.clock->NowMs() >= expires) {
          IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kExpired));
          IDEM_RETURN_IF_ERROR(CommitEntries(*st, {Entry(st->step_id, "token_expired", {})}));
          break;
        }
        if (options_.signer == nullptr) {
          return Status::FailedPrecondition("step " + st->step_id +
                                            " is two-phase but no token signer is configured");
        }
        auto claims = options_.signer->Verify(phase.value("token", ""), saga_id, st->step_id,
                                              Fingerprint(st->args));
        if (!claims.ok()) return fail(claims.status().message());
        ++st->attempt;
        IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kTokenConsumed));
        IDEM_RETURN_IF_ERROR(CommitEntries(
            *st,
            {Entry(st->step_id, "submitted",
                   {{"attempt", st->attempt}, {"key", st->step_key}, {"tool", spec.tool}})},
            claims->nonce));
        IDEM_FAILPOINT("step.after_submitted");
        return PhaseEnd::kContinue;
      }
      case StepState::kAwaitingApproval: {
        const Json approval = phase.value("approval", Json());
        if (approval.is_null()) {
          if (options_.clock->NowMs() < expires) return PhaseEnd::kWaiting;
          bool re_preview = spec.on_expiry == Fallback::kRePreview;
          if (!re_preview) st->error = "approval expired at " + FormatTimeMs(expires);
          IDEM_RETURN_IF_ERROR(
              FireStep(m, st, queue, StepEvent::kExpired, StepFacts::WithRePreview(re_preview)));
          if (m->state() == StepState::kFailed) return PhaseEnd::kContinue;  // kRecordFailed
          IDEM_RETURN_IF_ERROR(CommitEntries(
              *st, {Entry(st->step_id, "approval_expired", {{"then", "re_preview"}})}));
          break;
        }
        if (approval.value("decision", "") != "approved") {
          st->error =
              "rejected by " + approval.value("by", "?") + ": " + approval.value("note", "");
          IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kRejected));
          return PhaseEnd::kContinue;
        }
        // The approval checked the token; the arguments must still be the
        // ones it was minted for.
        if (Fingerprint(st->args) != phase.value("args_fingerprint", "")) {
          return fail(std::string(preview_commit::kMismatchedTokenMessage) +
                      ": the arguments changed after the preview");
        }
        ++st->attempt;
        IDEM_RETURN_IF_ERROR(FireStep(m, st, queue, StepEvent::kApproved));
        IDEM_RETURN_IF_ERROR(CommitEntries(*st,
                                           {Entry(st->step_id, "submitted",
                                                  {{"attempt", st->attempt},
                                                   {"key", st->step_key},
                                                   {"tool", spec.tool},
                                                   {"approved_by", approval.value("by", "")}})},
                                           phase.value("nonce", "")));
        IDEM_FAILPOINT("step.after_submitted");
        return PhaseEnd::kContinue;
      }
      default:
        return Status::Internal("two-phase step " + st->step_id + " is " + st->state);
    }
  }
  return Status::Internal("two-phase step " + st->step_id + " did not settle");
}

Result<UndoEnd> SagaRun::DriveUndo(int index) {
  StepRecord st = rec_.steps[index];
  const StepSpec& spec = spec_.steps[index];
  const CompensationSpec& comp = *spec.compensate;
  Tool* tool = tools_->Find(comp.tool);
  if (tool == nullptr)
    return Status::FailedPrecondition("tool \"" + comp.tool + "\" is not registered");
  auto parsed = ParseStepState(st.state);
  if (!parsed) return Status::Internal("step has an unknown state \"" + st.state + "\"");
  StepMachine m(*parsed);
  const std::string key = compensation::CompensationKey(st.step_key);
  const ToolInfo& info = tool->info();
  bool same_key_safe = info.honours_keys || info.effect == EffectClass::kIdempotent ||
                       info.effect == EffectClass::kRead;

  std::deque<StepCommand> queue;
  ToolOutcome outcome;
  auto fire = [&](StepEvent e, const StepFacts& facts = {}) -> Status {
    auto cmds = m.Fire(e, facts);
    if (!cmds.ok()) return cmds.status();
    st.state = StepStateName(m.state());
    queue.insert(queue.end(), cmds->begin(), cmds->end());
    return Status::Ok();
  };

  auto args = ResolveArgs(index, comp.args, "steps[" + std::to_string(index) + "].compensate.args");

  switch (m.state()) {
    case StepState::kSucceeded: {
      if (!args.ok()) {
        return Status::Internal(args.status().message());  // the spec checker forbids this
      }
      IDEM_FAILPOINT("compensation.before_submitted");
      IDEM_RETURN_IF_ERROR(fire(StepEvent::kRollbackStarted));
      st.comp_attempt = 1;
      IDEM_RETURN_IF_ERROR(
          CommitStep(st, "compensation_submitted",
                     {{"attempt", st.comp_attempt}, {"key", key}, {"tool", comp.tool}}));
      IDEM_FAILPOINT("compensation.after_submitted");
      break;
    }
    case StepState::kCompensating: {
      // Found after a crash: the undo may have happened.
      if (info.has_status) {
        LookupOutcome look = tool->Lookup(key);
        if (look.kind == LookupKind::kApplied) {
          outcome = ToolOutcome::Succeeded(look.result, look.external_ref);
          IDEM_RETURN_IF_ERROR(fire(StepEvent::kUndone));
          break;
        }
      }
      if (!same_key_safe && !info.has_status) {
        st.error = "compensation outcome unknown after a crash and " + comp.tool +
                   " has neither a status lookup nor idempotency keys";
        IDEM_RETURN_IF_ERROR(fire(StepEvent::kUndoFailed));
        break;
      }
      queue.push_back(StepCommand::kCallCompensation);
      break;
    }
    case StepState::kCompensated:
      return UndoEnd::kUndone;
    default:
      return UndoEnd::kParked;
  }
  if (!args.ok()) return Status::Internal(args.status().message());

  while (!queue.empty()) {
    StepCommand cmd = queue.front();
    queue.pop_front();
    switch (cmd) {
      case StepCommand::kCallCompensation: {
        ToolCall call{comp.tool, key, *args, st.comp_attempt, rec_.summary.saga_id, st.step_id, ""};
        IDEM_RETURN_IF_ERROR(Flush());
        IDEM_RETURN_IF_ERROR(CheckLease());
        outcome = tool->Invoke(call);
        IDEM_FAILPOINT("compensation.after_call");
        if (outcome.kind == OutcomeKind::kSucceeded) {
          IDEM_RETURN_IF_ERROR(fire(StepEvent::kUndone));
          break;
        }
        st.error = outcome.error;
        bool retry = st.comp_attempt < comp.retry.max_attempts &&
                     ((outcome.kind == OutcomeKind::kFailed && outcome.retryable) ||
                      (outcome.kind == OutcomeKind::kUnknown && same_key_safe));
        if (!retry && outcome.kind == OutcomeKind::kUnknown && !same_key_safe) {
          st.error = "compensation outcome unknown (" + outcome.error + ") and " + comp.tool +
                     " cannot be retried safely";
        } else if (!retry && st.comp_attempt >= comp.retry.max_attempts) {
          st.error =
              "gave up after " + std::to_string(st.comp_attempt) + " attempts: " + outcome.error;
        }
        IDEM_RETURN_IF_ERROR(fire(StepEvent::kUndoFailed, StepFacts::WithRetryAllowed(retry)));
        break;
      }
      case StepCommand::kScheduleUndoRetry: {
        int64_t wait = comp.retry.BackoffMs(st.comp_attempt + 1, rng_);
        options_.clock->SleepMs(wait);
        ++st.comp_attempt;
        IDEM_RETURN_IF_ERROR(CommitStep(st, "compensation_submitted",
                                        {{"attempt", st.comp_attempt},
                                         {"key", key},
                                         {"retry_after_ms", wait},
                                         {"previous_error", st.error}}));
        IDEM_FAILPOINT("compensation.after_submitted");
        queue.push_back(StepCommand::kCallCompensation);
        break;
      }
      case StepCommand::kRecordUndone: {
        st.comp_result = outcome.result;
        st.error.clear();
        storage::EffectRecord eff;
        eff.saga_id = rec_.summary.saga_id;
        eff.step_id = st.step_id;
        eff.kind = "compensation";
        eff.tool = comp.tool;
        eff.idempotency_key = key;
        eff.result = outcome.result;
        eff.external_ref = outcome.external_ref;
        eff.at_ms = options_.clock->NowMs();
        IDEM_RETURN_IF_ERROR(CommitStep(st, "compensated",
                                        {{"attempt", st.comp_attempt}, {"result", outcome.result}},
                                        {eff}, OutcomeDurability(info, st.comp_attempt)));
        IDEM_FAILPOINT("compensation.after_outcome");
        return UndoEnd::kUndone;
      }
      case StepCommand::kParkStep: {
        IDEM_RETURN_IF_ERROR(CommitStep(st, "compensation_failed",
                                        {{"attempt", st.comp_attempt}, {"reason", st.error}}));
        return UndoEnd::kParked;
      }
      default:
        return Status::Internal(std::string("unexpected undo command ") + StepCommandName(cmd));
    }
  }
  return Status::Internal("undo drive ended without an outcome");
}

}  // namespace

std::string StepKey(const std::string& saga_id, const std::string& step_id) {
  return saga_id + "/" + step_id;
}

struct Engine::SpecCache {
  static constexpr size_t kMaxEntries = 256;
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const SagaSpec>> specs;  // GUARDED_BY(mu)
};

Result<SagaSpec> Engine::CachedSpec(const Json& spec) {
  std::string text = spec.dump();
  {
    std::lock_guard<std::mutex> lock(spec_cache_->mu);
    auto it = spec_cache_->specs.find(text);
    if (it != spec_cache_->specs.end()) return *it->second;
  }
  auto parsed = ParseSpec(spec, *tools_);
  if (!parsed.ok()) return parsed.status();
  std::lock_guard<std::mutex> lock(spec_cache_->mu);
  if (spec_cache_->specs.size() >= SpecCache::kMaxEntries) spec_cache_->specs.clear();
  spec_cache_->specs.emplace(std::move(text), std::make_shared<const SagaSpec>(*parsed));
  return parsed;
}

Engine::Engine(storage::Store* store, const ToolRegistry* tools, EngineOptions options)
    : store_(store),
      tools_(tools),
      options_(std::move(options)),
      spec_cache_(std::make_shared<SpecCache>()) {
  if (options_.owner.empty()) options_.owner = NewId("drv_");
  renewer_ = std::make_shared<LeaseRenewer>(store_, options_.lease_ms);
}

Result<SubmitResult> Engine::Submit(const SagaSpec& spec, const Json& input,
                                    const std::string& intent_key) {
  if (intent_key.empty()) return Status::InvalidArgument("intent key: must not be empty");
  if (intent_key.size() > 255) return Status::InvalidArgument("intent key: longer than 255 bytes");
  if (!input.is_object()) return Status::InvalidArgument("input: expected a JSON object");
  storage::NewSaga ns;
  ns.saga_id = NewId("sg_");
  ns.intent_key = intent_key;
  ns.fingerprint = Fingerprint({{"spec", spec.raw}, {"input", input}});
  ns.spec_name = spec.name;
  ns.spec = spec.raw;
  ns.input = input;
  ns.state = SagaStateName(SagaState::kPending);
  ns.created_ms = options_.clock->NowMs();
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    storage::NewStep s;
    s.index = static_cast<int>(i);
    s.step_id = spec.steps[i].id;
    s.tool = spec.steps[i].tool;
    s.step_key = StepKey(ns.saga_id, s.step_id);
    s.state = StepStateName(StepState::kPlanned);
    ns.steps.push_back(s);
  }
  storage::JournalEntry created;
  created.saga_id = ns.saga_id;
  created.event = "saga_created";
  created.data = {{"intent_key", intent_key}, {"spec", spec.name}, {"fingerprint", ns.fingerprint}};
  created.at_ms = ns.created_ms;
  ns.journal.push_back(created);
  IDEM_FAILPOINT("intent.before_commit");
  auto out = store_->CreateIntent(ns);
  if (!out.ok()) return out.status();
  IDEM_FAILPOINT("intent.after_commit");
  if (out->created && options_.observer) options_.observer(created);
  return SubmitResult{out->saga_id, out->created};
}

// Renews the leases of every drive of one engine from one thread, each
// every lease_ms / 3; a renewal that is refused (the lease was lost) turns
// its `lost` flag true for good. One thread per engine rather than one per
// drive: a drive registers its lease without starting a thread.
class Engine::LeaseRenewer {
 public:
  struct Held {
    storage::Lease lease;
    std::chrono::steady_clock::time_point due;
    std::atomic<bool> lost{false};
    bool renewing = false;  // GUARDED_BY(LeaseRenewer::mu_)
  };

  LeaseRenewer(storage::Store* store, int64_t lease_ms)
      : store_(store), period_(std::max<int64_t>(1, lease_ms / 3)), lease_ms_(lease_ms) {}
  ~LeaseRenewer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::shared_ptr<Held> Add(const storage::Lease& lease) {
    auto held = std::make_shared<Held>();
    held->lease = lease;
    held->due = std::chrono::steady_clock::now() + period_;
    std::lock_guard<std::mutex> lock(mu_);
    // No wake-up: the thread never sleeps longer than one period, and a new
    // lease is first due a period from now.
    held_.push_back(held);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    return held;
  }

  /// After Remove returns, no renewal of the lease is running or will run:
  /// the caller may release it.
  void Remove(const std::shared_ptr<Held>& held) {
    std::unique_lock<std::mutex> lock(mu_);
    held_.erase(std::remove(held_.begin(), held_.end(), held), held_.end());
    cv_.wait(lock, [&] { return !held->renewing; });
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      auto now = std::chrono::steady_clock::now();
      auto next = now + period_;
      std::vector<std::shared_ptr<Held>> due;
      for (const auto& h : held_) {
        if (h->due <= now) {
          h->renewing = true;
          due.push_back(h);
        } else {
          next = std::min(next, h->due);
        }
      }
      if (due.empty()) {
        cv_.wait_until(lock, next);
        continue;
      }
      lock.unlock();
      for (const auto& h : due) {
        Status s = store_->RenewLease(h->lease, lease_ms_);
        // kUnavailable: the store is unreachable; keep trying. If the lease
        // expires meanwhile, the fenced writes will be refused.
        if (s.code() == Code::kAborted || s.code() == Code::kNotFound) h->lost = true;
      }
      lock.lock();
      auto after = std::chrono::steady_clock::now();
      for (const auto& h : due) {
        h->renewing = false;
        h->due = after + period_;
        if (h->lost) held_.erase(std::remove(held_.begin(), held_.end(), h), held_.end());
      }
      cv_.notify_all();
    }
  }

  storage::Store* store_;
  const std::chrono::milliseconds period_;
  const int64_t lease_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;                        // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<Held>> held_;  // GUARDED_BY(mu_)
  std::thread thread_;
};

Result<SagaRecord> Engine::Run(const std::string& saga_id) {
  if (options_.use_leases) {
    // A finished or parked saga is answered from the journal: no lease, no
    // write (a duplicate call costs a read).
    auto rec = store_->LoadSaga(saga_id);
    if (!rec.ok()) return rec.status();
    auto state = ParseSagaState(rec->summary.state);
    if (state && (IsTerminal(*state) || *state == SagaState::kNeedsAttention)) return rec;
  }
  return Drive(saga_id);
}

Result<SagaRecord> Engine::Drive(const std::string& saga_id) {
  auto lease = Claim(saga_id);
  if (!lease.ok()) {
    if (lease.status().code() == Code::kAborted) {
      return Status::Aborted("saga " + saga_id + " is being driven by another worker");
    }
    return lease.status();
  }
  return RunLeased(*lease);
}

Result<storage::Lease> Engine::Claim(const std::string& saga_id) {
  // Without leases: epoch 0, unfenced, nothing to renew or release.
  if (!options_.use_leases) return storage::Lease{saga_id, options_.owner, 0, 0};
  return store_->ClaimSaga(saga_id, options_.owner, options_.lease_ms);
}

namespace {

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

}  // namespace

Result<SagaRecord> Engine::RunLeased(const storage::Lease& lease) {
  const std::string& saga_id = lease.saga_id;
  Result<SagaRecord> out = Status::Internal("unset");
  const bool leased = lease.epoch != 0;
  std::shared_ptr<LeaseRenewer::Held> held;
  if (leased) held = renewer_->Add(lease);
  bool released = false;  // by the drive's last write
  BeginDrive(saga_id);
  {
    auto rec = store_->LoadSaga(saga_id);
    if (!rec.ok()) {
      out = rec.status();
    } else {
      auto spec = CachedSpec(rec->spec);
      if (!spec.ok()) {
        out = Status::FailedPrecondition(
            "saga " + saga_id +
            ": its frozen spec no longer validates: " + spec.status().message());
      } else if (spec->steps.size() != rec->steps.size()) {
        out = Status::Internal("saga " + saga_id + ": spec and journal disagree on the steps");
      } else {
        SagaRun run(store_, tools_, options_, std::move(rec).value(), std::move(spec).value());
        if (leased) {
          run.Fence(lease.epoch, &held->lost);
          // With leases, another process may have driven the saga before;
          // without, the file lock proves the previous driver is gone.
          run.MarkTakenOver();
        }
        run.CancelWhen([this, &saga_id] { return TakeCancelRequest(saga_id); });
        Status s = run.Drive();
        released = run.released();
        if (s.ok()) {
          out = run.record();
        } else {
          out = s;
        }
      }
    }
  }
  EndDrive(saga_id);
  if (leased) {
    renewer_->Remove(held);
    Status gone = released ? Status::Ok() : store_->ReleaseLease(lease);
    (void)gone;  // lost already, or the store is down: the lease expires on its own
  }
  return out;
}

Status Engine::Work(const WorkerOptions& worker) {
  const std::vector<std::string> states = {SagaStateName(SagaState::kPending),
                                           SagaStateName(SagaState::kRunning),
                                           SagaStateName(SagaState::kCompensating)};
  auto stopping = [&] { return options_.stop != nullptr && options_.stop->load(); };
  std::mutex mu;
  Status first_error;
  auto loop = [&] {
    while (!stopping()) {
      auto claimed = store_->ClaimSagas(states, options_.owner, options_.lease_ms, 1);
      if (!claimed.ok() || claimed->empty()) {
        if (!claimed.ok() && claimed.status().code() != Code::kUnavailable &&
            claimed.status().code() != Code::kAborted) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) first_error = claimed.status();
        }
        options_.clock->SleepMs(worker.poll_ms);
        continue;
      }
      for (const storage::Lease& lease : *claimed) {
        auto r = RunLeased(lease);
        if (worker.on_done) worker.on_done(lease.saga_id, r.ok() ? Status::Ok() : r.status());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, worker.concurrency); ++i) threads.emplace_back(loop);
  loop();
  for (auto& t : threads) t.join();
  return first_error;
}

Result<Decision> ParseDecision(const std::string& name) {
  if (name == "applied") return Decision::kApplied;
  if (name == "not_applied") return Decision::kNotApplied;
  if (name == "retry") return Decision::kRetry;
  if (name == "undone") return Decision::kUndone;
  if (name == "retry_undo") return Decision::kRetryUndo;
  return Status::InvalidArgument("decision \"" + name +
                                 "\": expected applied, not_applied, retry, undone or retry_undo");
}

namespace {
const char* DecisionName(Decision d) {
  switch (d) {
    case Decision::kApplied:
      return "applied";
    case Decision::kNotApplied:
      return "not_applied";
    case Decision::kRetry:
      return "retry";
    case Decision::kUndone:
      return "undone";
    case Decision::kRetryUndo:
      return "retry_undo";
  }
  return "?";
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
  if (rec->summary.state != SagaStateName(SagaState::kNeedsAttention)) {
    return Status::FailedPrecondition("saga " + saga_id + " is " + rec->summary.state +
                                      ", not needs_attention");
  }
  StepRecord* st = nullptr;
  for (StepRecord& s : rec->steps) {
    if (s.step_id == r.step_id) st = &s;
  }
  if (st == nullptr)
    return Status::NotFound("saga " + saga_id + " has no step \"" + r.step_id + "\"");
  auto parsed = ParseStepState(st->state);
  if (!parsed) return Status::Internal("step has an unknown state \"" + st->state + "\"");
  StepMachine m(*parsed);
  StepEvent event = StepEvent::kOperatorNotApplied;
  switch (r.decision) {
    case Decision::kApplied:
      event = StepEvent::kOperatorApplied;
      break;
    case Decision::kNotApplied:
      event = StepEvent::kOperatorNotApplied;
      break;
    case Decision::kRetry:
      event = StepEvent::kOperatorRetry;
      break;
    case Decision::kUndone:
      event = StepEvent::kOperatorUndone;
      break;
    case Decision::kRetryUndo:
      event = StepEvent::kOperatorRetryUndo;
      break;
  }
  auto cmds = m.Fire(event);
  if (!cmds.ok()) {
    return Status::FailedPrecondition("step " + r.step_id + " is " + st->state + ": decision \"" +
                                      DecisionName(r.decision) + "\" does not apply");
  }
  int64_t now = options_.clock->NowMs();
  Json who = {{"by", r.who}, {"decision", DecisionName(r.decision)}, {"note", r.note}};
  storage::WriteBatch b;
  b.saga_id = saga_id;
  st->state = StepStateName(m.state());
  st->updated_ms = now;
  const std::string comp_key = compensation::CompensationKey(st->step_key);
  switch (r.decision) {
    case Decision::kApplied: {
      st->result = r.result;
      st->error.clear();
      storage::EffectRecord eff{saga_id,      st->step_id, "action", st->tool,
                                st->step_key, r.result,    "",       now};
      b.effects.push_back(eff);
      break;
    }
    case Decision::kNotApplied:
      st->error =
          "resolved by " + r.who + ": not applied" + (r.note.empty() ? "" : " (" + r.note + ")");
      break;
    case Decision::kRetry:
      st->error.clear();
      break;
    case Decision::kUndone: {
      st->error.clear();
      auto spec = ParseSpec(rec->spec, *tools_);
      std::string comp_tool = st->tool;
      if (spec.ok() && st->index < static_cast<int>(spec->steps.size()) &&
          spec->steps[st->index].compensate) {
        comp_tool = spec->steps[st->index].compensate->tool;
      }
      storage::EffectRecord eff{saga_id,   st->step_id, "compensation",
                                comp_tool, comp_key,    {{"resolved_by", r.who}},
                                "",        now};
      b.effects.push_back(eff);
      break;
    }
    case Decision::kRetryUndo:
      st->error.clear();
      st->comp_attempt = 1;
      break;
  }
  b.steps.push_back(*st);
  storage::JournalEntry je;
  je.saga_id = saga_id;
  je.step_id = st->step_id;
  je.event = "operator_resolved";
  je.data = who;
  je.at_ms = now;
  b.journal.push_back(je);
  if (r.decision == Decision::kRetryUndo) {
    storage::JournalEntry sub = je;
    sub.event = "compensation_submitted";
    sub.data = {{"attempt", 1}, {"key", comp_key}, {"by", r.who}};
    b.journal.push_back(sub);
  }
  // Undo on if a rollback had begun, else go on forward (a step now failed
  // starts the rollback from there).
  bool rolling_back = false;
  for (const StepRecord& s : rec->steps) {
    rolling_back |=
        s.state == "compensating" || s.state == "compensated" || s.state == "compensation_failed";
  }
  SagaMachine saga(SagaState::kNeedsAttention);
  auto scmds = saga.Fire(SagaEvent::kOperatorResumed, SagaFacts::WithRollingBack(rolling_back));
  if (!scmds.ok()) return scmds.status();
  b.saga_state = SagaStateName(saga.state());
  b.saga_reason = rec->summary.reason;
  storage::JournalEntry resumed = je;
  resumed.step_id.clear();
  resumed.event = std::string("saga_") + SagaStateName(saga.state());
  resumed.data = {{"resumed_by", r.who}};
  b.journal.push_back(resumed);
  IDEM_RETURN_IF_ERROR(CommitClaimed(lease.lease(), &b));
  return RunLeased(lease.Hand());
}

Result<storage::Lease> Engine::ClaimForDecision(const std::string& saga_id) {
  auto lease = Claim(saga_id);
  if (!lease.ok() && lease.status().code() == Code::kAborted) {
    return Status::Unavailable("saga " + saga_id + " is busy; try again");
  }
  return lease;
}

Status Engine::CommitClaimed(const storage::Lease& lease, storage::WriteBatch* b) {
  b->fence_epoch = lease.epoch;
  IDEM_RETURN_IF_ERROR(store_->Commit(*b));
  if (options_.observer) {
    for (const auto& e : b->journal) options_.observer(e);
  }
  return Status::Ok();
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
  const Status mismatch =
      Status::FailedPrecondition(std::string(preview_commit::kMismatchedTokenMessage));
  if ((!d.expected_saga_id.empty() && d.expected_saga_id != claims->saga_id) ||
      (!d.expected_step_id.empty() && d.expected_step_id != claims->step_id)) {
    return mismatch;
  }
  // Read, check and write under the saga's lease (see Resolve).
  auto claimed = ClaimForDecision(claims->saga_id);
  if (!claimed.ok()) return claimed.status();
  ClaimedLease lease(store_, *claimed);
  DriveMark driving(this, claims->saga_id);  // a Cancel here records a request
  auto rec = store_->LoadSaga(claims->saga_id);
  if (!rec.ok()) return rec.status();
  StepRecord* st = nullptr;
  for (StepRecord& s : rec->steps) {
    if (s.step_id == claims->step_id) st = &s;
  }
  if (st == nullptr || !st->phase.is_object()) return mismatch;
  if (st->phase.value("nonce", "") != claims->nonce) {
    return Status::FailedPrecondition(
        "commit token was superseded by a newer preview; decide on the current one");
  }
  const char* decision = d.approve ? "approved" : "rejected";
  const Json recorded = st->phase.value("approval", Json());
  if (recorded.is_object()) {
    // Decided before: a replay, or a second process racing this one.
    if (recorded.value("decision", "") != decision) {
      return Status::FailedPrecondition("commit was already " + recorded.value("decision", "") +
                                        " by " + recorded.value("by", ""));
    }
    if (rec->summary.state == SagaStateName(SagaState::kRunning) ||
        rec->summary.state == SagaStateName(SagaState::kAwaitingApproval)) {
      return RunLeased(lease.Hand());  // finish what a crash interrupted
    }
    return rec;
  }
  // The saga may still say running when its driver died between journaling
  // the preview and parking the saga: the decision is just as valid.
  const bool saga_waiting = rec->summary.state == SagaStateName(SagaState::kAwaitingApproval);
  if (st->state != StepStateName(StepState::kAwaitingApproval) ||
      (!saga_waiting && rec->summary.state != SagaStateName(SagaState::kRunning))) {
    return Status::FailedPrecondition("step " + st->step_id + " is " + st->state +
                                      ", not awaiting approval");
  }
  if (Fingerprint(st->args) != claims->args_fingerprint ||
      st->phase.value("args_fingerprint", "") != claims->args_fingerprint) {
    return mismatch;
  }
  int64_t now = options_.clock->NowMs();
  st->phase["approval"] = {{"decision", decision}, {"by", d.who}, {"note", d.note}, {"at_ms", now}};
  st->updated_ms = now;
  SagaMachine saga(SagaState::kAwaitingApproval);
  auto cmds = saga.Fire(SagaEvent::kApprovalSettled);
  if (!cmds.ok()) return cmds.status();
  storage::WriteBatch b;
  b.saga_id = claims->saga_id;
  if (saga_waiting) b.saga_state = SagaStateName(saga.state());
  b.steps.push_back(*st);
  storage::JournalEntry je;
  je.saga_id = claims->saga_id;
  je.step_id = st->step_id;
  je.event = decision;
  je.data = {{"by", d.who}, {"note", d.note}, {"token_key", claims->key_id}};
  je.at_ms = now;
  b.journal.push_back(je);
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

Result<RecoveryReport> Engine::Recover(int concurrency) {
  storage::SagaFilter filter;
  filter.states = {SagaStateName(SagaState::kPending), SagaStateName(SagaState::kRunning),
                   SagaStateName(SagaState::kCompensating),
                   SagaStateName(SagaState::kAwaitingApproval)};
  filter.limit = 1'000'000;
  auto list = store_->ListSagas(filter);
  if (!list.ok()) return list.status();
  RecoveryReport report;
  std::mutex mu;
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < list->size(); i = next++) {
      const std::string& id = (*list)[i].saga_id;
      // Listed as unfinished: claimed at once, without Run's read first
      // (which spares finished sagas a lease when called again).
      auto r = Drive(id);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok() && r.status().code() == Code::kAborted) {
        ++report.skipped;  // another worker holds its lease and drives it
        continue;
      }
      ++report.resumed;
      report.saga_ids.push_back(id);
      if (!r.ok()) report.errors.push_back(id + ": " + r.status().ToString());
    }
  };
  int n = std::max(1, std::min<int>(concurrency, static_cast<int>(list->size())));
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return report;
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
        WriteBatch b;
        b.saga_id = saga_id;
        b.saga_state = SagaStateName(m.state());
        b.saga_reason = why;
        JournalEntry je;
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
        if (st.state == StepStateName(StepState::kAwaitingApproval) && st.phase.is_object()) {
          token = st.phase.value("token", "");
        }
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

bool NeedsDrive(const SagaRecord& saga, int64_t now_ms) {
  auto state = ParseSagaState(saga.summary.state);
  if (!state) return false;
  switch (*state) {
    case SagaState::kPending:
    case SagaState::kRunning:
    case SagaState::kCompensating:
      return true;
    case SagaState::kAwaitingApproval:
      for (const StepRecord& st : saga.steps) {
        if (st.state == StepStateName(StepState::kAwaitingApproval) && st.phase.is_object() &&
            (st.phase.contains("approval") || now_ms >= st.phase.value("expires_ms", int64_t{0}))) {
          return true;
        }
      }
      return false;
    default:
      return false;
  }
}

}  // namespace idem
