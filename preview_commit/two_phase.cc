#include "preview_commit/two_phase.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "saga/approval_policy.h"
#include "saga/hold.h"
#include "saga/machines.h"

#include "common/failpoint.h"
#include "common/principal_name.h"
#include "effect/call.h"
#include "effect/protocol.h"

namespace idem::preview_commit {

using storage::JournalEntry;
using storage::StepRecord;

namespace {

// The policy's rule for a preview's commit; `entry` gets what the journal
// records of it: the rule, its place and condition, the values the
// condition found, and the reason of a rule that passes.
PolicyDemand DecidingRule(const ApprovalPolicy& policy, const Json& args, const Json& input,
                          const PreviewOutcome& pv, std::optional<Json>* entry) {
  const Json context = {{"args", args},
                        {"input", input},
                        {"preview",
                         {{"summary", pv.summary},
                          {"changes", pv.changes},
                          {"resource_version", pv.resource_version}}}};
  const PolicyMatch m = EvaluatePolicy(policy, context);
  const PolicyRule& rule = policy.rules[m.rule];
  PolicyDemand demand{m.rule, rule.pass ? rule.reason : "", rule.role, rule.quorum};
  Json e = {{"rule", m.rule},
            {"place", policy.place + ".rules[" + std::to_string(m.rule) + "]"},
            {"when", rule.when},
            {"values", m.values}};
  if (rule.pass) {
    e["reason"] = rule.reason;
  } else {
    e["role"] = rule.role;
    e["quorum"] = rule.quorum;
  }
  *entry = std::move(e);
  return demand;
}

// What `submitted` records of the approvals: who approved, and under a
// policy the names of everyone whose approval it counted.
Json SubmittedData(const PhaseRecord& phase, int attempt, const std::string& key,
                   const std::string& tool) {
  Json data = {{"attempt", attempt},
               {"key", key},
               {"tool", tool},
               {"approved_by", phase.approval ? phase.approval->by : ""}};
  if (phase.policy) {
    data["approvals"] = Json::array();
    for (const auto& a : phase.approvals) data["approvals"].push_back(a.by);
  }
  return data;
}

}  // namespace

int MissingApprovals(const PhaseRecord& phase) {
  if (!phase.policy || !phase.policy->pass.empty()) return 0;
  std::vector<std::string> seen;  // folded: "Maria" and "maria" are one person
  for (const auto& a : phase.approvals) {
    if (!a.approved() || a.role != phase.policy->role) continue;
    const std::string who = FoldName(a.by);
    if (std::find(seen.begin(), seen.end(), who) == seen.end()) seen.push_back(who);
  }
  return std::max(0, phase.policy->quorum - static_cast<int>(seen.size()));
}

// Two-phase steps, from planned (arguments resolved), previewed or
// awaiting_approval: preview, mint the commit token, wait for a person where
// the spec asks, then spend the token in the same transaction as `submitted`.
// kContinue leaves the next command (kCallTool or kRecordFailed) in the drive.
Result<PhaseEnd> AdvanceTwoPhase(SagaRun* run, StepDrive* d) {
  const StepSpec& spec = *d->spec;
  StepRecord* st = &d->st;
  const std::string& saga_id = run->saga_id();
  const EngineOptions& options = run->options();
  auto fail = [&](const std::string& why) -> Result<PhaseEnd> {
    st->error = why;
    IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kFailed));
    return PhaseEnd::kContinue;
  };
  // A hold's capture (saga/hold.h) is never made once the hold expired.
  const bool capture = spec.hold && spec.hold->capture == d->index;
  const int64_t hold_expires =
      capture ? HoldExpiresMs(spec, run->record().steps[spec.hold->authorize]) : 0;
  auto hold_expired = [&] { return capture && run->clock()->NowMs() >= hold_expires; };
  auto fail_expired_hold = [&]() -> Result<PhaseEnd> {
    st->error = "hold_expired: the hold expired at " + FormatTimeMs(hold_expires) +
                "; not captured, the saga rolls back and voids it";
    IDEM_RETURN_IF_ERROR(d->Fire(
        d->state() == StepState::kAwaitingApproval ? StepEvent::kExpired : StepEvent::kFailed,
        StepFacts::WithRePreview(false)));
    return PhaseEnd::kContinue;
  };
  for (int round = 0; round < 2 * kMaxPreviews + 2; ++round) {
    const PhaseRecord phase = PhaseRecord::FromJson(st->phase).value_or(PhaseRecord{});
    switch (d->state()) {
      case StepState::kPlanned: {
        int previews = phase.previews + 1;
        if (previews > kMaxPreviews) {
          return fail("gave up after " + std::to_string(kMaxPreviews) +
                      " previews: the preview kept going stale or expiring");
        }
        if (options.signer == nullptr) {
          return Status::FailedPrecondition("step " + st->step_id +
                                            " is two-phase but no token signer is configured");
        }
        ToolCall call{spec.tool, d->key, st->args, previews, saga_id, st->step_id, ""};
        // A preview has no effect: the protocol asks again after a
        // transient failure, within the step's retries and two more.
        effect::Situation s;
        s.kind = effect::CallKind::kPreview;
        s.max_attempts = spec.retry.max_attempts + 2;
        PreviewOutcome pv;
        effect::Decision dec;
        for (s.attempt = 1;; ++s.attempt) {
          if (s.attempt > 1) {
            SagaRun::CallBoundary boundary(run);
            effect::Sleep(run->clock(), spec.retry.BackoffMs(s.attempt, *run->rng()), &boundary);
          }
          {
            SagaRun::CallBoundary boundary(run);  // outside the run's lock (saga/branches.h)
            pv = effect::Preview(d->tool, call, &boundary);
          }
          s.answer = pv.ok ? effect::Answer::kSucceeded
                           : (pv.retryable ? effect::Answer::kFailedRetryable
                                           : effect::Answer::kFailedPermanent);
          dec = effect::Decide(s);
          if (dec.action != effect::Action::kRetryAfterBackoff) break;
        }
        IDEM_FAILPOINT("preview.after_call");
        if (dec.action != effect::Action::kRecordSucceeded)
          return fail("preview failed: " + pv.error);
        bool human = spec.approval != Approval::kNone;
        std::optional<Json> policy_entry;  // the rule that decides, for the journal
        std::optional<PolicyDemand> demand;
        if (spec.policy) {
          demand = DecidingRule(*spec.policy, st->args, run->record().input, pv, &policy_entry);
          human = demand->pass.empty();
        }
        int64_t ttl = human ? spec.approval_ttl_ms : options.commit_token_ttl_ms;
        if (hold_expired()) return fail_expired_hold();
        if (capture) ttl = std::min(ttl, hold_expires - run->clock()->NowMs());
        TokenClaims claims;
        auto token = options.signer->Mint(saga_id, st->step_id, st->args_fingerprint, ttl, &claims);
        if (!token.ok()) return token.status();
        PhaseRecord next;
        next.preview = {pv.summary, pv.changes, pv.resource_version};
        next.token = *token;
        next.nonce = claims.nonce;
        next.expires_ms = claims.expires_at_ms;
        next.args_fingerprint = st->args_fingerprint;
        next.previews = previews;
        next.policy = demand;
        st->phase = next.ToJson();
        IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kPreviewRecorded));
        std::vector<JournalEntry> entries;
        entries.push_back(run->Entry(st->step_id, "previewed",
                                     {{"summary", pv.summary},
                                      {"resource_version", pv.resource_version},
                                      {"preview", previews}}));
        if (policy_entry && !human) {
          entries.push_back(run->Entry(st->step_id, "policy_passed", *policy_entry));
        }
        if (human) {
          IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kApprovalRequested));
          Json data = {{"summary", pv.summary}, {"expires_at", FormatTimeMs(claims.expires_at_ms)}};
          if (policy_entry) data["policy"] = *policy_entry;
          entries.push_back(run->Entry(st->step_id, "awaiting_approval", std::move(data)));
        }
        IDEM_RETURN_IF_ERROR(run->CommitEntries(*d, std::move(entries)));
        IDEM_FAILPOINT("preview.after_journal");
        break;
      }
      case StepState::kPreviewed: {
        if (hold_expired()) return fail_expired_hold();
        if (run->clock()->NowMs() >= phase.expires_ms) {
          IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kExpired));
          IDEM_RETURN_IF_ERROR(
              run->CommitEntries(*d, {run->Entry(st->step_id, "token_expired", {})}));
          break;
        }
        if (options.signer == nullptr) {
          return Status::FailedPrecondition("step " + st->step_id +
                                            " is two-phase but no token signer is configured");
        }
        auto claims =
            options.signer->Verify(phase.token, saga_id, st->step_id, Fingerprint(st->args));
        if (!claims.ok()) return fail(claims.status().message());
        ++st->attempt;
        IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kTokenConsumed));
        IDEM_RETURN_IF_ERROR(run->CommitEntries(
            *d,
            {run->Entry(st->step_id, "submitted",
                        {{"attempt", st->attempt}, {"key", d->key}, {"tool", spec.tool}})},
            claims->nonce));
        IDEM_FAILPOINT("step.after_submitted");
        return PhaseEnd::kContinue;
      }
      case StepState::kAwaitingApproval: {
        if (hold_expired() && (!phase.approval || phase.approval->approved())) {
          return fail_expired_hold();
        }
        if (!phase.approval) {
          if (run->clock()->NowMs() < phase.expires_ms) return PhaseEnd::kWaiting;
          bool re_preview = spec.on_expiry == Fallback::kRePreview;
          if (!re_preview) st->error = "approval expired at " + FormatTimeMs(phase.expires_ms);
          IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kExpired, StepFacts::WithRePreview(re_preview)));
          if (d->state() == StepState::kFailed) return PhaseEnd::kContinue;  // kRecordFailed
          IDEM_RETURN_IF_ERROR(run->CommitEntries(
              *d, {run->Entry(st->step_id, "approval_expired", {{"then", "re_preview"}})}));
          break;
        }
        const ApprovalRecord& approval = *phase.approval;
        if (!approval.approved()) {
          st->error = "rejected by " + approval.by + ": " + approval.note;
          IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kRejected));
          return PhaseEnd::kContinue;
        }
        // Never a commit with fewer approvals than its policy's quorum.
        if (int short_by = MissingApprovals(phase); short_by > 0) {
          return fail("approved with " + std::to_string(short_by) +
                      " approval(s) short of the policy's quorum: not committed");
        }
        // The approval checked the token; the arguments must still be the
        // ones it was minted for.
        if (Fingerprint(st->args) != phase.args_fingerprint) {
          return fail(std::string(kMismatchedTokenMessage) +
                      ": the arguments changed after the preview");
        }
        ++st->attempt;
        IDEM_RETURN_IF_ERROR(d->Fire(StepEvent::kApproved));
        IDEM_RETURN_IF_ERROR(
            run->CommitEntries(*d,
                               {run->Entry(st->step_id, "submitted",
                                           SubmittedData(phase, st->attempt, d->key, spec.tool))},
                               phase.nonce));
        IDEM_FAILPOINT("step.after_submitted");
        return PhaseEnd::kContinue;
      }
      default:
        return Status::Internal("two-phase step " + st->step_id + " is " +
                                StepStateName(d->state()));
    }
  }
  return Status::Internal("two-phase step " + st->step_id + " did not settle");
}

