// Log setup and the structured Log() call (observability/observability.h).

#include <memory>
#include <string>

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "observability/formatters.h"
#include "observability/observability.h"
#include "observability/redact.h"

namespace idem::observability {
namespace {

struct LevelName {
  const char* name;
  LogLevel level;
  spdlog::level::level_enum spd;
};
constexpr LevelName kLevels[] = {
    {"trace", LogLevel::kTrace, spdlog::level::trace},
    {"debug", LogLevel::kDebug, spdlog::level::debug},
    {"info", LogLevel::kInfo, spdlog::level::info},
    {"warn", LogLevel::kWarn, spdlog::level::warn},
    {"error", LogLevel::kError, spdlog::level::err},
    {"critical", LogLevel::kCritical, spdlog::level::critical},
    {"off", LogLevel::kOff, spdlog::level::off},
};

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  for (const auto& l : kLevels) {
    if (l.level == level) return l.spd;
  }
  return spdlog::level::off;
}

// idem's own logger (not spdlog's default one, which would print to stdout
// in a program that never set logging up): stderr, off until SetUpLogging.
spdlog::logger& Logger() {
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("idem", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_formatter(std::make_unique<TextFormatter>());
    l->set_level(spdlog::level::off);
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

}  // namespace

Result<LogLevel> ParseLogLevel(std::string_view name) {
  for (const auto& l : kLevels) {
    if (name == l.name) return l.level;
  }
  return Status::InvalidArgument(
      "--log-level: expected trace, debug, info, warn, error, "
      "critical or off, got \"" +
      std::string(name) + "\"");
}

Result<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return Status::InvalidArgument("--log-format: expected text or json, got \"" + std::string(name) +
                                 "\"");
}

void SetUpLogging(LogFormat format, LogLevel level) {
  if (format == LogFormat::kJson) {
    Logger().set_formatter(std::make_unique<JsonFormatter>());
  } else {
    Logger().set_formatter(std::make_unique<TextFormatter>());
  }
  Logger().set_level(ToSpdlog(level));
}

bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && Logger().should_log(ToSpdlog(level));
}

void Log(LogLevel level, std::string_view msg, const Json& fields) {
  if (!LogEnabled(level)) return;
  const Json safe = Redact(fields);
  FieldsScope scope(&safe);
  const std::string text = RedactText(msg);
  Logger().log(ToSpdlog(level), spdlog::string_view_t(text.data(), text.size()));
}

}  // namespace idem::observability
