#pragma once
// Approval policies (issue 19): which commits of a two-phase step need a
// person, which role decides and how many distinct people must agree.
//
// As a spec writes it (a step's "approval", or the saga's default one):
//
//   "approval": {"rules": [
//     {"when": "preview.changes.amount <= 10000", "pass": "small: no person"},
//     {"when": "preview.changes.amount <= 500000", "role": "finance", "quorum": 1},
//     {"role": "finance", "quorum": 2}]}
//
// Rules are tried in order and the first whose `when` holds decides; a rule
// without `when` always holds, and the last rule must have none (every
// commit matches a rule). `when` is `<path> <op> <literal>` joined by
// ` and `: op one of < <= > >= == !=, path rooted at `args.`, `input.` or
// `preview.` (`preview.summary`, `preview.changes.*`,
// `preview.resource_version`), literal a JSON number, string, true, false or
// null. A path without a value, or an ordering between different types,
// makes the condition false: the rule does not hold, the next one is tried
// (never an error, never a commit by accident: the last rule always holds).
//
// `pass` (a reason) lets the commit go on without a person; `role` +
// `quorum` (1..10, default 1) asks that many distinct people holding the
// role. The checks here are the spec checker's (errors name the place:
// `steps[3].approval.rules[1].quorum`); the protocol that counts the
// approvals is preview_commit/two_phase.cc.
//
// Thread safety: value types and pure functions.

#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// One comparison of a rule's `when`.
struct PolicyCondition {
  std::string path;  ///< "preview.changes.amount"
  std::string op;    ///< "<", "<=", ">", ">=", "==", "!="
  Json literal;      ///< a number, string, boolean or null
};

/// One rule of a policy.
struct PolicyRule {
  std::string when;  ///< as written; "" for a rule that always holds
  std::vector<PolicyCondition> conditions;
  bool pass = false;
  std::string reason;  ///< pass: why no person is needed
  std::string role;    ///< otherwise: who decides
  int quorum = 1;      ///< how many distinct people with `role`
};

struct ApprovalPolicy {
  std::vector<PolicyRule> rules;
  std::string place;  ///< where the spec wrote it ("steps[3].approval", "approval")

  static constexpr int kMaxQuorum = 10;
  static constexpr size_t kMaxRules = 32;
};

/// Parses and checks a policy object written at `path`; kInvalidArgument
/// naming the place of the first problem.
Result<ApprovalPolicy> ParseApprovalPolicy(const Json& v, const std::string& path);

/// The rule that decides a commit: its index, and the values its conditions
/// found ({"preview.changes.amount": 250000}), for the journal.
struct PolicyMatch {
  int rule = 0;
  Json values = Json::object();
};

/// Evaluates the rules against `context` = {"args": ..., "input": ...,
/// "preview": {"summary", "changes", "resource_version"}}. The last rule
/// always holds, so there is always a match.
PolicyMatch EvaluatePolicy(const ApprovalPolicy& policy, const Json& context);

/// True for a role name the auth file and a policy may use:
/// [a-z][a-z0-9_.-]{0,63}.
bool IsRoleName(const std::string& s);

}  // namespace idem
