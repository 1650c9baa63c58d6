#pragma once
// The drift job (issue 13, reconciliation): re-checks the recorded effects of
// succeeded steps against their providers, and reports drift.
//
//   effect_missing  the journal says a step's effect was applied, and the
//                   tool's status lookup says the provider does not know the
//                   key (not applied, or failed)
//   orphan          a tool that can list its effects (ToolInfo::has_list)
//                   holds an effect under a key the journal has no effect for
//
// Only tools with a status lookup are checked (the others are counted as
// skipped), and only steps that still stand succeeded (a compensated effect
// is gone on purpose). A lookup that answers pending or fails is not drift:
// it is reported as an error of the run, and asked again next time.
//
// Each finding is recorded once (Store::RecordDrift, per kind, tool and
// key): a `drift` journal entry on its saga (an orphan whose key names no
// saga has the finding row only), and the journal observer is told (the
// metric idem_reconcile_drift_total{kind}); a re-run finds it again and
// records nothing new. `idem reconcile` runs it once (cli/reconcile.h); the
// server and `idem worker` run it every --reconcile-every.
//
// Thread safety: FindDrift may run beside drives; it writes only findings.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "storage/store.h"
#include "tools/tool.h"

#include "common/clock.h"
#include "common/status.h"

namespace idem::reconcile {

/// One drift the run found.
struct Drift {
  storage::DriftFinding finding;
  bool recorded_now = false;  ///< false: an earlier run had recorded it
};

struct DriftReport {
  int checked = 0;  ///< effects asked about
  int skipped = 0;  ///< effects of tools without a status lookup, or not registered
  int listed = 0;   ///< provider effects listed (tools with has_list)
  std::vector<Drift> drifts;
  std::vector<std::string> errors;  ///< lookups or lists that did not answer
};

struct DriftOptions {
  int64_t since_ms = 0;    ///< effects recorded (and provider effects applied) since
  int limit = 1'000'000;   ///< effects read at most
  Clock* clock = nullptr;  ///< nullptr: the system clock
  /// Told of each new finding's journal entry (metrics, logs).
  std::function<void(const storage::JournalEntry&)> observer;
};

/// One run over the store's effects since `options.since_ms`.
Result<DriftReport> FindDrift(storage::Store* store, const ToolRegistry& tools,
                              const DriftOptions& options);

}  // namespace idem::reconcile