bool ApprovalSettled(const SagaRun& run, int64_t now_ms) {
  bool settled = false;
  for (int i = 0; i < run.step_count(); ++i) {
    if (run.step_state(i) != StepState::kAwaitingApproval) continue;
    auto phase = PhaseRecord::FromJson(run.record().steps[i].phase);
    settled |= phase && phase->Settled(now_ms);  // any: branches may wait side by side
  }
  return settled;
}

Status CountApproval(const PhaseRecord& phase, const ApprovalDecision& d, ApprovalRecord* record,
                     Json* data) {
  const PolicyDemand& policy = *phase.policy;
  const std::string need = std::to_string(policy.quorum) + " distinct " + policy.role +
                           " approval(s) (rule " + std::to_string(policy.rule) +
                           " of the step's approval policy)";
  const bool holds =
      d.any_role || std::find(d.roles.begin(), d.roles.end(), policy.role) != d.roles.end();
  if (!holds) {
    return Status::FailedPrecondition(std::string(kRoleMissingMessage) + policy.role + ": " +
                                      d.who + " may not decide on a commit that needs " + need);
  }
  for (const auto& a : phase.approvals) {
    if (SameName(a.by, d.who)) {
      return Status::Conflict(std::string(kAlreadyCountedMessage) + d.who + " at " +
                              FormatTimeMs(a.at_ms) + "; the commit needs " + need + ", one each");
    }
  }
  record->role = policy.role;
  const int count = static_cast<int>(phase.approvals.size()) + (d.approve ? 1 : 0);
  (*data)["role"] = policy.role;
  (*data)["rule"] = policy.rule;
  (*data)["quorum"] = policy.quorum;
  (*data)["count"] = count;
  return Status::Ok();
}

