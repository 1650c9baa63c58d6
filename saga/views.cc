#include "saga/views.h"

#include "preview_commit/phase.h"
#include "saga/park.h"
#include "saga/states.h"

namespace idem {

namespace {

// The approvals counted so far, as the views show them.
Json ApprovalsView(const preview_commit::PhaseRecord& phase) {
  Json out = Json::array();
  for (const auto& a : phase.approvals) {
    out.push_back(
        {{"by", a.by}, {"role", a.role}, {"at", FormatTimeMs(a.at_ms)}, {"note", a.note}});
  }
  return out;
}

}  // namespace

Json StepView(const storage::StepRecord& st) {
  Json s = {{"index", st.index},
            {"id", st.step_id},
            {"tool", st.tool},
            {"state", st.state},
            {"attempts", st.attempt},
            {"key", st.step_key},
            {"args", st.args},
            {"result", st.result},
            {"external_ref", st.external_ref},
            {"error", st.error},
            {"compensation_attempts", st.comp_attempt},
            {"compensation_result", st.comp_result}};
  // Why a drive could not get past it (saga/park.h).
  if (auto code = FindParkCode(st.error)) s["park_code"] = ParkCodeName(*code);
  if (auto phase = preview_commit::PhaseRecord::FromJson(st.phase)) {
    s["preview"] = phase->preview.ToJson();
    s["approval"] = phase->approval ? phase->approval->ToJson() : Json();
    if (phase->policy) {
      s["policy"] = phase->policy->ToJson();
      s["approvals"] = ApprovalsView(*phase);
    }
    // A phase without a deadline (none the engine writes) shows no expiry.
    if (phase->expires_ms > 0) s["approval_expires_at"] = FormatTimeMs(phase->expires_ms);
  }
  return s;
}

Json EffectView(const storage::EffectRecord& e) {
  return {{"step", e.step_id},
          {"kind", e.kind},
          {"tool", e.tool},
          {"key", e.idempotency_key},
          {"external_ref", e.external_ref},
          {"result", e.result},
          {"at", FormatTimeMs(e.at_ms)}};
}

std::optional<std::string> SagaParkCode(const storage::SagaSummary& saga) {
  if (saga.state != SagaStateName(SagaState::kNeedsAttention)) return std::nullopt;
  auto code = FindParkCode(saga.reason);
  if (!code) return std::nullopt;
  return std::string(ParkCodeName(*code));
}

std::optional<Json> ApprovalView(const std::string& saga_id, const storage::StepRecord& st) {
  auto phase = preview_commit::PhaseRecord::FromJson(st.phase);
  if (st.state != StepStateName(StepState::kAwaitingApproval) || !phase) return std::nullopt;
  Json v = {{"saga_id", saga_id},
            {"step", st.step_id},
            {"tool", st.tool},
            {"args", st.args},
            {"preview", phase->preview.ToJson()},
            {"expires_at", FormatTimeMs(phase->expires_ms)},
            {"token", phase->token}};
  // "approval": "human" is one approver; a policy's rule names its role.
  const bool policy = phase->policy && phase->policy->pass.empty();
  v["policy"] = policy ? Json{{"rule", phase->policy->rule},
                              {"role", phase->policy->role},
                              {"quorum", phase->policy->quorum}}
                       : Json{{"rule", nullptr}, {"role", "approver"}, {"quorum", 1}};
  v["approvals"] = ApprovalsView(*phase);
  return v;
}

void AddSpecRef(const storage::SagaSummary& s, Json* view) {
  (*view)["spec_version"] = s.spec_version > 0 ? Json(s.spec_version) : Json();
  (*view)["spec_sha256"] = s.spec_sha256;
}

void AddPruned(const storage::SagaSummary& s, Json* view) {
  (*view)["pruned"] = s.pruned_at_ms > 0;
  if (s.pruned_at_ms > 0) (*view)["pruned_at"] = FormatTimeMs(s.pruned_at_ms);
}

std::string SpecRefText(const storage::SagaSummary& s) {
  std::string out = s.spec_name;
  out += s.spec_version > 0 ? " version " + std::to_string(s.spec_version) : " (inline)";
  if (!s.spec_sha256.empty()) out += " " + s.spec_sha256;
  return out;
}

}  // namespace idem
