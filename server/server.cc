// Server: wires the parts of the server (server/context.h) together and
// runs them; the handlers (server/handlers.h) do the API's work.

#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "saga/engine.h"
#include "server/auth.h"
#include "server/context.h"
#include "server/driver_pool.h"
#include "server/front.h"
#include "server/metrics.h"
#include "server/problem.h"
#include "server/routes.h"
#include "server/spec_registry.h"
#include "server/ui_routes.h"
#include "storage/server_state.h"
#include "storage/sqlite_store.h"

#include "common/json_util.h"
#include "mcp/http_mount.h"
#include "observability/observability.h"

namespace idem::server {

struct Server::Impl {
  ServerOptions options;
  Clock* clock = nullptr;
  std::atomic<bool> stop_flag{false};
  // The deprecated state file, for a store that keeps no server state.
  std::unique_ptr<storage::SqliteStore> state_file;
  std::unique_ptr<Authenticator> auth;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<IdempotencyGuard> keys;
  std::unique_ptr<SpecRegistry> specs;
  Metrics metrics;
  std::unique_ptr<DriverPool> pool;
  std::unique_ptr<SagaWaiter> waiter;
  ServerContext ctx;
  std::unique_ptr<UiService> ui;            // before `http`: its routes use it
  std::unique_ptr<mcp::HttpTransport> mcp;  // /mcp (mcp/http.h); before `http` too
  std::unique_ptr<HttpListener> http;
  bool started = false;
  bool stopped = false;
};

Result<std::unique_ptr<Server>> Server::Create(storage::Store* store, const ToolRegistry* tools,
                                               ServerOptions options) {
  if (store == nullptr || tools == nullptr) {
    return Status::InvalidArgument("server: a store and a tool registry are required");
  }
  if (options.principals.empty()) {
    if (!options.insecure_no_auth) {
      return Status::FailedPrecondition(
          "server: no --auth file; refusing to serve without authentication (pass "
          "--insecure-no-auth to serve on loopback without it)");
    }
    if (!IsLoopback(options.host)) {
      return Status::FailedPrecondition(
          "server: --insecure-no-auth is allowed on loopback only, "
          "not on " +
          options.host);
    }
  }
  IDEM_RETURN_IF_ERROR(CheckDistinctNames(options.principals, "principals"));
  if (options.workers < 1 || options.workers > 256) {
    return Status::InvalidArgument("server: workers must be 1..256");
  }
  if (options.port < 0 || options.port > 65535) {
    return Status::InvalidArgument("server: port must be 0..65535");
  }
  const bool has_state = store->KeyRecords() != nullptr && store->Specs() != nullptr;
  if (!has_state && options.state_path.empty()) {
    return Status::InvalidArgument(
        "server: the store keeps no server state (keys, specs); a state file is required");
  }
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  impl->clock = options.clock != nullptr ? options.clock : SystemClock::Get();
  if (options.owner.empty()) options.owner = NewId("srv_");
  impl->options = std::move(options);
  const ServerOptions& o = impl->options;
  // Server state lives beside the journal, so that every server on one
  // database shares its keys and specs.
  storage::KeyRecordStore* records = store->KeyRecords();
  storage::SpecStore* spec_store = store->Specs();
  if (!has_state) {
    storage::SqliteOptions so;
    so.path = o.state_path;
    so.clock = impl->clock;
    auto file = storage::SqliteStore::Open(so);
    if (!file.ok()) return file.status();
    impl->state_file = std::move(file).value();
    records = impl->state_file->KeyRecords();
    spec_store = impl->state_file->Specs();
  }
  auto keys = IdempotencyGuard::Create(records, o.idempotency_ttl_ms, impl->clock);
  if (!keys.ok()) return keys.status();
  impl->keys = std::move(keys).value();
  impl->specs = std::make_unique<SpecRegistry>(spec_store, impl->clock);
  impl->auth = std::make_unique<Authenticator>(o.principals);

  EngineOptions eo;
  eo.clock = impl->clock;
  eo.signer = o.signer;
  eo.use_leases = o.use_leases;
  eo.owner = o.owner;
  eo.lease_ms = o.lease_ms;
  eo.limits = o.limits;
  eo.stop = &impl->stop_flag;
  eo.observer = observability::WithJournalLog(nullptr);
  observability::ReportTo(&raw->metrics, store, &eo);
  // Waiters (Prefer: wait=N) wake on their saga's entries; at most half the
  // handler threads wait at once, and each re-reads every 2 s for changes
  // other processes made.
  impl->waiter = std::make_unique<SagaWaiter>(std::max(1, o.http_threads / 2), 2'000);
  eo.observer = [next = eo.observer, waiter = impl->waiter.get()](const storage::JournalEntry& e) {
    if (next) next(e);
    waiter->Notify(e.saga_id);
  };
  impl->engine = std::make_unique<Engine>(store, tools, eo);

  DriverPoolOptions po;
  po.workers = o.workers;
  po.use_leases = o.use_leases;
  po.poll_ms = o.poll_ms;
  po.sweep_ms = o.sweep_ms;
  impl->pool = std::make_unique<DriverPool>(impl->engine.get(), store, impl->clock, po);

  ServerContext& ctx = impl->ctx;
  ctx.store = store;
  ctx.tools = tools;
  ctx.options = &impl->options;
  ctx.engine = impl->engine.get();
  ctx.specs = impl->specs.get();
  ctx.keys = impl->keys.get();
  ctx.auth = impl->auth.get();
  ctx.metrics = &impl->metrics;
  ctx.pool = impl->pool.get();
  ctx.stopping = &impl->stop_flag;
  ctx.waiter = impl->waiter.get();

  http::ServerOptions lo;
  lo.host = o.host;
  lo.port = o.port;
  lo.worker_threads = o.http_threads;
  lo.max_body_bytes = o.max_body_bytes;
  lo.max_header_bytes = o.max_header_bytes;
  lo.max_header_fields = o.max_header_fields;
  lo.request_timeout_ms = o.request_timeout_ms;
  lo.write_timeout_ms = int64_t{o.write_timeout_s} * 1000;
  lo.keep_alive_idle_ms = int64_t{o.keep_alive_timeout_s} * 1000;
  lo.max_requests_per_connection = o.keep_alive_max_count;
  lo.max_connections = o.max_connections;
  lo.max_connections_per_client = o.max_connections_per_client;
  lo.max_streams = o.max_streams;
  lo.max_streams_per_client = o.max_streams_per_client;
  lo.tls_cert_file = o.tls_cert_file;
  lo.tls_key_file = o.tls_key_file;
  HttpListenerHooks hooks;
  hooks.library_error = [](HttpResponse& res) { ProblemForHttpError(res); };
  hooks.exception = [](const std::string& what, HttpResponse& res) {
    Problem(res, 500, "internal", "Internal error", what);
  };
  hooks.responded = [raw](int status) { raw->metrics.Request(status); };
  std::vector<Route> routes = ApiRoutes(&impl->ctx);
  impl->ui = std::make_unique<UiService>(&impl->ctx, impl->options.ui, impl->clock);
  for (Route& r : impl->ui->Routes()) routes.push_back(std::move(r));
  if (impl->options.mcp.enabled) {
    impl->mcp = mcp::MountOnServer(&impl->ctx);
    for (Route& r : impl->mcp->Routes()) routes.push_back(std::move(r));
  }
  impl->http = std::make_unique<HttpListener>(std::move(routes), lo, std::move(hooks));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

int Server::port() const { return impl_->http->port(); }

std::function<void(const storage::JournalEntry&)> Server::journal_observer() const {
  return impl_->engine->options().observer;
}

Status Server::Start() {
  Impl& s = *impl_;
  if (s.started) return Status::FailedPrecondition("server: already started");
  // Listening first: a bind failure drives nothing. A saga submitted before
  // the pool starts waits in its queue.
  Status listening = s.http->Start();
  if (!listening.ok()) return listening;
  s.started = true;
  s.pool->Start();
  return Status::Ok();
}

void Server::Stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.stop_flag.store(true);  // drives stop between steps
  s.ui->Stop();             // the UI's event streams end first
  s.waiter->StopAll();      // requests waiting for an outcome answer now
  s.http->Stop();
  s.pool->Stop();
}

}  // namespace idem::server
