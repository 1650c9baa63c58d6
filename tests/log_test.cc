// observability: the redaction and the two line formats.

#include <chrono>
#include <string>

#include <gtest/gtest.h>
#include <spdlog/details/log_msg.h>

#include "observability/formatters.h"
#include "observability/observability.h"
#include "observability/redact.h"

namespace idem::observability {
namespace {

TEST(RedactTest, SecretFieldsAtAnyDepth) {
  Json in = {{"token", "abc"},
             {"key", "saga_1/pay"},
             {"attempt", 2},
             {"nested", {{"commit_token", "x"}, {"Authorization", "Bearer y"}, {"ok", "z"}}},
             {"list", Json::array({Json{{"api_key", "k"}}, "plain"})},
             {"token_sha256", "00ff"},
             {"secret", "s"}};
  Json out = Redact(in);
  EXPECT_EQ(out["token"], kRedacted);
  EXPECT_EQ(out["key"], "saga_1/pay");
  EXPECT_EQ(out["attempt"], 2);
  EXPECT_EQ(out["nested"]["commit_token"], kRedacted);
  EXPECT_EQ(out["nested"]["Authorization"], kRedacted);
  EXPECT_EQ(out["nested"]["ok"], "z");
  EXPECT_EQ(out["list"][0]["api_key"], kRedacted);
  EXPECT_EQ(out["list"][1], "plain");
  EXPECT_EQ(out["token_sha256"], kRedacted);
  EXPECT_EQ(out["secret"], kRedacted);
}

TEST(RedactTest, SecretsInsideText) {
  EXPECT_EQ(RedactText("commit idem1.eyJzIjoxfQ.mac-_=x refused"),
            "commit idem1.[redacted] refused");
  EXPECT_EQ(RedactText("Authorization: Bearer s3cr3t, then"),
            "Authorization: Bearer [redacted], then");
  EXPECT_EQ(RedactText("bearer abc"), "bearer [redacted]");
  EXPECT_EQ(RedactText("two idem1.a.b and idem1.c.d"), "two idem1.[redacted] and idem1.[redacted]");
  EXPECT_EQ(RedactText("nothing here"), "nothing here");
  EXPECT_EQ(Redact(Json("x idem1.a.b")), "x idem1.[redacted]");
}

std::string Format(spdlog::formatter& f, const std::string& msg, const Json* fields) {
  FieldsScope scope(fields);
  spdlog::details::log_msg m("idem", spdlog::level::info, msg);
  m.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(1'796'112'000'123));
  spdlog::memory_buf_t buf;
  f.format(m, buf);
  return std::string(buf.data(), buf.size());
}

TEST(FormatterTest, TextIsOneLineLeadingFieldsFirst) {
  TextFormatter f;
  Json fields = {{"tool", "hotels.book"},      {"outcome", "failed"}, {"saga_id", "saga_1"},
                 {"error", "no room\nat all"}, {"attempt", 1},        {"key", "saga_1/h"}};
  EXPECT_EQ(Format(f, "journal", &fields),
            "2026-12-01T08:00:00.123Z info journal saga_id=saga_1 key=saga_1/h attempt=1 "
            "outcome=failed error=\"no room\\nat all\" tool=hotels.book\n");
  EXPECT_EQ(Format(f, "plain\nmessage", nullptr), "2026-12-01T08:00:00.123Z info plain message\n");
}

TEST(FormatterTest, JsonIsOneObjectPerLine) {
  JsonFormatter f;
  Json fields = {{"outcome", "submitted"}, {"saga_id", "saga_1"}, {"msg", "not this"}};
  std::string line = Format(f, "journal \"quoted\"\n", &fields);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  EXPECT_EQ(line,
            "{\"ts\":\"2026-12-01T08:00:00.123Z\",\"level\":\"info\",\"msg\":\"journal "
            "\\\"quoted\\\"\\n\",\"saga_id\":\"saga_1\",\"outcome\":\"submitted\"}\n");
  Json parsed = Json::parse(Format(f, "plain", nullptr));
  EXPECT_EQ(parsed["msg"], "plain");
  EXPECT_EQ(parsed.size(), 3u);
}

TEST(LogLevelTest, Names) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("off"), LogLevel::kOff);
  EXPECT_EQ(ParseLogLevel("loud").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(ParseLogFormat("xml").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem::observability
