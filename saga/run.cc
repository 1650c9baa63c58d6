#include "saga/run.h"

#include <algorithm>
#include <functional>

#include "preview_commit/phase.h"
#include "saga/completion.h"
#include "saga/park.h"
#include "saga/step_key.h"

#include "common/failpoint.h"

namespace idem {

using storage::JournalEntry;
using storage::StepRecord;
using storage::WriteBatch;

namespace {

// Total attempts allowed when each resend follows a status lookup that
// confirmed the key was not applied (see ResolveUnknown).
constexpr int kMaxConfirmedAbsentAttempts = 5;
// The outcome's note when a status lookup said the key was not applied and
// the step is resent: its `submitted` records `lookup: not_applied`.
constexpr const char* kNotAppliedByLookup = "resolved_by_status_not_applied";

// Whether losing a record of the tool's call in a crash leaves only what the
// `submitted` before it did: a state a status lookup or a same-key resend
// settles without a person.
bool SettledWithoutAPerson(const ToolInfo& info) { return info.honours_keys || info.has_status; }

}  // namespace

Result<LoadedSaga> LoadedSaga::From(storage::SagaRecord record) {
  LoadedSaga out;
  auto state = ParseSagaState(record.summary.state);
  if (!state) {
    return Status::Internal("saga " + record.summary.saga_id + " has an unknown state \"" +
                            record.summary.state + "\"");
  }
  out.state = *state;
  for (const StepRecord& st : record.steps) {
    auto s = ParseStepState(st.state);
    if (!s) return Status::Internal("step has an unknown state \"" + st.state + "\"");
    out.steps.push_back(*s);
  }
  out.record = std::move(record);
  return out;
}

Status StepDrive::Fire(StepEvent e, const StepFacts& facts) {
  auto cmds = m.Fire(e, facts);
  if (!cmds.ok()) return cmds.status();
  queue.insert(queue.end(), cmds->begin(), cmds->end());
  return Status::Ok();
}

SagaRun::SagaRun(storage::Store* store, const ToolRegistry* tools, const EngineOptions& options,
                 LoadedSaga saga, SagaSpec spec)
    : store_(store),
      tools_(tools),
      options_(options),
      rec_(std::move(saga.record)),
      state_(saga.state),
      durable_state_(saga.state),
      step_states_(std::move(saga.steps)),
      spec_(std::move(spec)),
      rng_(options.seed ^ std::hash<std::string>()(rec_.summary.saga_id)) {
  for (const StepSpec& s : spec_.steps) compensable_.push_back(s.compensate.has_value());
  park_reason_ = rec_.summary.reason;  // a resumed rollback keeps its cause
}

Status SagaRun::CheckLease() const {
  if (lease_lost_ != nullptr && lease_lost_->load()) {
    return Status::Aborted("lease lost: another worker may drive saga " + rec_.summary.saga_id);
  }
  return Status::Ok();
}

Result<std::optional<int64_t>> SagaRun::EarliestCheck() const {
  return completion::EarliestCheck(store_, rec_.summary.saga_id);
}

Result<std::vector<int>> SagaRun::DueProcessingSteps() const {
  std::vector<int> out;
  bool any = false;
  for (int i = 0; i < step_count() && !any; ++i) any = step_state(i) == StepState::kProcessing;
  if (!any) return out;
  auto checks = store_->ListStepChecks(rec_.summary.saga_id);
  if (!checks.ok()) return checks.status();
  const int64_t now = options_.clock->NowMs();
  for (int i = 0; i < step_count(); ++i) {
    if (step_state(i) != StepState::kProcessing) continue;
    auto c = std::find_if(checks->begin(), checks->end(), [&](const storage::StepCheck& k) {
      return k.step_id == rec_.steps[i].step_id;
    });
    if (c == checks->end() || c->next_check_ms <= now) out.push_back(i);
  }
  return out;
}

// ---- journal

SagaRun::Durable SagaRun::OutcomeDurability(const ToolInfo& info, int attempt) {
  return attempt == 1 && SettledWithoutAPerson(info) ? Durable::kWithNextFlush : Durable::kNow;
}

SagaRun::Durable SagaRun::UnknownDurability(const ToolInfo& info) {
  return SettledWithoutAPerson(info) ? Durable::kWithNextFlush : Durable::kNow;
}

JournalEntry SagaRun::Entry(const std::string& step_id, const std::string& event, Json data) const {
  JournalEntry e;
  e.saga_id = rec_.summary.saga_id;
  e.step_id = step_id;
  e.event = event;
  e.data = std::move(data);
  e.at_ms = options_.clock->NowMs();
  return e;
}

// Writes are staged, then flushed in one transaction. Commit is
// Stage + Flush; a batch staged alone becomes durable with the next flush,
// which comes before any call to the outside world (every `submitted` is
// flushed at once), before a drive ends, and at terminal states. Only writes
// whose loss a recovery settles without a person are staged alone (see
// OutcomeDurability).
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
  // A step's check: the last staged write of it wins (kept or removed).
  auto drop = [](auto* list, const std::string& step_id, auto id_of) {
    list->erase(std::remove_if(list->begin(), list->end(),
                               [&](const auto& x) { return id_of(x) == step_id; }),
                list->end());
  };
  auto check_id = [](const storage::StepCheck& c) { return c.step_id; };
  auto done_id = [](const std::string& id) { return id; };
  for (storage::StepCheck& c : batch.checks) {
    drop(&staged_.checks, c.step_id, check_id);
    drop(&staged_.checks_done, c.step_id, done_id);
    staged_.checks.push_back(std::move(c));
  }
  for (std::string& id : batch.checks_done) {
    drop(&staged_.checks, id, check_id);
    drop(&staged_.checks_done, id, done_id);
    staged_.checks_done.push_back(std::move(id));
  }
  staged_.release_lease |= batch.release_lease;
  if (!batch.consume_token.empty()) {
    // One token per batch; every batch that spends one is flushed at once.
    staged_.consume_token = std::move(batch.consume_token);
    staged_.consume_token_step = std::move(batch.consume_token_step);
  }
  has_staged_ = true;
}

