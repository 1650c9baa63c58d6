#include "saga/open_drive.h"

#include "saga/open_saga.h"
#include "saga/states.h"

#include "common/clock.h"

namespace idem {

std::optional<IdleEvent> OpenIdleEvent(const SagaRun& run) {
  if (run.state() != SagaState::kOpen) return std::nullopt;
  if (!OpenIdleDue(run.record(), run.clock()->NowMs())) return std::nullopt;
  auto plan = ReadOpenPlan(run.record().spec);
  if (!plan.ok()) return std::nullopt;
  IdleEvent e;
  e.facts.open_saga = true;
  e.facts.park_on_idle = plan->on_idle == OnIdle::kPark;
  e.reason = "idle for more than " + std::to_string(plan->idle_timeout_ms / 1000) +
             " s (idle_timeout): " +
             (e.facts.park_on_idle ? "paused for a person (on_idle: park)"
                                   : "rolled back (on_idle: rollback)");
  return e;
}

}  // namespace idem
