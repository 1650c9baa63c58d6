#include "mcp/catalog.h"

#include <algorithm>
#include <regex>
#include <set>
#include <utility>

#include "saga/open_saga.h"

#include "mcp/upstream_tool.h"

namespace idem::mcp {
namespace {

bool Writes(EffectClass e) { return e == EffectClass::kWrite || e == EffectClass::kIrreversible; }

// Every `${input.<name>` in the strings of `v`.
void CollectInputRefs(const Json& v, std::set<std::string>* names) {
  if (v.is_string()) {
    static const std::regex kRef(R"(\$\{input\.([A-Za-z0-9_-]+))");
    const std::string& s = v.get_ref<const std::string&>();
    for (auto it = std::sregex_iterator(s.begin(), s.end(), kRef); it != std::sregex_iterator();
         ++it) {
      // `$${` is a literal dollar and brace, not a reference.
      const auto at = static_cast<size_t>(it->position(0));
      if (at > 0 && s[at - 1] == '$') continue;
      names->insert((*it)[1].str());
    }
    return;
  }
  if (v.is_object() || v.is_array()) {
    for (const auto& item : v) CollectInputRefs(item, names);
  }
}

Json ToolDefinition(const std::string& name, const std::string& title,
                    const std::string& description, Json schema, Json annotations) {
  annotations["title"] = title;
  return {{"name", name},
          {"title", title},
          {"description", description},
          {"inputSchema", std::move(schema)},
          {"annotations", std::move(annotations)}};
}

const char* kCursorPrefix = "idem-tools:";

bool HasType(const Json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "integer") return v.is_number_integer() || v.is_number_unsigned();
  if (type == "number") return v.is_number();
  if (type == "null") return v.is_null();
  return true;  // a type the catalog never writes: not checked
}

}  // namespace

Json AnnotationsFor(const ToolInfo& info) {
  const bool read = info.effect == EffectClass::kRead;
  // Destructive: it may change or remove what is there and idem cannot undo
  // it (irreversible, or no compensation named). A write that names its
  // compensation only adds what a rollback takes back.
  const bool destructive =
      !read && (info.effect == EffectClass::kIrreversible || info.open.compensate_tool.empty());
  // Idempotent within one open saga: reads and PUT-like tools by nature,
  // writes because idem answers the same tool with the same arguments from
  // the journal (unless the tool says "repeats": "allow").
  const bool idempotent = !Writes(info.effect) || info.open.deduplicate_repeats;
  return {{"readOnlyHint", read},
          {"destructiveHint", destructive},
          {"idempotentHint", idempotent},
          {"openWorldHint", true}};
}

Json SpecAnnotations(const SagaSpec& spec, const ToolRegistry& tools) {
  bool read = true;
  bool destructive = false;
  for (const StepSpec& st : spec.steps) {
    const Tool* t = tools.Find(st.tool);
    const EffectClass e = t != nullptr ? t->info().effect : st.effect;
    if (e != EffectClass::kRead) read = false;
    if (e == EffectClass::kIrreversible || (e != EffectClass::kRead && !st.compensate)) {
      destructive = true;
    }
  }
  // The same arguments are the same intent: a repeat answers the saga
  // already submitted.
  return {{"readOnlyHint", read},
          {"destructiveHint", !read && destructive},
          {"idempotentHint", true},
          {"openWorldHint", true}};
}

Json SpecInputSchema(const Json& spec_doc) {
  std::set<std::string> names;
  if (spec_doc.contains("steps")) CollectInputRefs(spec_doc["steps"], &names);
  Json props = Json::object();
  for (const std::string& n : names) props[n] = Json::object();
  Json schema = {{"type", "object"}, {"properties", props}};
  if (!names.empty())
    schema["required"] = Json(std::vector<std::string>(names.begin(), names.end()));
  return schema;
}

std::string CheckArguments(const Json& schema, const Json& args) {
  if (!schema.is_object()) return "";
  const std::string type = schema.value("type", "");
  if (!type.empty() && !HasType(args, type)) return "arguments: expected " + type;
  if (!args.is_object()) return "";
  if (schema.contains("required") && schema["required"].is_array()) {
    for (const Json& r : schema["required"]) {
      if (r.is_string() && !args.contains(r.get<std::string>())) {
        return "arguments." + r.get<std::string>() + ": required";
      }
    }
  }
  if (schema.contains("properties") && schema["properties"].is_object()) {
    for (const auto& [name, sub] : schema["properties"].items()) {
      if (!args.contains(name) || !sub.is_object() || !sub.contains("type")) continue;
      if (sub["type"].is_string() && !HasType(args[name], sub["type"].get<std::string>())) {
        return "arguments." + name + ": expected " + sub["type"].get<std::string>();
      }
    }
  }
  return "";
}

