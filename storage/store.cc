#include "storage/store.h"

#include <utility>

#include "storage/pg_store.h"
#include "storage/sqlite_store.h"

namespace idem::storage {
namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

Result<ClaimedSaga> Store::ClaimAndLoad(const std::string& saga_id, const std::string& owner,
                                        int64_t lease_ms) {
  Result<Lease> lease = ClaimSaga(saga_id, owner, lease_ms);
  if (!lease.ok()) return lease.status();
  ClaimedSaga out;
  out.lease = std::move(lease).value();
  Status read = [&]() -> Status {
    Result<SagaRecord> record = LoadSaga(saga_id);
    if (!record.ok()) return record.status();
    out.record = std::move(record).value();
    if (ControlStore* controls = Controls()) {
      auto pending = controls->PendingControl(saga_id);
      if (!pending.ok()) return pending.status();
      out.control = std::move(pending).value();
      out.control_read = true;
    }
    return Status::Ok();
  }();
  if (!read.ok()) {
    (void)ReleaseLease(out.lease);  // best effort: else it expires
    return read;
  }
  return out;
}

Status Store::CommitReadingControl(const WriteBatch& batch, ControlReadback* out) {
  out->read = false;
  out->pending.reset();
  return Commit(batch);
}

Result<StoreGauges> Store::ReadGauges(const GaugeQuery&) {
  return Status::FailedPrecondition("this store does not count gauges");
}

Result<std::vector<StepCheck>> Store::ListStepChecks(const std::string&) {
  return Status::FailedPrecondition("this store keeps no step checks");
}

Result<std::vector<DueCheck>> Store::ListDueChecks(const std::string&, int64_t, int) {
  return Status::FailedPrecondition("this store keeps no step checks");
}

Result<std::vector<EffectRecord>> Store::ListEffectsSince(int64_t, int) {
  return Status::FailedPrecondition("this store does not list effects across sagas");
}

Result<bool> Store::RecordDrift(const DriftFinding&) {
  return Status::FailedPrecondition("this store records no drift");
}

Result<PruneReport> Store::Prune(const PruneRequest&) {
  return Status::FailedPrecondition("this store cannot prune");
}

Result<std::unique_ptr<Store>> OpenStore(const std::string& locator, Clock* clock) {
  if (locator.empty()) {
    return Status::InvalidArgument(
        "store locator is empty; want a file path, sqlite:PATH or postgresql://...");
  }
  if (StartsWith(locator, "postgresql://") || StartsWith(locator, "postgres://")) {
    PgOptions options;
    options.url = locator;
    options.clock = clock;
    Result<std::unique_ptr<PgStore>> store = PgStore::Open(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(std::move(store).value());
  }
  SqliteOptions options;
  options.path = StartsWith(locator, "sqlite:") ? locator.substr(7) : locator;
  options.clock = clock;
  if (options.path.empty()) {
    return Status::InvalidArgument("store locator " + locator + " names no database file");
  }
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(std::move(store).value());
}

}  // namespace idem::storage
