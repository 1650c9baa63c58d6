#include "observability/formatters.h"

#include <cctype>
#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::observability {
namespace {

thread_local const Json* t_fields = nullptr;

// The fields an operator reads first, in this order.
constexpr const char* kLeading[] = {"saga_id", "step", "key", "attempt", "outcome"};

std::vector<std::pair<std::string, const Json*>> OrderedFields() {
  std::vector<std::pair<std::string, const Json*>> out;
  if (t_fields == nullptr || !t_fields->is_object()) return out;
  for (const char* k : kLeading) {
    auto it = t_fields->find(k);
    if (it != t_fields->end()) out.emplace_back(k, &*it);
  }
  for (auto it = t_fields->begin(); it != t_fields->end(); ++it) {
    bool leading = false;
    for (const char* k : kLeading) leading = leading || it.key() == k;
    if (!leading) out.emplace_back(it.key(), &*it);
  }
  return out;
}

std::string Timestamp(const spdlog::details::log_msg& msg) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch());
  return FormatTimeMs(ms.count());
}

std::string_view LevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A bare word when that is unambiguous, else JSON.
std::string TextValue(const Json& v) {
  if (!v.is_string()) return Dump(v);
  const std::string& s = v.get_ref<const std::string&>();
  bool bare = !s.empty();
  for (char c : s) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) ||
              std::string_view("._:/@+-,").find(c) != std::string_view::npos;
    bare = bare && ok;
  }
  return bare ? s : Dump(v);
}

void Append(spdlog::memory_buf_t& dest, std::string_view s) {
  dest.append(s.data(), s.data() + s.size());
}

}  // namespace

FieldsScope::FieldsScope(const Json* fields) : previous_(t_fields) { t_fields = fields; }
FieldsScope::~FieldsScope() { t_fields = previous_; }

void TextFormatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  std::string line = Timestamp(msg);
  line += ' ';
  line += LevelName(msg.level);
  line += ' ';
  for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
    line += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  }
  for (const auto& [k, v] : OrderedFields()) line += " " + k + "=" + TextValue(*v);
  line += '\n';
  Append(dest, line);
}

std::unique_ptr<spdlog::formatter> TextFormatter::clone() const {
  return std::make_unique<TextFormatter>();
}

void JsonFormatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  nlohmann::ordered_json line;
  line["ts"] = Timestamp(msg);
  line["level"] = LevelName(msg.level);
  line["msg"] = std::string(msg.payload.data(), msg.payload.size());
  for (const auto& [k, v] : OrderedFields()) {
    if (!line.contains(k)) line[k] = *v;
  }
  Append(dest, line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  Append(dest, "\n");
}

std::unique_ptr<spdlog::formatter> JsonFormatter::clone() const {
  return std::make_unique<JsonFormatter>();
}

}  // namespace idem::observability
