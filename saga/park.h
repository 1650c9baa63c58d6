#pragma once
// Parks: the conditions a drive cannot get past, and how they are journaled.
//
// A drive that meets a condition no further drive would change (a template
// without a value, a tool that is not registered, a frozen spec that no
// longer validates, a write the store keeps refusing) must not end in an
// error that every recovery and sweep repeats: it parks the saga
// needs_attention with a reason a person can act on. The reason starts with
// a code from the closed list below ("missing_value: steps[2].compensate.args
// .rental_id: \"${steps.rent_car.result.rental_id}\" has no value"); the
// journal entry of the park carries the code as `code` too.
//
//   - a forward step that cannot be driven is parked needs_attention
//     (StepEvent::kBlocked): a person decides (resolve: retry once fixed,
//     not_applied to roll back, applied with --result);
//   - a compensation that cannot be called is parked compensation_failed,
//     exactly as one that exhausts its retries (compensation/undo.h): the
//     earlier undos wait for a person (resolve: undone, retry_undo);
//   - a saga whose spec cannot be loaded is parked as a whole, with the step
//     its drive would take up (ParkUnloadableBatch): nothing can be driven
//     without the plan; once it loads again, a resolve resumes the saga.
//
// CheckResolvedValues keeps a person's `resolve ... applied` from creating
// such a park: it refuses a result that leaves a template without a value.
//
// Thread safety: pure functions.

#include <optional>
#include <string>

#include "saga/run.h"
#include "saga/spec.h"
#include "storage/store.h"

#include "common/status.h"

namespace idem {

/// Why a drive parked a saga it could not get past.
enum class ParkCode {
  kMissingValue,  ///< a template references a value the journal does not hold
  kUnknownTool,   ///< a tool (forward or compensation) is not registered
  kInvalidSpec,   ///< the frozen spec no longer parses or validates
  kStoreError,    ///< the store refuses the drive's write
  /// a step's guard (saga/guard.h) gave no answer within its retries: the
  /// write is not made blind
  kGuardUnanswered,
  /// an accepted call did not finish within its tool's completion window
  kCompletionWindow,
};

/// "missing_value", "unknown_tool", "invalid_spec", "store_error",
/// "guard_unanswered", "completion_window".
const char* ParkCodeName(ParkCode code);

/// `<code>: <message>`, the text a park's reason starts with.
std::string BlockedReason(ParkCode code, const std::string& message);

/// The code that a reason (a saga's, or a step's error) names: the first
/// "<code>: " of a known code in it; nullopt for any other reason.
std::optional<ParkCode> FindParkCode(const std::string& reason);

/// The data of a park's journal entry: {"reason": reason}, with "code" when
/// the reason names one (FindParkCode).
Json ParkEntryData(const std::string& reason);

/// The code for a template that did not resolve (ResolveTemplates' error).
ParkCode TemplateParkCode(const Status& error);

/// The code for a frozen spec that does not load (ParseSpec's error).
ParkCode SpecParkCode(const Status& error);

/// The batch that parks `saga` as a whole (needs_attention, reason
/// BlockedReason(code, message), journal `saga_needs_attention` {reason,
/// code}) when its drive cannot start, fenced on `fence_epoch` (and giving
/// that lease up). The step the drive would take up next, judged from the
/// states alone, is parked with it (needs_attention, or compensation_failed
/// in a rollback), so a person's resolve can resume the saga once the plan
/// loads again. kFailedPrecondition when the saga is in a state a park does
/// not leave (terminal, already parked).
Result<storage::WriteBatch> ParkUnloadableBatch(const LoadedSaga& saga, ParkCode code,
                                                const std::string& message, int64_t now_ms,
                                                int64_t fence_epoch);

/// A person resolves step `index` of `record` as applied with `result`:
/// kInvalidArgument, naming the template and the missing path, if a later
/// forward step, the step's own compensation or a later compensation
/// references a value of the step (`${steps.<id>.result...}` or
/// `${steps.<id>.args...}`) that `result` (or the step's arguments) does not
/// hold; also when `result` is not a JSON object.
Status CheckResolvedValues(const SagaSpec& spec, const storage::SagaRecord& record, int index,
                           const Json& result);

}  // namespace idem
