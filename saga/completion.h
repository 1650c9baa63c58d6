#pragma once
// Asynchronous completion: a step whose provider took the call and finishes
// it later (ToolOutcome::Accepted; HTTP 202), or whose status lookup answered
// `pending`, is `processing`, and its saga waits in `awaiting_completion`
// (docs/architecture.md, "Asynchronous completion"). Nothing is held while
// it waits: no thread, no lease. The step's next check is a row in the store
// (storage::StepCheck, migration 11), written with the step; a sweep (the
// server's sweeper, `idem worker`, `idem recover`) drives only sagas whose
// check is due (Store::ListDueChecks), and the drive asks the tool's status
// lookup once (saga/run.cc, ResolveUnknown):
//   applied      the step succeeds with the provider's result (no call)
//   failed       the step fails (rollback, as for any definite failure)
//   not applied  the provider never took it: the same-key resend rules
//   pending      the next check, later (full-jitter exponential backoff
//   lookup error   from CompletionPolicy::first_check_ms, capped at
//                  max_check_ms, never past the window's end)
// Past the tool's window (CompletionPolicy::window_ms from the first wait)
// the step parks needs_attention with park code `completion_window`.
//
// Thread safety: the functions are pure, or read the store (safe from any
// thread).

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "storage/store.h"
#include "tools/tool.h"

#include "common/status.h"

namespace idem::completion {

/// The step's check after one more wait: `current` (nullopt for a step that
/// begins waiting now, whose window starts now) with one more check counted,
/// the next one `suggested_ms` from now when the provider suggested it, else
/// after the backoff; never later than the window's end.
storage::StepCheck NextCheck(const CompletionPolicy& policy,
                             const std::optional<storage::StepCheck>& current,
                             const std::string& step_id, int64_t now_ms, int64_t suggested_ms,
                             std::mt19937_64* rng);

/// The window of `check` has passed at `now_ms`.
bool PastWindow(const storage::StepCheck& check, int64_t now_ms);

/// The reason a step parks with past its window (park code completion_window).
std::string WindowReason(const std::string& tool, const std::string& key,
                         const storage::StepCheck& check, const std::string& last_answer);

/// The earliest check of the saga's waiting steps (nullopt: none waits).
Result<std::optional<int64_t>> EarliestCheck(storage::Store* store, const std::string& saga_id);

/// Appends to `list` the sagas awaiting completion whose check is due at
/// `now_ms` (up to `limit`), for a sweep to drive.
Status AddDue(storage::Store* store, int64_t now_ms, std::vector<storage::SagaSummary>* list,
              int limit = 10'000);

}  // namespace idem::completion
