#include "mcp/gateway_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tools/open_policy.h"

namespace idem::mcp {
namespace {

Status Bad(const std::string& place, const std::string& problem) {
  return Status::InvalidArgument(place + ": " + problem);
}

std::string ToolPlace(const std::string& name) { return "tools[\"" + name + "\"]"; }

Status OnlyFields(const Json& obj, const std::string& place, std::vector<std::string> allowed) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
      return Bad((place.empty() ? "" : place + ".") + it.key(), "unknown field");
    }
  }
  return Status::Ok();
}

Status Timeout(const Json& obj, const std::string& field, const std::string& place, int64_t* out) {
  auto it = obj.find(field);
  if (it == obj.end()) return Status::Ok();
  const std::string where = (place.empty() ? "" : place + ".") + field;
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 3'600'000) {
    return Bad(where, "expected milliseconds in 1..3600000");
  }
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status FileField(const Json& doc, const std::string& field, const std::string& base_dir,
                 std::string* out) {
  auto it = doc.find(field);
  if (it == doc.end()) return Status::Ok();
  if (!it->is_string() || it->get<std::string>().empty()) return Bad(field, "expected a file path");
  std::filesystem::path p(it->get<std::string>());
  if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
  *out = p.string();
  return Status::Ok();
}

Result<UpstreamToolConfig> ParseTool(const Json& t, const std::string& place) {
  if (!t.is_object()) return Bad(place, "expected an object");
  std::vector<std::string> allowed = {"effect", "honours_keys", "status", "timeout_ms",
                                      "description"};
  for (const char* const* f = OpenPolicyFields(); *f != nullptr; ++f) allowed.emplace_back(*f);
  IDEM_RETURN_IF_ERROR(OnlyFields(t, place, allowed));
  UpstreamToolConfig c;
  if (auto e = t.find("effect"); e != t.end()) {
    if (!e->is_string()) return Bad(place + ".effect", "expected a string");
    auto effect = ParseEffectClass(e->get<std::string>());
    if (!effect.ok()) {
      return Bad(place + ".effect", "\"" + e->get<std::string>() +
                                        "\" is not one of read, idempotent, write, irreversible");
    }
    c.effect = *effect;
  }
  if (auto h = t.find("honours_keys"); h != t.end()) {
    if (!h->is_boolean()) return Bad(place + ".honours_keys", "expected true or false");
    c.honours_keys = h->get<bool>();
  }
  if (auto s = t.find("status"); s != t.end()) {
    const std::string sp = place + ".status";
    if (!s->is_object()) return Bad(sp, R"(expected an object {"tool": ..., "key_arg": ...})");
    IDEM_RETURN_IF_ERROR(OnlyFields(*s, sp, {"tool", "key_arg"}));
    auto tool = s->find("tool");
    if (tool == s->end()) return Bad(sp + ".tool", "is required");
    if (!tool->is_string() || tool->get<std::string>().empty()) {
      return Bad(sp + ".tool", "expected a tool name");
    }
    c.status_tool = tool->get<std::string>();
    if (auto k = s->find("key_arg"); k != s->end()) {
      if (!k->is_string() || k->get<std::string>().empty()) {
        return Bad(sp + ".key_arg", "expected an argument name");
      }
      c.status_key_arg = k->get<std::string>();
    }
  }
  IDEM_RETURN_IF_ERROR(Timeout(t, "timeout_ms", place, &c.timeout_ms));
  if (auto d = t.find("description"); d != t.end()) {
    if (!d->is_string()) return Bad(place + ".description", "expected a string");
    c.description = d->get<std::string>();
  }
  IDEM_RETURN_IF_ERROR(ParseOpenCallPolicy(t, place, &c.open));
  return c;
}

}  // namespace

Result<GatewayConfig> ParseGatewayConfig(const Json& doc, const std::string& base_dir) {
  if (!doc.is_object()) return Status::InvalidArgument("expected a JSON object");
  IDEM_RETURN_IF_ERROR(OnlyFields(
      doc, "", {"timeout_ms", "headers", "ca_file", "client_cert", "client_key", "tools"}));
  GatewayConfig c;
  IDEM_RETURN_IF_ERROR(Timeout(doc, "timeout_ms", "", &c.timeout_ms));
  if (auto h = doc.find("headers"); h != doc.end()) {
    if (!h->is_object()) return Bad("headers", "expected an object of strings");
    for (auto it = h->begin(); it != h->end(); ++it) {
      if (!it->is_string()) return Bad("headers[\"" + it.key() + "\"]", "expected a string");
      const std::string v = it->get<std::string>();
      const bool printable = std::all_of(v.begin(), v.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u >= 0x20 && u < 0x7f;
      });
      if (!printable || it.key().empty()) {
        return Bad("headers[\"" + it.key() + "\"]",
                   "control characters and non-ASCII bytes are not allowed");
      }
      c.headers[it.key()] = v;
    }
  }
  IDEM_RETURN_IF_ERROR(FileField(doc, "ca_file", base_dir, &c.ca_file));
  IDEM_RETURN_IF_ERROR(FileField(doc, "client_cert", base_dir, &c.client_cert));
  IDEM_RETURN_IF_ERROR(FileField(doc, "client_key", base_dir, &c.client_key));
  if (c.client_cert.empty() != c.client_key.empty()) {
    return Bad(c.client_cert.empty() ? "client_key" : "client_cert",
               "client_cert and client_key go together");
  }
  if (auto tools = doc.find("tools"); tools != doc.end()) {
    if (!tools->is_object()) return Bad("tools", "expected an object keyed by upstream tool name");
    for (auto it = tools->begin(); it != tools->end(); ++it) {
      auto t = ParseTool(it.value(), ToolPlace(it.key()));
      if (!t.ok()) return t.status();
      c.tools[it.key()] = std::move(*t);
    }
  }
  return c;
}

Result<GatewayConfig> LoadGatewayConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open the gateway config");
  std::ostringstream text;
  text << in.rdbuf();
  Json doc = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::InvalidArgument(path + ": not JSON");
  auto c = ParseGatewayConfig(doc, std::filesystem::path(path).parent_path().string());
  if (!c.ok()) return Status(c.status().code(), path + ": " + c.status().message());
  return c;
}

Status CheckAgainstUpstream(const GatewayConfig& config,
                            const std::vector<std::string>& upstream_tools) {
  auto known = [&](const std::string& n) {
    return std::find(upstream_tools.begin(), upstream_tools.end(), n) != upstream_tools.end();
  };
  for (const auto& [name, t] : config.tools) {
    const std::string place = ToolPlace(name);
    if (!known(name)) return Bad(place, "no upstream tool \"" + name + "\"");
    if (!t.status_tool.empty() && !known(t.status_tool)) {
      return Bad(place + ".status.tool", "no upstream tool \"" + t.status_tool + "\"");
    }
    if (!t.open.compensate_tool.empty() && !known(t.open.compensate_tool)) {
      return Bad(place + ".compensate.tool", "no upstream tool \"" + t.open.compensate_tool + "\"");
    }
  }
  return Status::Ok();
}

}  // namespace idem::mcp
