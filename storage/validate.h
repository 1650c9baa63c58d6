#pragma once
// The checks every Store runs on its arguments before it writes anything:
// one WriteBatch validation (Commit) and one NewSaga validation
// (CreateIntent), so that both stores refuse the same batches with the same
// messages. What only one backend cannot store (PostgreSQL: a NUL byte in
// text) is that backend's own check, made after these.
//
// Thread safety: pure functions of their arguments.
//
// Errors: kInvalidArgument naming the field, e.g. "Commit: saga_id is empty"
// or "CreateIntent: steps[2]: index 1 is used twice"; OK otherwise.

#include <string>

#include "storage/store.h"

#include "common/status.h"

namespace idem::storage {

/// `s` in double quotes, as storage messages name ids and keys.
std::string Quote(const std::string& s);

/// A Commit's batch: a saga id; release_lease only with a fence_epoch; every
/// step, journal entry and effect that names a saga names the batch's.
[[nodiscard]] Status ValidateWriteBatch(const WriteBatch& batch);

/// A CreateIntent's saga: a saga id and an intent key; step indexes unique;
/// every journal entry that names a saga names this one.
/// `leased`: a WriteBatch's create, which may carry a lease owner.
[[nodiscard]] Status ValidateNewSaga(const NewSaga& saga, bool leased = false);

/// A ListSagas filter: a positive limit and an offset of at least 0.
[[nodiscard]] Status ValidateSagaFilter(const SagaFilter& filter);

}  // namespace idem::storage
