#include "examples/payments/http_providers.h"

#include <chrono>
#include <csignal>
#include <optional>

#include "common/json_util.h"

namespace idem::payments {
namespace {

void Answer(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void Problem(httplib::Response& res, int status, const std::string& type,
             const std::string& detail) {
  res.status = status;
  res.set_content(Json{{"type", "https://idem.example/problems/" + type},
                       {"title", type},
                       {"status", status},
                       {"detail", detail}}
                      .dump(),
                  "application/problem+json");
}

/// The request body as a JSON object, or nullopt (answered 400).
std::optional<Json> Body(const httplib::Request& req, httplib::Response& res) {
  Json args = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!args.is_object()) {
    Problem(res, 400, "bad-body", "the body must be a JSON object");
    return std::nullopt;
  }
  return args;
}

}  // namespace

Result<std::unique_ptr<HttpPaymentProviders>> HttpPaymentProviders::Create(
    const ProviderOptions& options) {
  std::unique_ptr<HttpPaymentProviders> p(new HttpPaymentProviders());
  IDEM_RETURN_IF_ERROR(RegisterPaymentTools(p->tools_, options));
  for (const std::string& name : PaymentToolNames()) {
    Tool* tool = p->tools_.Find(name);
    std::string path = "/" + name;
    path[path.find('.')] = '/';
    p->server_.Post(path, [tool, name](const httplib::Request& req, httplib::Response& res) {
      const std::string key = req.get_header_value("Idempotency-Key");
      if (key.empty()) return Problem(res, 400, "key-missing", "Idempotency-Key is required");
      auto args = Body(req, res);
      if (!args) return;
      ToolCall call{name, key, *args, 1, "", "", req.get_header_value("If-Match")};
      ToolOutcome out = tool->Invoke(call);
      switch (out.kind) {
        case OutcomeKind::kSucceeded: {
          Json body = out.result.is_object() ? out.result : Json{{"result", out.result}};
          if (!out.external_ref.empty()) body["external_ref"] = out.external_ref;
          return Answer(res, 200, body);
        }
        case OutcomeKind::kFailed:
          if (out.retryable) {
            res.set_header("Retry-After", "1");
            return Problem(res, 503, "unavailable", out.error);
          }
          return Problem(res, 422, "rejected", out.error);
        case OutcomeKind::kUnknown:
          return Problem(res, 500, "unknown", out.error);
      }
    });
    p->server_.Get(path + "/status/(.+)", [tool](const httplib::Request& req,
                                                 httplib::Response& res) {
      LookupOutcome look = tool->Lookup(req.matches[1].str());
      if (look.kind == LookupKind::kApplied) {
        return Answer(
            res, 200,
            {{"status", "applied"}, {"result", look.result}, {"external_ref", look.external_ref}});
      }
      if (look.kind == LookupKind::kNotApplied) {
        return Answer(res, 404, {{"status", "not_applied"}});
      }
      Problem(res, 503, "lookup-failed", look.error);
    });
    if (!tool->info().has_preview) continue;
    p->server_.Post(path + "/preview",
                    [tool, name](const httplib::Request& req, httplib::Response& res) {
                      auto args = Body(req, res);
                      if (!args) return;
                      PreviewOutcome pv = tool->Preview(ToolCall{name, "", *args});
                      if (!pv.ok) return Problem(res, 422, "rejected", pv.error);
                      Answer(res, 200,
                             {{"summary", pv.summary},
                              {"changes", pv.changes},
                              {"resource_version", pv.resource_version}});
                    });
  }
  p->server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    Answer(res, 200, {{"ok", true}});
  });
  return p;
}

HttpPaymentProviders::~HttpPaymentProviders() { Stop(); }

Result<int> HttpPaymentProviders::Start(const std::string& host, int port) {
  std::signal(SIGPIPE, SIG_IGN);
  int bound = port == 0 ? server_.bind_to_any_port(host) : port;
  if (bound <= 0 || (port != 0 && !server_.bind_to_port(host, port))) {
    return Status::Unavailable("payment providers: cannot bind " + host + ":" +
                               std::to_string(port));
  }
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  for (int i = 0; i < 5000 && !server_.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_.is_running()) return Status::Internal("payment providers: the server did not start");
  return bound;
}

void HttpPaymentProviders::Stop() {
  server_.stop();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace idem::payments
