#include "mcp/upstream_tool.h"

#include <algorithm>
#include <utility>

namespace idem::mcp {
namespace {

bool Hint(const Json& annotations, const char* name, bool fallback) {
  if (!annotations.is_object()) return fallback;
  auto it = annotations.find(name);
  if (it == annotations.end() || !it->is_boolean()) return fallback;
  return it->get<bool>();
}

// The text of a result's content, for an error message (at most 500 bytes).
std::string ContentText(const Json& result) {
  std::string text;
  if (result.is_object() && result.contains("content") && result["content"].is_array()) {
    for (const Json& c : result["content"]) {
      if (c.is_object() && c.value("type", "") == "text" && c.contains("text") &&
          c["text"].is_string()) {
        if (!text.empty()) text += " ";
        text += c["text"].get<std::string>();
      }
    }
  }
  if (text.size() > 500) text = text.substr(0, 500) + "...";
  return PrintableText(text);
}

// The structured answer of a result: structuredContent, else the first text
// content parsed as JSON, else null.
Json Structured(const Json& result) {
  if (!result.is_object()) return nullptr;
  if (auto s = result.find("structuredContent"); s != result.end() && s->is_object()) return *s;
  if (result.contains("content") && result["content"].is_array()) {
    for (const Json& c : result["content"]) {
      if (c.is_object() && c.value("type", "") == "text" && c.contains("text") &&
          c["text"].is_string()) {
        return Json::parse(c["text"].get<std::string>(), nullptr, /*allow_exceptions=*/false);
      }
    }
  }
  return nullptr;
}

class UpstreamTool : public Tool {
 public:
  UpstreamTool(std::shared_ptr<Client> client, UpstreamToolSpec spec)
      : client_(std::move(client)), spec_(std::move(spec)) {}

  const ToolInfo& info() const override { return spec_.info; }
  const Json& listed() const { return spec_.listed; }

  ToolOutcome Invoke(const ToolCall& call) override {
    Json meta = {{kIdempotencyKeyMeta, call.key}};
    const Json args = call.args.is_object() ? call.args : Json::object();
    return MapCallResult(client_->CallTool(spec_.info.name, args, meta, spec_.timeout_ms));
  }

  LookupOutcome Lookup(const std::string& key) override {
    LookupOutcome out;
    if (spec_.status_tool.empty()) {
      out.error = "no status tool";
      return out;
    }
    CallResult r = client_->CallTool(spec_.status_tool, {{spec_.status_key_arg, key}},
                                     Json::object(), spec_.timeout_ms);
    const std::string what = "status tool " + spec_.status_tool;
    if (r.kind == CallResult::Kind::kRpcError) {
      out.error = what + ": JSON-RPC error " + std::to_string(r.error.code) + ": " +
                  PrintableText(r.error.message);
      return out;
    }
    if (r.kind != CallResult::Kind::kResult) {
      out.error = what + ": " + r.reason;
      return out;
    }
    if (r.result.value("isError", false)) {
      out.error = what + " answered an error: " + ContentText(r.result);
      return out;
    }
    Json s = Structured(r.result);
    const std::string status = s.is_object() ? s.value("status", "") : "";
    if (status == "applied") {
      out.kind = LookupKind::kApplied;
      Json stored = s.contains("result") ? s["result"] : Json(nullptr);
      out.result = {{"content", Json::array()}};
      if (stored.is_object()) {
        out.result["structuredContent"] = stored;
        if (stored.contains("id") && stored["id"].is_string()) {
          out.external_ref = stored["id"].get<std::string>();
        }
      }
      return out;
    }
    if (status == "not_applied") {
      out.kind = LookupKind::kNotApplied;
      return out;
    }
    out.error = what + ": expected {\"status\": \"applied\"|\"not_applied\"}";
    return out;
  }

  PreviewOutcome Preview(const ToolCall& call) override {
    PreviewOutcome p;
    p.ok = true;
    std::string args = CanonicalJson(call.args.is_object() ? call.args : Json::object());
    if (args.size() > 300) args = args.substr(0, 300) + "...";
    p.summary = "call " + spec_.info.name + " on " + client_->Describe() + " with " + args;
    p.changes = {{"tool", spec_.info.name}, {"arguments", call.args}};
    return p;
  }

