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

// The outcome's note when a status lookup said the key was not applied and
// the step is resent: its `submitted` records `lookup: not_applied`.
constexpr const char* kNotAppliedByLookup = "resolved_by_status_not_applied";

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
// whose loss a recovery settles without a person are staged alone (the effect
// protocol's Decision::durability).
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
  d->found_uncertain = d->state() != StepState::kProcessing;
  switch (d->state()) {
    case StepState::kSubmitted: {
      // Found after a crash: the call may have happened.
      d->outcome = ToolOutcome::Unknown("recovered: submitted without a recorded outcome");
      IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kOutcomeUnknown));
      IDEM_RETURN_IF_ERROR(CommitStep(
          *d, "unknown", {{"reason", d->outcome.error}}, {},
          DurabilityOf(effect::UnknownDurability(effect::Capabilities::Of(d->tool->info())))));
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

// ---- the effect protocol (effect/protocol.h): what each answer leads to

effect::CallKind SagaRun::CallKindOf(const StepDrive& d) const {
  if (d.spec->two_phase) return effect::CallKind::kCommit;
  const bool open = spec_.raw.is_object() && spec_.raw.contains("open");  // saga/open_saga.h
  return open ? effect::CallKind::kOpenCall : effect::CallKind::kAction;
}

effect::Situation SagaRun::SituationOf(const StepDrive& d, effect::CallKind kind) const {
  effect::Situation s;
  s.kind = kind;
  s.caps = effect::Capabilities::Of(d.tool->info());
  s.attempt = d.st.attempt;
  s.max_attempts = d.spec->retry.max_attempts;
  s.in_flight = d.inherited         ? effect::InFlight::kTakenOver
                : d.found_uncertain ? effect::InFlight::kCrashed
                                    : effect::InFlight::kNo;
  s.max_lookups = options_.lookup_attempts;
  s.halted = d.rolling_back || forward_halted_;
  s.can_wait = !d.rolling_back;
  return s;
}

effect::Decision SagaRun::LookUpUntilDecided(StepDrive* d, effect::Situation* s,
                                             LookupOutcome* look) {
  effect::Decision dec = effect::Decide(*s);
  const bool check = s->kind == effect::CallKind::kCompletionCheck;
  while (dec.action == effect::Action::kLookUp) {
    if (s->lookups > 0) {
      CallBoundary boundary(this);
      effect::Sleep(options_.clock, options_.lookup_backoff.BackoffMs(s->lookups + 1, rng_),
                    &boundary);
    }
    if (check) IDEM_FAILPOINT("completion.before_lookup");
    {
      CallBoundary boundary(this);
      *look = effect::Lookup(s->kind, d->tool, d->key, &boundary);
    }
    if (check) IDEM_FAILPOINT("completion.after_lookup");
    s->answer = effect::AnswerOf(*look);
    ++s->lookups;
    dec = effect::Decide(*s);
  }
  return dec;
}

Status SagaRun::OnCallAnswer(StepDrive* d) {
  StepRecord& st = d->st;
  ToolOutcome& outcome = d->outcome;
  effect::Situation s = SituationOf(*d, CallKindOf(*d));
  s.call = s.answer = effect::AnswerOf(outcome);
  effect::Decision dec = effect::Decide(s);
  if (dec.action == effect::Action::kLookUp && s.call == effect::Answer::kFailedRetryable) {
    // A refused write the provider does not deduplicate: retried only once
    // its lookup confirms the refusal left nothing behind.
    LookupOutcome look;
    dec = LookUpUntilDecided(d, &s, &look);
    if (dec.action == effect::Action::kRecordSucceeded) {
      outcome = ToolOutcome::Succeeded(look.result, look.external_ref);
      outcome.error = "resolved_by_status";
    } else if (dec.action == effect::Action::kWait) {
      outcome = ToolOutcome::Accepted(look.external_ref, look.check_after_ms);
    } else if (dec.action != effect::Action::kRetryAfterBackoff) {
      dec.action = effect::Action::kRecordFailed;  // the refusal stands
    }
  }
  switch (dec.action) {
    case effect::Action::kRecordSucceeded:
      d->durability = dec.durability;
      return d->Fire(StepEvent::kSucceeded);
    case effect::Action::kRecordFailed:
    case effect::Action::kRetryAfterBackoff:
      st.error = outcome.error;
      return d->Fire(StepEvent::kFailed,
                     StepFacts::WithRetryAllowed(dec.action == effect::Action::kRetryAfterBackoff));
    case effect::Action::kWait:
      return d->Fire(StepEvent::kAccepted);
    default:
      break;
  }
  // Uncertain: journaled `unknown`, then resolved (kResolveOutcome).
  if (outcome.kind == OutcomeKind::kAccepted) {
    outcome = ToolOutcome::Unknown("accepted by a tool without a status lookup");
  }
  st.error = outcome.error;
  IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kOutcomeUnknown));
  IDEM_RETURN_IF_ERROR(CommitStep(*d, "unknown", {{"reason", outcome.error}}, {},
                                  DurabilityOf(effect::UnknownDurability(s.caps))));
  IDEM_FAILPOINT("unknown.after_recorded");
  return Status::Ok();
}

