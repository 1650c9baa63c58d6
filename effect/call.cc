#include "effect/call.h"

namespace idem::effect {
namespace {

// RAII over a Boundary (null: no boundary), so that a tool that breaks its
// contract by throwing still leaves the boundary on the way out.
class Scope {
 public:
  explicit Scope(Boundary* b) : b_(b) {
    if (b_ != nullptr) b_->Enter();
  }
  ~Scope() {
    if (b_ != nullptr) b_->Leave();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Boundary* b_;
};

}  // namespace

ToolOutcome Invoke(CallKind, Tool* tool, const ToolCall& call, Boundary* boundary) {
  Scope scope(boundary);
  return tool->Invoke(call);
}

LookupOutcome Lookup(CallKind, Tool* tool, const std::string& key, Boundary* boundary) {
  Scope scope(boundary);
  return tool->Lookup(key);
}

PreviewOutcome Preview(Tool* tool, const ToolCall& call, Boundary* boundary) {
  Scope scope(boundary);
  return tool->Preview(call);
}

Result<std::vector<ProviderEffect>> ListEffects(Tool* tool, int64_t since_ms, Boundary* boundary) {
  Scope scope(boundary);
  return tool->ListEffects(since_ms);
}

void Sleep(Clock* clock, int64_t ms, Boundary* boundary) {
  Scope scope(boundary);
  clock->SleepMs(ms);
}

}  // namespace idem::effect
