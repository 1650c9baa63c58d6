#pragma once
// MetricsEndpoint: `/metrics` and `/healthz` over idem::http for a process
// that drives sagas without the REST API (`idem worker --metrics-listen
// HOST:PORT`). `/metrics` is observability::Metrics::Render (counters of this
// process, gauges of the store); `/healthz` answers 200 "ok" while the
// process runs; any other path is 404, any method but GET 405. No
// authentication, as the server's /metrics: bind it to loopback or a
// private network. Internal to the CLI.
//
// Thread safety: Start and Stop from one thread; handlers run on the HTTP
// front's workers.

#include <memory>
#include <string>

#include "storage/store.h"

#include "common/status.h"
#include "http/server.h"
#include "observability/metrics.h"

namespace idem::cli {

/// HOST:PORT (HOST may be [v6]; PORT 0..65535, 0 for an ephemeral port).
/// kInvalidArgument naming `flag` and what is wrong.
Status ParseListen(const std::string& text, const std::string& flag, std::string* host, int* port);

class MetricsEndpoint {
 public:
  /// Binds `listen` (HOST:PORT) and serves. `metrics` and `store` are not
  /// owned and must outlive the endpoint. kInvalidArgument for a bad
  /// address, kUnavailable when it cannot be bound.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                        observability::Metrics* metrics,
                                                        storage::Store* store);
  ~MetricsEndpoint();  ///< Stop()
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  const std::string& host() const { return host_; }
  int port() const;
  void Stop();

 private:
  MetricsEndpoint() = default;
  std::string host_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace idem::cli
