#pragma once
// ServerCore (internal): what every connection of one http::Server shares:
// the options, the handler, the admission counters, the worker pool, and
// the registry of live connections and streams that Stop walks.
//
// Thread safety: the registry and counters are safe from any thread; the
// rest is immutable after construction. Declared before the I/O context in
// Server::Impl, so it outlives every connection.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <boost/asio/thread_pool.hpp>

#include "http/admission.h"
#include "http/options.h"
#include "http/server.h"
#include "http/stream_state.h"

namespace idem::http {

/// The part of a connection that Stop needs, whatever its transport.
class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  /// Graceful (any thread): idle or half-read requests close now, an
  /// in-flight response finishes and then closes, a stream ends.
  virtual void Shutdown() = 0;
  /// Closes now (any thread).
  virtual void Abort() = 0;
};

struct ServerCore {
  ServerCore(ServerOptions o, Handler h, ServerHooks k)
      : options(std::move(o)),
        handler(std::move(h)),
        hooks(std::move(k)),
        connections(options.max_connections, options.max_connections_per_client),
        streams(options.max_streams, options.max_streams_per_client),
        workers(static_cast<size_t>(options.worker_threads)) {}

  void Register(const std::shared_ptr<ConnectionBase>& c);
  void Unregister(ConnectionBase* c);
  void RegisterStream(const std::shared_ptr<StreamState>& s);
  /// The live connections (those still alive).
  std::vector<std::shared_ptr<ConnectionBase>> Live();
  /// Every stream still registered, for Stop to mark closed.
  std::vector<std::shared_ptr<StreamState>> LiveStreams();
  /// Waits until no connection is registered or `ms` has passed; true if none.
  bool WaitIdle(int64_t ms);
  /// hooks.responded(status), if set.
  void Responded(int status) const;

  const ServerOptions options;
  const Handler handler;
  const ServerHooks hooks;
  Admission connections;
  Admission streams;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> rejected_requests{0};

  std::mutex mu;
  std::condition_variable idle_cv;
  std::unordered_map<ConnectionBase*, std::weak_ptr<ConnectionBase>> live;  // guarded by mu
  std::vector<std::weak_ptr<StreamState>> live_streams;                     // guarded by mu

  /// Runs handlers and stream openers. Last: destroyed (joined) first.
  boost::asio::thread_pool workers;
};

}  // namespace idem::http