Result<ApprovalOutcome> RecordApproval(const TokenClaims& claims, const ApprovalDecision& d,
                                       int64_t now_ms, const LoadedSaga& saga,
                                       storage::WriteBatch* batch) {
  const Status mismatch = Status::FailedPrecondition(std::string(kMismatchedTokenMessage));
  const storage::SagaRecord& rec = saga.record;
  int index = -1;
  for (size_t i = 0; i < rec.steps.size(); ++i) {
    if (rec.steps[i].step_id == claims.step_id) index = static_cast<int>(i);
  }
  if (index < 0) return mismatch;
  StepRecord st = rec.steps[index];
  auto phase = PhaseRecord::FromJson(st.phase);
  if (!phase) return mismatch;
  if (phase->nonce != claims.nonce) {
    return Status::FailedPrecondition(
        "commit token was superseded by a newer preview; decide on the current one");
  }
  const char* decision = d.approve ? ApprovalRecord::kApproved : ApprovalRecord::kRejected;
  if (phase->approval) {
    // Decided before: a replay, or a second process racing this one.
    if (phase->approval->decision != decision) {
      return Status::FailedPrecondition(std::string(kAlreadyDecidedMessage) +
                                        phase->approval->decision + " by " + phase->approval->by);
    }
    if (saga.state == SagaState::kRunning || saga.state == SagaState::kAwaitingApproval) {
      return ApprovalOutcome::kReplayed;  // finish what a crash interrupted
    }
    return ApprovalOutcome::kFinished;
  }
  // The saga may still say running when its driver died between journaling
  // the preview and parking the saga: the decision is just as valid.
  const bool saga_waiting = saga.state == SagaState::kAwaitingApproval;
  if (saga.steps[index] != StepState::kAwaitingApproval ||
      (!saga_waiting && saga.state != SagaState::kRunning)) {
    return Status::FailedPrecondition("step " + st.step_id + " is " + st.state +
                                      ", not awaiting approval");
  }
  if (Fingerprint(st.args) != claims.args_fingerprint ||
      phase->args_fingerprint != claims.args_fingerprint) {
    return mismatch;
  }
  ApprovalRecord record{decision, d.who, d.note, now_ms, ""};
  Json data = {{"by", d.who},
               {"authenticated", d.authenticated},
               {"note", d.note},
               {"token_key", claims.key_id}};
  if (phase->policy && phase->policy->pass.empty()) {
    IDEM_RETURN_IF_ERROR(CountApproval(*phase, d, &record, &data));
    if (d.approve) {
      phase->approvals.push_back(record);
      if (MissingApprovals(*phase) > 0) {
        // Counted; the commit waits for the others (the saga stays waiting).
        st.phase = phase->ToJson();
        st.updated_ms = now_ms;
        batch->saga_id = claims.saga_id;
        batch->steps.push_back(st);
        JournalEntry je{};
        je.saga_id = claims.saga_id;
        je.step_id = st.step_id;
        je.event = "approval_counted";
        je.data = std::move(data);
        je.at_ms = now_ms;
        batch->journal.push_back(je);
        return ApprovalOutcome::kCounted;
      }
    }
  }
  phase->approval = record;
  st.phase = phase->ToJson();
  st.updated_ms = now_ms;
  SagaMachine machine(SagaState::kAwaitingApproval);
  auto cmds = machine.Fire(SagaEvent::kApprovalSettled);
  if (!cmds.ok()) return cmds.status();
  batch->saga_id = claims.saga_id;
  if (saga_waiting) batch->saga_state = SagaStateName(machine.state());
  batch->steps.push_back(st);
  JournalEntry je;
  je.saga_id = claims.saga_id;
  je.step_id = st.step_id;
  je.event = decision;
  je.data = std::move(data);
  je.at_ms = now_ms;
  batch->journal.push_back(je);
  return ApprovalOutcome::kRecorded;
}

