#include "mcp/jsonrpc.h"

#include <utility>

namespace idem::mcp {

Json RequestIdToJson(const RequestId& id) {
  if (const auto* n = std::get_if<int64_t>(&id)) return *n;
  return std::get<std::string>(id);
}

std::string RequestIdText(const RequestId& id) { return RequestIdToJson(id).dump(); }

Message Message::Request(RequestId id, std::string method, Json params) {
  Message m;
  m.kind = Kind::kRequest;
  m.id = std::move(id);
  m.method = std::move(method);
  m.params = std::move(params);
  return m;
}

Message Message::Notification(std::string method, Json params) {
  Message m;
  m.kind = Kind::kNotification;
  m.method = std::move(method);
  m.params = std::move(params);
  return m;
}

Message Message::Result(RequestId id, Json result) {
  Message m;
  m.kind = Kind::kResult;
  m.id = std::move(id);
  m.result = std::move(result);
  return m;
}

Message Message::Error(std::optional<RequestId> id, int code, std::string message,
                       std::optional<Json> data) {
  Message m;
  m.kind = Kind::kError;
  m.id = std::move(id);
  m.error = RpcError{code, std::move(message), std::move(data)};
  return m;
}

namespace {

DecodeError Invalid(std::string why, std::optional<RequestId> id = std::nullopt) {
  return DecodeError{RpcError{rpc_error::kInvalidRequest, std::move(why), std::nullopt},
                     std::move(id)};
}

// An id as MCP allows it: a string or an integer.
std::optional<RequestId> ReadId(const Json& id) {
  if (id.is_string()) return RequestId(id.get<std::string>());
  if (id.is_number_integer()) return RequestId(id.get<int64_t>());
  if (id.is_number_unsigned() && id.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
    return RequestId(static_cast<int64_t>(id.get<uint64_t>()));
  }
  return std::nullopt;
}

}  // namespace

std::variant<Message, DecodeError> DecodeValue(const Json& v) {
  if (v.is_array()) return Invalid("batches are not supported (MCP 2025-06-18 and later)");
  if (!v.is_object()) return Invalid("a message is a JSON object");
  auto version = v.find("jsonrpc");
  if (version == v.end() || !version->is_string() || version->get<std::string>() != "2.0") {
    return Invalid("\"jsonrpc\" must be \"2.0\"");
  }
  std::optional<RequestId> id;
  auto id_it = v.find("id");
  bool has_id = id_it != v.end();
  if (has_id && !id_it->is_null()) {
    id = ReadId(*id_it);
    if (!id) return Invalid("\"id\" must be a string or an integer");
  }
  auto method = v.find("method");
  auto result = v.find("result");
  auto error = v.find("error");

  if (method != v.end()) {
    if (!method->is_string() || method->get<std::string>().empty()) {
      return Invalid("\"method\" must be a non-empty string", id);
    }
    if (result != v.end() || error != v.end()) {
      return Invalid("a request has no \"result\" or \"error\"", id);
    }
    if (has_id && !id) return Invalid("a request's \"id\" may not be null");
    Message m;
    m.kind = has_id ? Message::Kind::kRequest : Message::Kind::kNotification;
    m.id = id;
    m.method = method->get<std::string>();
    auto params = v.find("params");
    if (params != v.end()) {
      if (!params->is_object()) return Invalid("\"params\" must be an object", id);
      m.params = *params;
    }
    return m;
  }

  if ((result != v.end()) == (error != v.end())) {
    return Invalid("a response has exactly one of \"result\" and \"error\"", id);
  }
  if (!has_id) return Invalid("a response has an \"id\"");
  Message m;
  m.id = id;
  if (result != v.end()) {
    if (!id) return Invalid("a result's \"id\" may not be null");
    m.kind = Message::Kind::kResult;
    m.result = *result;
    return m;
  }
  if (!error->is_object()) return Invalid("\"error\" must be an object", id);
  auto code = error->find("code");
  auto message = error->find("message");
  if (code == error->end() || !code->is_number_integer() || message == error->end() ||
      !message->is_string()) {
    return Invalid("\"error\" needs an integer \"code\" and a string \"message\"", id);
  }
  m.kind = Message::Kind::kError;
  m.error.code = code->get<int>();
  m.error.message = message->get<std::string>();
  auto data = error->find("data");
  if (data != error->end()) m.error.data = *data;
  return m;
}

std::variant<Message, DecodeError> Decode(const std::string& text) {
  auto parsed = ParseJson(text, "message");
  if (!parsed.ok()) {
    return DecodeError{RpcError{rpc_error::kParseError, parsed.status().message(), std::nullopt},
                       std::nullopt};
  }
  return DecodeValue(parsed.value());
}

Json EncodeValue(const Message& m) {
  Json out = {{"jsonrpc", "2.0"}};
  switch (m.kind) {
    case Message::Kind::kRequest:
    case Message::Kind::kNotification:
      if (m.kind == Message::Kind::kRequest && m.id) out["id"] = RequestIdToJson(*m.id);
      out["method"] = m.method;
      if (!m.params.is_null() && !(m.params.is_object() && m.params.empty())) {
        out["params"] = m.params;
      }
      break;
    case Message::Kind::kResult:
      out["id"] = m.id ? RequestIdToJson(*m.id) : Json(nullptr);
      out["result"] = m.result;
      break;
    case Message::Kind::kError: {
      out["id"] = m.id ? RequestIdToJson(*m.id) : Json(nullptr);
      Json error = {{"code", m.error.code}, {"message", m.error.message}};
      if (m.error.data) error["data"] = *m.error.data;
      out["error"] = std::move(error);
      break;
    }
  }
  return out;
}

std::string Encode(const Message& m) {
  // dump() escapes control characters, so the text holds no raw newline.
  return EncodeValue(m).dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace idem::mcp
