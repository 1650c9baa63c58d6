#pragma once
// Holds: authorize, then capture (issue 19). A two-phase step may say
// "hold": its preview phase is preceded by an authorization, a keyed write
// that places a hold with an expiry; its commit captures the hold; a
// rollback, a rejection or an expired approval voids it.
//
//   {"id": "pay", "tool": "payments.capture",
//    "args": {"hold_id": "${hold.hold_id}", "amount": "${input.amount}"},
//    "compensate": {"tool": "payments.refund", "args": {"capture_id": ...}},
//    "approval": "human", "approval_ttl": "15m",
//    "hold": {"tool": "payments.authorize", "args": {...}, "lifetime": "7d",
//             "void": {"tool": "payments.void", "args": {"hold_id": "${hold.hold_id}"}}}}
//
// The step is expanded into two steps of the saga (ExpandHolds), so each
// gets the whole journal protocol with nothing new in the store:
//   `<id>_hold`  the authorization: an ordinary write step (its own key
//                `<saga>/<id>_hold` or `hold.key`, `submitted` before the
//                call, retried by key, an uncertain outcome resolved by the
//                tool's status lookup), whose compensation is the void;
//   `<id>`       the capture: a two-phase step (preview, token, approval,
//                commit) that runs after it; its compensation (a refund)
//                undoes a captured payment.
// `${hold.<field>}` in the capture's, the refund's and the void's arguments
// is `${steps.<id>_hold.result.<field>}`.
//
// Expiry. The authorization's answer carries `expires_at_ms` (else the hold
// lives `lifetime` from the authorization's answer). The commit token of the
// capture never outlives the hold; a capture found after the hold expired
// (an approval that came too late, a crash) is not made: the step fails
// ("hold_expired"), the saga rolls back and the void runs. `on_expiry` of a
// hold step is "rollback" (a new authorization would be a new hold: a new
// intent); the checker refuses "re_preview", and an "approval_ttl" longer
// than `lifetime`, naming the place.
//
// Rollback after a capture: the refund undoes the capture, and the void of
// its authorization is passed over (`compensated` with `skipped`), since a
// captured hold is no longer open.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "saga/states.h"
#include "storage/store.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

struct SagaSpec;
struct StepSpec;

/// The suffix of an authorization step's id: step "pay" holds with "pay_hold".
inline constexpr const char* kHoldStepSuffix = "_hold";

/// Where the steps of an expanded document came from.
struct HoldOrigin {
  int index = 0;           ///< the step's index in the document as written
  bool authorize = false;  ///< the authorization of a hold step
};

/// The document with every hold step expanded into its authorization and
/// its capture, and for each expanded step where it came from. Checks what
/// the expansion needs (names the place as written: `steps[2].approval_ttl`).
/// `doc` has passed the schema.
Result<Json> ExpandHolds(const Json& doc, std::vector<HoldOrigin>* origin);

/// `s` (an error of the expanded document) with every `steps[N]` named as
/// written: `steps[3].compensate` of an authorization is `steps[2].hold.void`.
Status PlaceHoldError(const Status& s, const std::vector<HoldOrigin>& origin);

/// Links each authorization step of `spec` (expanded from `written`, the
/// document as written) with its capture (StepSpec::hold).
void LinkHolds(const Json& written, const std::vector<HoldOrigin>& origin, SagaSpec* spec);

/// When the hold of capture step `capture` expires (ms since the epoch),
/// from its authorization's record; 0 when the authorization has no answer.
int64_t HoldExpiresMs(const StepSpec& capture, const storage::StepRecord& authorize);

/// True when the authorization at `index` needs no void in a rollback:
/// its capture took effect (succeeded, or undone by its own compensation).
bool HoldCaptured(const SagaSpec& spec, int index, const std::vector<StepState>& states);

}  // namespace idem