void SagaRun::CreateWithFirstFlush(storage::NewSaga create, std::function<void()> on_created) {
  create_ = std::move(create);
  on_created_ = std::move(on_created);
  unborn_ = true;
  has_staged_ = true;  // the first Flush writes it, staged writes or not
}

Status SagaRun::Flush() {
  if (!has_staged_) return Status::Ok();
  if (released_) return Status::Internal("a write after the drive gave its lease up");
  if (unborn_ && !create_) return store_refusal_;  // its create was refused
  WriteBatch batch = std::move(staged_);
  staged_ = WriteBatch();
  has_staged_ = false;
  const bool ends_drive = staged_ends_drive_;
  staged_ends_drive_ = false;
  DropPrefetchedControl();  // read before this write: stale after it
  batch.saga_id = rec_.summary.saga_id;
  batch.fence_epoch = fence_epoch_;
  if (create_) {
    batch.create = std::move(create_);
    create_.reset();
  }
  // A write that does not end the drive may be followed by the control
  // check (saga/drive.cc): the request is read with it where the store can
  // do that in the same round trip. Not for a write before a call (a
  // `submitted` or `compensation_submitted`): the call drops what it read.
  const bool read_back =
      !batch.create && !ends_drive && !batch.release_lease &&
      std::none_of(batch.journal.begin(), batch.journal.end(), [](const storage::JournalEntry& e) {
        return e.event == "submitted" || e.event == "compensation_submitted";
      });
  storage::ControlReadback readback;
  Status committed =
      read_back ? store_->CommitReadingControl(batch, &readback) : store_->Commit(batch);
  if (!committed.ok()) {
    store_refusal_ = committed;
    return committed;
  }
  if (readback.read) PrefetchControl(std::move(readback.pending));
  if (batch.create) {
    unborn_ = false;
    // As Submit then Run tell it: the create's entries, the caller, the rest.
    if (options_.observer) {
      for (const JournalEntry& e : batch.create->journal) options_.observer(e);
    }
    if (on_created_) on_created_();
  }
  if (batch.saga_state) {
    if (auto durable = ParseSagaState(*batch.saga_state)) durable_state_ = *durable;
  }
  released_ = batch.release_lease;
  if (options_.observer) {
    for (const JournalEntry& e : batch.journal) options_.observer(e);
  }
  return Status::Ok();
}