Status SupersedeToken(const LoadedSaga& saga, const std::string& step_id,
                      const std::string& token_key, const std::string& who,
                      const std::string& reason, int64_t now_ms, storage::WriteBatch* batch) {
  const storage::SagaRecord& rec = saga.record;
  int index = -1;
  for (size_t i = 0; i < rec.steps.size(); ++i) {
    if (rec.steps[i].step_id == step_id) index = static_cast<int>(i);
  }
  if (index < 0) {
    return Status::NotFound("saga " + rec.summary.saga_id + " has no step \"" + step_id + "\"");
  }
  StepRecord st = rec.steps[index];
  auto phase = PhaseRecord::FromJson(st.phase);
  const StepState state = saga.steps[index];
  const bool waiting = state == StepState::kAwaitingApproval || state == StepState::kPreviewed;
  const bool saga_open =
      saga.state == SagaState::kAwaitingApproval || saga.state == SagaState::kRunning;
  if (!phase || !waiting || phase->approval || !saga_open) {
    return Status::FailedPrecondition("step " + step_id + " of saga " + rec.summary.saga_id +
                                      " is " + st.state +
                                      ": no undecided commit token to preview again");
  }
  StepMachine m(state);
  auto cmds = m.Fire(StepEvent::kExpired, StepFacts::WithRePreview(true));
  if (!cmds.ok()) return cmds.status();
  // The preview that follows is the key's doing, not the resource's.
  phase->previews = std::max(0, phase->previews - 1);
  st.phase = phase->ToJson();
  st.state = StepStateName(m.state());
  st.updated_ms = now_ms;
  batch->saga_id = rec.summary.saga_id;
  if (saga.state == SagaState::kAwaitingApproval) {
    SagaMachine machine(SagaState::kAwaitingApproval);
    auto scmds = machine.Fire(SagaEvent::kApprovalSettled);
    if (!scmds.ok()) return scmds.status();
    batch->saga_state = SagaStateName(machine.state());
  }
  batch->steps.push_back(st);
  JournalEntry je;
  je.saga_id = rec.summary.saga_id;
  je.step_id = st.step_id;
  je.event = "approval_superseded";
  je.data = {{"by", who}, {"reason", reason}, {"token_key", token_key}};
  je.at_ms = now_ms;
  batch->journal.push_back(je);
  return Status::Ok();
}

}  // namespace idem::preview_commit
