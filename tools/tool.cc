#include "tools/tool.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace idem {

const char* EffectClassName(EffectClass c) {
  switch (c) {
    case EffectClass::kRead:
      return "read";
    case EffectClass::kIdempotent:
      return "idempotent";
    case EffectClass::kWrite:
      return "write";
    case EffectClass::kIrreversible:
      return "irreversible";
  }
  return "write";
}

Result<EffectClass> ParseEffectClass(const std::string& name) {
  if (name == "read") return EffectClass::kRead;
  if (name == "idempotent") return EffectClass::kIdempotent;
  if (name == "write") return EffectClass::kWrite;
  if (name == "irreversible") return EffectClass::kIrreversible;
  return Status::InvalidArgument("unknown effect class \"" + name +
                                 "\" (read, idempotent, write, irreversible)");
}

const char* OutcomeKindName(OutcomeKind k) {
  switch (k) {
    case OutcomeKind::kSucceeded:
      return "succeeded";
    case OutcomeKind::kFailed:
      return "failed";
    case OutcomeKind::kUnknown:
      return "unknown";
    case OutcomeKind::kAccepted:
      return "accepted";
  }
  return "unknown";
}

const char* LookupKindName(LookupKind k) {
  switch (k) {
    case LookupKind::kApplied:
      return "applied";
    case LookupKind::kNotApplied:
      return "not_applied";
    case LookupKind::kError:
      return "error";
    case LookupKind::kPending:
      return "pending";
    case LookupKind::kFailed:
      return "failed";
  }
  return "error";
}

ToolOutcome ToolOutcome::Accepted(std::string provider_ref, int64_t check_after_ms) {
  ToolOutcome o;
  o.kind = OutcomeKind::kAccepted;
  o.external_ref = std::move(provider_ref);
  o.check_after_ms = check_after_ms;
  return o;
}

ToolOutcome ToolOutcome::Succeeded(Json result, std::string external_ref) {
  ToolOutcome o;
  o.kind = OutcomeKind::kSucceeded;
  o.result = std::move(result);
  o.external_ref = std::move(external_ref);
  return o;
}

ToolOutcome ToolOutcome::Failed(std::string error, bool retryable) {
  ToolOutcome o;
  o.kind = OutcomeKind::kFailed;
  o.error = std::move(error);
  o.retryable = retryable;
  return o;
}

ToolOutcome ToolOutcome::Unknown(std::string error) {
  ToolOutcome o;
  o.kind = OutcomeKind::kUnknown;
  o.error = std::move(error);
  return o;
}

ToolOutcome ToolOutcome::Stale(std::string error) {
  ToolOutcome o = Failed(std::move(error), false);
  o.stale = true;
  return o;
}

PreviewOutcome Tool::Preview(const ToolCall& /*call*/) {
  PreviewOutcome o;
  o.error = "tool " + info().name + " offers no preview";
  return o;
}

LookupOutcome Tool::Lookup(const std::string& /*key*/) {
  LookupOutcome o;
  o.kind = LookupKind::kError;
  o.error = "tool " + info().name + " offers no status lookup";
  return o;
}

Result<std::vector<ProviderEffect>> Tool::ListEffects(int64_t /*since_ms*/) {
  return Status::FailedPrecondition("tool " + info().name + " cannot list its effects");
}

FunctionTool::FunctionTool(ToolInfo info, InvokeFn invoke, LookupFn lookup, PreviewFn preview,
                           ListFn list)
    : info_(std::move(info)),
      invoke_(std::move(invoke)),
      lookup_(std::move(lookup)),
      preview_(std::move(preview)),
      list_(std::move(list)) {
  info_.has_status = static_cast<bool>(lookup_);
  info_.has_preview = static_cast<bool>(preview_);
  info_.has_list = static_cast<bool>(list_);
}

