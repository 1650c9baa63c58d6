#pragma once
// JSON views of journal records, shared by the command line (`status --json`)
// and the server (`GET /v1/sagas/{id}`) so both show a saga the same way.
// Commit tokens are part of ApprovalView only: it goes to approvers.

#include <optional>
#include <string>

#include "storage/store.h"

#include "common/json_util.h"

namespace idem {

/// A step: state, attempts, key, arguments, result, errors (with
/// `park_code` when a drive could not get past it: saga/park.h) and, for a
/// two-phase step, its preview, approval and approval deadline.
Json StepView(const storage::StepRecord& st);

/// For a saga that needs attention because a drive could not get past it,
/// the park's code ("missing_value", ...: saga/park.h), shown as `park_code`
/// beside the reason; nullopt otherwise.
std::optional<std::string> SagaParkCode(const storage::SagaSummary& saga);

/// An effect recorded in the journal.
Json EffectView(const storage::EffectRecord& e);

/// Which spec a saga runs, added to a saga's view: "spec_version" (the
/// registry's version, null for a spec given inline) and "spec_sha256"
/// ("sha256:<hex>" of its canonical text; "" for sagas older than schema 7).
void AddSpecRef(const storage::SagaSummary& s, Json* view);

/// Whether its data was pruned (storage/prune.h), added to a saga's view:
/// "pruned" (true or false) and, once pruned, "pruned_at".
void AddPruned(const storage::SagaSummary& s, Json* view);

/// The same as text: `travel version 3 sha256:...`, or `travel (inline) sha256:...`.
std::string SpecRefText(const storage::SagaSummary& s);

/// A commit waiting for a person (the step is awaiting_approval with its
/// preview), for approvers: saga, step, tool, arguments, preview, deadline
/// and the commit token. Nullopt for any other step.
std::optional<Json> ApprovalView(const std::string& saga_id, const storage::StepRecord& st);

}  // namespace idem
