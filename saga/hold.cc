#include "saga/hold.h"

#include <cctype>

#include "saga/spec.h"

#include "common/duration.h"

namespace idem {
namespace {

Status HoldError(size_t index, const std::string& rest, const std::string& problem) {
  return Status::InvalidArgument("steps[" + std::to_string(index) + "]" + rest + ": " + problem);
}

/// `${hold.x}` -> `${steps.<auth>.result.x}` in every string of `v`; `$${`
/// stays a literal.
Json RewriteHoldRefs(const Json& v, const std::string& auth_id) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const std::string from = "${hold.";
    const std::string to = "${steps." + auth_id + ".result.";
    std::string out;
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, 3, "$${") == 0) {
        out += "$${";
        i += 3;
      } else if (s.compare(i, from.size(), from) == 0) {
        out += to;
        i += from.size();
      } else {
        out.push_back(s[i++]);
      }
    }
    return out;
  }
  if (v.is_object()) {
    Json out = Json::object();
    for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = RewriteHoldRefs(*it, auth_id);
    return out;
  }
  if (v.is_array()) {
    Json out = Json::array();
    for (const Json& e : v) out.push_back(RewriteHoldRefs(e, auth_id));
    return out;
  }
  return v;
}

/// The checks of one hold step as written, at `steps[i]`.
Status CheckHoldStep(const Json& s, size_t i, int64_t* lifetime_ms) {
  const Json& hold = s["hold"];
  auto life = ParseDurationMs(hold["lifetime"], "lifetime", StepSpec::kMaxApprovalTtlMs);
  if (!life.ok() || *life <= 0) {
    return HoldError(i, ".hold.lifetime",
                     "expected seconds or a duration like \"7d\", from 1s up to 30d");
  }
  *lifetime_ms = *life;
  if (s.contains("two_phase") && !s["two_phase"].get<bool>()) {
    return HoldError(i, ".two_phase", "a hold step is two-phase (its commit captures the hold)");
  }
  if (s.value("on_expiry", "rollback") == "re_preview") {
    return HoldError(i, ".on_expiry",
                     "a hold step rolls back on expiry (the hold is voided); \"re_preview\" "
                     "would need a new authorization, which is a new intent");
  }
  if (s.contains("approval_ttl")) {
    auto ttl = ParseDurationMs(s["approval_ttl"], "approval_ttl", StepSpec::kMaxApprovalTtlMs);
    if (ttl.ok() && *ttl > *lifetime_ms) {
      return HoldError(i, ".approval_ttl",
                       "the approval may not outlive the hold: " + s["approval_ttl"].dump() +
                           " is longer than hold.lifetime " + hold["lifetime"].dump());
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Json> ExpandHolds(const Json& doc, std::vector<HoldOrigin>* origin) {
  origin->clear();
  const Json& steps = doc.at("steps");
  bool declared = false;  // some step says "after": the capture must say it too
  for (const Json& s : steps) declared |= s.contains("after");
  Json out = doc;
  Json expanded = Json::array();
  for (size_t i = 0; i < steps.size(); ++i) {
    const Json& s = steps[i];
    if (!s.contains("hold")) {
      expanded.push_back(s);
      origin->push_back({static_cast<int>(i), false});
      continue;
    }
    int64_t lifetime_ms = 0;
    IDEM_RETURN_IF_ERROR(CheckHoldStep(s, i, &lifetime_ms));
    const Json& hold = s["hold"];
    const std::string id = s.at("id").get<std::string>();
    const std::string auth_id = id + kHoldStepSuffix;

    Json auth = {{"id", auth_id}, {"tool", hold.at("tool")}};
    if (hold.contains("args")) auth["args"] = RewriteHoldRefs(hold["args"], auth_id);
    if (hold.contains("retry")) auth["retry"] = hold["retry"];
    if (hold.contains("key")) auth["key"] = hold["key"];
    if (s.contains("after")) auth["after"] = s["after"];
    Json void_call = hold.at("void");
    if (void_call.contains("args")) void_call["args"] = RewriteHoldRefs(void_call["args"], auth_id);
    auth["compensate"] = void_call;

    Json capture = s;
    capture.erase("hold");
    capture["two_phase"] = true;
    if (capture.contains("args")) capture["args"] = RewriteHoldRefs(capture["args"], auth_id);
    if (capture.contains("compensate") && capture["compensate"].is_object() &&
        capture["compensate"].contains("args")) {
      capture["compensate"]["args"] = RewriteHoldRefs(capture["compensate"]["args"], auth_id);
    }
    // The approval waits at most as long as the hold lives.
    const bool asks = capture.contains("approval") && capture["approval"] != "none";
    if (asks && !capture.contains("approval_ttl")) capture["approval_ttl"] = lifetime_ms / 1000;
    if (declared) capture["after"] = Json::array({auth_id});

    expanded.push_back(std::move(auth));
    origin->push_back({static_cast<int>(i), true});
    expanded.push_back(std::move(capture));
    origin->push_back({static_cast<int>(i), false});
  }
  out["steps"] = std::move(expanded);
  return out;
}

Status PlaceHoldError(const Status& s, const std::vector<HoldOrigin>& origin) {
  if (s.ok()) return s;
  const std::string& m = s.message();
  std::string out;
  const std::string open = "steps[";
  for (size_t i = 0; i < m.size();) {
    if (m.compare(i, open.size(), open) != 0) {
      out.push_back(m[i++]);
      continue;
    }
    size_t j = i + open.size();
    size_t n = 0;
    bool digits = false;
    while (j < m.size() && std::isdigit(static_cast<unsigned char>(m[j])) && j - i < 12) {
      n = n * 10 + static_cast<size_t>(m[j] - '0');
      digits = true;
      ++j;
    }
    if (!digits || j >= m.size() || m[j] != ']' || n >= origin.size()) {
      out += open;
      i += open.size();
      continue;
    }
    ++j;  // past ']'
    const HoldOrigin& o = origin[n];
    out += open + std::to_string(o.index) + "]";
    if (o.authorize) {
      const std::string comp = ".compensate";
      if (m.compare(j, comp.size(), comp) == 0) {
        out += ".hold.void";
        j += comp.size();
      } else if (m.compare(j, 3, ".id") != 0 && m.compare(j, 6, ".after") != 0) {
        out += ".hold";
      }
    }
    i = j;
  }
  return Status(s.code(), out);
}

void LinkHolds(const Json& written, const std::vector<HoldOrigin>& origin, SagaSpec* spec) {
  const Json& steps = written.at("steps");
  for (size_t e = 0; e + 1 < origin.size() && e + 1 < spec->steps.size(); ++e) {
    if (!origin[e].authorize) continue;
    const Json& hold = steps[origin[e].index]["hold"];
    HoldLink link;
    link.authorize = static_cast<int>(e);
    link.capture = static_cast<int>(e + 1);
    auto life = ParseDurationMs(hold["lifetime"], "lifetime", StepSpec::kMaxApprovalTtlMs);
    link.lifetime_ms = life.ok() ? *life : 0;
    spec->steps[e].hold = link;
    spec->steps[e + 1].hold = link;
  }
}

int64_t HoldExpiresMs(const StepSpec& capture, const storage::StepRecord& authorize) {
  if (!capture.hold || !authorize.result.is_object()) return 0;
  auto it = authorize.result.find("expires_at_ms");
  if (it != authorize.result.end() && it->is_number_integer()) return it->get<int64_t>();
  return authorize.updated_ms + capture.hold->lifetime_ms;
}

bool HoldCaptured(const SagaSpec& spec, int index, const std::vector<StepState>& states) {
  if (index < 0 || index >= static_cast<int>(spec.steps.size())) return false;
  const auto& link = spec.steps[index].hold;
  if (!link || link->authorize != index) return false;
  if (link->capture >= static_cast<int>(states.size())) return false;
  StepState c = states[link->capture];
  return c == StepState::kSucceeded || c == StepState::kCompensating ||
         c == StepState::kCompensated || c == StepState::kCompensationFailed;
}

}  // namespace idem
