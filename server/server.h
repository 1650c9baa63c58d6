#pragma once
// The idem server: a versioned REST API (/v1) over the engine.
//
//   POST /v1/sagas                      submit {"spec": <object or name>, "input": {...}}
//                                       under an Idempotency-Key; 201 new, 200 existing
//   GET  /v1/sagas/{id}                 the saga, its steps and effects (owner only)
//   GET  /v1/sagas?status=S&limit=N     the caller's sagas, newest first
//   POST /v1/sagas/{id}/cancel          cancel (agent: its own; operator), see below
//   POST /v1/sagas/{id}/pause|resume    pause / resume (operator), see below
//   POST /v1/sagas/{id}/resolve         a person's decision on a parked step (operator)
//   PUT  /v1/specs/{name}               register a spec version (validated; versions kept)
//   GET  /v1/specs, /v1/specs/{name}    the registered specs
//   GET  /v1/approvals                  commits waiting for a person (approver)
//   POST /v1/approvals/{token}/approve  {"note": ...}    (approver)
//   POST /v1/approvals/{token}/reject   {"reason": ...}  (approver)
//   GET  /healthz, /readyz, /metrics    liveness, store reachable, Prometheus text
//
// server/openapi.json describes every endpoint, body and error; docs/server.md
// explains how to run it. Errors are RFC 9457 application/problem+json
// {type, title, status, detail} with types "urn:idem:problem:<name>".
//
// Callers: a bearer token (Authorization: Bearer <token>) names a principal
// of ServerOptions::principals, found by the SHA-256 of the token compared
// with CRYPTO_memcmp. Role "agent" submits and reads its own sagas; role
// "approver" lists and decides approvals (never for a saga of its own).
// A saga belongs to the principal that submitted it: its intent key is
// stored as "<principal>:<Idempotency-Key>", so keys are scoped per caller
// and another caller's GET answers 404.
//
// Idempotency-Key (draft-ietf-httpapi-idempotency-key-header) on POST
// /v1/sagas through server::IdempotencyLayer, scoped by principal: missing
// 400, in flight 409 (+ Retry-After), other payload 422, after completion
// the stored response (+ Idempotent-Replayed: true). When the key store has
// forgotten a key (TTL), the journal's intent key still dedupes: 200 with
// the existing saga, or 422 for other content.
//
// Driving: on SQLite (use_leases = false) this process is the one driver
// (the caller holds the DriverLock): a pool of `workers` threads drives the
// sagas the API submits, and a sweeper re-queues every unfinished saga
// (startup recovery, store hiccups, expired approvals). On PostgreSQL
// (use_leases = true) Engine::Work claims sagas with leases, beside other
// workers; the sweeper only drives sagas waiting on an approval.
//
// Cancel, pause and resume are the engine's durable requests (Engine::Cancel,
// Pause, Resume; server/control.cc): recorded in the store and honoured by
// whichever process drives the saga; 200 when carried out by the request,
// 202 when recorded for the process driving it (docs/server.md).
//
// Layout: handlers by resource (server/handlers.h) over the server's own
// request and response (server/http.h), routes in server/routes.cc, and
// the HTTP front (idem::http) in server/front.cc only.
//
// Thread safety: Start and Stop from one thread; the server serves requests
// from its own threads. Not copyable.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "preview_commit/token.h"
#include "saga/limits.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/clock.h"
#include "common/status.h"