WriteBatch SagaRun::StepBatch(const StepDrive& d) {
  StepRecord copy = d.st;
  copy.state = StepStateName(d.state());
  copy.updated_ms = options_.clock->NowMs();
  step_states_[d.index] = d.state();
  WriteBatch b;
  b.steps.push_back(std::move(copy));
  if (d.check) {
    // A waiting step's check goes with its row; once it stops waiting, away.
    if (d.state() == StepState::kProcessing) {
      b.checks.push_back(*d.check);
    } else {
      b.checks_done.push_back(d.st.step_id);
    }
  }
  return b;
}

Status SagaRun::CommitStep(const StepDrive& d, const std::string& event, Json data,
                           std::vector<storage::EffectRecord> effects, Durable durable) {
  WriteBatch b = StepBatch(d);
  b.journal.push_back(Entry(d.st.step_id, event, std::move(data)));
  b.effects = std::move(effects);
  if (durable == Durable::kWithNextFlush) {
    Stage(std::move(b));
    return Status::Ok();
  }
  return Commit(std::move(b));
}

storage::EffectRecord SagaRun::ActionEffect(const StepDrive& d) const {
  storage::EffectRecord eff;
  eff.saga_id = rec_.summary.saga_id;
  eff.step_id = d.st.step_id;
  eff.kind = "action";
  eff.tool = d.spec->tool;
  eff.idempotency_key = d.st.step_key;
  eff.result = d.st.result;
  eff.external_ref = d.st.external_ref;
  eff.at_ms = options_.clock->NowMs();
  return eff;
}

Status SagaRun::CommitEntries(const StepDrive& d, std::vector<JournalEntry> entries,
                              const std::string& consume_nonce) {
  WriteBatch b = StepBatch(d);
  b.journal = std::move(entries);
  b.consume_token = consume_nonce;
  if (!consume_nonce.empty()) b.consume_token_step = d.st.step_id;
  return Commit(std::move(b));
}

Status SagaRun::CommitJournal(std::vector<JournalEntry> entries) {
  WriteBatch b;
  b.journal = std::move(entries);
  return Commit(std::move(b));
}

Status SagaRun::CommitSagaState(SagaState next, const std::string& reason, JournalEntry entry,
                                bool ends_drive, Durable durable) {
  state_ = next;
  WriteBatch b;
  b.saga_state = SagaStateName(next);
  b.saga_reason = reason;
  b.journal.push_back(std::move(entry));
  b.release_lease = ends_drive && fence_epoch_ != 0;
  if (ends_drive) staged_ends_drive_ = true;
  if (durable == Durable::kWithNextFlush) {
    Stage(std::move(b));
    return Status::Ok();
  }
  return Commit(std::move(b));
}

Status SagaRun::ParkAfterFault(const std::string& reason, bool rewind) {
  if (unborn_) {
    return Status::FailedPrecondition("saga " + rec_.summary.saga_id +
                                      " was never recorded: nothing to park");
  }
  if (rewind) state_ = durable_state_;
  if (released_ || IsTerminal(state_) || state_ == SagaState::kNeedsAttention ||
      state_ == SagaState::kAwaitingApproval || state_ == SagaState::kAwaitingCompletion) {
    return Status::Ok();  // the drive had ended: nothing to park
  }
  // Through the saga machine like any park: a step (or an undo) needs a person.
  SagaMachine saga(state_);
  auto cmds = saga.Fire(state_ == SagaState::kCompensating ? SagaEvent::kUndoParked
                                                           : SagaEvent::kStepParked);
  if (!cmds.ok()) return cmds.status();
  park_reason_ = reason;
  return CommitSagaState(
      saga.state(), reason,
      Entry("", std::string("saga_") + SagaStateName(saga.state()), ParkEntryData(reason)),
      /*ends_drive=*/true, Durable::kNow);
}