ToolCatalog ToolCatalog::Build(const ToolRegistry& tools, const std::vector<SpecSource>& specs,
                               std::vector<std::string>* skipped) {
  ToolCatalog c;
  for (const ToolInfo& info : tools.List()) {
    if (!CheckOpenTool(tools, info.name, "tool").ok()) {
      if (skipped != nullptr) {
        skipped->push_back(info.name + ": " + CheckOpenTool(tools, info.name, "tool").message());
      }
      continue;
    }
    c.open_tools_.push_back(info.name);
    CatalogEntry e;
    e.name = info.name;
    e.kind = CatalogKind::kTool;
    e.target = info.name;
    std::string description = info.description.empty() ? info.name : info.description;
    description += std::string(" [idem: effect ") + EffectClassName(info.effect) +
                   "; journaled in the session's open saga";
    if (info.open.human_approval) description += "; a person approves each commit";
    description += "]";
    // An upstream tool (gateway mode) keeps the argument schema its server
    // listed; idem's own tools declare none.
    Json schema = {{"type", "object"}};
    const Tool* tool = tools.Find(info.name);
    if (const Json* listed = tool ? UpstreamListing(*tool) : nullptr; listed != nullptr) {
      auto it = listed->find("inputSchema");
      if (it != listed->end() && it->is_object()) schema = *it;
    }
    e.definition =
        ToolDefinition(info.name, info.name, description, std::move(schema), AnnotationsFor(info));
    c.entries_.push_back(std::move(e));
  }
  for (const SpecSource& s : specs) {
    auto parsed = ParseSpec(s.doc, tools);
    if (!parsed.ok()) {
      if (skipped != nullptr) skipped->push_back(s.name + ": " + parsed.status().message());
      continue;
    }
    CatalogEntry e;
    e.name = kSpecToolPrefix + s.name;
    e.kind = CatalogKind::kSpec;
    e.target = s.name;
    e.spec = std::move(parsed).value();
    e.spec.registered_version = s.version;
    std::string description =
        e.spec.description.empty() ? "Run saga " + s.name : e.spec.description;
    description += " [idem: submits saga spec \"" + s.name + "\" with the arguments as input (" +
                   std::to_string(e.spec.steps.size()) +
                   " steps); the same arguments answer the same saga]";
    e.definition = ToolDefinition(e.name, "saga " + s.name, description, SpecInputSchema(s.doc),
                                  SpecAnnotations(e.spec, tools));
    c.entries_.push_back(std::move(e));
  }
  // The saga's end: commit and rollback, which touch idem's journal (and,
  // for a rollback, the providers' compensations).
  auto end_tool = [&c](CatalogKind kind, const char* name, const char* title,
                       const char* description, Json schema, bool destructive) {
    CatalogEntry e;
    e.name = name;
    e.kind = kind;
    e.definition = ToolDefinition(name, title, description, std::move(schema),
                                  {{"readOnlyHint", false},
                                   {"destructiveHint", destructive},
                                   {"idempotentHint", true},
                                   {"openWorldHint", destructive}});
    c.entries_.push_back(std::move(e));
  };
  end_tool(CatalogKind::kCommit, kCommitTool, "commit the saga",
           "Commit the open saga of this session (or of the _meta io.idem/intent given): every "
           "call made so far stands and the saga ends succeeded. Refused while a call waits for "
           "a person.",
           {{"type", "object"}}, false);
  end_tool(CatalogKind::kRollback, kRollbackTool, "roll the saga back",
           "Roll back the open saga of this session (or of the _meta io.idem/intent given): "
           "every completed call is compensated, in reverse order, and the saga ends.",
           {{"type", "object"}, {"properties", {{"reason", {{"type", "string"}}}}}}, true);
  return c;
}

const CatalogEntry* ToolCatalog::Find(const std::string& name) const {
  for (const CatalogEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Result<Json> ToolCatalog::Page(const std::string& cursor, size_t page_size) const {
  size_t from = 0;
  if (!cursor.empty()) {
    const std::string prefix = kCursorPrefix;
    const std::string rest = cursor.rfind(prefix, 0) == 0 ? cursor.substr(prefix.size()) : "";
    if (rest.empty() || rest.size() > 9 ||
        !std::all_of(rest.begin(), rest.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      return Status::InvalidArgument("cursor: not a cursor this server gave");
    }
    from = static_cast<size_t>(std::stoul(rest));
    if (from > entries_.size()) return Status::InvalidArgument("cursor: past the end");
  }
  if (page_size == 0) page_size = 1;
  Json tools = Json::array();
  size_t i = from;
  for (; i < entries_.size() && tools.size() < page_size; ++i)
    tools.push_back(entries_[i].definition);
  Json page = {{"tools", tools}};
  if (i < entries_.size()) page["nextCursor"] = kCursorPrefix + std::to_string(i);
  return page;
}

}  // namespace idem::mcp