Result<std::vector<ProviderEffect>> FunctionTool::ListEffects(int64_t since_ms) {
  if (!list_) return Tool::ListEffects(since_ms);
  try {
    return list_(since_ms);
  } catch (const std::exception& e) {
    return Status::Unavailable(std::string("effect list threw: ") + e.what());
  }
}

PreviewOutcome FunctionTool::Preview(const ToolCall& call) {
  if (!preview_) return Tool::Preview(call);
  try {
    return preview_(call);
  } catch (const std::exception& e) {
    PreviewOutcome o;
    o.error = std::string("preview threw: ") + e.what();
    o.retryable = true;  // a preview has no effect: asking again is safe
    return o;
  }
}

ToolOutcome FunctionTool::Invoke(const ToolCall& call) {
  try {
    return invoke_(call);
  } catch (const std::exception& e) {
    // The function may have done anything before it threw: uncertain.
    return ToolOutcome::Unknown(std::string("tool threw: ") + e.what());
  }
}

LookupOutcome FunctionTool::Lookup(const std::string& key) {
  if (!lookup_) return Tool::Lookup(key);
  try {
    return lookup_(key);
  } catch (const std::exception& e) {
    LookupOutcome o;
    o.kind = LookupKind::kError;
    o.error = std::string("status lookup threw: ") + e.what();
    return o;
  }
}

Status ToolRegistry::Register(std::unique_ptr<Tool> tool) {
  if (!tool) return Status::InvalidArgument("null tool");
  const std::string& name = tool->info().name;
  bool valid =
      !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (!valid)
    return Status::InvalidArgument("tool name \"" + name + "\" is not [A-Za-z0-9._-]{1,128}");
  if (tools_.count(name) != 0)
    return Status::Conflict("tool \"" + name + "\" is already registered");
  tools_[name] = std::move(tool);
  return Status::Ok();
}

Tool* ToolRegistry::Find(const std::string& name) const {
  auto it = tools_.find(name);
  return it == tools_.end() ? nullptr : it->second.get();
}

std::vector<ToolInfo> ToolRegistry::List() const {
  std::vector<ToolInfo> out;
  for (const auto& [name, tool] : tools_) out.push_back(tool->info());
  return out;
}

RetryPolicy RetryPolicy::DefaultFor(EffectClass c) {
  RetryPolicy p;
  switch (c) {
    case EffectClass::kRead:
    case EffectClass::kIdempotent:
      p.max_attempts = 5;
      break;
    case EffectClass::kWrite:
    case EffectClass::kIrreversible:
      p.max_attempts = 2;
      break;
  }
  return p;
}

RetryPolicy RetryPolicy::DefaultCompensation() {
  RetryPolicy p;
  p.max_attempts = 5;
  return p;
}

int RetryPolicy::MaxAttemptsCap(EffectClass c) {
  switch (c) {
    case EffectClass::kRead:
    case EffectClass::kIdempotent:
      return 10;
    case EffectClass::kWrite:
    case EffectClass::kIrreversible:
      return 2;
  }
  return 2;
}

namespace {

// The largest sleep before attempt `next_attempt`: min(cap, base * 2^n).
int64_t CeilingMs(const RetryPolicy& p, int next_attempt) {
  int shift = std::clamp(next_attempt - 2, 0, 30);
  int64_t ceiling = p.initial_backoff_ms;
  for (int i = 0; i < shift && ceiling < p.max_backoff_ms; ++i) ceiling *= 2;
  return std::min(ceiling, p.max_backoff_ms);
}

}  // namespace

int64_t RetryPolicy::BackoffMs(int next_attempt, std::mt19937_64& rng) const {
  int64_t ceiling = CeilingMs(*this, next_attempt);
  if (ceiling <= 0) return 0;
  std::uniform_int_distribution<int64_t> dist(0, ceiling);
  return dist(rng);
}

int64_t RetryPolicy::HorizonMs() const {
  int64_t total = 0;
  for (int next = 2; next <= max_attempts; ++next) {
    total += std::max<int64_t>(0, CeilingMs(*this, next));
  }
  return total;
}

}  // namespace idem
