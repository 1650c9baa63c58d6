#pragma once
// What a person decides about a saga: an approval of a commit waiting for
// one (preview_commit/approval.h carries it out), or a decision about a
// parked step (saga/operator.cc; the undo decisions in compensation/undo.h).
// Public through saga/engine.h.
//
// Thread safety: value types.

#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// A person's answer to a commit waiting for approval.
struct ApprovalDecision {
  bool approve = false;
  std::string who;   ///< required
  std::string note;  ///< why; required for a rejection
  /// `who` and `roles` come from a credential checked against an auth file
  /// (the server's callers, the CLI's `--credential`), not from the
  /// caller's word. Engine::Decide (saga/approval_rights.h) counts only an
  /// authenticated person toward an approval policy's role or quorum, and
  /// asks an authenticated person deciding on an "approval": "human" commit
  /// for the role `approver`.
  bool authenticated = false;
  /// The roles `who` holds (the auth file's). A commit under an approval
  /// policy counts only a person holding the rule's role
  /// (kFailedPrecondition starting preview_commit::kRoleMissingMessage).
  /// `any_role`: the caller is trusted with every role and is nobody in
  /// particular (a server without auth): no self-approval check.
  std::vector<std::string> roles;
  bool any_role = false;
  /// When set, the token must be for this saga / step (an API that names
  /// the step in its path); kFailedPrecondition otherwise.
  std::string expected_saga_id;
  std::string expected_step_id;
};

/// A person's decision about a parked step (`needs_attention`, or
/// `compensation_failed`), after checking with the provider.
enum class Decision {
  kApplied,     ///< the action did take effect (result optional)
  kNotApplied,  ///< the action did not take effect: the step failed
  kRetry,       ///< call the action again, with the same key
  kUndone,      ///< the failed compensation has been carried out by hand
  kRetryUndo,   ///< run the compensation again, with the same key
};
/// "applied", "not_applied", "retry", "undone", "retry_undo";
/// kInvalidArgument for any other name.
Result<Decision> ParseDecision(const std::string& name);
/// The name ParseDecision accepts for `d`.
const char* DecisionName(Decision d);

struct Resolution {
  std::string step_id;
  Decision decision = Decision::kNotApplied;
  Json result = Json::object();  ///< kApplied: what the provider reported
  std::string who;               ///< required: who decided
  std::string note;
};

}  // namespace idem
