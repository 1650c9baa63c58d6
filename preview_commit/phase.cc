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
  return {{"decision", decision}, {"by", by}, {"note", note}, {"at_ms", at_ms}};
}

Json PhaseRecord::ToJson() const {
  Json j = {{"preview", preview.ToJson()},
            {"token", token},
            {"nonce", nonce},
            {"expires_ms", expires_ms},
            {"args_fingerprint", args_fingerprint},
            {"previews", previews}};
  if (approval) j["approval"] = approval->ToJson();
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
  if (ap != phase.end() && ap->is_object()) {
    ApprovalRecord a;
    a.decision = Member<std::string>(*ap, "decision", "");
    a.by = Member<std::string>(*ap, "by", "");
    a.note = Member<std::string>(*ap, "note", "");
    a.at_ms = Member<int64_t>(*ap, "at_ms", 0);
    r.approval = std::move(a);
  }
  return r;
}

}  // namespace idem::preview_commit
