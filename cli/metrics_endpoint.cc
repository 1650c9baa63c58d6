// MetricsEndpoint (cli/metrics_endpoint.h).

#include "cli/metrics_endpoint.h"

#include <exception>
#include <utility>

namespace idem::cli {

Status ParseListen(const std::string& text, const std::string& flag, std::string* host, int* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument(flag + ": expected HOST:PORT, got " + text);
  }
  *host = text.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  try {
    size_t used = 0;
    *port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1 || *port < 0 || *port > 65535) {
      throw std::invalid_argument("port");
    }
  } catch (const std::exception&) {
    return Status::InvalidArgument(flag + ": bad port in " + text);
  }
  return Status::Ok();
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen,
                                                                observability::Metrics* metrics,
                                                                storage::Store* store) {
  std::unique_ptr<MetricsEndpoint> ep(new MetricsEndpoint());
  http::ServerOptions so;
  IDEM_RETURN_IF_ERROR(ParseListen(listen, "--metrics-listen", &so.host, &so.port));
  so.worker_threads = 1;
  ep->host_ = so.host;
  auto handler = [metrics, store](const http::Request& req, http::Response& res) {
    if (req.method != "GET") {
      res.status = 405;
      res.SetHeader("Allow", "GET");
      res.SetContent("method not allowed\n", "text/plain; charset=utf-8");
    } else if (req.path == "/metrics") {
      res.SetContent(metrics->Render(store), "text/plain; version=0.0.4; charset=utf-8");
    } else if (req.path == "/healthz") {
      res.SetContent("ok\n", "text/plain; charset=utf-8");
    } else {
      res.status = 404;
      res.SetContent("not found: /metrics and /healthz only\n", "text/plain; charset=utf-8");
    }
  };
  auto server = http::Server::Create(so, handler);
  if (!server.ok()) return server.status();
  ep->server_ = std::move(server).value();
  IDEM_RETURN_IF_ERROR(ep->server_->Start());
  return ep;
}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

int MetricsEndpoint::port() const { return server_ ? server_->port() : 0; }

void MetricsEndpoint::Stop() {
  if (server_) server_->Stop();
}

}  // namespace idem::cli
