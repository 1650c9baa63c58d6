#pragma once
// JSON-RPC 2.0 messages as MCP uses them (https://www.jsonrpc.org/spec,
// MCP "Base Protocol"): the one codec that idem's MCP server (mcp/server*)
// and its MCP client (mcp/client*, the gateway's upstream side) share.
//
// MCP narrows JSON-RPC: ids are strings or integers (never null), batches are
// not used (revision 2025-06-18 removed them; a batch is refused), and
// `params`, when present, is an object. A message is exactly one of:
//   request       {"jsonrpc":"2.0","id":..,"method":..,"params"?:{..}}
//   notification  {"jsonrpc":"2.0","method":..,"params"?:{..}}      (no id)
//   result        {"jsonrpc":"2.0","id":..,"result":{..}}
//   error         {"jsonrpc":"2.0","id":..|null,"error":{"code","message","data"?}}
//
// Thread safety: values; safe to copy between threads.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "common/json_util.h"
#include "common/status.h"

namespace idem::mcp {

/// The error codes of JSON-RPC 2.0 that MCP uses.
namespace rpc_error {
inline constexpr int kParseError = -32700;      ///< the text is not JSON
inline constexpr int kInvalidRequest = -32600;  ///< JSON, but not a valid message
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
}  // namespace rpc_error

/// A request id: a string or an integer, compared by type and value
/// (1 and "1" are different ids).
using RequestId = std::variant<int64_t, std::string>;

Json RequestIdToJson(const RequestId& id);
/// "7" or "\"abc\"": for logs and maps.
std::string RequestIdText(const RequestId& id);

/// The error object of an error response.
struct RpcError {
  int code = rpc_error::kInternalError;
  std::string message;
  std::optional<Json> data;
};

/// One JSON-RPC message.
struct Message {
  enum class Kind { kRequest, kNotification, kResult, kError };
  Kind kind = Kind::kNotification;
  /// Requests, results and errors; an error answering an unparseable
  /// message has no id (serialized as null).
  std::optional<RequestId> id;
  std::string method;            ///< requests and notifications
  Json params = Json::object();  ///< requests and notifications ({} when absent)
  Json result;                   ///< results
  RpcError error;                ///< errors

  bool is_request() const { return kind == Kind::kRequest; }
  bool is_notification() const { return kind == Kind::kNotification; }
  bool is_response() const { return kind == Kind::kResult || kind == Kind::kError; }

  static Message Request(RequestId id, std::string method, Json params = Json::object());
  static Message Notification(std::string method, Json params = Json::object());
  static Message Result(RequestId id, Json result);
  static Message Error(std::optional<RequestId> id, int code, std::string message,
                       std::optional<Json> data = std::nullopt);
};

/// Why a text could not be read as a message: the error response to send
/// back (code kParseError or kInvalidRequest, the id when it could be read).
struct DecodeError {
  RpcError error;
  std::optional<RequestId> id;
};

/// Reads one message from JSON text (one line of stdio, one HTTP body).
/// Never throws; refuses batches, a missing or wrong "jsonrpc", ids that are
/// null/float/bool/object, a non-object params, a message with both or
/// neither of result and error, and nesting deeper than 64.
std::variant<Message, DecodeError> Decode(const std::string& text);

/// The same, for a value already parsed.
std::variant<Message, DecodeError> DecodeValue(const Json& value);

/// The message as a JSON value, and as compact text with no newline (safe
/// as one line of the stdio transport).
Json EncodeValue(const Message& message);
std::string Encode(const Message& message);

}  // namespace idem::mcp
