#pragma once
// The server's metrics are the ones of every process that drives sagas
// (observability/metrics.h); /metrics renders them. Internal to the server.

#include "observability/metrics.h"

namespace idem::server {

using Metrics = observability::Metrics;

}  // namespace idem::server
