#include "server/metrics.h"

#include <algorithm>
#include <iterator>
#include <sstream>

#include "saga/states.h"

namespace idem::server {

void Metrics::Observe(const storage::JournalEntry& e, storage::Store* store) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string step = e.saga_id + "/" + e.step_id;
  if (!e.step_id.empty()) {
    bool was_unknown = unknown_.count(step) > 0;
    if (e.event == "succeeded" || e.event == "failed" || e.event == "needs_attention") {
      ++steps_[e.event];
    }
    if (e.event == "unknown") {
      ++steps_["unknown"];
      ++unknown_total_;
      unknown_.insert(step);
    } else if (was_unknown) {
      std::string how;
      if (e.event == "succeeded") {
        how = e.data.is_object() && e.data.contains("resolved_by") ? "status_lookup"
                                                                   : "same_key_retry";
      } else if (e.event == "submitted") {
        how = "same_key_retry";
      } else if (e.event == "failed") {
        how = "not_applied";
      } else if (e.event == "needs_attention") {
        how = "needs_attention";
      } else if (e.event == "operator_resolved") {
        how = "operator";
      }
      if (!how.empty()) {
        ++unknown_resolved_[how];
        if (how != "needs_attention") unknown_.erase(step);
      }
    }
    if (e.event == "submitted" && e.data.is_object() && e.data.contains("retry_after_ms")) {
      ++retries_;
    }
    if (e.event == "compensated") ++compensations_["compensated"];
    if (e.event == "compensation_failed") ++compensations_["failed"];
    return;
  }
  static const std::set<std::string> kTerminal = {"saga_succeeded", "saga_compensated",
                                                  "saga_failed", "saga_cancelled"};
  if (kTerminal.count(e.event) == 0) return;
  auto rec = store->LoadSaga(e.saga_id);
  if (!rec.ok()) return;
  ObserveTerminalLocked(static_cast<double>(e.at_ms - rec->summary.created_ms) / 1000.0);
  for (auto it = unknown_.begin(); it != unknown_.end();) {
    it = it->rfind(e.saga_id + "/", 0) == 0 ? unknown_.erase(it) : std::next(it);
  }
}

void Metrics::ObserveTerminal(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ObserveTerminalLocked(seconds);
}

void Metrics::Duplicate(const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  ++duplicates_[how];
}

void Metrics::Request(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[status];
}

std::string Metrics::Render(storage::Store* store) {
  std::ostringstream o;
  storage::SagaFilter f;
  f.limit = 100'000'000;
  std::map<std::string, int64_t> by_state;
  for (int s = 0; s <= static_cast<int>(SagaState::kNeedsAttention); ++s) {
    by_state[SagaStateName(static_cast<SagaState>(s))] = 0;
  }
  auto list = store->ListSagas(f);
  bool store_ok = list.ok();
  if (store_ok) {
    for (const auto& s : *list) ++by_state[s.state];
  }
  o << "# HELP idem_store_up Whether the last scrape could read the journal.\n"
    << "# TYPE idem_store_up gauge\nidem_store_up " << (store_ok ? 1 : 0) << "\n";
  if (store_ok) {
    o << "# HELP idem_sagas Sagas in the journal by state.\n# TYPE idem_sagas gauge\n";
    for (const auto& [state, n] : by_state) {
      o << "idem_sagas{state=\"" << state << "\"} " << n << "\n";
    }
    o << "# HELP idem_sagas_needing_attention Sagas parked for a person.\n"
      << "# TYPE idem_sagas_needing_attention gauge\n"
      << "idem_sagas_needing_attention " << by_state["needs_attention"] << "\n";
  }
  std::lock_guard<std::mutex> lock(mu_);
  o << "# HELP idem_step_outcomes_total Step outcomes journaled by this process.\n"
    << "# TYPE idem_step_outcomes_total counter\n";
  for (const char* k : {"succeeded", "failed", "unknown", "needs_attention"}) {
    o << "idem_step_outcomes_total{outcome=\"" << k << "\"} " << Get(steps_, k) << "\n";
  }
  o << "# HELP idem_duplicates_absorbed_total Intent replays answered without a new saga.\n"
    << "# TYPE idem_duplicates_absorbed_total counter\n";
  for (const char* k : {"stored_response", "existing_intent", "in_flight"}) {
    o << "idem_duplicates_absorbed_total{how=\"" << k << "\"} " << Get(duplicates_, k) << "\n";
  }
  o << "# HELP idem_unknown_outcomes_total Tool calls whose outcome was unknown.\n"
    << "# TYPE idem_unknown_outcomes_total counter\n"
    << "idem_unknown_outcomes_total " << unknown_total_ << "\n";
  o << "# HELP idem_unknown_resolved_total How unknown outcomes were resolved.\n"
    << "# TYPE idem_unknown_resolved_total counter\n";
  for (const char* k :
       {"status_lookup", "same_key_retry", "not_applied", "needs_attention", "operator"}) {
    o << "idem_unknown_resolved_total{how=\"" << k << "\"} " << Get(unknown_resolved_, k) << "\n";
  }
  o << "# HELP idem_retries_total Keyed retries of tool calls.\n"
    << "# TYPE idem_retries_total counter\nidem_retries_total " << retries_ << "\n";
  o << "# HELP idem_compensations_total Compensations by outcome.\n"
    << "# TYPE idem_compensations_total counter\n";
  for (const char* k : {"compensated", "failed"}) {
    o << "idem_compensations_total{outcome=\"" << k << "\"} " << Get(compensations_, k) << "\n";
  }
  o << "# HELP idem_saga_time_to_terminal_seconds From submission to a terminal state.\n"
    << "# TYPE idem_saga_time_to_terminal_seconds histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += buckets_[i];
    o << "idem_saga_time_to_terminal_seconds_bucket{le=\"" << kBuckets[i] << "\"} " << cumulative
      << "\n";
  }
  o << "idem_saga_time_to_terminal_seconds_bucket{le=\"+Inf\"} " << terminal_count_ << "\n"
    << "idem_saga_time_to_terminal_seconds_sum " << terminal_sum_ << "\n"
    << "idem_saga_time_to_terminal_seconds_count " << terminal_count_ << "\n";
  o << "# HELP idem_http_requests_total HTTP responses by status code.\n"
    << "# TYPE idem_http_requests_total counter\n";
  for (const auto& [code, n] : requests_) {
    o << "idem_http_requests_total{code=\"" << code << "\"} " << n << "\n";
  }
  return o.str();
}

void Metrics::ObserveTerminalLocked(double seconds) {
  seconds = std::max(0.0, seconds);
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) {
      ++buckets_[i];
      break;
    }
  }
  ++terminal_count_;
  terminal_sum_ += seconds;
}

}  // namespace idem::server
