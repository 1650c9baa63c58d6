// The journal-entry logger (observability/observability.h).

#include <string>
#include <utility>

#include "compensation/rollback.h"
#include "saga/engine.h"

#include "observability/observability.h"

namespace idem::observability {
namespace {

// Entries that tell of trouble: a person may have to look.
bool IsTrouble(const std::string& event) {
  static const char* const kTrouble[] = {"failed",
                                         "unknown",
                                         "stale",
                                         "needs_attention",
                                         "compensation_failed",
                                         "token_expired",
                                         "approval_expired",
                                         "saga_failed",
                                         "saga_needs_attention"};
  for (const char* t : kTrouble) {
    if (event == t) return true;
  }
  return false;
}

// The idempotency key the entry is about: the one it records, else the
// step's key (or its compensation's key for a compensation entry).
std::string KeyOf(const storage::JournalEntry& e) {
  if (e.data.is_object() && e.data.contains("key") && e.data["key"].is_string()) {
    return e.data["key"].get<std::string>();
  }
  const std::string step_key = StepKey(e.saga_id, e.step_id);
  const bool compensation = e.event.rfind("compensat", 0) == 0 || e.event == "null_compensation";
  return compensation ? compensation::CompensationKey(step_key) : step_key;
}

}  // namespace

void LogJournalEntry(const storage::JournalEntry& e) {
  const LogLevel level = IsTrouble(e.event) ? LogLevel::kWarn : LogLevel::kInfo;
  if (!LogEnabled(level)) return;
  Json f = {{"saga_id", e.saga_id}, {"outcome", e.event}};
  if (e.seq > 0) f["seq"] = e.seq;
  if (!e.step_id.empty()) {
    f["step"] = e.step_id;
    f["key"] = KeyOf(e);
  }
  if (e.data.is_object()) {
    for (const char* k : {"attempt", "tool", "error", "reason", "by", "resolved_by", "approved_by",
                          "external_ref", "retry_after_ms", "intent_key"}) {
      auto it = e.data.find(k);
      if (it != e.data.end() && !it->is_null()) f[k] = *it;
    }
  }
  if (LogEnabled(LogLevel::kDebug)) f["data"] = e.data;
  Log(level, "journal", f);
}

JournalObserver WithJournalLog(JournalObserver next) {
  return [next = std::move(next)](const storage::JournalEntry& e) {
    LogJournalEntry(e);
    if (next) next(e);
  };
}

}  // namespace idem::observability
