#include "tools/open_policy.h"

namespace idem {
namespace {

Status Bad(const std::string& place, const std::string& problem) {
  return Status::InvalidArgument(place + ": " + problem);
}

}  // namespace

const char* const* OpenPolicyFields() {
  static const char* const kFields[] = {"compensate", "reason",   "repeats",
                                        "two_phase",  "approval", nullptr};
  return kFields;
}

Status ParseOpenCallPolicy(const Json& entry, const std::string& place, OpenCallPolicy* out) {
  // "reason" says why there is no compensation, or why nobody approves.
  if (entry.contains("reason") && !entry.value("compensate", Json::object()).is_null() &&
      entry.value("approval", Json()) != "none") {
    return Bad(place + ".reason", "only with \"compensate\": null or \"approval\": \"none\"");
  }
  if (auto c = entry.find("compensate"); c != entry.end()) {
    if (c->is_null()) {
      auto reason = entry.find("reason");
      if (reason == entry.end() || !reason->is_string() || reason->get<std::string>().empty()) {
        return Bad(place + ".reason", "required (a non-empty string) when \"compensate\" is null");
      }
      out->no_compensation_reason = reason->get<std::string>();
    } else if (c->is_object()) {
      for (auto it = c->begin(); it != c->end(); ++it) {
        if (it.key() != "tool" && it.key() != "args") {
          return Bad(place + ".compensate." + it.key(), "unknown field");
        }
      }
      auto tool = c->find("tool");
      if (tool == c->end()) return Bad(place + ".compensate.tool", "is required");
      if (!tool->is_string() || tool->get<std::string>().empty()) {
        return Bad(place + ".compensate.tool", "expected a tool name");
      }
      out->compensate_tool = tool->get<std::string>();
      if (auto args = c->find("args"); args != c->end()) {
        if (!args->is_object()) return Bad(place + ".compensate.args", "expected an object");
        out->compensate_args = *args;
      }
    } else {
      return Bad(place + ".compensate", "expected an object or null");
    }
  }
  if (auto r = entry.find("repeats"); r != entry.end()) {
    if (*r == "deduplicate") {
      out->deduplicate_repeats = true;
    } else if (*r == "allow") {
      out->deduplicate_repeats = false;
    } else {
      return Bad(place + ".repeats", "expected \"deduplicate\" or \"allow\"");
    }
  }
  if (auto t = entry.find("two_phase"); t != entry.end()) {
    if (!t->is_boolean()) return Bad(place + ".two_phase", "expected true or false");
    out->two_phase = t->get<bool>();
  }
  if (auto a = entry.find("approval"); a != entry.end()) {
    if (*a == "human") {
      out->human_approval = true;
      out->two_phase = true;
    } else if (*a != "none") {
      return Bad(place + ".approval", "expected \"none\" or \"human\"");
    } else if (auto reason = entry.find("reason"); reason != entry.end()) {
      if (!reason->is_string() || reason->get<std::string>().empty()) {
        return Bad(place + ".reason", "expected a non-empty string");
      }
      out->no_approval_reason = reason->get<std::string>();
    }
  }
  return Status::Ok();
}

}  // namespace idem
