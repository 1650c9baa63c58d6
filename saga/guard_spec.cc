#include "saga/guard_spec.h"

namespace idem {
namespace {

Status Bad(const std::string& where, const std::string& problem) {
  return Status::InvalidArgument(where + ": " + problem);
}

/// A JSON pointer (RFC 6901): "" or "/a/b".
Status CheckPointer(const Json& v, const std::string& where) {
  if (!v.is_string()) return Bad(where, "expected a JSON pointer string such as \"/booking_id\"");
  const std::string& s = v.get_ref<const std::string&>();
  try {
    (void)Json::json_pointer(s);
  } catch (const Json::exception&) {
    return Bad(where, "not a JSON pointer: \"" + PrintableText(s) +
                          "\" (expected \"\" or \"/name/...\", ~0 and ~1 for ~ and /)");
  }
  return Status::Ok();
}

}  // namespace

Status ParseGuard(const Json& guard, const ToolRegistry& tools, const std::string& where,
                  StepSpec* step) {
  if (!guard.is_object()) return Bad(where, "expected an object");
  GuardSpec g;
  const bool has_tool = guard.contains("tool");
  g.status_lookup = guard.value("status_lookup", false);
  if (has_tool == g.status_lookup) {
    return Bad(where, "needs either \"tool\" (a read tool) or \"status_lookup\": true");
  }
  if (g.status_lookup) {
    const Tool* own = tools.Find(step->tool);
    if (own == nullptr || !own->info().has_status) {
      return Bad(where + ".status_lookup",
                 "tool \"" + step->tool + "\" has no status lookup to ask");
    }
    for (const char* only_with_tool : {"args", "exists_when", "result"}) {
      if (guard.contains(only_with_tool)) {
        return Bad(where + "." + only_with_tool, "only applies with \"tool\"");
      }
    }
  } else {
    g.tool = guard["tool"].get<std::string>();
    const Tool* t = tools.Find(g.tool);
    if (t == nullptr) return Bad(where + ".tool", "unknown tool \"" + g.tool + "\"");
    if (t->info().effect != EffectClass::kRead) {
      return Bad(where + ".tool", std::string(EffectClassName(t->info().effect)) + " tool \"" +
                                      g.tool + "\" cannot be a guard: a guard must be a read");
    }
    if (!guard.contains("exists_when")) {
      return Bad(where + ".exists_when",
                 "required with \"tool\": a JSON pointer into the read's result whose value, "
                 "present and neither null nor false, says the effect exists");
    }
    IDEM_RETURN_IF_ERROR(CheckPointer(guard["exists_when"], where + ".exists_when"));
    g.exists_when = guard["exists_when"].get<std::string>();
    if (guard.contains("result")) {
      IDEM_RETURN_IF_ERROR(CheckPointer(guard["result"], where + ".result"));
      g.result_at = guard["result"].get<std::string>();
    }
    if (guard.contains("args")) g.args = guard["args"];
  }
  step->guard = std::move(g);
  return Status::Ok();
}

}  // namespace idem
