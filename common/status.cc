#include "common/status.h"

namespace idem {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kNotFound:
      return "not_found";
    case Code::kConflict:
      return "conflict";
    case Code::kFailedPrecondition:
      return "failed_precondition";
    case Code::kIllegalTransition:
      return "illegal_transition";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kAborted:
      return "aborted";
    case Code::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

}  // namespace idem
