#include "preview_commit/phase.h"

namespace idem::preview_commit {
namespace {

// A member of `j` if it has the type of `fallback`, else `fallback`.
template <typename T>
T Member(const Json& j, const char* name, T fallback) {
  auto it = j.find(name);
  if (it == j.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->template get<std::string>() : fallback;
  } else {
    return it->is_number() ? it->template get<T>() : fallback;
  }
}

}  // namespace

Json PreviewRecord::ToJson() const {
  return {{"summary", summary}, {"changes", changes}, {"resource_version", resource_version}};
}

Json ApprovalRecord::ToJson() const {
  Json j = {{"decision", decision}, {"by", by}, {"note", note}, {"at_ms", at_ms}};
  if (!role.empty()) j["role"] = role;
  return j;
}

static ApprovalRecord ApprovalFromJson(const Json& ap) {
  ApprovalRecord a;
  a.decision = Member<std::string>(ap, "decision", "");
  a.by = Member<std::string>(ap, "by", "");
  a.note = Member<std::string>(ap, "note", "");
  a.at_ms = Member<int64_t>(ap, "at_ms", 0);
  a.role = Member<std::string>(ap, "role", "");
  return a;
}

Json PolicyDemand::ToJson() const {
  Json j = {{"rule", rule}};
  if (!pass.empty()) {
    j["pass"] = pass;
  } else {
    j["role"] = role;
    j["quorum"] = quorum;
  }
  return j;
}

Json PhaseRecord::ToJson() const {
  Json j = {{"preview", preview.ToJson()},
            {"token", token},
            {"nonce", nonce},
            {"expires_ms", expires_ms},
            {"args_fingerprint", args_fingerprint},
            {"previews", previews}};
  if (approval) j["approval"] = approval->ToJson();
  if (policy) j["policy"] = policy->ToJson();
  if (policy || !approvals.empty()) {
    j["approvals"] = Json::array();
    for (const auto& a : approvals) j["approvals"].push_back(a.ToJson());
  }
  return j;
}

std::optional<PhaseRecord> PhaseRecord::FromJson(const Json& phase) {
  if (!phase.is_object()) return std::nullopt;
  PhaseRecord r;
  auto pv = phase.find("preview");
  if (pv != phase.end() && pv->is_object()) {
    r.preview.summary = Member<std::string>(*pv, "summary", "");
    auto changes = pv->find("changes");
    if (changes != pv->end()) r.preview.changes = *changes;
    r.preview.resource_version = Member<std::string>(*pv, "resource_version", "");
  }
  r.token = Member<std::string>(phase, "token", "");
  r.nonce = Member<std::string>(phase, "nonce", "");
  r.expires_ms = Member<int64_t>(phase, "expires_ms", 0);
  r.args_fingerprint = Member<std::string>(phase, "args_fingerprint", "");
  r.previews = Member<int>(phase, "previews", 0);
  auto ap = phase.find("approval");
  if (ap != phase.end() && ap->is_object()) r.approval = ApprovalFromJson(*ap);
  auto pol = phase.find("policy");
  if (pol != phase.end() && pol->is_object()) {
    PolicyDemand d;
    d.rule = Member<int>(*pol, "rule", 0);
    d.pass = Member<std::string>(*pol, "pass", "");
    d.role = Member<std::string>(*pol, "role", "");
    d.quorum = Member<int>(*pol, "quorum", 1);
    r.policy = std::move(d);
  }
  auto votes = phase.find("approvals");
  if (votes != phase.end() && votes->is_array()) {
    for (const auto& v : *votes) {
      if (v.is_object()) r.approvals.push_back(ApprovalFromJson(v));
    }
  }
  return r;
}

}  // namespace idem::preview_commit
