#pragma once
// Metrics: the server's Prometheus counters (text format 0.0.4, written by
// hand): step outcomes, duplicates absorbed, unknown outcomes and how they
// were resolved, retries, compensations, time to a terminal state, HTTP
// responses by code, and gauges of the journal's sagas by state, read at
// every scrape. Internal to the server.
//
// Thread safety: every method may be called from several threads at once.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "storage/store.h"

namespace idem::server {

class Metrics {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.01, 0.05, 0.1, 0.5,  1,    5,     10,
                                                      30,   60,   300, 1800, 3600, 21600, 86400};

  /// Counts a journal entry this process committed; a terminal saga entry
  /// reads the saga from `store` for its time to terminal.
  void Observe(const storage::JournalEntry& e, storage::Store* store);
  /// Counts a saga that reached a terminal state after `seconds`.
  void ObserveTerminal(double seconds);
  /// Counts an intent replay answered without a new saga, by `how`
  /// ("stored_response", "existing_intent", "in_flight").
  void Duplicate(const std::string& how);
  /// Counts an HTTP response.
  void Request(int status);
  /// The metrics page; the gauges are read from `store` now.
  std::string Render(storage::Store* store);

 private:
  template <typename K>
  static uint64_t Get(const std::map<K, uint64_t>& m, const K& k) {
    auto it = m.find(k);
    return it == m.end() ? 0 : it->second;
  }
  static uint64_t Get(const std::map<std::string, uint64_t>& m, const char* k) {
    return Get(m, std::string(k));
  }
  void ObserveTerminalLocked(double seconds);

  std::mutex mu_;
  std::map<std::string, uint64_t> steps_;             // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> duplicates_;        // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> unknown_resolved_;  // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> compensations_;     // GUARDED_BY(mu_)
  std::map<int, uint64_t> requests_;                  // GUARDED_BY(mu_)
  std::set<std::string> unknown_;                     // GUARDED_BY(mu_) "saga/step"
  uint64_t unknown_total_ = 0;
  uint64_t retries_ = 0;
  std::array<uint64_t, kBuckets.size()> buckets_{};
  uint64_t terminal_count_ = 0;
  double terminal_sum_ = 0;
};

}  // namespace idem::server
