#pragma once
// The payment tools of providers.h as a real HTTP server on loopback: one
// cpp-httplib server serves the five tools, each route calling the
// in-process tool over the same SQLite ledger. idem reaches them through
// HTTP tools (tools/http_tool.h; the tools file tools.http.json), so a lost
// answer happens on a real socket.
//
// Routes (TOOL = PROVIDER.OPERATION, e.g. payments.authorize):
//   POST /PROVIDER/OPERATION               Invoke; body: the args; header
//                                          Idempotency-Key (required)
//   GET  /PROVIDER/OPERATION/status/{key}  status lookup
//   POST /PROVIDER/OPERATION/preview       preview (payments.capture)
//   GET  /healthz                          200 {"ok": true}
// Answers, as tools/http_tool.cc classifies them:
//   succeeded 200 (the result, with "external_ref"); failed, retryable 503
//   with Retry-After: 1; failed 422 problem+json; unknown 500 (the client
//   resolves it by the status lookup); lookup 200 {"status": "applied",
//   "result"} or 404 {"status": "not_applied"}, 503 when it fails; preview
//   200 {"summary", "changes", "resource_version"} or 422; a commit without
//   Idempotency-Key or with a body that is not a JSON object 400.
//
// Thread safety: Start and Stop from any thread but a handler's; the
// handlers run on httplib's pool and call the thread-safe tools.

#include <memory>
#include <string>
#include <thread>

#include <httplib.h>

#include "examples/payments/providers.h"
#include "tools/tool.h"

#include "common/status.h"

namespace idem::payments {

class HttpPaymentProviders {
 public:
  /// Opens the ledger, registers the tools and mounts the routes.
  /// InvalidArgument for a bad fault; Unavailable/Internal for the ledger.
  static Result<std::unique_ptr<HttpPaymentProviders>> Create(const ProviderOptions& options);
  ~HttpPaymentProviders();  ///< Stop()s
  HttpPaymentProviders(const HttpPaymentProviders&) = delete;
  HttpPaymentProviders& operator=(const HttpPaymentProviders&) = delete;

  /// Binds `host:port` (0: an ephemeral port), serves on a thread of its
  /// own and answers the port once the server accepts.
  Result<int> Start(const std::string& host, int port);
  /// Stops serving and joins the thread; idempotent.
  void Stop();

 private:
  HttpPaymentProviders() = default;
  ToolRegistry tools_;
  httplib::Server server_;
  std::thread thread_;
};

}  // namespace idem::payments