StepEvent SagaRun::ResolveUnknown(StepDrive* d) {
  const bool check = d->state() == StepState::kProcessing;
  effect::Situation s =
      SituationOf(*d, check ? effect::CallKind::kCompletionCheck : CallKindOf(*d));
  s.call = s.answer = check ? effect::Answer::kAccepted : effect::Answer::kUnknown;
  if (check && d->check) s.past_window = completion::PastWindow(*d->check, options_.clock->NowMs());
  LookupOutcome look;
  const effect::Decision dec = LookUpUntilDecided(d, &s, &look);
  return ResolvedEvent(d, s, dec, look);
}

StepEvent SagaRun::ResolvedEvent(StepDrive* d, const effect::Situation& s,
                                 const effect::Decision& dec, const LookupOutcome& look) {
  StepRecord* st = &d->st;
  ToolOutcome* out = &d->outcome;
  const ToolInfo& info = d->tool->info();
  const bool check = s.kind == effect::CallKind::kCompletionCheck;
  const std::string code = dec.code;
  const std::string detail = look.error.empty() ? "" : ": " + look.error;
  switch (dec.action) {
    case effect::Action::kRecordSucceeded:
      *out = ToolOutcome::Succeeded(look.result, look.external_ref);
      out->error = "resolved_by_status";
      d->durability = dec.durability;
      return StepEvent::kResolvedApplied;
    case effect::Action::kRecordFailed:
      if (code == "failed_by_provider") {
        st->error = check ? "the provider of " + info.name + " failed key " + d->key + detail
                          : "status lookup: the provider failed key " + d->key + detail;
      } else {
        st->error = "status lookup: key " + d->key + " was not applied";
      }
      return StepEvent::kResolvedNotApplied;
    case effect::Action::kResend:
    case effect::Action::kRetryAfterBackoff:
      // The resend's `submitted` says a lookup found the key absent.
      if (s.answer == effect::Answer::kNotApplied) out->error = kNotAppliedByLookup;
      return StepEvent::kResolvedRetry;
    case effect::Action::kWait:
      if (check) {
        const bool pending = s.answer == effect::Answer::kPending;
        *out =
            ToolOutcome::Accepted(look.external_ref.empty() ? st->external_ref : look.external_ref,
                                  pending ? look.check_after_ms : 0);
        out->error = pending ? "pending" : "lookup error: " + look.error;
      } else {
        *out = ToolOutcome::Accepted(look.external_ref, look.check_after_ms);
      }
      return StepEvent::kResolvedPending;
    default:
      break;
  }
  // A person decides.
  if (code == "completion_window" && d->check) {
    const std::string answer =
        s.answer == effect::Answer::kPending ? "pending" : "lookup error: " + look.error;
    st->error = BlockedReason(ParkCode::kCompletionWindow,
                              completion::WindowReason(info.name, d->key, *d->check, answer));
    return StepEvent::kBlocked;
  }
  if (code == "in_flight_not_proven") {
    // Another worker submitted this step and lost its lease; it may be
    // frozen with its call still on the way. "Not applied yet" is no proof
    // for a provider that does not deduplicate keys.
    st->error = "taken over from a worker whose call to " + info.name +
                " may still land, and the tool does not deduplicate keys: check key " + d->key;
  } else if (code == "lookup_unanswered") {
    st->error = "outcome unknown; status lookup kept failing: " +
                (s.answer == effect::Answer::kPending ? std::string("pending during a rollback")
                                                      : look.error);
  } else if (code == "unknown_after_resends") {
    st->error = "outcome still unknown after " + std::to_string(st->attempt) +
                " same-key attempts: " + out->error;
  } else if (code == "no_lookup_no_keys") {
    st->error = "outcome unknown (" + out->error + ") and tool " + info.name +
                " has neither a status lookup nor idempotency keys: a person must check key " +
                d->key;
  } else {
    st->error = "outcome unknown (" + out->error + "): the effect protocol parks it (" + code + ")";
  }
  return StepEvent::kUnresolvable;
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
        d->found_uncertain = false;
        {
          CallBoundary boundary(this);
          outcome = effect::Invoke(CallKindOf(*d), d->tool, call, &boundary);
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
        IDEM_RETURN_IF_ERROR(OnCallAnswer(d));
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
          CallBoundary boundary(this);
          effect::Sleep(options_.clock, wait, &boundary);
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
        IDEM_RETURN_IF_ERROR(CommitStep(*d, "succeeded", data, {eff}, DurabilityOf(d->durability)));
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