// ---- steps

Result<StepDrive> SagaRun::BeginStep(int index, bool rolling_back) {
  const StepSpec& spec = spec_.steps[index];
  Tool* tool = tools_->Find(spec.tool);
  if (tool == nullptr) {
    return Status::FailedPrecondition("tool \"" + spec.tool + "\" is not registered");
  }
  StepDrive d(index, &spec, tool, rec_.steps[index], step_states_[index]);
  d.key = CallKey(index, &d.key_error);
  d.rolling_back = rolling_back;
  d.inherited =
      taken_over_ && (d.state() == StepState::kSubmitted || d.state() == StepState::kUnknown);
  if (d.state() == StepState::kProcessing) {
    auto checks = store_->ListStepChecks(rec_.summary.saga_id);
    if (!checks.ok()) return checks.status();
    for (const storage::StepCheck& c : *checks) {
      if (c.step_id == d.st.step_id) d.check = c;
    }
  }
  return d;
}

std::string SagaRun::CallKey(int index, std::string* error) const {
  const StepSpec& spec = spec_.steps[index];
  if (spec.key_template.empty()) return rec_.steps[index].step_key;
  auto key = RenderStepKey(spec_, index, rec_.summary.saga_id, rec_.input);
  if (key.ok()) return *key;
  if (error != nullptr) *error = key.status().message();
  return "";
}

namespace {

// What templates see: {"input": ..., "steps": {"<id>": {"args", "result"}}}.
Json TemplateContext(const storage::SagaRecord& rec) {
  Json steps = Json::object();
  for (const StepRecord& st : rec.steps) {
    steps[st.step_id] = {{"args", st.args}, {"result", st.result}};
  }
  return {{"input", rec.input}, {"steps", steps}};
}

}  // namespace

Result<Json> SagaRun::ResolveArgs(const Json& templ, const std::string& where) const {
  return ResolveWithinLimits(templ, TemplateContext(rec_), where, options_.limits);
}

Result<Json> SagaRun::ResolveStepArgs(int index) const {
  const SagaLimits& limits = options_.limits;
  size_t used = JsonBytes(rec_.input, limits.max_saga_bytes);
  for (size_t i = 0; i < rec_.steps.size(); ++i) {
    if (static_cast<int>(i) == index || step_states_[i] == StepState::kPlanned) continue;
    used += JsonBytes(rec_.steps[i].args, limits.max_saga_bytes);
  }
  const size_t room = used < limits.max_saga_bytes ? limits.max_saga_bytes - used : 0;
  return ResolveWithinLimits(spec_.steps[index].args, TemplateContext(rec_),
                             "steps[" + std::to_string(index) + "].args", limits, room);
}

Result<StepEnd> SagaRun::SettleUncertain(StepDrive* d) {
  switch (d->state()) {
    case StepState::kSubmitted: {
      // Found after a crash: the call may have happened.
      d->outcome = ToolOutcome::Unknown("recovered: submitted without a recorded outcome");
      IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kOutcomeUnknown));
      IDEM_RETURN_IF_ERROR(CommitStep(*d, "unknown", {{"reason", d->outcome.error}}, {},
                                      UnknownDurability(d->tool->info())));
      IDEM_FAILPOINT("unknown.after_recorded");
      break;
    }
    case StepState::kUnknown:
      d->outcome = ToolOutcome::Unknown("recovered: outcome unknown");
      d->queue.push_back(StepCommand::kResolveOutcome);
      break;
    case StepState::kProcessing:
      // Waiting for the provider: its check is due (saga/completion.h).
      d->outcome = ToolOutcome::Accepted(d->st.external_ref);
      d->queue.push_back(StepCommand::kResolveOutcome);
      break;
    default:
      return Status::Internal(std::string("step ") + d->st.step_id + " is " +
                              StepStateName(d->state()) + ", not uncertain");
  }
  return RunCommands(d);
}

