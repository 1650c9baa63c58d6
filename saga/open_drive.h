#pragma once
// What a drive does with an open saga (saga/open_saga.h) that idles: the
// saga event its idle policy calls for once the timeout has passed. Internal
// to the engine (saga/drive.cc).

#include <optional>
#include <string>

#include "saga/machines.h"
#include "saga/run.h"

namespace idem {

struct IdleEvent {
  SagaFacts facts;     ///< park_on_idle from the policy
  std::string reason;  ///< kept on the saga: "idle for more than 15m (idle_timeout): ..."
};

/// The idle event for `run`'s saga when it is open and its idle timeout has
/// passed (the run's clock), else nullopt.
std::optional<IdleEvent> OpenIdleEvent(const SagaRun& run);

}  // namespace idem
