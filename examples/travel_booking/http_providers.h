#pragma once
// The simulated travel providers of providers.h as real HTTP servers: one
// cpp-httplib server on one port serves all ten tools, each route calling
// the in-process tool (Invoke, Lookup, Preview) over the same SQLite ledger.
// An idem process reaches them through HTTP tools (tools/http_tool.h, the
// tools file examples/travel_booking/tools.http.json), so every failure of a
// real network call (a lost response, a dropped connection, a 503) happens
// on a real socket.
//
// Routes (TOOL = PROVIDER.OPERATION, e.g. flights.reserve):
//   POST /PROVIDER/OPERATION                   commit: Invoke. Body: the args
//                                              (a JSON object). Headers:
//                                              Idempotency-Key (required),
//                                              Idempotency-Attempt, If-Match
//                                              (the previewed version)
//   GET  /PROVIDER/OPERATION/status/{key}      status lookup (tools with one)
//   POST /PROVIDER/OPERATION/preview[/{key}]   preview (flights.reserve,
//                                              payments.charge); with {key},
//                                              barriers and already-applied
//                                              keys are seen as in-process
//   GET  /healthz                              200 {"ok": true}
//   GET  /tools                                the ten tools and their routes
//
// Answers (chosen so that tools/http_tool.cc classifies each as the
// in-process outcome):
//   in-process outcome                 HTTP
//   ---------------------------------  ---------------------------------------
//   succeeded                          200, body = the result, plus
//                                      "external_ref" when the tool names one
//   failed, retryable                  503 problem+json, Retry-After: 1
//   failed: action after its undo      409 problem+json ...refused-after-compensation
//   failed: other permanent refusal    422 problem+json ...rejected
//   stale (If-Match no longer holds)   412 problem+json ...stale
//   unknown (a ledger commit error,    500 problem+json (the client resolves it
//     a failpoint `err`)                 through the status lookup)
//   accepted (transfers.book)          202 {"id": JOB, "status": "pending"},
//                                      Retry-After: the seconds until done
//   lookup: applied / not applied      200 {"status": "applied", "result",
//                                      "external_ref"} / 404 {"status":
//                                      "not_applied"}; ledger error 503
//   lookup: pending / failed           200 {"status": "pending", "id"} with
//                                      Retry-After / 200 {"status": "failed",
//                                      "error"} (a declined job)
//   preview ok / refused               200 {"summary", "changes",
//                                      "resource_version"} / 422 (503 when
//                                      retryable)
//   no Idempotency-Key on a commit     400 problem+json ...key-missing
//
// Keys. The providers that honour keys at their front door, flights and
// payments, mount server/idempotency.h's IdempotencyLayer on their commit
// routes (one key store, scoped per provider): a same-key retry gets the
// stored response (Idempotent-Replayed: true) without reaching the ledger, a
// retry while the first request runs gets 409 in flight, a same key with
// another body 422. A 412 (stale), like 429 and 503, releases the key, so the
// commit after a re-preview runs. hotels and cars mount no layer: hotels.book
// and cars.rent apply a repeated key again, as providers.h describes (their
// compensations still deduplicate in the ledger).
//
// Faults (HttpProviderOptions::faults; `TOOL=MODE[@N]` as in providers.h,
// plus `drop_connection`). @N counts the commit requests of TOOL that reach
// the server (replays included), in this server's lifetime. The faults of
// providers.h keep their meaning; where they act on the wire:
//   fail, fail_times(K)  503 + Retry-After; no effect; ledger call "fault:fail"
//   reject               422; no effect; ledger call "fault:reject"
//   lose_request         the connection is closed without an answer, before
//                        the key layer and the ledger (call "fault:lose_request")
//   delay(MS)            the request is held MS ms, then runs normally
//   reprice              the resource's version moves, then the call runs
//   lose_response        the effect is applied and committed (and the response
//                        stored by the key layer), then the answer is withheld
//                        for `lost_response_hold_ms` (past the client's read
//                        timeout) and the connection closed unanswered: the
//                        client times out. Ledger call "applied", not
//                        "applied;response_lost": the loss is on the wire.
//   drop_connection      the same, but the connection is closed at once
//                        (commit, then a FIN before any byte of the answer).
// Failing or rejecting requests are refused before the key layer, so a retry
// of the same key runs normally (as in-process). Lookups and previews never
// fault.
//
// Thread safety: Bind, Run, Start and Stop may be called from different
// threads; the handlers run on httplib's thread pool and call the
// thread-safe in-process tools. Start ignores SIGPIPE process-wide: a dropped
// or abandoned connection makes httplib write to a closed socket.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "examples/travel_booking/providers.h"
#include "server/idempotency.h"
#include "tools/tool.h"

