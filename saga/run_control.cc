// SagaRun's view of the saga's durable control requests
// (storage/control_store.h): what the drive asks before it starts and
// between steps (saga/drive.cc, TakeControl).

#include <string>

#include "saga/run.h"
#include "saga/states.h"

namespace idem {

Result<std::optional<storage::ControlRequest>> SagaRun::PendingControl() const {
  storage::ControlStore* controls = store_->Controls();
  // A saga not in the store yet has none: a request names a recorded saga
  // (ControlStore::RequestControl refuses any other), so no read is spent.
  if (controls == nullptr || unborn_) return std::optional<storage::ControlRequest>();
  {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    if (prefetched_control_) {
      std::optional<storage::ControlRequest> pending = std::move(*prefetched_control_);
      prefetched_control_.reset();
      // No older than a read of the store's would be under load; older (a
      // backoff, a lookup, a slow thread came between): read again.
      if (options_.clock->NowMs() - prefetched_ms_ <= kPrefetchFreshMs) return pending;
    }
  }
  return controls->PendingControl(saga_id());
}

void SagaRun::PrefetchControl(std::optional<storage::ControlRequest> pending) {
  std::lock_guard<std::mutex> lock(prefetch_mu_);
  prefetched_control_ = std::move(pending);
  prefetched_ms_ = options_.clock->NowMs();
}

void SagaRun::DropPrefetchedControl() const {
  std::lock_guard<std::mutex> lock(prefetch_mu_);
  prefetched_control_.reset();
}

Status SagaRun::SettleControl(const std::string& request_id) const {
  // A request read before it was carried out (with the write of its state
  // change) is gone once settled: the next check reads again.
  DropPrefetchedControl();
  storage::ControlStore* controls = store_->Controls();
  return controls == nullptr ? Status::Ok() : controls->SettleControl(saga_id(), request_id);
}

Result<bool> SagaRun::PausedWhileRollingBack() const {
  auto journal = store_->ReadJournal(saga_id());
  if (!journal.ok()) return journal.status();
  for (auto it = journal->rbegin(); it != journal->rend(); ++it) {
    if (it->step_id.empty() && it->event == "saga_paused") {
      return it->data.is_object() &&
             it->data.value("from", "") == SagaStateName(SagaState::kCompensating);
    }
  }
  return false;
}

}  // namespace idem
