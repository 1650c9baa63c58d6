#include "saga/completion.h"

#include <algorithm>

#include "saga/states.h"

namespace idem::completion {

storage::StepCheck NextCheck(const CompletionPolicy& policy,
                             const std::optional<storage::StepCheck>& current,
                             const std::string& step_id, int64_t now_ms, int64_t suggested_ms,
                             std::mt19937_64* rng) {
  storage::StepCheck next;
  if (current) {
    next = *current;
    ++next.checks;
  } else {
    next.step_id = step_id;
    next.since_ms = now_ms;
    next.deadline_ms = now_ms + std::max<int64_t>(policy.window_ms, 1);
    next.checks = 0;
  }
  int64_t delay = suggested_ms;
  if (delay <= 0) {
    // Full jitter over an exponential ceiling: uniform(first, min(cap, first * 2^n)).
    const int64_t first = std::max<int64_t>(policy.first_check_ms, 1);
    const int64_t cap = std::max(policy.max_check_ms, first);
    int64_t ceiling = first;
    for (int i = 0; i < next.checks && ceiling < cap; ++i) ceiling *= 2;
    ceiling = std::min(ceiling, cap);
    // Every check is made by a fresh drive, whose generator starts from the
    // same per-saga seed (SagaRun): drawn from it alone, each check would
    // wait the same fraction of its ceiling. The check's number is mixed in,
    // so the draws of one saga differ from check to check and stay
    // reproducible from EngineOptions::seed.
    std::mt19937_64 draw((*rng)() ^
                         (static_cast<uint64_t>(next.checks) + 1) * 0x9e3779b97f4a7c15ULL);
    std::uniform_int_distribution<int64_t> dist(first, ceiling);
    delay = dist(draw);
  }
  // The last check lands on the window's end, so a late finish is still seen.
  next.next_check_ms = std::min(now_ms + delay, next.deadline_ms);
  if (next.next_check_ms <= now_ms) next.next_check_ms = now_ms + 1;
  return next;
}

bool PastWindow(const storage::StepCheck& check, int64_t now_ms) {
  return now_ms >= check.deadline_ms;
}

std::string WindowReason(const std::string& tool, const std::string& key,
                         const storage::StepCheck& check, const std::string& last_answer) {
  return "the provider of " + tool + " did not finish key " + key +
         " within its completion window (" +
         std::to_string((check.deadline_ms - check.since_ms) / 1000) + " s, " +
         std::to_string(check.checks + 1) + " status checks; last answer: " + last_answer +
         "): a person must check it";
}

Result<std::optional<int64_t>> EarliestCheck(storage::Store* store, const std::string& saga_id) {
  auto checks = store->ListStepChecks(saga_id);
  if (!checks.ok()) return checks.status();
  std::optional<int64_t> earliest;
  for (const storage::StepCheck& c : *checks) {
    if (!earliest || c.next_check_ms < *earliest) earliest = c.next_check_ms;
  }
  return earliest;
}

Status AddDue(storage::Store* store, int64_t now_ms, std::vector<storage::SagaSummary>* list,
              int limit) {
  auto due = store->ListDueChecks(SagaStateName(SagaState::kAwaitingCompletion), now_ms, limit);
  if (!due.ok()) {
    // A store without step checks (a test double) has no waiting sagas.
    return due.status().code() == Code::kFailedPrecondition ? Status::Ok() : due.status();
  }
  for (const storage::DueCheck& d : *due) {
    storage::SagaSummary s;
    s.saga_id = d.saga_id;
    s.state = SagaStateName(SagaState::kAwaitingCompletion);
    list->push_back(std::move(s));
  }
  return Status::Ok();
}

}  // namespace idem::completion
