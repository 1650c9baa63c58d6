#include "storage/server_state.h"

#include <utility>

namespace idem::storage {

ExistingKey DecideExistingKey(const KeyRecord& record, int64_t claimed_ms,
                              const std::string& fingerprint, const KeyClaimPolicy& policy) {
  const bool expired = record.state == "done" && policy.now_ms - record.created_ms >= policy.ttl_ms;
  const bool abandoned =
      record.state == "in_flight" && policy.now_ms - claimed_ms >= policy.lock_timeout_ms;
  // An expired key starts a new request; an abandoned claim (a crashed or
  // hung holder) passes to this request, and the old token is fenced.
  if (expired) return ExistingKey::kRestart;
  if (abandoned && record.fingerprint == fingerprint) return ExistingKey::kTakeOver;
  if (record.fingerprint != fingerprint) return ExistingKey::kMismatch;
  if (record.state == "done") return ExistingKey::kReplay;
  return ExistingKey::kInFlight;
}

KeyClaim UnclaimedKey(ExistingKey decided, KeyRecord record) {
  KeyClaim claim;
  if (decided == ExistingKey::kMismatch) {
    claim.kind = KeyClaim::Kind::kMismatch;
  } else if (decided == ExistingKey::kReplay) {
    claim.kind = KeyClaim::Kind::kReplay;
    claim.stored = std::move(record);
  } else {
    claim.kind = KeyClaim::Kind::kInFlight;
  }
  return claim;
}

Result<SpecPutOutcome> SettleExistingSpec(StoredSpec existing, const StoredSpec& wanted) {
  if (existing.fingerprint != wanted.fingerprint) {
    return Status::Conflict("spec " + wanted.name + " version " + std::to_string(wanted.version) +
                            " exists with other content; versions never change (use a "
                            "new version)");
  }
  return SpecPutOutcome{std::move(existing), false};
}

Status SpecNotFound(const std::string& name, int version) {
  return Status::NotFound("no spec " + name +
                          (version > 0 ? " version " + std::to_string(version) : ""));
}

}  // namespace idem::storage
