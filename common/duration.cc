#include "common/duration.h"

namespace idem {
namespace {

Status Bad(const std::string& where, const std::string& text) {
  return Status::InvalidArgument(where + ": expected a duration like \"30s\", \"15m\", \"2h\" or " +
                                 "\"3d\", got \"" + PrintableText(text) + "\"");
}

}  // namespace

Result<int64_t> ParseDurationMs(const std::string& text, const std::string& where, int64_t max_ms) {
  if (text.size() < 2 || text.size() > 16) return Bad(where, text);
  int64_t unit = 0;
  switch (text.back()) {
    case 's':
      unit = 1000;
      break;
    case 'm':
      unit = 60'000;
      break;
    case 'h':
      unit = 3'600'000;
      break;
    case 'd':
      unit = 86'400'000;
      break;
    default:
      return Bad(where, text);
  }
  int64_t n = 0;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return Bad(where, text);
    if (n > max_ms / 10) return Status::InvalidArgument(where + ": " + text + " is too long");
    n = n * 10 + (text[i] - '0');
  }
  if (n > max_ms / unit) {
    return Status::InvalidArgument(where + ": " + text + " is above the maximum of " +
                                   FormatDurationMs(max_ms));
  }
  return n * unit;
}

Result<int64_t> ParseDurationMs(const Json& value, const std::string& where, int64_t max_ms) {
  if (value.is_string()) return ParseDurationMs(value.get_ref<const std::string&>(), where, max_ms);
  if (value.is_number_integer()) {
    int64_t secs = value.get<int64_t>();
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX)) secs = -1;
    if (secs < 0) return Status::InvalidArgument(where + ": a duration cannot be negative");
    if (secs > max_ms / 1000) {
      return Status::InvalidArgument(where + ": " + std::to_string(secs) +
                                     " seconds is above the maximum of " +
                                     FormatDurationMs(max_ms));
    }
    return secs * 1000;
  }
  return Status::InvalidArgument(where + ": expected seconds or a duration like \"15m\", got " +
                                 std::string(value.type_name()));
}

std::string FormatDurationMs(int64_t ms) {
  if (ms == 0) return "0s";
  struct Unit {
    int64_t ms;
    const char* name;
  };
  std::string out;
  uint64_t left = ms < 0 ? 0 - static_cast<uint64_t>(ms) : static_cast<uint64_t>(ms);
  for (Unit u : {Unit{86'400'000, "d"}, Unit{3'600'000, "h"}, Unit{60'000, "m"}, Unit{1000, "s"},
                 Unit{1, "ms"}}) {
    const uint64_t n = left / static_cast<uint64_t>(u.ms);
    if (n == 0) continue;
    out += (out.empty() ? "" : " ") + std::to_string(n) + u.name;
    left -= n * static_cast<uint64_t>(u.ms);
  }
  return ms < 0 ? "-" + out : out;
}

}  // namespace idem
