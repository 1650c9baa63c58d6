#pragma once
// IdempotencyLayer: the Idempotency-Key semantics of the IETF draft
// (draft-ietf-httpapi-idempotency-key-header) and of Stripe, for a tool
// provider to mount on its own httplib::Server, so that a provider's handler
// runs at most once per key however often idem (or anyone) retries.
//
//   auto layer = IdempotencyLayer::Open("/var/lib/payments/idem.db", {});
//   server.Post("/charges", (*layer)->Wrap(ChargeHandler));
//
// Per request, Wrap's handler answers (errors are RFC 9457
// application/problem+json {type, title, status, detail}):
//
//   request                                            answer
//   -------------------------------------------------  -----------------------
//   no Idempotency-Key (when key_required)             400 ...key-missing
//   two headers, empty, > 255 chars, bytes outside     400 ...key-invalid
//     printable ASCII, or a malformed sf-string
//   first use of (scope, key)                          the handler runs; its
//                                                      response is stored
//   same key, other fingerprint                        422 ...key-reused
//   same key, first request still running              409 ...key-in-flight
//                                                      + Retry-After
//   same key, first request finished                   the stored response
//                                                      + Idempotent-Replayed: true
//   the key store fails before the handler ran         503 ...unavailable
//                                                      + Retry-After
//
// The key: the header's value as sent, or, when it is an RFC 8941 sf-string
// ("..." in double quotes), its unescaped content, so `abc` and `"abc"` name
// the same key.
//
// Scope: a key belongs to a caller. The scope is WrapOptions::scope(request)
// when set, else the value of WrapOptions::scope_header (Authorization by
// default; "" for no header), and is stored only as a SHA-256, so another
// caller's key never replays the first caller's response (OWASP API1) and no
// credential lands in the database. Callers without the header share one
// anonymous scope: authenticate before this layer where that matters.
//
// Fingerprint: SHA-256 over the method, the path, the query parameters
// (sorted) and the body: its canonical JSON (json_util.h: key order and
// whitespace do not matter) when it parses as JSON, else its raw bytes.
//
// What is stored (the Stripe rule): once the handler has begun, its response
// is stored, 5xx included: a 500 may follow an applied effect, so a retry
// must not run the handler again; it gets the same 500, which the client
// resolves through a status lookup. Two exceptions: a handler that answers
// 429 or 503 (WrapOptions::released_statuses) declares that it did nothing
// and asks for a later retry, so its claim is released and a retry runs the
// handler. A handler that throws is answered, and stored, as a 500 problem.
// Validation failures, 409s and 422s of this layer are never stored.
// The stored response is the status, the Content-Type and the body; other
// headers are not replayed, and a streamed body (set_content_provider) is not
// captured (a replay has an empty body), so wrapped handlers use set_content.
//
// Claims ("change instead of check"): the first request INSERTs an in_flight
// row in its own transaction, before the handler runs; the primary key
// (scope, key) makes exactly one concurrent request win, in one process or
// several sharing the file. A claim is a lease: while the handler runs, the
// layer's one background renewer renews every live claim of the layer (one
// store transaction per tick, every lock_timeout_ms / 3), so a handler that
// runs far longer than lock_timeout_ms keeps its claim and a retry gets 409
// the whole time. A claim not renewed for Options::lock_timeout_ms (its
// process crashed or was killed) is abandoned and a retry with the same
// fingerprint takes it over and runs the handler. The trade-off: a holder
// stalled longer than lock_timeout_ms (SIGSTOP, a renewer blocked on the
// store) loses its claim; its handler may then run twice, and its late
// result is discarded (fenced by the claim token): the stalled request's
// own client still gets that late response, every later retry gets the
// taker's stored response.
//
// Expiry (published policy): a finished record older than Options::ttl_ms
// (24 h by default) is forgotten; the key then starts a new request.
// PurgeExpired deletes such rows.
//
// Storage (storage/server_state.h): the records live in a
// storage::KeyRecordStore. Open gives the layer a SQLite file of its own (a
// SqliteStore: the journal's schema with its `idempotency` table; the
// example providers mount it so); Create puts it on a given store, e.g. the
// journal's (Store::KeyRecords()), which is how `idem serve` shares its keys
// with every other server on the same database.
//
// Durability: the claim and the stored response are each committed before
// the handler runs and before the response is sent (Open: SQLite in WAL mode
// with synchronous=FULL by default).
//
// Thread safety: every method, and every handler Wrap returns, may be called
// from many threads at once. The layer must outlive the handlers Wrap returns.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

#include "storage/server_state.h"

#include "common/clock.h"
#include "common/status.h"

namespace idem::storage {
class Store;  // storage/store.h
}  // namespace idem::storage

