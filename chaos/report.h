#pragma once
// The sweep's report: the checker's table (one row per check, one column of
// counts per store), the findings in detail, and the run's figures (kills
// per kind, restarts, sagas per state).
//
//   std::vector<chaos::StoreReport> stores = ...;
//   std::cout << chaos::FormatTable(stores) << chaos::FormatFindings(stores);
//
// Thread safety: pure functions.

#include <string>
#include <vector>

#include "chaos/checker.h"
#include "chaos/runner.h"

namespace idem::chaos {

/// One store's outcome.
struct StoreReport {
  std::string store;   ///< "sqlite", "postgres" or the locator given to `check`
  std::string digest;  ///< the plan's digest ("" for `check` alone)
  CheckResult check;
  RunStats stats;
  bool ran = false;  ///< a sweep ran (stats are meaningful)
};

/// The checker's table: a row per check, a column per store.
std::string FormatTable(const std::vector<StoreReport>& stores);

/// Every finding, one line each (at most `limit` per store).
std::string FormatFindings(const std::vector<StoreReport>& stores, size_t limit = 50);

/// The sweep's figures per store: kills per kind, restarts, states, time.
std::string FormatFigures(const std::vector<StoreReport>& stores);

}  // namespace idem::chaos