 private:
  std::shared_ptr<Client> client_;
  UpstreamToolSpec spec_;
};

}  // namespace

EffectClass EffectFromAnnotations(const Json& annotations) {
  if (Hint(annotations, "readOnlyHint", false)) return EffectClass::kRead;
  if (Hint(annotations, "idempotentHint", false) && !Hint(annotations, "destructiveHint", true)) {
    return EffectClass::kIdempotent;
  }
  return EffectClass::kWrite;
}

ToolOutcome MapCallResult(const CallResult& r) {
  switch (r.kind) {
    case CallResult::Kind::kResult: {
      if (!r.result.is_object())
        return ToolOutcome::Unknown("the upstream's result is not an object");
      if (r.result.value("isError", false)) {
        std::string text = ContentText(r.result);
        return ToolOutcome::Failed("the upstream tool failed" + (text.empty() ? "" : ": " + text),
                                   /*retryable=*/false);
      }
      Json result = {
          {"content", r.result.contains("content") ? r.result["content"] : Json::array()}};
      std::string ref;
      if (auto s = r.result.find("structuredContent"); s != r.result.end()) {
        result["structuredContent"] = *s;
        if (s->is_object() && s->contains("id") && (*s)["id"].is_string()) {
          ref = (*s)["id"].get<std::string>();
        }
      }
      return ToolOutcome::Succeeded(std::move(result), ref);
    }
    case CallResult::Kind::kRpcError: {
      const int c = r.error.code;
      const std::string text = "JSON-RPC error " + std::to_string(c) + ": " +
                               PrintableText(r.error.message.substr(0, 500));
      if (c == rpc_error::kInvalidParams || c == rpc_error::kMethodNotFound ||
          c == rpc_error::kInvalidRequest || c == rpc_error::kParseError) {
        return ToolOutcome::Failed("the upstream refused the call: " + text, /*retryable=*/false);
      }
      return ToolOutcome::Unknown("the upstream answered " + text + " (the tool may have run)");
    }
    case CallResult::Kind::kNotSent:
      return ToolOutcome::Failed("not sent: " + r.reason, /*retryable=*/true);
    case CallResult::Kind::kUnknown:
      break;
  }
  return ToolOutcome::Unknown(r.reason);
}

Result<std::vector<UpstreamToolSpec>> PlanUpstreamTools(const std::vector<Json>& listed,
                                                        const GatewayConfig& config) {
  std::vector<std::string> names;
  std::vector<UpstreamToolSpec> out;
  for (size_t i = 0; i < listed.size(); ++i) {
    const Json& t = listed[i];
    const std::string place = "tools/list[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
      return Status::InvalidArgument(place + ".name: expected a string");
    }
    UpstreamToolSpec s;
    s.listed = t;
    s.info.name = t["name"].get<std::string>();
    const std::string& n = s.info.name;
    const bool valid = !n.empty() && n.size() <= 128 && std::all_of(n.begin(), n.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
    if (!valid) {
      return Status::InvalidArgument(place + ".name: \"" + PrintableText(n.substr(0, 200)) +
                                     "\" is not [A-Za-z0-9._-]{1,128}");
    }
    if (std::find(names.begin(), names.end(), n) != names.end()) {
      return Status::InvalidArgument(place + ".name: \"" + n + "\" is listed twice");
    }
    names.push_back(n);
    if (t.contains("description") && t["description"].is_string()) {
      s.info.description = t["description"].get<std::string>();
    }
    s.info.effect = EffectFromAnnotations(t.contains("annotations") ? t["annotations"] : Json());
    s.timeout_ms = config.timeout_ms;
    if (auto c = config.tools.find(n); c != config.tools.end()) {
      const UpstreamToolConfig& tc = c->second;
      if (tc.effect) s.info.effect = *tc.effect;
      s.info.honours_keys = tc.honours_keys;
      s.status_tool = tc.status_tool;
      s.status_key_arg = tc.status_key_arg;
      s.info.has_status = !tc.status_tool.empty();
      s.info.open = tc.open;
      if (tc.timeout_ms > 0) s.timeout_ms = tc.timeout_ms;
      if (!tc.description.empty()) s.info.description = tc.description;
    }
    s.info.has_preview = s.info.open.two_phase;
    const bool writes =
        s.info.effect == EffectClass::kWrite || s.info.effect == EffectClass::kIrreversible;
    if (writes && s.info.open.compensate_tool.empty() &&
        s.info.open.no_compensation_reason.empty()) {
      s.info.open.no_compensation_reason = "no compensation mapped in the gateway config";
    }
    out.push_back(std::move(s));
  }
  IDEM_RETURN_IF_ERROR(CheckAgainstUpstream(config, names));
  return out;
}

std::unique_ptr<Tool> NewUpstreamTool(std::shared_ptr<Client> client, UpstreamToolSpec spec) {
  return std::make_unique<UpstreamTool>(std::move(client), std::move(spec));
}

const Json* UpstreamListing(const Tool& tool) {
  const auto* upstream = dynamic_cast<const UpstreamTool*>(&tool);
  return upstream == nullptr ? nullptr : &upstream->listed();
}

}  // namespace idem::mcp
