// Engine::RePreview: a two-phase step previewed again because the key that
// signed its commit token is being retired (`idem keys retire --re-preview`).

#include "preview_commit/two_phase.h"
#include "saga/engine.h"
#include "saga/run.h"

namespace idem {

Result<storage::SagaRecord> Engine::RePreview(const std::string& saga_id,
                                              const std::string& step_id,
                                              const std::string& token_key, const std::string& who,
                                              const std::string& reason) {
  if (who.empty())
    return Status::InvalidArgument("re-preview: who decides is required (--as NAME)");
  if (options_.signer == nullptr)
    return Status::FailedPrecondition("no token signer is configured");
  // Read, check and write under the saga's lease (see Decide).
  auto claimed = ClaimForDecision(saga_id);
  if (!claimed.ok()) return claimed.status();
  const storage::Lease lease = *claimed;
  DriveMark driving(this, saga_id);
  Status written = [&]() -> Status {
    auto rec = store_->LoadSaga(saga_id);
    if (!rec.ok()) return rec.status();
    auto saga = LoadedSaga::From(std::move(rec).value());
    if (!saga.ok()) return saga.status();
    storage::WriteBatch b;
    IDEM_RETURN_IF_ERROR(preview_commit::SupersedeToken(*saga, step_id, token_key, who, reason,
                                                        options_.clock->NowMs(), &b));
    return CommitClaimed(lease, &b);
  }();
  if (!written.ok()) {
    if (lease.epoch != 0) (void)store_->ReleaseLease(lease);
    return written;
  }
  return RunLeased(lease);  // previews again, then waits for the person
}

}  // namespace idem
