#pragma once
// Who may decide on a commit waiting for approval: one set of rules for
// every surface (the CLI's approve and reject, the REST API, the web UI),
// checked by Engine::Decide before the decision is recorded, and by the
// server's approval lists to show who may decide.
//
//   - A commit whose approval policy asks a role (saga/approval_policy.h)
//     counts only an authenticated person (ApprovalDecision::authenticated:
//     a credential checked against an auth file) who holds that role.
//   - An "approval": "human" commit decided by an authenticated person
//     needs the role `approver`; an unauthenticated decision (the CLI's
//     `--as NAME` without a credential) is taken at its word, as it always
//     was, and the journal says it was not authenticated.
//   - Whoever asked for the effect never decides on it: the saga's owner
//     (its intent key's owner: the principal that submitted or began it
//     through the server) and, for an open saga's call, the principal that
//     made the call (recorded with the call). Not for a server without auth
//     (ApprovalDecision::any_role), whose callers are nobody in particular.
//
// Names compare folded (common/principal_name.h): "Maria" is "maria".
//
// Thread safety: pure functions.

#include <string>
#include <string_view>
#include <vector>

#include "saga/decisions.h"
#include "storage/store.h"

#include "common/status.h"

namespace idem {

/// The start of the message when whoever asked for a commit decides on it.
inline constexpr std::string_view kSelfApprovalMessage = "self-approval refused: ";
/// The start of the message when a commit under a policy that asks a role
/// is decided by a person who did not authenticate.
inline constexpr std::string_view kUnauthenticatedMessage = "authentication required: ";

/// The owner of an intent key: the part before its first ':' ("" without
/// one), as the store's owner filter reads it (storage::SagaFilter::owner).
std::string IntentKeyOwner(const std::string& intent_key);

/// Who asked for the effect that the commit of step `step_id` would make:
/// the saga's owner, and for an open saga's call its caller (each once,
/// empty names left out).
std::vector<std::string> Requesters(const storage::SagaRecord& saga, const std::string& step_id);

/// Ok when `d` may decide on the commit that `step` of `saga` waits for, by
/// the rules above; else kFailedPrecondition starting kUnauthenticatedMessage,
/// preview_commit::kRoleMissingMessage or kSelfApprovalMessage. A step with
/// no commit waiting (no phase record) is not judged here (Ok).
Status CheckDecider(const storage::SagaRecord& saga, const storage::StepRecord& step,
                    const ApprovalDecision& d);

}  // namespace idem
