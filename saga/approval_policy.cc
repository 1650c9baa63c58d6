#include "saga/approval_policy.h"

#include <cctype>
#include <limits>

namespace idem {
namespace {

Status Bad(const std::string& path, const std::string& problem) {
  return Status::InvalidArgument(path + ": " + problem);
}

std::string Quoted(const std::string& s) {
  return Json(s.substr(0, 80)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// An integer JSON value as int64, saturating (nlohmann keeps positive
// integers unsigned).
int64_t AsInt64(const Json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    return u > kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(u);
  }
  return v.get<int64_t>();
}

const char* kOps[] = {"<=", ">=", "==", "!=", "<", ">"};

bool IsSegment(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

std::vector<std::string> SplitDots(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    out.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

// "" when `path` may be used in a condition, else what is wrong with it.
std::string PathProblem(const std::string& path) {
  const std::vector<std::string> parts = SplitDots(path);
  for (const auto& p : parts) {
    if (!IsSegment(p)) return "malformed path " + Quoted(path);
  }
  const std::string& root = parts[0];
  if (root != "args" && root != "input" && root != "preview") {
    return "path " + Quoted(path) + " must start with args., input. or preview.";
  }
  if (parts.size() < 2) return "path " + Quoted(path) + " names no value under " + root;
  if (root == "preview") {
    const std::string& what = parts[1];
    if (what != "summary" && what != "changes" && what != "resource_version") {
      return "path " + Quoted(path) +
             ": a preview has summary, changes.<path> and resource_version";
    }
    if (what != "changes" && parts.size() > 2) {
      return "path " + Quoted(path) + ": preview." + what + " is a string";
    }
    if (what == "changes" && parts.size() < 3) {
      return "path " + Quoted(path) + " names no value under preview.changes";
    }
  }
  return "";
}

void SkipSpaces(const std::string& s, size_t* i) {
  while (*i < s.size() && s[*i] == ' ') ++*i;
}

// Reads one `<path> <op> <literal>` from s[*i]; the text up to the next
// " and " or the end.
Status ReadCondition(const std::string& s, size_t* i, const std::string& at, PolicyCondition* c) {
  const std::string expected =
      "expected \"<path> <op> <literal>\" joined by \" and \" (op one of "
      "< <= > >= == !=), got " +
      Quoted(s);
  SkipSpaces(s, i);
  size_t start = *i;
  while (*i < s.size() && s[*i] != ' ' && std::string("<>=!").find(s[*i]) == std::string::npos) {
    ++*i;
  }
  c->path = s.substr(start, *i - start);
  if (c->path.empty()) return Bad(at, expected);
  if (std::string problem = PathProblem(c->path); !problem.empty()) return Bad(at, problem);
  SkipSpaces(s, i);
  for (const char* op : kOps) {
    if (s.compare(*i, std::char_traits<char>::length(op), op) == 0) {
      c->op = op;
      break;
    }
  }
  if (c->op.empty()) return Bad(at, expected);
  *i += c->op.size();
  SkipSpaces(s, i);
  start = *i;
  if (*i < s.size() && s[*i] == '"') {
    ++*i;
    while (*i < s.size() && s[*i] != '"') *i += s[*i] == '\\' ? 2 : 1;
    if (*i >= s.size()) return Bad(at, "unterminated string literal in " + Quoted(s));
    ++*i;
  } else {
    while (*i < s.size() && s[*i] != ' ') ++*i;
  }
  const std::string text = s.substr(start, *i - start);
  Json lit = Json::parse(text, nullptr, false);
  if (text.empty() || lit.is_discarded() || lit.is_object() || lit.is_array()) {
    return Bad(at, "expected a literal (a JSON number, string, true, false or null) after " +
                       Quoted(c->path + " " + c->op) + ", got " + Quoted(text));
  }
  c->literal = std::move(lit);
  return Status::Ok();
}

Result<std::vector<PolicyCondition>> ParseWhen(const std::string& when, const std::string& at) {
  std::vector<PolicyCondition> out;
  size_t i = 0;
  while (true) {
    PolicyCondition c;
    IDEM_RETURN_IF_ERROR(ReadCondition(when, &i, at, &c));
    out.push_back(std::move(c));
    SkipSpaces(when, &i);
    if (i == when.size()) return out;
    if (when.compare(i, 4, "and ") != 0 || when[i - 1] != ' ') {
      return Bad(at, "expected \" and \" or the end after " + Quoted(when.substr(0, i)) +
                         " (no \"or\", no parentheses)");
    }
    i += 4;
  }
}

// The value at `path` in `context`, or nullptr.
const Json* Lookup(const Json& context, const std::string& path) {
  const Json* v = &context;
  for (const auto& part : SplitDots(path)) {
    if (v->is_object()) {
      auto it = v->find(part);
      if (it == v->end()) return nullptr;
      v = &*it;
    } else if (v->is_array() && !part.empty() &&
               part.find_first_not_of("0123456789") == std::string::npos && part.size() < 9) {
      size_t n = std::stoul(part);
      if (n >= v->size()) return nullptr;
      v = &(*v)[n];
    } else {
      return nullptr;
    }
  }
  return v;
}

bool Holds(const PolicyCondition& c, const Json& v) {
  const Json& lit = c.literal;
  const bool numbers = v.is_number() && lit.is_number();
  const bool same = numbers || (v.is_string() && lit.is_string()) ||
                    (v.is_boolean() && lit.is_boolean()) || (v.is_null() && lit.is_null());
  if (c.op == "==" || c.op == "!=") {
    // null compares with anything by equality; other types must agree.
    if (!same && !lit.is_null()) return false;
    bool eq = numbers ? v.get<double>() == lit.get<double>() : v == lit;
    return c.op == "==" ? eq : !eq;
  }
  if (!numbers && !(v.is_string() && lit.is_string())) return false;
  bool lt, gt;
  if (numbers) {
    if (v.is_number_integer() && lit.is_number_integer()) {
      lt = AsInt64(v) < AsInt64(lit);
      gt = AsInt64(v) > AsInt64(lit);
    } else {
      lt = v.get<double>() < lit.get<double>();
      gt = v.get<double>() > lit.get<double>();
    }
  } else {
    lt = v.get_ref<const std::string&>() < lit.get_ref<const std::string&>();
    gt = v.get_ref<const std::string&>() > lit.get_ref<const std::string&>();
  }
  if (c.op == "<") return lt;
  if (c.op == "<=") return !gt;
  if (c.op == ">") return gt;
  return !lt;  // >=
}

}  // namespace

bool IsRoleName(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] < 'a' || s[0] > 'z') return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<ApprovalPolicy> ParseApprovalPolicy(const Json& v, const std::string& path) {
  if (!v.is_object()) return Bad(path, "expected \"none\", \"human\" or {\"rules\": [...]}");
  for (const auto& [k, _] : v.items()) {
    if (k != "rules") return Bad(path, "unknown property " + Quoted(k) + " (expected \"rules\")");
  }
  const std::string rules_at = path + ".rules";
  auto rules = v.find("rules");
  if (rules == v.end()) return Bad(path, "missing required property \"rules\"");
  if (!rules->is_array() || rules->empty()) return Bad(rules_at, "expected a non-empty array");
  if (rules->size() > ApprovalPolicy::kMaxRules) {
    return Bad(rules_at, std::to_string(rules->size()) + " rules exceed the maximum of " +
                             std::to_string(ApprovalPolicy::kMaxRules));
  }
  ApprovalPolicy policy;
  policy.place = path;
  for (size_t i = 0; i < rules->size(); ++i) {
    const Json& r = (*rules)[i];
    const std::string at = rules_at + "[" + std::to_string(i) + "]";
    if (!r.is_object()) return Bad(at, "expected an object");
    PolicyRule rule;
    for (const auto& [k, val] : r.items()) {
      if (k != "when" && k != "pass" && k != "role" && k != "quorum") {
        return Bad(at, "unknown property " + Quoted(k) +
                           " (expected \"when\", \"pass\", \"role\", \"quorum\")");
      }
    }
    if (r.contains("when")) {
      if (!r["when"].is_string()) return Bad(at + ".when", "expected a string");
      rule.when = r["when"].get<std::string>();
      auto conds = ParseWhen(rule.when, at + ".when");
      if (!conds.ok()) return conds.status();
      rule.conditions = std::move(conds).value();
    }
    const bool pass = r.contains("pass");
    const bool role = r.contains("role");
    if (pass && role) return Bad(at, "a rule has \"pass\" or \"role\", not both");
    if (!pass && !role) return Bad(at, "a rule needs \"pass\" (a reason) or \"role\"");
    if (pass) {
      if (r.contains("quorum")) return Bad(at + ".quorum", "only applies with \"role\"");
      if (!r["pass"].is_string() || r["pass"].get<std::string>().empty()) {
        return Bad(at + ".pass", "expected a non-empty string: why no person is needed");
      }
      rule.pass = true;
      rule.reason = r["pass"].get<std::string>();
    } else {
      if (!r["role"].is_string() || !IsRoleName(r["role"].get<std::string>())) {
        return Bad(at + ".role",
                   "expected a role name ([a-z][a-z0-9_.-]{0,63}), got " + r["role"].dump());
      }
      rule.role = r["role"].get<std::string>();
      if (r.contains("quorum")) {
        const Json& q = r["quorum"];
        if (!q.is_number_integer()) return Bad(at + ".quorum", "expected an integer");
        int64_t n = AsInt64(q);
        if (n < 1) return Bad(at + ".quorum", std::to_string(n) + " is below the minimum of 1");
        if (n > ApprovalPolicy::kMaxQuorum) {
          return Bad(at + ".quorum", std::to_string(n) + " is above the maximum of " +
                                         std::to_string(ApprovalPolicy::kMaxQuorum));
        }
        rule.quorum = static_cast<int>(n);
      }
    }
    policy.rules.push_back(std::move(rule));
  }
  if (!policy.rules.back().when.empty()) {
    return Bad(rules_at + "[" + std::to_string(policy.rules.size() - 1) + "].when",
               "the last rule must have no \"when\": a commit that matches no rule would have "
               "no policy");
  }
  return policy;
}

PolicyMatch EvaluatePolicy(const ApprovalPolicy& policy, const Json& context) {
  PolicyMatch m;
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    const PolicyRule& rule = policy.rules[i];
    Json values = Json::object();
    bool holds = true;
    for (const auto& c : rule.conditions) {
      const Json* v = Lookup(context, c.path);
      values[c.path] = v ? *v : Json();
      holds = holds && v != nullptr && Holds(c, *v);
    }
    if (holds || i + 1 == policy.rules.size()) {
      m.rule = static_cast<int>(i);
      m.values = std::move(values);
      return m;
    }
  }
  return m;
}

}  // namespace idem