// A definite failure: keyed retry where policy and the tool allow it.
// Write tools retry at most once, and only when the tool honours keys or a
// status lookup confirms the key was not applied.
StepFacts SagaRun::ClassifyFailure(const StepDrive& d, const ToolOutcome& outcome) {
  if (d.rolling_back || forward_halted_ || !outcome.retryable ||
      d.st.attempt >= d.spec->retry.max_attempts) {
    return StepFacts::WithRetryAllowed(false);
  }
  const ToolInfo& info = d.tool->info();
  bool write = info.effect == EffectClass::kWrite || info.effect == EffectClass::kIrreversible;
  if (!write || info.honours_keys) return StepFacts::WithRetryAllowed(true);
  if (info.has_status) {
    LookupOutcome look;
    {
      OutsideCall outside(this);
      look = d.tool->Lookup(d.key);
    }
    if (look.kind == LookupKind::kNotApplied) return StepFacts::WithRetryAllowed(true);
  }
  return StepFacts::WithRetryAllowed(false);
}

// An unknown outcome: status lookup, else a same-key retry where the tool
// honours keys, else a person. Never a fresh call.
StepEvent SagaRun::ResolveUnknown(StepDrive* d) {
  if (d->state() == StepState::kProcessing) return CheckCompletion(d);
  const ToolInfo& info = d->tool->info();
  StepRecord* st = &d->st;
  ToolOutcome* out = &d->outcome;
  bool attempts_left = st->attempt < std::max(d->spec->retry.max_attempts, 2);
  if (info.has_status) {
    std::string last_error;
    for (int n = 1; n <= options_.lookup_attempts; ++n) {
      LookupOutcome look;
      {
        OutsideCall outside(this);
        look = d->tool->Lookup(d->key);
      }
      if (look.kind == LookupKind::kApplied) {
        *out = ToolOutcome::Succeeded(look.result, look.external_ref);
        out->error = "resolved_by_status";
        return StepEvent::kResolvedApplied;
      }
      if (look.kind == LookupKind::kPending && !d->rolling_back) {
        // The provider holds the key and has not finished: wait for it.
        *out = ToolOutcome::Accepted(look.external_ref, look.check_after_ms);
        return StepEvent::kResolvedPending;
      }
      if (look.kind == LookupKind::kFailed) {
        st->error = "status lookup: the provider failed key " + d->key +
                    (look.error.empty() ? "" : ": " + look.error);
        return StepEvent::kResolvedNotApplied;
      }
      if (look.kind == LookupKind::kNotApplied) return NotApplied(d, attempts_left);
      last_error = look.kind == LookupKind::kPending ? "pending during a rollback" : look.error;
      if (n < options_.lookup_attempts) {
        const int64_t wait = options_.lookup_backoff.BackoffMs(n + 1, rng_);
        OutsideCall outside(this);
        options_.clock->SleepMs(wait);
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
              d->key;
  return StepEvent::kUnresolvable;
}

StepEvent SagaRun::NotApplied(StepDrive* d, bool attempts_left) {
  const ToolInfo& info = d->tool->info();
  StepRecord* st = &d->st;
  if (d->inherited && !info.honours_keys) {
    // Another worker submitted this step and lost its lease; it may be
    // frozen with its call still on the way. The provider does not
    // deduplicate keys, so "not applied yet" is no proof: a resend could
    // book twice. A person decides (resolve --decision retry/...).
    st->error = "taken over from a worker whose call to " + info.name +
                " may still land, and the tool does not deduplicate keys: check key " + d->key;
    return StepEvent::kUnresolvable;
  }
  // The provider says the key never took effect, so a same-key resend
  // cannot duplicate it. Attempts burnt by crashes between `submitted`
  // and the call must not end the saga: allow resends up to a hard cap.
  bool resend_ok = attempts_left || st->attempt < kMaxConfirmedAbsentAttempts;
  if (!d->rolling_back && !forward_halted_ && resend_ok) {
    d->outcome.error = kNotAppliedByLookup;  // the resend's `submitted` says so
    return StepEvent::kResolvedRetry;
  }
  st->error = "status lookup: key " + d->key + " was not applied";
  return StepEvent::kResolvedNotApplied;
}

// A processing step's check: one lookup; the saga waits again on pending or
// a lookup error, until the window's end.
StepEvent SagaRun::CheckCompletion(StepDrive* d) {
  StepRecord* st = &d->st;
  ToolOutcome* out = &d->outcome;
  const ToolInfo& info = d->tool->info();
  const int64_t now = options_.clock->NowMs();
  IDEM_FAILPOINT("completion.before_lookup");
  LookupOutcome look;
  {
    OutsideCall outside(this);
    look = d->tool->Lookup(d->key);
  }
  IDEM_FAILPOINT("completion.after_lookup");
  switch (look.kind) {
    case LookupKind::kApplied:
      *out = ToolOutcome::Succeeded(look.result, look.external_ref);
      out->error = "resolved_by_status";
      return StepEvent::kResolvedApplied;
    case LookupKind::kFailed:
      st->error = "the provider of " + info.name + " failed key " + d->key +
                  (look.error.empty() ? "" : ": " + look.error);
      return StepEvent::kResolvedNotApplied;
    case LookupKind::kNotApplied:
      return NotApplied(d, st->attempt < std::max(d->spec->retry.max_attempts, 2));
    case LookupKind::kPending:
    case LookupKind::kError:
      break;
  }
  const std::string answer =
      look.kind == LookupKind::kPending ? "pending" : "lookup error: " + look.error;
  if (d->check && completion::PastWindow(*d->check, now)) {
    st->error = BlockedReason(ParkCode::kCompletionWindow,
                              completion::WindowReason(info.name, d->key, *d->check, answer));
    return StepEvent::kBlocked;
  }
  *out = ToolOutcome::Accepted(look.external_ref.empty() ? st->external_ref : look.external_ref,
                               look.kind == LookupKind::kPending ? look.check_after_ms : 0);
  out->error = answer;
  return StepEvent::kResolvedPending;
}

Result<StepEnd> SagaRun::RunCommands(StepDrive* d) {
  const StepSpec& spec = *d->spec;
  StepRecord& st = d->st;
  ToolOutcome& outcome = d->outcome;
  while (!d->queue.empty()) {
    StepCommand cmd = d->queue.front();
    d->queue.pop_front();
    switch (cmd) {
      case StepCommand::kCallTool: {
        ToolCall call{spec.tool, d->key, st.args, st.attempt, rec_.summary.saga_id, st.step_id, ""};
        if (spec.two_phase) {
          if (auto phase = preview_commit::PhaseRecord::FromJson(st.phase)) {
            call.expected_version = phase->preview.resource_version;
          }
        }
        IDEM_RETURN_IF_ERROR(Flush());  // normally done by `submitted`
        IDEM_RETURN_IF_ERROR(CheckLease());
        d->inherited = false;  // from here on the uncertainty is this drive's own
        {
          OutsideCall outside(this);
          outcome = d->tool->Invoke(call);
        }
        IDEM_FAILPOINT("step.after_call");
        if (outcome.kind == OutcomeKind::kFailed && outcome.stale && spec.two_phase &&
            spec.on_stale == Fallback::kRePreview && !d->rolling_back) {
          // The previewed resource moved: never a blind commit. Preview again
          // (and, with approval, ask the person again).
          st.error = outcome.error;
          IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kStaleRePreview));
          IDEM_RETURN_IF_ERROR(CommitStep(*d, "stale", {{"error", outcome.error}}));
          return StepEnd::kStale;
        }
        switch (outcome.kind) {
          case OutcomeKind::kSucceeded:
            IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kSucceeded));
            break;
          case OutcomeKind::kFailed:
            st.error = outcome.error;
            IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kFailed, ClassifyFailure(*d, outcome)));
            break;
          case OutcomeKind::kAccepted:
            if (d->tool->info().has_status && !d->rolling_back) {
              IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kAccepted));
              break;
            }
            // Nothing to ask how it ends: as uncertain as a lost answer.
            outcome = ToolOutcome::Unknown("accepted by a tool without a status lookup");
            [[fallthrough]];
          case OutcomeKind::kUnknown:
            st.error = outcome.error;
            IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kOutcomeUnknown));
            IDEM_RETURN_IF_ERROR(CommitStep(*d, "unknown", {{"reason", outcome.error}}, {},
                                            UnknownDurability(d->tool->info())));
            IDEM_FAILPOINT("unknown.after_recorded");
            break;
        }
        break;
      }
      case StepCommand::kResolveOutcome:
        IDEM_RETURN_IF_ERROR(d->Fire(ResolveUnknown(d)));
        break;
      case StepCommand::kScheduleRetry: {
        // Back off after the provider refused; a resend that only settles
        // an uncertain outcome (lookup said not applied, or a keyed tool
        // after a crash) has nothing to wait for.
        int64_t wait =
            outcome.kind == OutcomeKind::kFailed ? spec.retry.BackoffMs(st.attempt + 1, rng_) : 0;
        {
          OutsideCall outside(this);
          options_.clock->SleepMs(wait);
        }
        ++st.attempt;
        Json data = {{"attempt", st.attempt},
                     {"key", d->key},
                     {"retry_after_ms", wait},
                     {"previous_error", st.error}};
        if (outcome.error == kNotAppliedByLookup) data["lookup"] = "not_applied";
        IDEM_RETURN_IF_ERROR(CommitStep(*d, "submitted", data));
        IDEM_FAILPOINT("step.after_submitted");
        d->queue.push_back(StepCommand::kCallTool);
        break;
      }
      case StepCommand::kRecordSucceeded: {
        st.result = outcome.result;
        st.external_ref = outcome.external_ref;
        bool by_status = outcome.error == "resolved_by_status";
        st.error.clear();
        storage::EffectRecord eff = ActionEffect(*d);
        Json data = {{"attempt", st.attempt}, {"result", st.result}};
        if (!st.external_ref.empty()) data["external_ref"] = st.external_ref;
        if (by_status) data["resolved_by"] = "status_lookup";
        if (outcome.replayed) data["replayed"] = true;  // a duplicate the provider absorbed
        IDEM_RETURN_IF_ERROR(CommitStep(*d, "succeeded", data, {eff},
                                        OutcomeDurability(d->tool->info(), st.attempt)));
        IDEM_FAILPOINT("step.after_outcome");
        return StepEnd::kSucceeded;
      }
      case StepCommand::kRecordFailed: {
        IDEM_RETURN_IF_ERROR(
            CommitStep(*d, "failed", {{"attempt", st.attempt}, {"error", st.error}}));
        IDEM_FAILPOINT("step.after_outcome");
        return StepEnd::kFailed;
      }
      case StepCommand::kAwaitCompletion: {
        // Wait for the provider: the next check is stored with the step,
        // and the saga waits with nothing held (saga/completion.h).
        const int64_t now = options_.clock->NowMs();
        d->check = completion::NextCheck(d->tool->info().completion, d->check, st.step_id, now,
                                         outcome.check_after_ms, &rng_);
        if (!outcome.external_ref.empty()) st.external_ref = outcome.external_ref;
        st.error.clear();
        Json data = {{"attempt", st.attempt},
                     {"next_check_ms", d->check->next_check_ms},
                     {"deadline_ms", d->check->deadline_ms},
                     {"checks", d->check->checks}};
        if (!st.external_ref.empty()) data["provider_ref"] = st.external_ref;
        if (!outcome.error.empty()) data["last_answer"] = outcome.error;
        // Staged: the saga's wait is written with it, in one transaction. A
        // crash before leaves `submitted`, which a status lookup settles.
        IDEM_RETURN_IF_ERROR(CommitStep(*d, "processing", data, {}, Durable::kWithNextFlush));
        return StepEnd::kProcessing;
      }
      case StepCommand::kParkStep: {
        IDEM_RETURN_IF_ERROR(CommitStep(*d, "needs_attention", ParkEntryData(st.error)));
        return StepEnd::kParked;
      }
      default:
        return Status::Internal(std::string("unexpected step command ") + StepCommandName(cmd));
    }
  }
  return Status::Internal("step drive ended without an outcome");
}

}  // namespace idem
