#include "mcp/http.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <utility>

#include "saga/engine.h"
#include "server/auth.h"
#include "server/server.h"
#include "storage/store.h"

#include "http/stream.h"
#include "mcp/protocol.h"

namespace idem::mcp {
namespace {

using server::HttpRequest;
using server::HttpResponse;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A JSON-RPC error as the body of a refused HTTP request.
void RpcRefusal(HttpResponse& res, int status, int code, const std::string& message) {
  res.status = status;
  res.SetContent(Encode(Message::Error(std::nullopt, code, message)), "application/json");
}

void SendMessage(HttpResponse& res, const Message& m) {
  res.status = 200;
  res.SetContent(Encode(m), "application/json");
}

// "localhost", "127.0.0.1", "::1" and the like, without port or brackets.
bool LoopbackName(const std::string& host) {
  const std::string h = Lower(host);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0 || server::IsLoopback(h);
}

// The host part of "name:port", "[v6]:port" or "name".
std::string HostPart(const std::string& authority) {
  if (!authority.empty() && authority[0] == '[') {
    const size_t end = authority.find(']');
    return end == std::string::npos ? authority : authority.substr(1, end - 1);
  }
  const size_t colon = authority.find(':');
  return colon == std::string::npos ? authority : authority.substr(0, colon);
}

bool Accepts(const std::string& accept, const char* type) {
  return Lower(accept).find(type) != std::string::npos;
}

}  // namespace

HttpTransport::HttpTransport(std::function<Backend(const std::string&)> backend_for,
                             const server::Authenticator* auth, HttpOptions options)
    : backend_for_(std::move(backend_for)), auth_(auth), options_(std::move(options)) {}

HttpTransport::~HttpTransport() = default;

bool HttpTransport::OriginAllowed(const std::string& origin) const {
  for (const std::string& o : options_.allowed_origins) {
    if (Lower(o) == Lower(origin)) return true;
  }
  const std::string o = Lower(origin);
  for (const char* scheme : {"http://", "https://"}) {
    if (o.rfind(scheme, 0) != 0) continue;
    const std::string authority = o.substr(std::string(scheme).size());
    if (authority.find('/') != std::string::npos || authority.empty()) return false;
    return LoopbackName(HostPart(authority));
  }
  return false;
}

bool HttpTransport::HostAllowed(const std::string& host) const {
  if (host.empty()) return false;
  const std::string name = Lower(HostPart(host));
  if (LoopbackName(name)) return true;
  if (!options_.listen_host.empty() && name == Lower(options_.listen_host) &&
      options_.listen_host != "0.0.0.0" && options_.listen_host != "::") {
    return true;
  }
  for (const std::string& h : options_.allowed_hosts) {
    if (Lower(h) == name || Lower(h) == Lower(host)) return true;
  }
  return false;
}

std::vector<server::Route> HttpTransport::Routes() {
  return {
      {"POST", "/mcp", [this](const HttpRequest& req, HttpResponse& res) { Post(req, res); }},
      {"DELETE", "/mcp", [this](const HttpRequest& req, HttpResponse& res) { Delete(req, res); }},
      {"GET", "/mcp",
       [this](const HttpRequest& req, HttpResponse& res) {
         std::string principal;
         if (!Admit(req, res, &principal)) return;
         res.SetHeader("Allow", "POST, DELETE");
         RpcRefusal(res, 405, rpc_error::kInvalidRequest,
                    "Method not allowed: this server offers no server-to-client stream (GET)");
       }},
  };
}

bool HttpTransport::Admit(const HttpRequest& req, HttpResponse& res, std::string* principal) {
  if (req.HasHeader("Origin") && !OriginAllowed(req.Header("Origin"))) {
    RpcRefusal(res, 403, rpc_error::kInvalidRequest,
               "Forbidden: Origin " + req.Header("Origin") + " is not allowed");
    return false;
  }
  if (!HostAllowed(req.Header("Host"))) {
    RpcRefusal(res, 403, rpc_error::kInvalidRequest,
               "Forbidden: Host " + req.Header("Host") + " is not this server's");
    return false;
  }
  const server::Principal* p = auth_->Authorize(req, res, {server::kRoleAgent});
  if (p == nullptr) return false;
  *principal = p->name;
  if (req.HasHeader("MCP-Protocol-Version") &&
      !IsSupportedProtocolVersion(req.Header("MCP-Protocol-Version"))) {
    RpcRefusal(res, 400, rpc_error::kInvalidRequest,
               "Bad Request: unsupported MCP-Protocol-Version " +
                   req.Header("MCP-Protocol-Version") +
                   " (supported: 2025-11-25, 2025-06-18, "
                   "2025-03-26)");
    return false;
  }
  return true;
}

std::shared_ptr<Session> HttpTransport::Find(const HttpRequest& req, const std::string& principal,
                                             HttpResponse& res) {
  const std::string id = req.Header("Mcp-Session-Id");
  if (id.empty()) {
    RpcRefusal(res, 400, rpc_error::kInvalidRequest,
               "Bad Request: Mcp-Session-Id header is required (send initialize first)");
    return nullptr;
  }
  const int64_t now = NowMs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Forget sessions idle too long (their sagas stay in the store).
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      it =
          now - it->second.used_ms > options_.session_idle_ms ? sessions_.erase(it) : std::next(it);
    }
    auto it = sessions_.find(id);
    if (it != sessions_.end() && it->second.principal == principal) {
      it->second.used_ms = now;
      return it->second.session;
    }
    if (ended_.count(id) > 0 || it != sessions_.end()) {
      RpcRefusal(res, 404, rpc_error::kInvalidRequest, "Session not found");
      return nullptr;
    }
  }
  // Not known here: a session another server began (or this one before a
  // restart). Its saga says whether it is that caller's and still open.
  const size_t dot = id.find('.');
  std::shared_ptr<Session> adopted;
  if (dot != std::string::npos && dot > 0 && dot + 1 < id.size() && id.size() <= 300) {
    const std::string saga_id = id.substr(0, dot);
    const std::string nonce = id.substr(dot + 1);
    Backend backend = backend_for_(principal);
    auto rec = backend.store->LoadSaga(saga_id);
    if (rec.ok() && rec->summary.intent_key == principal + ":mcp-session:" + nonce &&
        rec->summary.state != "succeeded" && rec->summary.state != "compensated" &&
        rec->summary.state != "cancelled" && rec->summary.state != "failed") {
      SessionOptions so;
      so.session_id = nonce;
      so.key_scope = principal + ":";
      so.who = principal;
      so.page_size = options_.page_size;
      so.progress_interval_ms = options_.progress_interval_ms;
      adopted = std::make_shared<Session>(std::move(backend), so);
      const std::string version = req.HasHeader("MCP-Protocol-Version")
                                      ? req.Header("MCP-Protocol-Version")
                                      : kFallbackProtocolVersion;
      adopted->Adopt(version, saga_id);
    }
  }
  if (adopted == nullptr) {
    RpcRefusal(res, 404, rpc_error::kInvalidRequest, "Session not found");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = sessions_.emplace(id, Entry{adopted, principal, now});
  return it->second.session;
}

