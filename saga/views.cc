#include "saga/views.h"

#include "saga/states.h"

namespace idem {

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
  if (st.phase.is_object()) {
    s["preview"] = st.phase.value("preview", Json());
    s["approval"] = st.phase.value("approval", Json());
    if (st.phase.contains("expires_ms")) {
      s["approval_expires_at"] = FormatTimeMs(st.phase.value("expires_ms", int64_t{0}));
    }
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

std::optional<Json> ApprovalView(const std::string& saga_id, const storage::StepRecord& st) {
  if (st.state != StepStateName(StepState::kAwaitingApproval) || !st.phase.is_object()) {
    return std::nullopt;
  }
  return Json{{"saga_id", saga_id},
              {"step", st.step_id},
              {"tool", st.tool},
              {"args", st.args},
              {"preview", st.phase.value("preview", Json::object())},
              {"expires_at", FormatTimeMs(st.phase.value("expires_ms", int64_t{0}))},
              {"token", st.phase.value("token", "")}};
}

}  // namespace idem
