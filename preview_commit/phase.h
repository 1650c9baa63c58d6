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
//                 "at_ms": <ms>}}            (approval: once a person decided)
//
// ToJson(FromJson(j)) == j for every object the engine ever wrote, so
// existing journals load and are written back unchanged.
//
// Thread safety: a value type.

#include <cstdint>
#include <optional>
#include <string>

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

  bool approved() const { return decision == kApproved; }
  Json ToJson() const;  ///< the stored "approval" member
  static constexpr const char* kApproved = "approved";
  static constexpr const char* kRejected = "rejected";
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
