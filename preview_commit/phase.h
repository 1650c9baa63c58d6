#pragma once
// PhaseRecord: what a two-phase step keeps between its preview and its
// commit (StepRecord::phase in the store), typed.
//
// The stored form is one JSON object, read and written here only:
//
//   {"preview": {"summary": ..., "changes": ..., "resource_version": ...},
//    "token": "idem1....", "nonce": "<32 hex>", "expires_ms": <ms>,
//    "args_fingerprint": "sha256:...", "previews": <n>,
//    "approval": {"decision": "approved"|"rejected", "by": ..., "note": ...,
//                 "at_ms": <ms>, "role": ...},   (approval: once decided)
//    "policy": {"rule": <i>, "role": ..., "quorum": <n>, "pass": ...},
//    "approvals": [{"decision": "approved", "by", "note", "at_ms", "role"}]}
//
// `policy` is the approval policy's rule that decided this preview's commit
// (saga/approval_policy.h): `pass` (the reason) when no person is needed,
// else `role` and `quorum`; `approvals` the approvals counted so far. Both
// belong to this preview and its token: a new preview starts with none, so
// a partial quorum lapses with its token. `role` and the two members are
// written only when set (journals from before policies read back equal).
//
// ToJson(FromJson(j)) == j for every object the engine ever wrote, so
// existing journals load and are written back unchanged.
//
// Thread safety: a value type.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/json_util.h"

namespace idem::preview_commit {

/// A preview: what the commit would do, and the version it was made at.
struct PreviewRecord {
  std::string summary;            ///< one line for a person
  Json changes = Json::object();  ///< structured detail
  std::string resource_version;   ///< "" where the provider does not version

  Json ToJson() const;  ///< the stored "preview" member
};

/// A person's recorded answer to a commit waiting for approval.
struct ApprovalRecord {
  std::string decision;  ///< "approved" or "rejected"
  std::string by;
  std::string note;
  int64_t at_ms = 0;
  std::string role;  ///< the role the person decided in; "" for "approval": "human"

  bool approved() const { return decision == kApproved; }
  Json ToJson() const;  ///< the stored "approval" member
  static constexpr const char* kApproved = "approved";
  static constexpr const char* kRejected = "rejected";
};

/// The rule of an approval policy that decided a preview's commit.
struct PolicyDemand {
  int rule = 0;
  std::string pass;  ///< set: no person needed, and why
  std::string role;  ///< otherwise: who decides
  int quorum = 1;    ///< and how many distinct people

  Json ToJson() const;  ///< the stored "policy" member
};

/// The phase of a two-phase step: its current preview, the commit token
/// minted for it and, once decided, the approval.
struct PhaseRecord {
  PreviewRecord preview;
  std::string token;             ///< the commit token (a bearer capability)
  std::string nonce;             ///< the token's nonce, spent with `submitted`
  int64_t expires_ms = 0;        ///< the token's expiry
  std::string args_fingerprint;  ///< the arguments the token was minted for
  int previews = 0;              ///< previews made so far (bounded)
  std::optional<ApprovalRecord> approval;
  std::optional<PolicyDemand> policy;     ///< the policy's rule for this preview
  std::vector<ApprovalRecord> approvals;  ///< counted toward policy->quorum so far

  /// The stored object.
  Json ToJson() const;
  /// The record of a stored phase, or nullopt when `phase` is not an object
  /// (a step that never previewed). Missing members read as their defaults.
  static std::optional<PhaseRecord> FromJson(const Json& phase);

  /// True once a commit waiting for approval can go on: decided, or expired
  /// at `now_ms`.
  bool Settled(int64_t now_ms) const { return approval.has_value() || now_ms >= expires_ms; }
};

}  // namespace idem::preview_commit
