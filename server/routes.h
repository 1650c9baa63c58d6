#pragma once
// The API's routes: every endpoint of server/openapi.json and its handler.
// Internal to the server.

#include <vector>

#include "server/context.h"
#include "server/http.h"

namespace idem::server {

/// The routes of the /v1 API, /healthz, /readyz and /metrics. `ctx` must
/// outlive them.
std::vector<Route> ApiRoutes(ServerContext* ctx);

}  // namespace idem::server
