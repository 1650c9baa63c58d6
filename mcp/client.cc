#include "mcp/client.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace idem::mcp {

Client::Client(std::unique_ptr<ClientTransport> transport, ClientOptions options)
    : transport_(std::move(transport)), options_(std::move(options)) {}

Client::~Client() { Close(); }

Result<std::unique_ptr<Client>> Client::Connect(std::unique_ptr<ClientTransport> transport,
                                                ClientOptions options) {
  std::unique_ptr<Client> client(new Client(std::move(transport), std::move(options)));
  Client* self = client.get();
  TransportSinks sinks;
  sinks.on_message = [self](const Message& m) { self->OnMessage(m); };
  sinks.on_closed = [self](const std::string& reason) { self->OnClosed(reason); };
  IDEM_RETURN_IF_ERROR(self->transport_->Start(std::move(sinks)));
  Status init = self->Initialize();
  if (!init.ok()) {
    self->Close();
    return init;
  }
  return client;
}

Status Client::Initialize() {
  const std::string where = transport_->Describe();
  Json params = {
      {"protocolVersion", kLatestProtocolVersion},
      {"capabilities", Json::object()},
      {"clientInfo", {{"name", options_.client_name}, {"version", options_.client_version}}}};
  CallResult r = Request("initialize", std::move(params), options_.initialize_timeout_ms);
  if (r.kind == CallResult::Kind::kRpcError) {
    return Status::FailedPrecondition(where + ": initialize refused: " + r.error.message);
  }
  if (r.kind != CallResult::Kind::kResult) {
    return Status::Unavailable(where + ": initialize: " + r.reason);
  }
  if (!r.result.is_object() || !r.result.contains("protocolVersion") ||
      !r.result["protocolVersion"].is_string()) {
    return Status::FailedPrecondition(where + ": initialize: the answer has no protocolVersion");
  }
  const std::string version = r.result["protocolVersion"].get<std::string>();
  const auto& ok = SupportedProtocolVersions();
  if (std::find(ok.begin(), ok.end(), version) == ok.end()) {
    return Status::FailedPrecondition(where + ": the server answered protocol version \"" +
                                      version +
                                      "\"; idem speaks 2025-11-25, 2025-06-18 and 2025-03-26");
  }
  protocol_version_ = version;
  if (r.result.contains("serverInfo") && r.result["serverInfo"].is_object()) {
    server_info_ = r.result["serverInfo"];
  }
  if (r.result.contains("capabilities") && r.result["capabilities"].is_object()) {
    server_capabilities_ = r.result["capabilities"];
  }
  transport_->SetProtocolVersion(version);
  SendResult sent = transport_->Send(Message::Notification("notifications/initialized"),
                                     options_.initialize_timeout_ms);
  if (!sent.ok()) {
    return Status::Unavailable(where + ": notifications/initialized: " + sent.error);
  }
  return Status::Ok();
}

