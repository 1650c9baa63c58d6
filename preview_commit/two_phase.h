#pragma once
// The two-phase protocol of a step: preview, commit token, approval, commit.
//
//   1. Preview (no effect), retried with backoff while it fails retryably;
//      at most kMaxPreviews per step (stale commits and expiries count).
//   2. A commit token is minted (preview_commit/token.h) and journaled with
//      the preview in one batch (`previewed`, and `awaiting_approval` when
//      the spec asks a person); the step's PhaseRecord holds both.
//   3. Without approval the token is verified at once; with approval the
//      saga waits (nothing held in memory) until RecordApproval journals a
//      person's decision, or the token expires and `on_expiry` applies
//      (re_preview, or rollback).
//   4. The token's nonce is spent in the same transaction as `submitted`;
//      the step core (saga/run.h) then calls the tool with the previewed
//      resource version. A stale commit previews again (`on_stale`).
//
// Thread safety: none; the run belongs to the driving thread.

#include <string>
#include <string_view>

#include "preview_commit/phase.h"
#include "preview_commit/token.h"
#include "saga/decisions.h"
#include "saga/run.h"
#include "storage/store.h"

#include "common/status.h"

namespace idem::preview_commit {

/// The start of the message of a decision on a commit decided otherwise.
inline constexpr std::string_view kAlreadyDecidedMessage = "commit was already ";

/// Previews of one step before it gives up (stale commits, expired tokens).
inline constexpr int kMaxPreviews = 5;

enum class PhaseEnd {
  kContinue,  ///< the next command (kCallTool or kRecordFailed) is queued in the drive
  kWaiting,   ///< the commit waits for a person: the drive ends
};

/// Advances a two-phase step from planned (arguments resolved), previewed or
/// awaiting_approval. kFailedPrecondition without a token signer; store
/// errors are returned.
Result<PhaseEnd> AdvanceTwoPhase(SagaRun* run, StepDrive* d);

/// For a saga awaiting approval: true when the approval of a waiting step
/// was decided or has expired at `now_ms`, so its drive can go on.
bool ApprovalSettled(const SagaRun& run, int64_t now_ms);

/// The start of the message when a person without the policy's role
/// decides (then the role's name).
inline constexpr std::string_view kRoleMissingMessage = "this commit needs the role ";
/// The start of the message when a person decides twice on one commit.
inline constexpr std::string_view kAlreadyCountedMessage = "already approved by ";

/// How many approvals a commit under an approval policy still lacks: the
/// rule's quorum less the distinct people with its role who approved; 0
/// without a policy, or for a rule that passes.
int MissingApprovals(const PhaseRecord& phase);

/// Checks a person's decision on a commit under an approval policy (its
/// rule in `phase.policy` asks a role): the person holds the role
/// (kFailedPrecondition starting kRoleMissingMessage) and has not decided
/// on this commit before (kConflict starting kAlreadyCountedMessage;
/// nothing changes). Sets `record`'s role and adds role, rule, quorum and
/// count to the journal entry's `data`.
Status CountApproval(const PhaseRecord& phase, const ApprovalDecision& d, ApprovalRecord* record,
                     Json* data);

/// What RecordApproval found.
enum class ApprovalOutcome {
  kCounted,   ///< `batch` holds an approval short of the quorum: commit it; the saga waits on
  kRecorded,  ///< `batch` holds the decision: commit it, then drive the saga
  kReplayed,  ///< decided so before and not finished: drive the saga on
  kFinished,  ///< decided so before and finished: answer the saga as it is
};

/// Checks a person's decision on the commit that `claims` (an opened,
/// genuine token) stands for against `saga`, loaded under its lease, and
/// fills `batch` with the decision (who, when, why; under an approval
/// policy also the role, counted by CountApproval: an approval short of
/// the quorum is kCounted, a rejection ends it). kFailedPrecondition
/// for a token minted for another step or arguments, superseded by a newer
/// preview, already decided otherwise, or a step not awaiting approval.
Result<ApprovalOutcome> RecordApproval(const TokenClaims& claims, const ApprovalDecision& d,
                                       int64_t now_ms, const LoadedSaga& saga,
                                       storage::WriteBatch* batch);

/// Takes back the commit token of step `step_id` so that the step previews
/// again and, where the spec asks, a person is asked again, with a token of
/// the active key (`keys retire --re-preview`): the step must be previewed
/// or awaiting an undecided approval. Fills `batch`: the step back to
/// planned (the step machine's re-preview on expiry; this preview is not
/// counted against kMaxPreviews), the saga running again, and the journal's
/// `approval_superseded` {reason, by, token_key}. kFailedPrecondition when
/// the step holds no such token; kNotFound for no such step.
Status SupersedeToken(const LoadedSaga& saga, const std::string& step_id,
                      const std::string& token_key, const std::string& who,
                      const std::string& reason, int64_t now_ms, storage::WriteBatch* batch);

}  // namespace idem::preview_commit
