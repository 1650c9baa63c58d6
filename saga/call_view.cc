#include "saga/call_view.h"

namespace idem {

Json CallAnswerView(const std::string& saga_id, const CallAnswer& a) {
  Json j = {{"saga_id", saga_id},
            {"call_id", a.call_id},
            {"step_id", a.step_id},
            {"tool", a.tool},
            {"state", a.state},
            {"saga_state", a.saga_state},
            {"deduplicated", a.deduplicated}};
  if (a.deduplicated) {
    j["duplicate_of"] = a.duplicate_of;
    j["reason"] = a.duplicate_reason;
  }
  if (!a.result.is_null()) j["result"] = a.result;
  if (!a.error.empty()) j["error"] = a.error;
  return j;
}

}  // namespace idem
