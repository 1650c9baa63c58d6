#include "storage/validate.h"

#include <set>

namespace idem::storage {

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

Status ValidateWriteBatch(const WriteBatch& batch) {
  if (batch.saga_id.empty()) return Status::InvalidArgument("Commit: saga_id is empty");
  if (batch.release_lease && batch.fence_epoch == 0) {
    return Status::InvalidArgument("Commit: release_lease needs the lease's fence_epoch");
  }
  if (batch.create) {
    const NewSaga& c = *batch.create;
    IDEM_RETURN_IF_ERROR(ValidateNewSaga(c, /*leased=*/true));
    if (c.saga_id != batch.saga_id) {
      return Status::InvalidArgument("Commit: create.saga_id " + Quote(c.saga_id) +
                                     " is not the batch's " + Quote(batch.saga_id));
    }
    const int64_t epoch = c.lease_owner.empty() ? 0 : 1;
    if (batch.fence_epoch != epoch) {
      return Status::InvalidArgument("Commit: a batch that creates its saga is fenced on epoch " +
                                     std::to_string(epoch) + " (" +
                                     (epoch == 0 ? "no lease" : "the creator's lease") + "), not " +
                                     std::to_string(batch.fence_epoch));
    }
  }
  auto check_owner = [&](const std::string& id, const char* what, size_t i) -> Status {
    if (id.empty() || id == batch.saga_id) return Status::Ok();
    return Status::InvalidArgument("Commit: " + std::string(what) + "[" + std::to_string(i) +
                                   "]: saga_id " + Quote(id) + " is not the batch's " +
                                   Quote(batch.saga_id));
  };
  for (size_t i = 0; i < batch.steps.size(); ++i) {
    IDEM_RETURN_IF_ERROR(check_owner(batch.steps[i].saga_id, "steps", i));
  }
  for (size_t i = 0; i < batch.journal.size(); ++i) {
    IDEM_RETURN_IF_ERROR(check_owner(batch.journal[i].saga_id, "journal", i));
  }
  for (size_t i = 0; i < batch.effects.size(); ++i) {
    IDEM_RETURN_IF_ERROR(check_owner(batch.effects[i].saga_id, "effects", i));
  }
  for (size_t i = 0; i < batch.checks.size(); ++i) {
    const StepCheck& c = batch.checks[i];
    if (c.step_id.empty() || c.next_check_ms <= 0 || c.deadline_ms <= 0 || c.checks < 0) {
      return Status::InvalidArgument("Commit: checks[" + std::to_string(i) +
                                     "]: a step check needs a step_id, positive next_check_ms "
                                     "and deadline_ms, and checks >= 0");
    }
  }
  for (size_t i = 0; i < batch.checks_done.size(); ++i) {
    if (batch.checks_done[i].empty()) {
      return Status::InvalidArgument("Commit: checks_done[" + std::to_string(i) +
                                     "]: step_id is empty");
    }
  }
  return Status::Ok();
}

Status ValidateNewSaga(const NewSaga& saga, bool leased) {
  if (saga.saga_id.empty()) return Status::InvalidArgument("CreateIntent: saga_id is empty");
  if (saga.intent_key.empty()) return Status::InvalidArgument("CreateIntent: intent_key is empty");
  if (!leased && !saga.lease_owner.empty()) {
    return Status::InvalidArgument(
        "CreateIntent: lease_owner is set; only a batch's create records a leased saga");
  }
  if (!saga.lease_owner.empty() && saga.lease_ms <= 0) {
    return Status::InvalidArgument("create: lease_ms must be positive with a lease_owner, got " +
                                   std::to_string(saga.lease_ms));
  }
  std::set<int> indexes;
  for (size_t i = 0; i < saga.steps.size(); ++i) {
    if (!indexes.insert(saga.steps[i].index).second) {
      return Status::InvalidArgument("CreateIntent: steps[" + std::to_string(i) + "]: index " +
                                     std::to_string(saga.steps[i].index) + " is used twice");
    }
  }
  for (size_t i = 0; i < saga.journal.size(); ++i) {
    const std::string& id = saga.journal[i].saga_id;
    if (!id.empty() && id != saga.saga_id) {
      return Status::InvalidArgument("CreateIntent: journal[" + std::to_string(i) + "]: saga_id " +
                                     Quote(id) + " is not " + Quote(saga.saga_id));
    }
  }
  return Status::Ok();
}

Status ValidateSagaFilter(const SagaFilter& filter) {
  if (filter.limit <= 0) {
    return Status::InvalidArgument("ListSagas: limit must be positive, got " +
                                   std::to_string(filter.limit));
  }
  if (filter.offset < 0) {
    return Status::InvalidArgument("ListSagas: offset must be at least 0, got " +
                                   std::to_string(filter.offset));
  }
  return Status::Ok();
}

}  // namespace idem::storage