CallResult Client::Request(const std::string& method, Json params, int64_t timeout_ms) {
  auto pending = std::make_shared<Pending>();
  int64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      CallResult r;
      r.kind = CallResult::Kind::kNotSent;
      r.reason = transport_->Describe() + " is closed: " + closed_reason_;
      return r;
    }
    id = next_id_++;
    pending_[id] = pending;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  SendResult sent = transport_->Send(Message::Request(id, method, std::move(params)), timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  if (!sent.ok() && !pending->done) {
    pending_.erase(id);
    CallResult r;
    r.kind = sent.kind == SendResult::Kind::kNotSent ? CallResult::Kind::kNotSent
                                                     : CallResult::Kind::kUnknown;
    r.reason = method + " to " + transport_->Describe() + ": " + sent.error;
    return r;
  }
  cv_.wait_until(lock, deadline, [&] { return pending->done; });
  pending_.erase(id);
  if (pending->done) return pending->result;
  lock.unlock();
  // The deadline passed: cancel it (the server may have acted already).
  (void)transport_->Send(
      Message::Notification("notifications/cancelled",
                            {{"requestId", id}, {"reason", "the client's deadline passed"}}),
      1'000);
  CallResult r;
  r.kind = CallResult::Kind::kUnknown;
  r.reason = method + " to " + transport_->Describe() + ": no answer within " +
             std::to_string(timeout_ms) + " ms";
  return r;
}

void Client::OnMessage(const Message& m) {
  if (m.is_response()) {
    if (!m.id || !std::holds_alternative<int64_t>(*m.id)) return;  // not one of ours
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(std::get<int64_t>(*m.id));
    if (it == pending_.end() || it->second->done) return;  // late or repeated: ignored
    CallResult& r = it->second->result;
    if (m.kind == Message::Kind::kResult) {
      r.kind = CallResult::Kind::kResult;
      r.result = m.result;
    } else {
      r.kind = CallResult::Kind::kRpcError;
      r.error = m.error;
    }
    it->second->done = true;
    cv_.notify_all();
    return;
  }
  if (m.is_request()) {
    Message answer = m.method == "ping"
                         ? Message::Result(*m.id, Json::object())
                         : Message::Error(*m.id, rpc_error::kMethodNotFound,
                                          "idem's MCP client does not offer " + m.method);
    (void)transport_->Send(answer, options_.request_timeout_ms);
    return;
  }
  // Notifications (progress, logging, list_changed): nothing idem acts on.
}

void Client::OnClosed(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  closed_reason_ = reason;
  for (auto& [id, p] : pending_) {
    if (p->done) continue;
    p->done = true;
    p->result.kind = CallResult::Kind::kUnknown;
    p->result.reason = transport_->Describe() + " closed with the request in flight: " + reason;
  }
  cv_.notify_all();
}

void Client::Close() {
  transport_->Close();
  OnClosed("closed by idem");
}

bool Client::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

Result<std::vector<Json>> Client::ListTools() {
  std::vector<Json> tools;
  std::string cursor;
  for (int page = 0; page < 1000; ++page) {
    Json params = Json::object();
    if (!cursor.empty()) params["cursor"] = cursor;
    CallResult r = Request("tools/list", params, options_.request_timeout_ms);
    const std::string where =
        transport_->Describe() + ": tools/list page " + std::to_string(page + 1);
    if (r.kind == CallResult::Kind::kRpcError) {
      return Status::FailedPrecondition(where + ": " + r.error.message);
    }
    if (r.kind != CallResult::Kind::kResult) return Status::Unavailable(where + ": " + r.reason);
    if (!r.result.is_object() || !r.result.contains("tools") || !r.result["tools"].is_array()) {
      return Status::FailedPrecondition(where + ": the answer has no \"tools\" array");
    }
    for (const Json& t : r.result["tools"]) tools.push_back(t);
    if (!r.result.contains("nextCursor") || r.result["nextCursor"].is_null()) return tools;
    if (!r.result["nextCursor"].is_string()) {
      return Status::FailedPrecondition(where + ": nextCursor is not a string");
    }
    cursor = r.result["nextCursor"].get<std::string>();
  }
  return Status::FailedPrecondition(transport_->Describe() + ": tools/list: more than 1000 pages");
}

CallResult Client::CallTool(const std::string& name, const Json& arguments, const Json& meta,
                            int64_t timeout_ms) {
  Json params = {{"name", name}, {"arguments", arguments}};
  if (meta.is_object() && !meta.empty()) params["_meta"] = meta;
  return Request("tools/call", std::move(params), timeout_ms);
}

Status Client::Ping() {
  CallResult r = Request("ping", Json::object(), options_.request_timeout_ms);
  if (r.kind == CallResult::Kind::kResult) return Status::Ok();
  if (r.kind == CallResult::Kind::kRpcError) {
    return Status::FailedPrecondition(transport_->Describe() + ": ping: " + r.error.message);
  }
  return Status::Unavailable(transport_->Describe() + ": ping: " + r.reason);
}

}  // namespace idem::mcp
