// Liveness, readiness and the metrics page.

#include "server/handlers.h"
#include "server/problem.h"

namespace idem::server {

void Healthz(ServerContext&, const HttpRequest&, HttpResponse& res) {
  SendJson(res, 200, {{"status", "ok"}});
}

void Readyz(ServerContext& ctx, const HttpRequest&, HttpResponse& res) {
  storage::SagaFilter f;
  f.limit = 1;
  auto list = ctx.store->ListSagas(f);
  if (!list.ok()) {
    res.SetHeader("Retry-After", "1");
    return Problem(res, 503, "not-ready", "Not ready",
                   "the store is not reachable: " + list.status().message());
  }
  if (ctx.stopping->load()) {
    return Problem(res, 503, "not-ready", "Not ready", "the server is stopping");
  }
  SendJson(res, 200, {{"status", "ready"}});
}

void MetricsPage(ServerContext& ctx, const HttpRequest&, HttpResponse& res) {
  res.SetContent(ctx.metrics->Render(ctx.store), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace idem::server