void HttpTransport::Post(const HttpRequest& req, HttpResponse& res) {
  std::string principal;
  if (!Admit(req, res, &principal)) return;
  const std::string accept = req.Header("Accept");
  if (!Accepts(accept, "application/json") || !Accepts(accept, "text/event-stream")) {
    return RpcRefusal(res, 406, rpc_error::kInvalidRequest,
                      "Not Acceptable: Accept must name application/json and text/event-stream");
  }
  if (!Accepts(req.Header("Content-Type"), "application/json")) {
    return RpcRefusal(res, 415, rpc_error::kInvalidRequest,
                      "Unsupported Media Type: the body must be application/json");
  }
  auto decoded = Decode(req.body);
  if (auto* err = std::get_if<DecodeError>(&decoded)) {
    res.status = 400;
    res.SetContent(Encode(Message::Error(err->id, err->error.code, err->error.message)),
                   "application/json");
    return;
  }
  Message m = std::get<Message>(std::move(decoded));
  if (m.is_request() && m.method == "initialize") {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sessions_.size() >= options_.max_sessions) {
        res.SetHeader("Retry-After", "60");
        return RpcRefusal(res, 503, rpc_error::kInternalError,
                          "Service Unavailable: too many MCP sessions");
      }
    }
    SessionOptions so;
    so.session_id = NewId("");
    so.key_scope = principal + ":";
    so.who = principal;
    so.begin_at_initialize = true;
    so.page_size = options_.page_size;
    so.progress_interval_ms = options_.progress_interval_ms;
    auto session = std::make_shared<Session>(backend_for_(principal), so);
    auto answer = session->Handle(m, nullptr);
    if (answer && answer->kind == Message::Kind::kResult) {
      // "<saga id>.<nonce>": any server on the store can take it up. A
      // session without a saga (no tool to begin one with) is "m.<nonce>",
      // known to this server only.
      const std::string saga_id = session->saga_id();
      const std::string id = (saga_id.empty() ? std::string("m") : saga_id) + "." + session->id();
      std::lock_guard<std::mutex> lock(mu_);
      sessions_[id] = Entry{session, principal, NowMs()};
      res.SetHeader("Mcp-Session-Id", id);
    }
    return SendMessage(res, *answer);
  }
  auto session = Find(req, principal, res);
  if (session == nullptr) return;
  if (!m.is_request()) {
    session->Handle(m, nullptr);
    res.status = 202;
    return;
  }
  const Json& meta = m.params.contains("_meta") ? m.params["_meta"] : Json();
  const bool progress = meta.is_object() && meta.contains("progressToken");
  if (!progress) {
    auto answer = session->Handle(m, nullptr);
    if (!answer) {  // cancelled while it ran: the client has stopped waiting
      res.status = 202;
      return;
    }
    return SendMessage(res, *answer);
  }
  // An SSE stream: progress notifications while the call runs, then the
  // response, then the stream ends.
  res.status = 200;
  res.SetHeader("Cache-Control", "no-cache");
  res.SetHeader("X-Accel-Buffering", "no");
  res.on_stream = [session, m = std::move(m)](http::Stream stream) {
    const Session::Notify notify = [stream](const Message& n) mutable {
      stream.Send(Encode(n), "message");
    };
    auto answer = session->Handle(m, notify);
    if (answer) stream.Send(Encode(*answer), "message");
    stream.Close();
  };
}

void HttpTransport::Delete(const HttpRequest& req, HttpResponse& res) {
  std::string principal;
  if (!Admit(req, res, &principal)) return;
  auto session = Find(req, principal, res);
  if (session == nullptr) return;
  const std::string id = req.Header("Mcp-Session-Id");
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.erase(id);
    ended_.insert(id);
  }
  // A session saga without calls ends with the session, in the store too.
  Backend backend = backend_for_(principal);
  const std::string saga_id = session->saga_id();
  auto rec = saga_id.empty() ? Result<storage::SagaRecord>(Status::NotFound(""))
                             : backend.store->LoadSaga(saga_id);
  if (rec.ok() && rec->steps.empty() && rec->summary.state == "open") {
    ControlRequest cr;
    cr.who = principal;
    cr.reason = "MCP session ended (DELETE /mcp) before any call";
    (void)backend.engine->Rollback(saga_id, cr);
  }
  res.status = 200;
  res.SetContent("", "");
}

}  // namespace idem::mcp
