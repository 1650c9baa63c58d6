#pragma once
// Metrics: Prometheus counters and gauges of any process that drives sagas
// (`idem serve`, `idem worker`, a program embedding the engine), in the text
// exposition format 0.0.4.
//
// Counters are this process's: journal entries it committed (steps started,
// step outcomes, compensations, approvals decided, sagas by outcome), how
// unknown outcomes were resolved, duplicates absorbed, retries, time to a
// terminal state, HTTP responses. Gauges come from the store
// (Store::ReadGauges), so every process on one journal reports the same
// fleet: sagas by state, the oldest needs_attention saga's age, pending
// approvals, expired leases, sagas past their reconciliation window. The
// store is read at most once per MetricsOptions::gauge_cache_ms, however
// often it is scraped. The names are those of docs/server.md.
//
// Use from a program of one's own:
//
//   idem::observability::Metrics metrics;
//   idem::EngineOptions eo;
//   idem::observability::ReportTo(&metrics, store.get(), &eo);
//   idem::Engine engine(store.get(), &tools, eo);
//   ...
//   std::string page = metrics.Render(store.get());  // serve it as /metrics
//
// Nothing secret is exposed: labels are closed sets (event names, outcomes,
// status codes), never saga ids, keys, tokens or arguments.
//
// Thread safety: every method may be called from several threads at once.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "saga/options.h"
#include "storage/store.h"

#include "common/clock.h"

namespace idem::observability {

struct MetricsOptions {
  /// Gauges are read from the store at most this often (a scrape storm
  /// costs one store read per period); 0 reads at every Render.
  int64_t gauge_cache_ms = 1'000;
  /// A saga not finished (not succeeded, compensated, failed or cancelled)
  /// this long after it was created is past its reconciliation window
  /// (default 24 h, the Idempotency-Key records' lifetime: after it an
  /// agent's retry is no longer answered from the stored response).
  int64_t reconciliation_window_ms = 86'400'000;
  /// Times the gauge cache. Not owned.
  Clock* clock = SystemClock::Get();
};

class Metrics {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.01, 0.05, 0.1, 0.5,  1,    5,     10,
                                                      30,   60,   300, 1800, 3600, 21600, 86400};

  explicit Metrics(MetricsOptions options = {});

  /// Counts a journal entry this process committed; a terminal saga entry
  /// reads the saga from `store` for its time to terminal.
  void Observe(const storage::JournalEntry& e, storage::Store* store);
  /// Counts an intent answered without a new saga, by `how`
  /// ("stored_response", "existing_intent", "in_flight").
  void Duplicate(std::string_view how);
  /// Counts a lease renewal that failed: refused (`lost`: the lease was
  /// taken) or not answered by the store.
  void LeaseRenewFailed(bool lost);
  /// Counts an HTTP response.
  void Request(int status);
  /// The metrics page; the gauges are `store`'s, read now or at most
  /// gauge_cache_ms ago.
  std::string Render(storage::Store* store);

 private:
  /// The gauges' part of the page, from the cache or a new store read.
  std::string GaugeText(storage::Store* store);
  void ObserveTerminalLocked(double seconds);

  const MetricsOptions options_;

  std::mutex gauge_mu_;
  const storage::Store* gauge_store_ = nullptr;  // GUARDED_BY(gauge_mu_)
  int64_t gauge_read_ms_ = 0;                    // GUARDED_BY(gauge_mu_)
  std::string gauge_text_;                       // GUARDED_BY(gauge_mu_)
  uint64_t gauge_reads_ = 0;                     // GUARDED_BY(gauge_mu_)

  std::mutex mu_;
  std::map<std::string, uint64_t> events_;            // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> steps_;             // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> duplicates_;        // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> drift_;             // GUARDED_BY(mu_) by kind
  std::map<std::string, uint64_t> renew_failures_;    // GUARDED_BY(mu_) lost, error
  std::map<std::string, uint64_t> unknown_resolved_;  // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> compensations_;     // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> approvals_;         // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> sagas_;             // GUARDED_BY(mu_)
  std::map<int, uint64_t> requests_;                  // GUARDED_BY(mu_)
  std::set<std::string> unknown_;                     // GUARDED_BY(mu_) "saga/step"
  uint64_t unknown_total_ = 0;                        // GUARDED_BY(mu_)
  uint64_t steps_started_ = 0;                        // GUARDED_BY(mu_)
  uint64_t retries_ = 0;                              // GUARDED_BY(mu_)
  std::array<uint64_t, kBuckets.size()> buckets_{};   // GUARDED_BY(mu_)
  uint64_t terminal_count_ = 0;                       // GUARDED_BY(mu_)
  double terminal_sum_ = 0;                           // GUARDED_BY(mu_)
};

/// Makes the engine built with `options` report to `metrics` (not owned;
/// must outlive the engine): its journal observer counts every committed
/// entry, then calls the observer already set (it composes, like
/// WithJournalLog), and its duplicate observer counts intents answered from
/// the journal. `store` is the engine's.
void ReportTo(Metrics* metrics, storage::Store* store, EngineOptions* options);

}  // namespace idem::observability
