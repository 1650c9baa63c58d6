#include "saga/limits.h"

#include <algorithm>
#include <utility>

#include "saga/spec.h"

namespace idem {
namespace {

size_t Add(size_t a, size_t b) {
  return a > std::numeric_limits<size_t>::max() - b ? std::numeric_limits<size_t>::max() : a + b;
}

size_t Bytes(const Json& v, size_t stop, size_t acc) {
  if (acc > stop) return acc;
  switch (v.type()) {
    case Json::value_t::string:
      return Add(acc, v.get_ref<const std::string&>().size() + 2);
    case Json::value_t::array: {
      acc = Add(acc, v.empty() ? 2 : 1 + v.size());  // brackets and commas
      for (const Json& e : v) {
        acc = Bytes(e, stop, acc);
        if (acc > stop) return acc;
      }
      return acc;
    }
    case Json::value_t::object: {
      acc = Add(acc, v.empty() ? 2 : 1 + v.size());  // braces and commas
      for (auto it = v.begin(); it != v.end(); ++it) {
        acc = Bytes(it.value(), stop, Add(acc, it.key().size() + 3));
        if (acc > stop) return acc;
      }
      return acc;
    }
    case Json::value_t::null:
      return Add(acc, 4);
    case Json::value_t::boolean:
      return Add(acc, v.get<bool>() ? 4 : 5);
    default:
      return Add(acc, v.dump().size());
  }
}

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

// The budget of one resolution: max_arg_bytes, or what the saga has left
// when that is less (the error names the bound that binds).
TemplateBudget BudgetFor(const SagaLimits& limits, size_t saga_room) {
  TemplateBudget b;
  if (saga_room < limits.max_arg_bytes) {
    b.max_bytes = saga_room;
    b.limit = "what max_saga_bytes (" + Bytes(limits.max_saga_bytes) +
              " for the input and all arguments) leaves (" + Bytes(saga_room) + ")";
  } else {
    b.max_bytes = limits.max_arg_bytes;
    b.limit = "max_arg_bytes (" + Bytes(limits.max_arg_bytes) + " per call)";
  }
  return b;
}

}  // namespace

size_t JsonBytes(const Json& v, size_t stop) { return Bytes(v, stop, 0); }

Status CheckSubmitLimits(const SagaSpec& spec, const Json& input, const SagaLimits& limits) {
  if (spec.steps.size() > static_cast<size_t>(std::max(limits.max_steps, 0))) {
    return Status::InvalidArgument("steps: " + std::to_string(spec.steps.size()) +
                                   " steps, more than max_steps (" +
                                   std::to_string(limits.max_steps) + ")");
  }
  size_t total = JsonBytes(input, limits.max_saga_bytes);
  if (total > limits.max_saga_bytes) {
    return Status::InvalidArgument("input: larger than max_saga_bytes (" +
                                   Bytes(limits.max_saga_bytes) + ")");
  }
  // Only the input is known yet: references to steps count as nothing here
  // and are checked when their step runs.
  const Json context = {{"input", input}, {"steps", Json::object()}};
  auto check = [&](const Json& templ, const std::string& where) -> Status {
    TemplateBudget b = BudgetFor(limits, limits.max_saga_bytes - total);
    b.skip_step_refs = true;
    auto resolved = ResolveTemplates(templ, context, where, &b);
    if (!resolved.ok()) return resolved.status();
    total += b.used;
    return Status::Ok();
  };
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    const StepSpec& step = spec.steps[i];
    const std::string path = "steps[" + std::to_string(i) + "]";
    IDEM_RETURN_IF_ERROR(check(step.args, path + ".args"));
    if (step.compensate)
      IDEM_RETURN_IF_ERROR(check(step.compensate->args, path + ".compensate.args"));
  }
  return Status::Ok();
}

Result<Json> ResolveWithinLimits(const Json& templ, const Json& context, const std::string& where,
                                 const SagaLimits& limits, size_t saga_room) {
  TemplateBudget b = BudgetFor(limits, saga_room);
  return ResolveTemplates(templ, context, where, &b);
}

bool IsLimitRefusal(const Status& s) {
  return s.code() == Code::kInvalidArgument &&
         s.message().find("resolved arguments exceed ") != std::string::npos;
}

}  // namespace idem