#include "common/status.h"

namespace idem::travel {

/// One route of the servers, for documentation and `GET /tools`.
struct HttpRoute {
  std::string tool;     ///< "flights.reserve"
  std::string method;   ///< "POST"
  std::string path;     ///< "/flights/reserve/status/{key}"
  std::string purpose;  ///< "commit", "status" or "preview"
};

/// Every route of the ten tools, commit routes first per tool.
std::vector<HttpRoute> TravelHttpRoutes();

/// Parses `TOOL=MODE[@N]`: the modes of ParseFaultRule plus drop_connection.
/// InvalidArgument quoting the text on a bad rule.
Result<FaultRule> ParseHttpFaultRule(const std::string& text);

struct HttpProviderOptions {
  std::string ledger_path;  ///< created if missing
  /// The key store of the IdempotencyLayer; "": `<ledger_path>.keys.sqlite`.
  std::string keys_path;
  int latency_ms = 0;  ///< slept in every commit (not lookups, previews)
  /// ProviderOptions::confirm_delay_ms of the slow provider (transfers.book).
  int64_t confirm_delay_ms = ProviderOptions().confirm_delay_ms;
  std::vector<FaultRule> faults;
  /// How long a lose_response answer is withheld before the connection is
  /// closed; must exceed the client's read timeout (tools file timeout_ms).
  int64_t lost_response_hold_ms = 15'000;
  /// httplib's own read/write timeouts for a request from a client.
  int64_t socket_timeout_ms = 30'000;
  /// HTTPS (both or neither): a PEM certificate chain and its private key
  /// (owner-only; common/tls_files.h checks both). "": plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
};

/// The providers' HTTP server. Owns its httplib::Server, the in-process
/// tools and the key store; the ledger file is shared with anyone who opens it.
class HttpProviders {
 public:
  /// Opens the ledger and the key store and mounts the routes.
  /// InvalidArgument for a bad option or fault (an unknown tool, reprice for a
  /// tool without a preview) or TLS file; NotFound/FailedPrecondition for a
  /// TLS file that cannot be read or a key others may read;
  /// Unavailable/Internal when the ledger or the key store cannot be opened.
  static Result<std::unique_ptr<HttpProviders>> Create(HttpProviderOptions options);

  ~HttpProviders();  ///< Stop()s
  HttpProviders(const HttpProviders&) = delete;
  HttpProviders& operator=(const HttpProviders&) = delete;

  /// Binds `host:port` (port 0: an ephemeral port) and answers the port.
  /// Unavailable when the address cannot be bound.
  Result<int> Bind(const std::string& host, int port);
  /// Serves on the bound socket until Stop(). FailedPrecondition before Bind.
  Status Run();
  /// Bind, then Run on a thread of its own; returns once the server accepts.
  Result<int> Start(const std::string& host, int port);
  /// Stops serving, wakes withheld answers and joins Start's thread.
  /// Idempotent; safe from any thread but a handler's.
  void Stop();

  int port() const { return port_; }
  const std::string& ledger_path() const { return options_.ledger_path; }

 private:
  struct Route;  // one tool's routes and fault count
  explicit HttpProviders(HttpProviderOptions options);
  Status Init();

  void Commit(Route& route, const httplib::Request& req, httplib::Response& res);
  void Lookup(Route& route, const httplib::Request& req, httplib::Response& res);
  void Preview(Route& route, const httplib::Request& req, httplib::Response& res);
  /// Closes the request's connection without an answer; false when its
  /// socket cannot be found (the caller then answers 500: still unknown).
  bool DropConnection(const httplib::Request& req);
  /// Waits `ms`, or less when Stop() is called.
  void Hold(int64_t ms);

  HttpProviderOptions options_;
  std::unique_ptr<httplib::Server> server_;  ///< an httplib::SSLServer for HTTPS
  /// The in-process tools: "" without faults, else per fault mode.
  std::map<std::string, std::unique_ptr<ToolRegistry>> registries_;
  std::unique_ptr<server::IdempotencyLayer> layer_;
  std::vector<std::unique_ptr<Route>> routes_;
  std::thread thread_;
  int port_ = 0;
  bool bound_ = false;
  std::mutex mu_;  // guards stopping_ (with hold_cv_)
  std::condition_variable hold_cv_;
  bool stopping_ = false;
};

}  // namespace idem::travel
