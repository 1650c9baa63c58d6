#pragma once
// HTTP tools: tools served by a provider's HTTP API, declared in a tools file.
//
//   {"tools": [{"name": "payments.charge", "effect": "write",
//               "base_url": "http://127.0.0.1:8091",
//               "commit":  {"method": "POST", "path": "/charges"},
//               "status":  {"method": "GET",  "path": "/charges/status/{key}"},
//               "preview": {"method": "POST", "path": "/charges/preview"},
//               "honours_keys": true, "timeout_ms": 2000, "connect_timeout_ms": 500}]}
//
// Fields: "name", "effect" (read|idempotent|write|irreversible), "base_url"
// (http://host[:port][/prefix] or https://host[:port][/prefix]) and "commit"
// are required; "status", "preview", "honours_keys" (false), "description",
// "headers" (extra request headers, e.g. an Authorization for the provider),
// "timeout_ms" (10000), "connect_timeout_ms" (1000), "key_retention" (how
// long the provider keeps idempotency keys, "24h" or seconds; the spec
// checker refuses steps whose waits outlive it, saga/step_key.h), for
// https, "ca_file", "client_cert" and "client_key" (tools/http_tls.h:
// certificates are always verified, chain and host name) and "completion"
// are optional: {"mode": "done"|"accepted", "window": "2h", "first_check":
// "5s", "max_check": "5m"} says what a 2xx means (saga/completion.h);
// "accepted" needs "status", and durations are digits and s|m|h|d. Unknown
// fields are errors, so a typo never silently drops a setting. A path starts
// with "/" and may contain "{key}", replaced by the percent-encoded
// idempotency key. Methods: commit POST, PUT, PATCH or DELETE (default POST);
// status GET; preview POST, PUT or PATCH (default POST).
//
// Invoke sends the call's args as a JSON body with the headers
//   Idempotency-Key: <key>          (the raw key, as Stripe reads it)
//   Idempotency-Attempt: <attempt>
//   If-Match: <expected_version>    (verbatim; only when set)
// and classifies the answer. The rule: only an answer that proves the effect
// did not happen is "failed"; anything that leaves it open is "unknown", which
// idem resolves with Lookup and never turns into a blind re-call.
//
//   answer                                       outcome
//   -------------------------------------------  ---------------------------
//   202, completion mode "accepted"              accepted: the provider finishes
//                                                later (reference = "external_ref"
//                                                or "id" of the body; Retry-After
//                                                seconds: the first check's delay)
//   2xx                                          succeeded (result = body JSON,
//                                                external_ref = "external_ref"
//                                                or "id" of the body)
//   412; 409 whose problem type ends in "stale"  failed, stale
//   409 with Retry-After, or problem type        unknown: an earlier request
//     ending in "in-flight"                      under this key is still running
//   422 whose problem type ends in               unknown: an earlier request
//     "idempotency-key-reused"                   under this key exists
//   408, 425, 429, 503                           failed, retryable
//   other 3xx and 4xx (400, 402, 404, 409, 422)  failed, not retryable
//   501                                          failed, not retryable
//   500, 502, 504, other 5xx, anything else      unknown (the provider may
//                                                have applied it first)
//   no connection (refused, connect timeout,     failed, retryable: the
//     unresolvable host): nothing was sent       request never left
//   TLS: the certificate fails verification or   failed, not retryable: the
//     the server refuses the handshake           request was not read
//   TLS: the handshake is cut with no alert      failed, retryable
//   write error, read timeout, connection        unknown
//     closed or reset after the request left,
//     a response body over 8 MiB (abandoned)
//
// Timeouts: timeout_ms bounds each wait for the socket to become readable or
// writable (cpp-httplib's read/write timeouts), not the whole exchange.
//
// Lookup (only with "status") asks GET status.path and answers:
//   200 {"status": "applied"|"succeeded", "result": ...}   applied
//   200 {"status": "failed", "error": ...}, mode accepted  failed (a definite refusal)
//   200 {"status": "not_found"|"not_applied"|"failed"}     not applied
//   200 {"status": "pending"|"processing"|"in_progress"}   pending (not an error)
//   404 with a JSON body                                   not applied
//   anything else (a bare 404 included, so that a mistyped status path never
//   reads as "not applied"; "in_flight")                  error
//
// Preview (only with "preview") sends the args like Invoke, without the
// idempotency headers (a preview has no effect, and a provider that guards
// its commit path with keys must not see the key twice), and reads a 200
// {"summary": "...", "changes": {...}, "resource_version": "..."}.
//
// Connections: a tool keeps up to 64 connections to its provider open
// between calls (HTTP/1.1 keep-alive; for https, no handshake per call) and
// uses one again only if it idled less than 2 s, well inside the 5 s after
// which common servers close idle ones; a connection the server closed is
// noticed before the request is written and replaced. The outcome rules
// above are the same on a kept connection, except that a failed read or
// write there is always "unknown" (the server may have read the request;
// it is never read as a TLS refusal, which only a new handshake can show).
//
// Thread safety: an HTTP tool may be invoked from several threads at once;
// each exchange holds its connection alone. No exception leaves Invoke,
// Lookup or Preview.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// One endpoint of an HTTP tool.
struct HttpEndpoint {
  std::string method;  ///< "POST"
  std::string path;    ///< "/charges/status/{key}"; starts with "/"
};

/// A parsed tool declaration (one element of "tools").
struct HttpToolConfig {
  /// name, effect, honours_keys, description; has_status and has_preview
  /// follow whether `status` and `preview` are set.
  ToolInfo info;
  std::string host;         ///< "127.0.0.1", "localhost", "::1"
  int port = 80;            ///< 1..65535 (https: 443 unless given)
  bool tls = false;         ///< an https base_url
  std::string ca_file;      ///< https: PEM CAs to trust; "": the system store
  std::string client_cert;  ///< https: mutual TLS certificate (PEM), or ""
  std::string client_key;   ///< https: its private key (PEM, 0600), or ""
  std::string base_path;    ///< "" or a prefix like "/api" (no trailing "/")
  HttpEndpoint commit;
  HttpEndpoint status;                         ///< path empty: no status lookup
  HttpEndpoint preview;                        ///< path empty: no preview
  std::map<std::string, std::string> headers;  ///< extra request headers
  int64_t timeout_ms = 10'000;                 ///< 1..600000
  int64_t connect_timeout_ms = 1'000;          ///< 1..60000
};

/// Parses a tools document ({"tools": [...]}). Errors are kInvalidArgument
/// naming the place: `tools[1].commit.path: must start with "/"` (kNotFound
/// or kFailedPrecondition for a TLS file, see tools/http_tls.h). Relative
/// TLS file paths are taken from `base_dir` ("": the working directory).
Result<std::vector<HttpToolConfig>> ParseHttpTools(const Json& doc,
                                                   const std::string& base_dir = "");

/// A tool that calls the endpoints of `config` (see the file comment).
/// kInvalidArgument when the config would not pass ParseHttpTools.
Result<std::unique_ptr<Tool>> NewHttpTool(HttpToolConfig config);

/// Reads a tools document and registers every tool in `registry`.
/// `path_or_json` is the document itself when its first non-blank character
/// is "{", otherwise a file path (then errors start with the path:
/// `tools.json: tools[0].name: ...`). All or nothing: on any error (bad
/// document, a name already in `registry`) nothing is registered.
/// kInvalidArgument for a bad document, kNotFound for an unreadable file,
/// kConflict for a name registered twice.
Status LoadHttpTools(const std::string& path_or_json, ToolRegistry* registry);

}  // namespace idem
