#include "storage/control_store.h"

namespace idem::storage {

bool ControlReplaces(const std::string& pending, const std::string& wanted) {
  return pending != "cancel" && pending != wanted;
}

Status CheckControlRequest(const ControlRequest& r) {
  if (r.kind != "cancel" && r.kind != "pause" && r.kind != "resume") {
    return Status::InvalidArgument("control request: kind \"" + r.kind +
                                   "\" is not cancel, pause or resume");
  }
  if (r.saga_id.empty()) return Status::InvalidArgument("control request: saga_id is empty");
  if (r.request_id.empty()) return Status::InvalidArgument("control request: request_id is empty");
  if (r.by.empty()) return Status::InvalidArgument("control request: who asks (by) is empty");
  return Status::Ok();
}

}  // namespace idem::storage
