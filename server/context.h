#pragma once
// ServerContext: what the handlers work with. The Server owns every part
// and outlives the handlers; none of the pointers is owned here.

#include <atomic>

#include "saga/engine.h"
#include "server/auth.h"
#include "server/driver_pool.h"
#include "server/front.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/spec_registry.h"
#include "server/waiter.h"
#include "storage/store.h"
#include "tools/tool.h"

namespace idem::server {

struct ServerContext {
  storage::Store* store = nullptr;
  const ToolRegistry* tools = nullptr;
  const ServerOptions* options = nullptr;
  Engine* engine = nullptr;
  SpecRegistry* specs = nullptr;
  IdempotencyGuard* keys = nullptr;  ///< Idempotency-Key on POST /v1/sagas
  const Authenticator* auth = nullptr;
  Metrics* metrics = nullptr;
  DriverPool* pool = nullptr;
  const std::atomic<bool>* stopping = nullptr;  ///< the server is stopping
  SagaWaiter* waiter = nullptr;                 ///< `Prefer: wait=N` (server/waiter.h)
};

}  // namespace idem::server
