#include "saga/spec.h"

#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "saga/guard_spec.h"
#include "saga/hold.h"
#include "saga/limits.h"
#include "saga/schedule.h"
#include "saga/schema_text.h"
#include "saga/step_key.h"

#include "common/duration.h"
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

namespace idem {
namespace {

// Documents deeper than this are refused before any recursive walk (the same
// limit ParseJson applies to text).
constexpr int kMaxDepth = 64;
// Long values are cut in messages.
constexpr size_t kMaxQuoted = 80;

constexpr const char* kRefHelp = "(expected input.<path> or steps.<id>.result|args.<path>)";

// ---- message helpers

/// `s` as a JSON string literal, cut to kMaxQuoted bytes.
std::string Quote(const std::string& s) {
  if (s.size() <= kMaxQuoted) return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string cut =
      Json(s.substr(0, kMaxQuoted)).dump(-1, ' ', false, Json::error_handler_t::replace);
  cut.insert(cut.size() - 1, "...");
  return cut;
}

bool IsIdentifier(const std::string& key) {
  if (key.empty()) return false;
  for (size_t i = 0; i < key.size(); ++i) {
    char c = key[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

/// `base.key`, or `base["odd key"]` when the key is not an identifier.
std::string JoinKey(const std::string& base, const std::string& key) {
  if (!IsIdentifier(key)) return base + "[" + Quote(key) + "]";
  return base.empty() ? key : base + "." + key;
}

std::string JoinIndex(const std::string& base, size_t index) {
  return base + "[" + std::to_string(index) + "]";
}

/// The place named in a message; the document root is "spec".
std::string Place(const std::string& path) { return path.empty() ? "spec" : path; }

Status Error(const std::string& path, const std::string& problem) {
  return Status::InvalidArgument(Place(path) + ": " + problem);
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "invalid value";
  }
}

/// An integer JSON value as int64, saturating (nlohmann keeps positive
/// integers unsigned).
int64_t AsInt64(const Json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return 0;
}

std::string ValueText(const Json& v) {
  return v.is_string() ? v.get<std::string>()
                       : v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

/// True when `v` nests containers deeper than `limit` (the root container is
/// level 1). Recursion stops at the limit.
bool TooDeep(const Json& v, int limit) {
  if (!v.is_structured()) return false;
  if (limit <= 0) return true;
  for (const auto& child : v) {
    if (TooDeep(child, limit - 1)) return true;
  }
  return false;
}

// ---- templates

/// A piece of a template string: literal text or a reference `${ref}`.
struct Piece {
  bool is_ref = false;
  std::string text;  ///< literal text, or the reference without ${ }
};

/// Splits a string into pieces. `$${` is a literal `${`. Returns false (and
/// the problem) for an unterminated `${`.
bool SplitTemplate(const std::string& s, std::vector<Piece>* pieces, std::string* problem) {
  std::string literal;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 3, "$${") == 0) {
      literal += "${";
      i += 3;
    } else if (s.compare(i, 2, "${") == 0) {
      size_t end = s.find('}', i + 2);
      if (end == std::string::npos) {
        *problem = "unterminated \"${\" in " + Quote(s);
        return false;
      }
      if (!literal.empty()) pieces->push_back({false, std::move(literal)});
      literal.clear();
      pieces->push_back({true, s.substr(i + 2, end - i - 2)});
      i = end + 1;
    } else {
      literal.push_back(s[i]);
      ++i;
    }
  }
  if (!literal.empty()) pieces->push_back({false, std::move(literal)});
  return true;
}

/// Splits a reference into its dot-separated segments: each non-empty, of
/// [A-Za-z0-9_-]. Returns false when the reference is malformed.
bool SplitRef(const std::string& ref, std::vector<std::string>* segments) {
  std::string seg;
  for (size_t i = 0; i <= ref.size(); ++i) {
    if (i == ref.size() || ref[i] == '.') {
      if (seg.empty()) return false;
      segments->push_back(std::move(seg));
      seg.clear();
      continue;
    }
    char c = ref[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
    seg.push_back(c);
  }
  return true;
}

std::string RefText(const std::string& ref) { return Quote("${" + ref + "}"); }

/// The value at `segments` in `context`, or nullptr.
const Json* Lookup(const Json& context, const std::vector<std::string>& segments) {
  const Json* cur = &context;
  for (const std::string& seg : segments) {
    if (cur->is_object()) {
      auto it = cur->find(seg);
      if (it == cur->end()) return nullptr;
      cur = &*it;
    } else if (cur->is_array()) {
      if (seg.empty() || seg.size() > 9) return nullptr;
      size_t index = 0;
      for (char c : seg) {
        if (c < '0' || c > '9') return nullptr;
        index = index * 10 + static_cast<size_t>(c - '0');
      }
      if (index >= cur->size()) return nullptr;
      cur = &(*cur)[index];
    } else {
      return nullptr;
    }
  }
  return cur;
}

/// What a template in step `self` (at index `self_index`) may reference.
struct RefScope {
  const std::map<std::string, size_t>* step_index;  ///< id -> first position
  size_t self_index;
  std::string self_id;
  bool in_compensation;
  const StepGraph* graph;  ///< which steps run before which
};

Status CheckRef(const std::string& ref, const RefScope& scope, const std::string& path) {
  std::vector<std::string> seg;
  if (!SplitRef(ref, &seg)) return Error(path, "bad reference " + RefText(ref) + " " + kRefHelp);
  if (seg[0] == "input") return Status::Ok();
  if (seg[0] != "steps" || seg.size() < 3 || (seg[2] != "result" && seg[2] != "args")) {
    return Error(path, "bad reference " + RefText(ref) + " " + kRefHelp);
  }
  const std::string& id = seg[1];
  auto it = scope.step_index->find(id);
  if (it == scope.step_index->end()) return Error(path, "reference to unknown step " + Quote(id));
  if (it->second == scope.self_index) {
    if (scope.in_compensation) return Status::Ok();
    return Error(path, "reference to step " + Quote(id) +
                           " itself (only its compensation may use its own result)");
  }
  if (scope.graph->declared && !scope.graph->before[scope.self_index][it->second]) {
    return Error(path, "step " + Quote(scope.self_id) + " may not use step " + Quote(id) +
                           ", which does not run before it (list it in " +
                           JoinIndex("steps", scope.self_index) +
                           ".after, or a step that runs after it)");
  }
  if (scope.graph->declared) return Status::Ok();
  if (it->second > scope.self_index) {
    return Error(path, "reference to a later step " + Quote(id) +
                           (scope.in_compensation
                                ? " (a compensation may only use the input, earlier steps and "
                                  "its own step)"
                                : " (steps may only use the input and earlier steps)"));
  }
  return Status::Ok();
}

/// Checks every template string in `v` (values only, at any depth).
Status CheckTemplates(const Json& v, const RefScope& scope, const std::string& path) {
  if (v.is_string()) {
    std::vector<Piece> pieces;
    std::string problem;
    if (!SplitTemplate(v.get_ref<const std::string&>(), &pieces, &problem)) {
      return Error(path, problem);
    }
    for (const Piece& p : pieces) {
      if (p.is_ref) IDEM_RETURN_IF_ERROR(CheckRef(p.text, scope, path));
    }
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      IDEM_RETURN_IF_ERROR(CheckTemplates(it.value(), scope, JoinKey(path, it.key())));
    }
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      IDEM_RETURN_IF_ERROR(CheckTemplates(v[i], scope, JoinIndex(path, i)));
    }
  }
  return Status::Ok();
}

/// Counts `n` resolved bytes at `path` against the budget (none: no bound).
Status Spend(TemplateBudget* b, size_t n, const std::string& path) {
  if (b == nullptr) return Status::Ok();
  b->used += n;
  if (b->used > b->max_bytes) {
    return Error(path, "resolved arguments exceed " + b->limit);
  }
  return Status::Ok();
}

Result<Json> Resolve(const Json& templ, const Json& context, const std::string& path, int depth,
                     TemplateBudget* b) {
  if (depth > kMaxDepth) {
    return Error(path, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  if (templ.is_object()) {
    IDEM_RETURN_IF_ERROR(Spend(b, 2, path));
    Json out = Json::object();
    for (auto it = templ.begin(); it != templ.end(); ++it) {
      const std::string at = JoinKey(path, it.key());
      IDEM_RETURN_IF_ERROR(Spend(b, it.key().size() + (it == templ.begin() ? 3 : 4), at));
      Result<Json> r = Resolve(it.value(), context, at, depth + 1, b);
      if (!r.ok()) return r.status();
      out[it.key()] = std::move(r).value();
    }
    return out;
  }
  if (templ.is_array()) {
    IDEM_RETURN_IF_ERROR(Spend(b, 2, path));
    Json out = Json::array();
    for (size_t i = 0; i < templ.size(); ++i) {
      const std::string at = JoinIndex(path, i);
      if (i > 0) IDEM_RETURN_IF_ERROR(Spend(b, 1, at));
      Result<Json> r = Resolve(templ[i], context, at, depth + 1, b);
      if (!r.ok()) return r.status();
      out.push_back(std::move(r).value());
    }
    return out;
  }
  if (!templ.is_string()) {
    IDEM_RETURN_IF_ERROR(Spend(b, JsonBytes(templ), path));
    return templ;
  }

  const auto& s = templ.get_ref<const std::string&>();
  std::vector<Piece> pieces;
  std::string problem;
  if (!SplitTemplate(s, &pieces, &problem)) return Error(path, problem);
  IDEM_RETURN_IF_ERROR(Spend(b, 2, path));  // the quotes
  std::string text;
  for (const Piece& p : pieces) {
    if (!p.is_ref) {
      IDEM_RETURN_IF_ERROR(Spend(b, p.text.size(), path));
      text += p.text;
      continue;
    }
    std::vector<std::string> segments;
    if (!SplitRef(p.text, &segments)) return Error(path, "bad reference " + RefText(p.text));
    if (b != nullptr && b->skip_step_refs && segments[0] == "steps") {
      if (pieces.size() == 1) return Json();  // checked when the step runs
      continue;
    }
    const Json* value = Lookup(context, segments);
    if (value == nullptr && b != nullptr && b->skip_step_refs) {
      if (pieces.size() == 1) return Json();  // the step reports it when it runs
      continue;
    }
    if (value == nullptr) return Error(path, RefText(p.text) + " has no value");
    // A string that is exactly one reference takes the value with its type.
    // Measured before it is copied (the quotes counted above stand in for
    // a string's own; close enough for a bound).
    if (b != nullptr) {
      const size_t room = b->max_bytes >= b->used ? b->max_bytes - b->used : 0;
      const size_t n = JsonBytes(*value, room);
      IDEM_RETURN_IF_ERROR(Spend(b, value->is_string() && n >= 2 ? n - 2 : n, path));
    }
    if (pieces.size() == 1) return *value;
    text += ValueText(*value);
  }
  return Json(std::move(text));
}

// ---- schema validation

/// The schema, parsed once.
struct CompiledSchema {
  valijson::Schema schema;
  Json doc;             ///< the schema as JSON, walked to explain errors
  std::string problem;  ///< non-empty when the compiled-in schema is broken
};

const CompiledSchema& GetSchema() {
  static const CompiledSchema* compiled = [] {
    auto* c = new CompiledSchema();  // never destroyed: used until exit
    try {
      c->doc = Json::parse(SagaSchemaText());
      valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
      valijson::adapters::NlohmannJsonAdapter adapter(c->doc);
      parser.populateSchema(adapter, c->schema);
    } catch (const std::exception& e) {
      c->problem = std::string("the compiled-in saga schema is broken: ") + e.what();
    }
    return c;
  }();
  return *compiled;
}

/// Follows a local "$ref" ("#/definitions/x") in the schema document.
const Json* Deref(const Json& schema_doc, const Json* node) {
  for (int hops = 0; node != nullptr && hops < 8; ++hops) {
    if (!node->is_object()) return node;
    auto ref = node->find("$ref");
    if (ref == node->end() || !ref->is_string()) return node;
    const auto& pointer = ref->get_ref<const std::string&>();
    if (pointer.rfind("#/", 0) != 0) return nullptr;
    try {
      node = &schema_doc.at(Json::json_pointer(pointer.substr(1)));
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  return node;
}

/// Maps a valijson context (["<root>", "[steps]", "[2]", "[id]"]) to the
/// document node, its schema node and a readable path (`steps[2].id`).
struct Located {
  const Json* value = nullptr;
  const Json* schema = nullptr;
  std::string path;
};

Located Locate(const Json& doc, const Json& schema_doc, const std::vector<std::string>& context) {
  Located at;
  at.value = &doc;
  at.schema = Deref(schema_doc, &schema_doc);
  for (size_t i = 1; i < context.size(); ++i) {  // context[0] is "<root>"
    const std::string& token = context[i];
    if (token.size() < 2 || token.front() != '[' || token.back() != ']') break;
    std::string key = token.substr(1, token.size() - 2);
    const Json* next_schema = nullptr;
    if (at.value != nullptr && at.value->is_array()) {
      size_t index = 0;
      bool digits = !key.empty() && key.size() < 10;
      for (char c : key) {
        if (c < '0' || c > '9') digits = false;
        if (digits) index = index * 10 + static_cast<size_t>(c - '0');
      }
      at.path = digits ? JoinIndex(at.path, index) : JoinKey(at.path, key);
      at.value = digits && index < at.value->size() ? &(*at.value)[index] : nullptr;
      if (at.schema != nullptr && at.schema->is_object() && at.schema->contains("items")) {
        next_schema = &(*at.schema)["items"];
      }
    } else {
      at.path = JoinKey(at.path, key);
      if (at.value != nullptr && at.value->is_object()) {
        auto it = at.value->find(key);
        at.value = it == at.value->end() ? nullptr : &*it;
      } else {
        at.value = nullptr;
      }
      if (at.schema != nullptr && at.schema->is_object()) {
        auto props = at.schema->find("properties");
        if (props != at.schema->end() && props->is_object() && props->contains(key)) {
          next_schema = &(*props)[key];
        }
      }
    }
    at.schema = Deref(schema_doc, next_schema);
  }
  return at;
}

/// The value of `keyword` in a schema node, or nullptr.
const Json* Keyword(const Json* schema, const char* keyword) {
  if (schema == nullptr || !schema->is_object()) return nullptr;
  auto it = schema->find(keyword);
  return it == schema->end() ? nullptr : &*it;
}

std::string ExpectedTypes(const Json* type) {
  if (type == nullptr) return "another type";
  if (type->is_string()) return type->get<std::string>();
  std::string out;
  if (type->is_array()) {
    for (size_t i = 0; i < type->size(); ++i) {
      if (!(*type)[i].is_string()) continue;
      if (!out.empty()) out += i + 1 == type->size() ? " or " : ", ";
      out += (*type)[i].get<std::string>();
    }
  }
  return out.empty() ? "another type" : out;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// The text between `prefix` and a closing "'." in a valijson description.
std::string QuotedName(const std::string& description, const std::string& prefix) {
  std::string rest = description.substr(prefix.size());
  if (rest.size() >= 2 && rest.compare(rest.size() - 2, 2, "'.") == 0) {
    rest.resize(rest.size() - 2);
  }
  return rest;
}

std::string Count(size_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

/// A readable message for one valijson error.
Status Explain(const Json& doc, const CompiledSchema& compiled,
               const valijson::ValidationResults::Error& error) {
  Located at = Locate(doc, compiled.doc, error.context);
  const std::string& d = error.description;
  const Json* v = at.value;

  const std::string missing = "Missing required property '";
  if (StartsWith(d, missing)) {
    std::string name = QuotedName(d, missing);
    if (name == "reason" && v != nullptr && v->is_object() && v->contains("compensate") &&
        (*v)["compensate"].is_null()) {
      return Error(JoinKey(at.path, "reason"), "required when \"compensate\" is null");
    }
    return Error(at.path, "missing required property " + Quote(name));
  }
  const std::string unknown =
      "Object contains a property that could not be validated using 'properties' or "
      "'additionalProperties' constraints: '";
  if (StartsWith(d, unknown)) {
    return Error(at.path, "unknown property " + Quote(QuotedName(d, unknown)));
  }
  if (v != nullptr) {
    if (StartsWith(d, "Value type not permitted")) {
      return Error(at.path, "expected " + ExpectedTypes(Keyword(at.schema, "type")) + ", got " +
                                TypeName(*v));
    }
    const Json* pattern = Keyword(at.schema, "pattern");
    if (StartsWith(d, "Failed to match regex") && v->is_string() && pattern != nullptr &&
        pattern->is_string()) {
      return Error(at.path,
                   Quote(v->get<std::string>()) + " does not match " + pattern->get<std::string>());
    }
    const Json* min_length = Keyword(at.schema, "minLength");
    if (StartsWith(d, "String should be no fewer") && min_length != nullptr &&
        min_length->is_number_unsigned()) {
      uint64_t n = min_length->get<uint64_t>();
      if (n == 1) return Error(at.path, "must not be empty");
      return Error(at.path, "must be at least " + Count(n, "character") + " long");
    }
    const Json* min_items = Keyword(at.schema, "minItems");
    if (StartsWith(d, "Array should contain no fewer") && min_items != nullptr &&
        min_items->is_number_unsigned() && v->is_array()) {
      uint64_t n = min_items->get<uint64_t>();
      if (n == 1) return Error(at.path, "must not be empty");
      return Error(at.path,
                   "must have at least " + Count(n, "item") + ", got " + std::to_string(v->size()));
    }
    const Json* max_items = Keyword(at.schema, "maxItems");
    if (StartsWith(d, "Array should contain no more") && max_items != nullptr &&
        max_items->is_number_unsigned() && v->is_array()) {
      return Error(at.path, "must have at most " + Count(max_items->get<uint64_t>(), "item") +
                                ", got " + std::to_string(v->size()));
    }
    const Json* minimum = Keyword(at.schema, "minimum");
    if (StartsWith(d, "Expected number greater") && minimum != nullptr && v->is_number()) {
      return Error(at.path, ValueText(*v) + " is below the minimum of " + ValueText(*minimum));
    }
    const Json* maximum = Keyword(at.schema, "maximum");
    if (StartsWith(d, "Expected number less") && maximum != nullptr && v->is_number()) {
      return Error(at.path, ValueText(*v) + " is above the maximum of " + ValueText(*maximum));
    }
  }
  // Anything else: valijson's own words, lower-cased, without the period.
  std::string text = d;
  if (!text.empty() && text.back() == '.') text.pop_back();
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z') text[0] = static_cast<char>(text[0] + 32);
  return Error(at.path, text.empty() ? "does not match the schema" : text);
}

Status ValidateAgainstSchema(const Json& doc) {
  const CompiledSchema& compiled = GetSchema();
  if (!compiled.problem.empty()) return Status::Internal(compiled.problem);
  // A validator caches compiled regexes; one per thread keeps that cache
  // unshared. The parsed schema is only read.
  thread_local valijson::Validator validator(valijson::Validator::kStrongTypes);
  valijson::adapters::NlohmannJsonAdapter adapter(doc);
  valijson::ValidationResults results;
  if (validator.validate(compiled.schema, adapter, &results)) return Status::Ok();

  // Report the most specific (deepest) error; the first of equals.
  const valijson::ValidationResults::Error* best = nullptr;
  for (const auto& e : results) {
    if (best == nullptr || e.context.size() > best->context.size()) best = &e;
  }
  if (best == nullptr) return Error("", "does not match the schema");
  return Explain(doc, compiled, *best);
}

// ---- semantic checks

/// "15m" -> 900000; an integer counts seconds (common/duration.h). -1 when
/// malformed or above 30 days.
int64_t ParseTtlMs(const Json& v) {
  auto ms = ParseDurationMs(v, "approval_ttl", StepSpec::kMaxApprovalTtlMs);
  return ms.ok() ? *ms : -1;
}

/// Reads two_phase, approval (the step's, else `default_approval`, the
/// saga's), approval_ttl, on_expiry and on_stale.
Status ApplyTwoPhase(const Json& s, const ToolInfo& tool, const std::string& path,
                     const Json& default_approval, StepSpec* step) {
  bool asked = s.value("two_phase", false);
  if (asked && !tool.has_preview) {
    return Error(path + ".two_phase", "tool " + Quote(tool.name) + " offers no preview");
  }
  step->two_phase = asked || (tool.effect == EffectClass::kIrreversible && tool.has_preview);
  const bool own = s.contains("approval");
  const Json approval = own ? s["approval"] : step->two_phase ? default_approval : Json("none");
  const std::string approval_at = own ? path + ".approval" : "approval";
  if (approval.is_object()) {
    if (!step->two_phase) {
      return Error(approval_at,
                   "a policy needs a two-phase step (\"two_phase\": true, on a tool with a "
                   "preview)");
    }
    auto policy = ParseApprovalPolicy(approval, approval_at);
    if (!policy.ok()) return policy.status();
    step->policy = std::move(policy).value();
    step->approval = Approval::kPolicy;
  } else if (approval == "human") {
    if (!step->two_phase) {
      return Error(path + ".approval",
                   "\"human\" needs a two-phase step (\"two_phase\": true, on a tool with a "
                   "preview)");
    }
    step->approval = Approval::kHuman;
  }
  if (s.contains("approval_ttl")) {
    int64_t ms = ParseTtlMs(s["approval_ttl"]);
    if (ms <= 0) {
      return Error(path + ".approval_ttl",
                   "expected seconds or a duration like \"15m\", from 1s up to 30d");
    }
    step->approval_ttl_ms = ms;
  }
  for (const char* key : {"approval_ttl", "on_expiry"}) {
    if (s.contains(key) && step->approval == Approval::kNone) {
      return Error(path + "." + key, "only applies with \"approval\": \"human\"");
    }
  }
  if (s.contains("on_stale") && !step->two_phase) {
    return Error(path + ".on_stale", "only applies to a two-phase step");
  }
  auto fallback = [](const std::string& v) {
    return v == "re_preview" ? Fallback::kRePreview : Fallback::kRollback;
  };
  step->on_expiry = fallback(s.value("on_expiry", "rollback"));
  step->on_stale = fallback(s.value("on_stale", "re_preview"));
  return Status::Ok();
}

bool IsBlank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

/// An irreversible step cannot be undone, so a person or a policy approves
/// it before it happens (two-phase, "approval" human or a policy), unless
/// the step itself says "approval": "none" and why ("reason").
Status CheckIrreversible(const Json& s, const std::string& path, StepSpec* step) {
  if (step->effect != EffectClass::kIrreversible) return Status::Ok();
  if (step->two_phase && step->approval != Approval::kNone) return Status::Ok();
  if (!s.contains("approval") || s["approval"] != "none") {
    return Error(path, "tool " + Quote(step->tool) +
                           R"( is irreversible: make the step two_phase with an approval, or say )"
                           R"("approval": "none" with a "reason")");
  }
  auto reason = s.find("reason");
  if (reason == s.end() || !reason->is_string() || IsBlank(reason->get_ref<const std::string&>())) {
    return Error(path + ".reason", "tool " + Quote(step->tool) +
                                       R"( is irreversible and "approval" is "none": say why )"
                                       "no person approves it");
  }
  step->no_approval_reason = reason->get<std::string>();
  return Status::Ok();
}

/// Applies a "retry" object over `policy` and checks the bounds.
Status ApplyRetry(const Json& retry, int cap, const std::string& cap_owner, const std::string& path,
                  RetryPolicy* policy) {
  if (!retry.is_object())
    return Error(path, std::string("expected object, got ") + TypeName(retry));
  auto attempts = retry.find("max_attempts");
  if (attempts != retry.end()) {
    std::string at = JoinKey(path, "max_attempts");
    if (!attempts->is_number_integer()) {
      return Error(at, std::string("expected integer, got ") + TypeName(*attempts));
    }
    int64_t n = AsInt64(*attempts);
    if (n < 1) return Error(at, std::to_string(n) + " is below the minimum of 1");
    if (n > cap) {
      return Error(at, std::to_string(n) + " exceeds the cap of " + std::to_string(cap) + " for " +
                           cap_owner);
    }
    policy->max_attempts = static_cast<int>(n);
  }
  for (const char* name : {"initial_backoff_ms", "max_backoff_ms"}) {
    auto it = retry.find(name);
    if (it == retry.end()) continue;
    std::string at = JoinKey(path, name);
    if (!it->is_number_integer()) {
      return Error(at, std::string("expected integer, got ") + TypeName(*it));
    }
    int64_t ms = AsInt64(*it);
    if (ms < 0) return Error(at, std::to_string(ms) + " is below the minimum of 0");
    if (ms > RetryPolicy::kMaxBackoffCapMs) {
      return Error(at, std::to_string(ms) + " is above the maximum of " +
                           std::to_string(RetryPolicy::kMaxBackoffCapMs));
    }
    if (std::string(name) == "initial_backoff_ms") {
      policy->initial_backoff_ms = ms;
    } else {
      policy->max_backoff_ms = ms;
    }
  }
  if (policy->max_backoff_ms < policy->initial_backoff_ms) {
    return Error(JoinKey(path, "max_backoff_ms"),
                 std::to_string(policy->max_backoff_ms) + " is less than initial_backoff_ms (" +
                     std::to_string(policy->initial_backoff_ms) + ")");
  }
  return Status::Ok();
}

/// The checks the schema cannot express. `doc` has passed the schema.
Result<SagaSpec> Build(const Json& doc, const ToolRegistry& tools) {
  SagaSpec spec;
  spec.name = doc.at("name").get<std::string>();
  if (doc.contains("version")) spec.version = static_cast<int>(AsInt64(doc["version"]));
  if (doc.contains("description")) spec.description = doc["description"].get<std::string>();

  const Json& steps = doc.at("steps");
  std::map<std::string, size_t> first_at;  // step id -> index of its first use
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& id = steps[i].at("id").get_ref<const std::string&>();
    first_at.emplace(id, i);
  }
  auto graph = ParseStepGraph(steps, first_at);
  if (!graph.ok()) return graph.status();
  spec.parallel = graph->declared;

  for (size_t i = 0; i < steps.size(); ++i) {
    const Json& s = steps[i];
    const std::string path = JoinIndex("steps", i);
    StepSpec step;

    step.id = s.at("id").get<std::string>();
    size_t first = first_at.at(step.id);
    if (first != i) {
      return Error(path + ".id", "duplicate step id " + Quote(step.id) + " (first at " +
                                     JoinIndex("steps", first) + ")");
    }

    step.tool = s.at("tool").get<std::string>();
    const Tool* tool = tools.Find(step.tool);
    if (tool == nullptr) return Error(path + ".tool", "unknown tool " + Quote(step.tool));
    step.effect = tool->info().effect;
    const std::string effect_name = EffectClassName(step.effect);

    RefScope scope{&first_at, i, step.id, false, &*graph};
    if (s.contains("args")) {
      step.args = s["args"];
      IDEM_RETURN_IF_ERROR(CheckTemplates(step.args, scope, path + ".args"));
    }

    step.retry = RetryPolicy::DefaultFor(step.effect);
    if (s.contains("retry")) {
      IDEM_RETURN_IF_ERROR(ApplyRetry(s["retry"], RetryPolicy::MaxAttemptsCap(step.effect),
                                      effect_name + " tools", path + ".retry", &step.retry));
    }

    bool has_effect =
        step.effect == EffectClass::kWrite || step.effect == EffectClass::kIrreversible;
    auto comp = s.find("compensate");
    if (comp == s.end()) {
      if (has_effect) {
        return Error(path + ".compensate",
                     effect_name + " tool " + Quote(step.tool) +
                         R"( needs a compensation, or "compensate": null with a "reason")");
      }
    } else if (comp->is_null()) {
      auto reason = s.find("reason");
      if (reason == s.end() || !reason->is_string()) {
        return Error(path + ".reason", "required when \"compensate\" is null");
      }
      if (IsBlank(reason->get_ref<const std::string&>())) {
        return Error(path + ".reason", "must not be blank");
      }
      step.no_compensation_reason = reason->get<std::string>();
    } else {
      const std::string cpath = path + ".compensate";
      if (step.effect == EffectClass::kRead) {
        return Error(cpath, "read tool " + Quote(step.tool) + " has no effect to compensate");
      }
      CompensationSpec c;
      c.tool = comp->at("tool").get<std::string>();
      if (tools.Find(c.tool) == nullptr) {
        return Error(cpath + ".tool", "unknown tool " + Quote(c.tool));
      }
      if (comp->contains("args")) {
        c.args = (*comp)["args"];
        RefScope cscope{&first_at, i, step.id, true, &*graph};
        IDEM_RETURN_IF_ERROR(CheckTemplates(c.args, cscope, cpath + ".args"));
      }
      if (comp->contains("retry")) {
        IDEM_RETURN_IF_ERROR(ApplyRetry((*comp)["retry"], RetryPolicy::kCompensationMaxAttemptsCap,
                                        "compensations", cpath + ".retry", &c.retry));
      }
      step.compensate = std::move(c);
    }
    IDEM_RETURN_IF_ERROR(
        ApplyTwoPhase(s, tool->info(), path, doc.value("approval", Json("none")), &step));
    IDEM_RETURN_IF_ERROR(CheckIrreversible(s, path, &step));
    if (s.contains("key")) {
      IDEM_RETURN_IF_ERROR(CheckTemplates(s["key"], scope, path + ".key"));
      IDEM_RETURN_IF_ERROR(ParseStepKey(s["key"], path + ".key", &step));
    }
    if (s.contains("guard")) {
      if (s["guard"].contains("args")) {
        IDEM_RETURN_IF_ERROR(CheckTemplates(s["guard"]["args"], scope, path + ".guard.args"));
      }
      IDEM_RETURN_IF_ERROR(ParseGuard(s["guard"], tools, path + ".guard", &step));
      if (s["guard"].contains("retry")) {
        IDEM_RETURN_IF_ERROR(ApplyRetry(s["guard"]["retry"],
                                        RetryPolicy::MaxAttemptsCap(EffectClass::kRead),
                                        "read tools", path + ".guard.retry", &step.guard->retry));
      }
    }
    IDEM_RETURN_IF_ERROR(CheckKeyRetention(step, tools, path));
    step.after = graph->parents[i];
    spec.steps.push_back(std::move(step));
  }
  IDEM_RETURN_IF_ERROR(CheckKeyCollisions(spec));
  spec.raw = doc;
  return spec;
}

}  // namespace

Result<SagaSpec> ParseSpec(const Json& doc, const ToolRegistry& tools) {
  try {
    if (TooDeep(doc, kMaxDepth)) {
      return Error("", "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    IDEM_RETURN_IF_ERROR(ValidateAgainstSchema(doc));
    std::vector<HoldOrigin> origin;  // saga/hold.h: "hold" steps as two
    auto expanded = ExpandHolds(doc, &origin);
    if (!expanded.ok()) return expanded.status();
    auto spec = Build(*expanded, tools);
    if (!spec.ok()) return PlaceHoldError(spec.status(), origin);
    LinkHolds(doc, origin, &*spec);
    spec->raw = doc;
    return spec;
  } catch (const std::exception& e) {
    // A bug: the schema should have refused what Build cannot read.
    return Status::Internal(std::string("spec: unexpected error: ") + e.what());
  }
}

Result<SagaSpec> ParseSpecText(const std::string& text, const ToolRegistry& tools,
                               const std::string& where) {
  try {
    Result<Json> doc = ParseJson(text, where, kMaxDepth);
    if (!doc.ok()) return doc.status();
    return ParseSpec(*doc, tools);
  } catch (const Json::exception& e) {
    // ParseJson turns parse errors into a Status, but nlohmann reports a
    // number too large for a double ("1e400") as out_of_range.
    std::string msg = e.what();
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    return Status::InvalidArgument(where + ": invalid JSON: " + msg);
  } catch (const std::exception& e) {
    return Status::Internal(where + ": unexpected error: " + e.what());
  }
}

int64_t ParseDurationMs(const Json& v) { return ParseTtlMs(v); }

const std::string& SagaSchemaText() {
  static const std::string* text = new std::string(generated::kSagaSchemaText);
  return *text;
}

Result<Json> ResolveTemplates(const Json& templ, const Json& context, const std::string& where,
                              TemplateBudget* budget) {
  try {
    return Resolve(templ, context, where, 0, budget);
  } catch (const std::exception& e) {
    return Status::Internal(Place(where) + ": unexpected error: " + e.what());
  }
}

namespace {

void CollectReferences(const Json& v, int depth, std::vector<std::string>* out) {
  if (depth > kMaxDepth) return;
  if (v.is_string()) {
    std::vector<Piece> pieces;
    std::string problem;
    if (!SplitTemplate(v.get_ref<const std::string&>(), &pieces, &problem)) return;
    for (Piece& p : pieces) {
      if (p.is_ref) out->push_back(std::move(p.text));
    }
  } else if (v.is_structured()) {
    for (const Json& child : v) CollectReferences(child, depth + 1, out);
  }
}

}  // namespace

Result<std::vector<TemplatePiece>> SplitTemplateText(const std::string& s,
                                                     const std::string& where) {
  std::vector<Piece> pieces;
  std::string problem;
  if (!SplitTemplate(s, &pieces, &problem)) return Error(where, problem);
  std::vector<TemplatePiece> out;
  for (Piece& p : pieces) out.push_back({p.is_ref, std::move(p.text)});
  return out;
}

std::vector<std::string> TemplateReferences(const Json& templ) {
  std::vector<std::string> out;
  CollectReferences(templ, 0, &out);
  return out;
}

}  // namespace idem
