#pragma once
// Test-only switches that put known protocol defects back, so that the
// deterministic simulation (sim/) and the unit tests can show that their
// checkers catch each one. Production code never sets them: the default is
// kNone, and every guarded branch is the defect's old behaviour verbatim.
//
// Thread safety: the switch is one atomic; set it before any engine runs.

namespace idem::effect {

/// A defect the protocol once had (docs/architecture.md, "The effect
/// protocol"), named by what it did.
enum class Mutation {
  kNone = 0,
  /// A compensation found `compensating` after a crash or a takeover is
  /// resent after any status-lookup answer other than `applied` (a lookup
  /// error, `pending`, `not_applied` while the earlier call may be in flight).
  kUndoResendsAfterAnyLookup = 1,
  /// A guard's read that answers `accepted` counts as "the effect is absent",
  /// so the guarded write is made.
  kGuardReadsAcceptedAsAbsent = 2,
  /// The drift check asks providers about the effects row's key
  /// (`<saga>/<step>`) instead of the key the step sent.
  kDriftAsksTheRowKey = 3,
  /// An open saga's call id reused with other arguments is answered with the
  /// earlier call's result (flagged deduplicated) instead of a conflict.
  kCallIdIgnoresArguments = 4,
};

/// Sets the process-wide mutation (kNone turns it off).
void SetMutation(Mutation m);
/// True while `m` is the active mutation.
bool Mutated(Mutation m);
/// Parses "0".."4" or a name ("undo-resends-after-any-lookup", ...);
/// false for anything else.
bool ParseMutation(const char* text, Mutation* out);
const char* MutationName(Mutation m);

}  // namespace idem::effect