namespace idem::server {

/// Problem types (RFC 9457 "type") of the layer's own answers. idem's HTTP
/// tool recognises the last two by their suffix.
inline constexpr const char* kProblemKeyMissing = "urn:idem:problem:idempotency-key-missing";
inline constexpr const char* kProblemKeyInvalid = "urn:idem:problem:idempotency-key-invalid";
inline constexpr const char* kProblemUnavailable = "urn:idem:problem:idempotency-store-unavailable";
inline constexpr const char* kProblemHandlerFailed = "urn:idem:problem:handler-failed";
inline constexpr const char* kProblemKeyInFlight = "urn:idem:problem:idempotency-key-in-flight";
inline constexpr const char* kProblemKeyReused = "urn:idem:problem:idempotency-key-reused";

/// The longest key accepted (Stripe's limit).
inline constexpr size_t kMaxIdempotencyKeyLength = 255;

struct IdempotencyOptions {
  /// A claim not renewed for this long (its holder died) may be taken over
  /// by a retry: how long a key stays 409 after a crash. The layer renews
  /// its live claims every lock_timeout_ms / 3.
  int64_t lock_timeout_ms = 5'000;
  /// A finished record older than this is forgotten (>= 24 h, like Stripe).
  int64_t ttl_ms = 24LL * 3600 * 1000;
  /// Retry-After (seconds) on a 409 and a 503.
  int retry_after_s = 1;
  /// Open only: PRAGMA synchronous: "FULL" or "EXTRA" survive a power loss;
  /// "NORMAL".
  std::string synchronous = "FULL";
  /// Open only: how long a write waits for another process's lock.
  int busy_timeout_ms = 5'000;
  /// Judges lock timeouts and expiry; nullptr: SystemClock::Get(). Not
  /// owned; must outlive the layer.
  Clock* clock = nullptr;
};

struct WrapOptions {
  /// Answer 400 to a request without a key. When false, such a request runs
  /// the handler unguarded.
  bool key_required = true;
  /// The header naming the caller; "" puts every caller in one scope.
  std::string scope_header = "Authorization";
  /// When set, the caller's scope (overrides scope_header). Must not throw.
  std::function<std::string(const httplib::Request&)> scope;
  /// Handler statuses that mean "nothing was done, retry later": the claim is
  /// released instead of the response stored.
  std::vector<int> released_statuses = {429, 503};
};

/// A request as the layer sees it, free of any HTTP library: what Run
/// fingerprints and keys on (Wrap builds one from an httplib::Request).
struct IdempotentRequest {
  std::string method;
  std::string path;
  std::multimap<std::string, std::string> params;  ///< query parameters, decoded
  std::vector<std::string> keys;                   ///< every Idempotency-Key header value, as sent
  std::string scope;  ///< the caller's raw scope text ("" for anonymous)
  std::string body;
};

/// A response as the layer writes it (and as a handler run by Run writes it).
/// Only status, content_type and body are stored and replayed.
struct IdempotentResponse {
  int status = 200;
  std::string content_type;  ///< "" for none
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  ///< others (Retry-After, ...)
};

/// A stored record, for tests and diagnostics.
using IdempotencyRecord = storage::KeyRecord;

class IdempotencyLayer {
 public:
  /// Opens (creating if needed) the SQLite key store at `sqlite_path`.
  /// kInvalidArgument: bad options or an empty path / ":memory:".
  /// kFailedPrecondition: the file cannot run in WAL mode.
  /// kUnavailable: locked by another connection past the busy timeout.
  /// kInternal: another SQLite failure.
  static Result<std::unique_ptr<IdempotencyLayer>> Open(const std::string& sqlite_path,
                                                        IdempotencyOptions options = {});

  /// The layer over `records` (not owned; must outlive the layer), e.g. the
  /// journal's store's KeyRecords(). kInvalidArgument: no records or bad
  /// options (synchronous and busy_timeout_ms are the store's, not read).
  static Result<std::unique_ptr<IdempotencyLayer>> Create(storage::KeyRecordStore* records,
                                                          IdempotencyOptions options = {});

  ~IdempotencyLayer();
  IdempotencyLayer(const IdempotencyLayer&) = delete;
  IdempotencyLayer& operator=(const IdempotencyLayer&) = delete;
  IdempotencyLayer(IdempotencyLayer&&) = delete;
  IdempotencyLayer& operator=(IdempotencyLayer&&) = delete;

  /// `handler` guarded by Idempotency-Key (see the file comment).
  httplib::Server::Handler Wrap(httplib::Server::Handler handler, WrapOptions options = {});

  /// The core of Wrap, for servers on another HTTP library: answers `req`
  /// into `res` as the file comment says, running `handler` at most once per
  /// (scope, key). `key_required` and `released_statuses` as in WrapOptions.
  /// When the handler ran and returned, `res` is exactly what it wrote.
  void Run(const IdempotentRequest& req, const std::function<void(IdempotentResponse&)>& handler,
           bool key_required, const std::vector<int>& released_statuses, IdempotentResponse& res);

  /// The record of `key` for a request with `scope_text` (the raw scope: the
  /// header value or the scope function's answer). kNotFound when absent.
  Result<IdempotencyRecord> Find(const std::string& scope_text, const std::string& key);

  /// Deletes finished records older than ttl_ms; returns how many.
  Result<int64_t> PurgeExpired();

 private:
  IdempotencyLayer(std::unique_ptr<storage::Store> owned, storage::KeyRecordStore* records,
                   IdempotencyOptions options);

  // The renewer: renews every claim in live_ each tick until stop_.
  void RenewLoop();
  uint64_t Hold(storage::KeyLease lease);  // adds to live_; returns its id
  void Drop(uint64_t id);                  // removes from live_

  std::unique_ptr<storage::Store> owned_;  // Open's SQLite file; null for Create
  storage::KeyRecordStore* records_;       // owned_'s, or Create's
  IdempotencyOptions options_;
  Clock* clock_;

  std::mutex renew_mu_;
  std::condition_variable renew_cv_;
  bool stop_ = false;                           // guarded by renew_mu_
  uint64_t next_id_ = 0;                        // guarded by renew_mu_
  std::map<uint64_t, storage::KeyLease> live_;  // guarded by renew_mu_
  std::thread renewer_;  // started by the constructor, joined by the destructor
};

}  // namespace idem::server
