#pragma once
// JSON views of journal records, shared by the command line (`status --json`)
// and the server (`GET /v1/sagas/{id}`) so both show a saga the same way.
// Commit tokens are never part of a view: they go to approvers only.

#include "storage/store.h"

#include "common/json_util.h"

namespace idem {

/// A step: state, attempts, key, arguments, result, errors and, for a
/// two-phase step, its preview, approval and approval deadline.
Json StepView(const storage::StepRecord& st);

/// An effect recorded in the journal.
Json EffectView(const storage::EffectRecord& e);

}  // namespace idem