namespace idem::server {

/// A caller allowed in, from the --auth file.
struct Principal {
  /// 1 to 64 bytes (common/principal_name.h, PrincipalNameProblem), unique
  /// after folding (NFKC + case fold): "maria" and "Maria" are one name.
  std::string name;
  std::string token_sha256;        ///< lower-case hex SHA-256 of the bearer token
  std::vector<std::string> roles;  ///< "agent", "approver", "operator", or a policy's ("finance")
};

/// Parses an auth document: [{"name": ..., "token_sha256": ..., "roles": [...]}, ...].
/// kInvalidArgument naming the place (`[1].roles[0]: unknown role "admin"`);
/// duplicate token hashes are errors, and so are names that fold alike
/// (CheckDistinctNames).
Result<std::vector<Principal>> ParsePrincipals(const std::string& json_text);

/// kInvalidArgument naming both entries (`<list>[2].name: "Maria" and
/// <list>[0].name "maria" are one name to idem ...`) when two names fold
/// alike (common/principal_name.h): they would count as two people toward a
/// quorum, or let a requester approve as another.
Status CheckDistinctNames(const std::vector<Principal>& principals, const std::string& list);

/// The principal whose bearer token is `token` (its SHA-256 compared in
/// constant time with every entry's), or nullptr.
const Principal* PrincipalForToken(const std::vector<Principal>& principals,
                                   const std::string& token);

/// Reads and parses an auth file. kNotFound when it cannot be read; refuses
/// (kFailedPrecondition) a file that group or others may write, and
/// (kInvalidArgument) one that lists no caller (`[]`).
Result<std::vector<Principal>> LoadPrincipals(const std::string& path);

/// The web UI at /ui (server/ui_routes.h; docs/server.md "Web UI").
struct UiOptions {
  bool enabled = true;
  int64_t session_idle_ms = 30LL * 60 * 1000;   ///< a session unused this long ends
  int64_t session_max_ms = 12LL * 3600 * 1000;  ///< and any session this long after sign-in
  size_t max_sessions = 10'000;                 ///< signed in at once; more: 503 at sign-in
  /// Cookies with the Secure attribute: set it when the front serves HTTPS
  /// (serve --tls-cert), or behind a TLS proxy (serve --ui-secure-cookie).
  bool secure_cookie = false;
  int64_t poll_ms = 250;  ///< how often an event stream looks for new journal entries
  /// Failed sign-ins one client address may make within the window; more
  /// are answered 429 with Retry-After (server/sign_in_limit.h).
  int sign_in_max_failures = 10;
  int64_t sign_in_window_ms = 60'000;
};

/// MCP over Streamable HTTP at /mcp (mcp/http.h; docs/mcp.md).
struct McpHttpOptions {
  bool enabled = true;
  std::vector<std::string> allowed_origins;  ///< besides loopback origins
  std::vector<std::string> allowed_hosts;    ///< Host names besides loopback and --listen's
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  ///< 0: an ephemeral port (see Server::port)
  std::vector<Principal> principals;
  /// Without principals the server refuses to start unless this is set, and
  /// then only on a loopback host; every caller is "anonymous" with both roles.
  bool insecure_no_auth = false;
  int workers = 4;          ///< sagas driven at once
  bool use_leases = false;  ///< PostgreSQL: Engine::Work with leases
  std::string owner;        ///< lease owner name (default: a fresh id)
  int64_t lease_ms = 30'000;
  int64_t poll_ms = 100;     ///< Engine::Work's wait between empty claims
  int64_t sweep_ms = 2'000;  ///< the sweeper's period
  /// Deprecated (server state lives in the journal's store, see
  /// storage/server_state.h): a SQLite file for the Idempotency-Key records
  /// and the spec registry, read only when `store` keeps no server state
  /// (Store::KeyRecords() or Specs() is nullptr, e.g. a test double).
  std::string state_path;
  int64_t idempotency_ttl_ms = 24LL * 3600 * 1000;
  int max_json_depth = 64;  ///< deeper: 400
  // ---- the HTTP front's bounds (http/options.h; docs/server.md "Limits")
  size_t max_body_bytes = 1 << 20;      ///< decoded body, any coding; larger: 413
  size_t max_header_bytes = 16 * 1024;  ///< request line + header fields; larger: 431
  size_t max_header_fields = 64;        ///< header lines; more: 431
  /// One deadline for a whole request, first byte to last body byte (for a
  /// connection's first request: from accept). Past it: closed.
  int64_t request_timeout_ms = 10'000;
  int write_timeout_s = 10;                ///< writing one response
  int keep_alive_timeout_s = 5;            ///< an idle kept-alive connection
  int keep_alive_max_count = 100;          ///< requests per connection
  size_t max_connections = 1024;           ///< open at once; more: 503 + close
  size_t max_connections_per_client = 64;  ///< per client IP address; more: 503
  size_t max_streams = 512;                ///< event streams open at once
  size_t max_streams_per_client = 32;      ///< per client IP address
  int http_threads = 8;                    ///< threads running handlers
  /// HTTPS (both or neither): a PEM certificate chain and its private key
  /// (owner-only); see http/options.h.
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Mints and checks commit tokens; not owned; required for approvals.
  const preview_commit::TokenSigner* signer = nullptr;
  Clock* clock = nullptr;  ///< nullptr: SystemClock::Get()
  /// Steps and sizes a submitted saga may have (saga/limits.h); past them
  /// POST /v1/sagas is 422 saga-too-large and nothing is written.
  SagaLimits limits;
  UiOptions ui;
  McpHttpOptions mcp;
};

class Server {
 public:
  /// Checks the options (auth, loopback, server state). `store` and `tools`
  /// are not owned and must outlive the server.
  /// kInvalidArgument for bad options; kFailedPrecondition for no auth
  /// without insecure_no_auth, or insecure_no_auth off loopback.
  static Result<std::unique_ptr<Server>> Create(storage::Store* store, const ToolRegistry* tools,
                                                ServerOptions options);
  ~Server();  ///< Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds, starts the drivers and the HTTP threads, returns once listening.
  /// kUnavailable when the address cannot be bound.
  Status Start();
  /// The bound port (after Start).
  int port() const;
  /// What the server's engine tells of each journal entry (metrics, logs,
  /// waiters): for jobs beside it that write entries (the drift job).
  std::function<void(const storage::JournalEntry&)> journal_observer() const;
  /// Graceful: stops accepting, lets running steps finish (sagas are left
  /// between steps for the next start), joins every thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::server
