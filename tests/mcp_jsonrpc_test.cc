#include <gtest/gtest.h>

#include "mcp/jsonrpc.h"

namespace idem::mcp {
namespace {

Message MustDecode(const std::string& text) {
  auto decoded = Decode(text);
  EXPECT_TRUE(std::holds_alternative<Message>(decoded)) << text;
  return std::get<Message>(decoded);
}

DecodeError MustFail(const std::string& text) {
  auto decoded = Decode(text);
  EXPECT_TRUE(std::holds_alternative<DecodeError>(decoded)) << text;
  return std::get<DecodeError>(decoded);
}

TEST(JsonRpcTest, ReadsRequestsNotificationsAndResponses) {
  Message req =
      MustDecode(R"({"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"cursor":"c"}})");
  EXPECT_TRUE(req.is_request());
  EXPECT_EQ(std::get<int64_t>(*req.id), 7);
  EXPECT_EQ(req.method, "tools/list");
  EXPECT_EQ(req.params["cursor"], "c");

  Message note = MustDecode(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  EXPECT_TRUE(note.is_notification());
  EXPECT_FALSE(note.id.has_value());
  EXPECT_TRUE(note.params.is_object());

  Message result = MustDecode(R"({"jsonrpc":"2.0","id":"a","result":{}})");
  EXPECT_EQ(result.kind, Message::Kind::kResult);
  EXPECT_EQ(std::get<std::string>(*result.id), "a");

  Message error =
      MustDecode(R"({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x","data":1}})");
  EXPECT_EQ(error.kind, Message::Kind::kError);
  EXPECT_FALSE(error.id.has_value());
  EXPECT_EQ(error.error.code, rpc_error::kParseError);
  EXPECT_EQ(*error.error.data, 1);
}

TEST(JsonRpcTest, StringAndIntegerIdsStayDistinct) {
  Message a = MustDecode(R"({"jsonrpc":"2.0","id":1,"method":"ping"})");
  Message b = MustDecode(R"({"jsonrpc":"2.0","id":"1","method":"ping"})");
  EXPECT_NE(*a.id, *b.id);
  EXPECT_EQ(RequestIdText(*a.id), "1");
  EXPECT_EQ(RequestIdText(*b.id), "\"1\"");
}

TEST(JsonRpcTest, RefusesWhatMcpDoesNotAllow) {
  EXPECT_EQ(MustFail("{not json").error.code, rpc_error::kParseError);
  EXPECT_EQ(MustFail(R"([{"jsonrpc":"2.0","id":1,"method":"ping"}])").error.code,
            rpc_error::kInvalidRequest);
  EXPECT_EQ(MustFail(R"({"id":1,"method":"ping"})").error.code, rpc_error::kInvalidRequest);
  EXPECT_EQ(MustFail(R"({"jsonrpc":"1.0","id":1,"method":"ping"})").error.code,
            rpc_error::kInvalidRequest);
  EXPECT_EQ(MustFail(R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})").error.code,
            rpc_error::kInvalidRequest);
  EXPECT_EQ(MustFail(R"({"jsonrpc":"2.0","id":null,"method":"ping"})").error.code,
            rpc_error::kInvalidRequest);
  DecodeError bad_params = MustFail(R"({"jsonrpc":"2.0","id":3,"method":"ping","params":[1]})");
  EXPECT_EQ(bad_params.error.code, rpc_error::kInvalidRequest);
  ASSERT_TRUE(bad_params.id.has_value());  // the answer can name the request
  EXPECT_EQ(std::get<int64_t>(*bad_params.id), 3);
  MustFail(R"({"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}})");
  MustFail(R"({"jsonrpc":"2.0","result":{}})");
  MustFail(R"({"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}})");
  MustFail("17");
}

TEST(JsonRpcTest, EncodesOneLineThatDecodesToTheSameMessage) {
  Message req = Message::Request(RequestId(std::string("r\n1")), "tools/call",
                                 Json{{"name", "a\nb"}, {"arguments", Json::object()}});
  std::string line = Encode(req);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  Message back = MustDecode(line);
  EXPECT_TRUE(back.is_request());
  EXPECT_EQ(*back.id, *req.id);
  EXPECT_EQ(back.params, req.params);

  Json error = EncodeValue(Message::Error(std::nullopt, rpc_error::kParseError, "bad"));
  EXPECT_TRUE(error["id"].is_null());
  EXPECT_EQ(error["error"]["code"], rpc_error::kParseError);
  Json note = EncodeValue(Message::Notification("notifications/initialized"));
  EXPECT_FALSE(note.contains("id"));
  EXPECT_FALSE(note.contains("params"));
}

}  // namespace
}  // namespace idem::mcp
