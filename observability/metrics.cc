// Metrics (observability/metrics.h).

#include "observability/metrics.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <sstream>
#include <utility>

#include "saga/states.h"

namespace idem::observability {
namespace {

#define IDEM_METRICS_STATE_NAME_(e, name) name,
// Every saga state, so that a state with no saga reads 0 rather than missing.
constexpr const char* kSagaStates[] = {IDEM_SAGA_STATES(IDEM_METRICS_STATE_NAME_)};
#undef IDEM_METRICS_STATE_NAME_

// The pending approvals: a step, and its saga, in this state.
constexpr const char* kWaitingState = "awaiting_approval";

template <typename K>
uint64_t Get(const std::map<K, uint64_t>& m, const K& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}
uint64_t Get(const std::map<std::string, uint64_t>& m, const char* k) {
  return Get(m, std::string(k));
}

// A label value in the text format: backslash, quote and newline escaped.
std::string LabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Head(std::ostringstream& o, const char* name, const char* type, const char* help) {
  o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << "\n";
}

// One labelled sample per key of `keys`, from `m` (0 when absent).
void Labelled(std::ostringstream& o, const char* name, const char* label,
              std::initializer_list<const char*> keys, const std::map<std::string, uint64_t>& m) {
  for (const char* k : keys) {
    o << name << '{' << label << "=\"" << k << "\"} " << Get(m, k) << "\n";
  }
}

bool DataHas(const storage::JournalEntry& e, const char* key) {
  return e.data.is_object() && e.data.contains(key);
}

std::string DataString(const storage::JournalEntry& e, const char* key) {
  if (!e.data.is_object()) return "";
  auto it = e.data.find(key);
  return it != e.data.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

Metrics::Metrics(MetricsOptions options) : options_(options) {}

void Metrics::Observe(const storage::JournalEntry& e, storage::Store* store) {
  static const std::set<std::string> kTerminal = {"saga_succeeded", "saga_compensated",
                                                  "saga_failed", "saga_cancelled"};
  const bool terminal = e.step_id.empty() && kTerminal.count(e.event) > 0;
  // The saga's age is read before the lock: a scrape never waits on the store.
  std::optional<double> seconds;
  if (terminal && store != nullptr) {
    auto rec = store->LoadSaga(e.saga_id);
    if (rec.ok()) seconds = static_cast<double>(e.at_ms - rec->summary.created_ms) / 1000.0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++events_[e.event];
  if (e.event == "drift") ++drift_[DataString(e, "kind")];  // saga/reconcile.h
  if (!e.step_id.empty()) {
    const std::string step = e.saga_id + "/" + e.step_id;
    const bool was_unknown = unknown_.count(step) > 0;
    if (e.event == "succeeded" || e.event == "failed" || e.event == "needs_attention") {
      ++steps_[e.event];
    }
    if (e.event == "submitted") {
      const auto attempt = e.data.is_object() ? e.data.find("attempt") : e.data.end();
      if (!e.data.is_object() || attempt == e.data.end() || !attempt->is_number_integer() ||
          attempt->get<int64_t>() <= 1) {
        ++steps_started_;
      }
      if (DataHas(e, "retry_after_ms")) ++retries_;
    }
    if (e.event == "succeeded" && e.data.is_object() && e.data.contains("replayed") &&
        e.data["replayed"] == true) {
      ++duplicates_["provider_replay"];
    }
    // How an unknown outcome was settled. What the journal says itself (a
    // status lookup's answer, a person's decision) counts in any process,
    // also one that took the step over after a crash; the rest by the
    // unknown this process saw.
    std::string how;
    if (e.event == "unknown") {
      ++steps_["unknown"];
      ++unknown_total_;
      unknown_.insert(step);
    } else if (e.event == "succeeded" && DataString(e, "resolved_by") == "status_lookup") {
      how = "status_lookup";
    } else if (e.event == "submitted" && DataString(e, "lookup") == "not_applied") {
      how = "not_applied";
    } else if (e.event == "operator_resolved") {
      const std::string d = DataString(e, "decision");
      if (d == "applied" || d == "not_applied" || d == "retry") how = "operator";
    } else if (was_unknown) {
      if (e.event == "succeeded" || e.event == "submitted") {
        how = "same_key_retry";
      } else if (e.event == "failed") {
        how = "not_applied";
      } else if (e.event == "needs_attention") {
        how = "needs_attention";
      }
    }
    if (!how.empty()) {
      ++unknown_resolved_[how];
      unknown_.erase(step);  // a person's decision later counts from the journal
    }
    if (e.event == "compensated") ++compensations_["compensated"];
    if (e.event == "compensation_failed") ++compensations_["failed"];
    if (e.event == "null_compensation") ++compensations_["null"];
    if (e.event == "approved" || e.event == "rejected") ++approvals_[e.event];
    if (e.event == "approval_expired") ++approvals_["expired"];
    return;
  }
  if (e.event == "saga_needs_attention") ++sagas_["needs_attention"];
  if (!terminal) return;
  ++sagas_[e.event.substr(5)];
  for (auto it = unknown_.begin(); it != unknown_.end();) {
    it = it->rfind(e.saga_id + "/", 0) == 0 ? unknown_.erase(it) : std::next(it);
  }
  if (seconds) ObserveTerminalLocked(*seconds);
}

void Metrics::Duplicate(std::string_view how) {
  std::lock_guard<std::mutex> lock(mu_);
  ++duplicates_[std::string(how)];
}

void Metrics::LeaseRenewFailed(bool lost) {
  std::lock_guard<std::mutex> lock(mu_);
  ++renew_failures_[lost ? "lost" : "error"];
}

void Metrics::Request(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[status];
}

std::string Metrics::GaugeText(storage::Store* store) {
  std::lock_guard<std::mutex> lock(gauge_mu_);
  const int64_t now = options_.clock->NowMs();
  if (store == gauge_store_ && !gauge_text_.empty() && now >= gauge_read_ms_ &&
      now - gauge_read_ms_ < options_.gauge_cache_ms) {
    return gauge_text_;
  }
  ++gauge_reads_;
  storage::GaugeQuery q;
  q.age_ms = options_.reconciliation_window_ms;
  q.waiting_state = kWaitingState;
  // Details for the unfinished states only; the finished ones (most of a
  // long journal) are counted from an index.
  for (const char* s : kSagaStates) {
    auto parsed = ParseSagaState(s);
    if (!parsed || !IsTerminal(*parsed)) q.detail_states.push_back(s);
  }
  Result<storage::StoreGauges> g =
      store != nullptr ? store->ReadGauges(q) : Status::FailedPrecondition("no store");
  std::ostringstream o;
  o.precision(15);  // seconds since 1970 and sums keep their digits
  Head(o, "idem_store_up", "gauge", "Whether the last read of the journal's store succeeded.");
  o << "idem_store_up " << (g.ok() ? 1 : 0) << "\n";
  if (g.ok()) {
    std::map<std::string, storage::StateGauges> by_state = g->by_state;
    for (const char* s : kSagaStates) by_state[s];  // 0 for a state without sagas
    int64_t expired = 0;
    int64_t past_window = 0;
    for (const auto& [state, sg] : by_state) {
      auto parsed = ParseSagaState(state);
      const bool open = !parsed || !IsTerminal(*parsed);
      if (open) {
        expired += sg.leases_expired;
        past_window += sg.created_before;
      }
    }
    const storage::StateGauges& na = by_state[SagaStateName(SagaState::kNeedsAttention)];
    const double oldest_s =
        na.sagas > 0
            ? static_cast<double>(std::max<int64_t>(0, g->now_ms - na.oldest_updated_ms)) / 1000.0
            : 0.0;
    Head(o, "idem_sagas", "gauge", "Sagas in the journal by state (the store's, all processes).");
    for (const auto& [state, sg] : by_state) {
      o << "idem_sagas{state=\"" << LabelValue(state) << "\"} " << sg.sagas << "\n";
    }
    Head(o, "idem_sagas_needing_attention", "gauge", "Sagas parked for a person.");
    o << "idem_sagas_needing_attention " << na.sagas << "\n";
    Head(o, "idem_oldest_needs_attention_seconds", "gauge",
         "How long the longest-parked needs_attention saga has waited (0: none).");
    o << "idem_oldest_needs_attention_seconds " << oldest_s << "\n";
    Head(o, "idem_approvals_pending", "gauge", "Commits waiting for a person's approval.");
    o << "idem_approvals_pending " << g->waiting_steps << "\n";
    Head(o, "idem_leases_expired", "gauge",
         "Unfinished sagas whose lease expired without being given back (a driver died).");
    o << "idem_leases_expired " << expired << "\n";
    Head(o, "idem_sagas_past_reconciliation_window", "gauge",
         "Unfinished sagas created longer ago than the reconciliation window.");
    o << "idem_sagas_past_reconciliation_window " << past_window << "\n";
  }
  Head(o, "idem_metrics_store_reads_total", "counter",
       "Reads of the store for the gauges (at most one per cache period).");
  o << "idem_metrics_store_reads_total " << gauge_reads_ << "\n";
  gauge_store_ = store;
  gauge_read_ms_ = now;
  gauge_text_ = o.str();
  return gauge_text_;
}

std::string Metrics::Render(storage::Store* store) {
  std::ostringstream o;
  o.precision(15);
  o << GaugeText(store);
  std::lock_guard<std::mutex> lock(mu_);
  Head(o, "idem_journal_entries_total", "counter", "Journal entries committed by this process.");
  for (const auto& [event, n] : events_) {
    o << "idem_journal_entries_total{event=\"" << LabelValue(event) << "\"} " << n << "\n";
  }
  Head(o, "idem_steps_started_total", "counter", "Steps whose first attempt was submitted.");
  o << "idem_steps_started_total " << steps_started_ << "\n";
  Head(o, "idem_step_outcomes_total", "counter", "Step outcomes journaled by this process.");
  Labelled(o, "idem_step_outcomes_total", "outcome",
           {"succeeded", "failed", "unknown", "needs_attention"}, steps_);
  Head(o, "idem_sagas_finished_total", "counter",
       "Sagas this process brought to a terminal or parked state, by outcome.");
  Labelled(o, "idem_sagas_finished_total", "outcome",
           {"succeeded", "compensated", "failed", "cancelled", "needs_attention"}, sagas_);
  Head(o, "idem_duplicates_absorbed_total", "counter",
       "Repeats answered without doing the work again.");
  Labelled(o, "idem_duplicates_absorbed_total", "how",
           {"stored_response", "existing_intent", "in_flight", "provider_replay"}, duplicates_);
  Head(o, "idem_reconcile_drift_total", "counter",
       "Drift the reconciliation job found (once per finding), by kind.");
  Labelled(o, "idem_reconcile_drift_total", "kind", {"effect_missing", "orphan"}, drift_);
  Head(o, "idem_lease_renewals_failed_total", "counter",
       "Lease renewals of this process that failed: lost (refused: another process took the "
       "saga) or error (the store did not answer).");
  Labelled(o, "idem_lease_renewals_failed_total", "why", {"lost", "error"}, renew_failures_);
  Head(o, "idem_unknown_outcomes_total", "counter", "Tool calls whose outcome was unknown.");
  o << "idem_unknown_outcomes_total " << unknown_total_ << "\n";
  Head(o, "idem_unknown_resolved_total", "counter", "How unknown outcomes were resolved.");
  Labelled(o, "idem_unknown_resolved_total", "how",
           {"status_lookup", "same_key_retry", "not_applied", "needs_attention", "operator"},
           unknown_resolved_);
  Head(o, "idem_retries_total", "counter", "Keyed retries of tool calls.");
  o << "idem_retries_total " << retries_ << "\n";
  Head(o, "idem_compensations_total", "counter", "Compensations by outcome.");
  Labelled(o, "idem_compensations_total", "outcome", {"compensated", "failed", "null"},
           compensations_);
  Head(o, "idem_approvals_decided_total", "counter", "Approvals decided, by decision.");
  Labelled(o, "idem_approvals_decided_total", "decision", {"approved", "rejected", "expired"},
           approvals_);
  Head(o, "idem_saga_time_to_terminal_seconds", "histogram",
       "From submission to a terminal state.");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += buckets_[i];
    o << "idem_saga_time_to_terminal_seconds_bucket{le=\"" << kBuckets[i] << "\"} " << cumulative
      << "\n";
  }
  o << "idem_saga_time_to_terminal_seconds_bucket{le=\"+Inf\"} " << terminal_count_ << "\n"
    << "idem_saga_time_to_terminal_seconds_sum " << terminal_sum_ << "\n"
    << "idem_saga_time_to_terminal_seconds_count " << terminal_count_ << "\n";
  Head(o, "idem_http_requests_total", "counter", "HTTP responses by status code.");
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

void ReportTo(Metrics* metrics, storage::Store* store, EngineOptions* options) {
  options->observer = [metrics, store,
                       next = std::move(options->observer)](const storage::JournalEntry& e) {
    metrics->Observe(e, store);
    if (next) next(e);
  };
  options->duplicate_observer =
      [metrics, next = std::move(options->duplicate_observer)](std::string_view how) {
        metrics->Duplicate(how);
        if (next) next(how);
      };
  options->lease_renew_observer = [metrics,
                                   next = std::move(options->lease_renew_observer)](bool lost) {
    metrics->LeaseRenewFailed(lost);
    if (next) next(lost);
  };
}

}  // namespace idem::observability
