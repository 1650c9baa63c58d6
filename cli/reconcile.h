#pragma once
// `idem reconcile [--since DURATION] [--json]`: one run of the drift job
// (saga/reconcile.h). Prints a table of the drift found (kind, tool, key,
// saga, whether this run recorded it) or, with --json, one object; exits
// kExitDrift when it found any drift (new or recorded before), 0 when none,
// 2 for a bad --since, 1 when the store or a provider did not answer.
//
// `idem serve|worker --reconcile-every DURATION [--reconcile-since DURATION]`
// runs the same job in the background (off by default): each round looks at
// the effects of the last --reconcile-since (7d), records new findings (a
// `drift` journal entry, told to the process's journal observer, so the
// metric idem_reconcile_drift_total{kind} counts it) and logs them.
//
// Thread safety: CmdReconcile is called once, from RunCli; a
// BackgroundReconciler runs its own thread and stops it when destroyed.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "storage/store.h"
#include "tools/tool.h"

#include "common/clock.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace idem::cli {

/// Runs the drift job over the effects of the last `since` (a duration:
/// 30m, 2h, 7d) and prints what it found; answers the exit code.
int CmdReconcile(const std::string& since, bool json, const ToolRegistry& tools,
                 storage::Store* store);

struct ReconcileFlags {
  std::string every;         ///< a duration; empty: off
  std::string since = "7d";  ///< how far back each round looks
};

/// Adds --reconcile-every and --reconcile-since to `serve` or `worker`.
void AddBackgroundReconcileFlags(CLI::App* command, ReconcileFlags* flags);

/// Runs the drift job every `flags.every` on its own thread until destroyed.
/// Findings go to `observer` (the journal entry of each new one) and the log;
/// errors are logged and retried next round. Start fails on bad flags,
/// naming the flag.
class BackgroundReconciler {
 public:
  static Result<std::unique_ptr<BackgroundReconciler>> Start(
      const ReconcileFlags& flags, const ToolRegistry* tools, storage::Store* store, Clock* clock,
      std::function<void(const storage::JournalEntry&)> observer);
  ~BackgroundReconciler();
  BackgroundReconciler(const BackgroundReconciler&) = delete;
  BackgroundReconciler& operator=(const BackgroundReconciler&) = delete;

  /// Rounds completed so far (tests wait on it).
  int rounds() const;

 private:
  BackgroundReconciler() = default;
  void Loop();

  const ToolRegistry* tools_ = nullptr;
  storage::Store* store_ = nullptr;
  Clock* clock_ = nullptr;
  std::function<void(const storage::JournalEntry&)> observer_;
  int64_t every_ms_ = 0;
  int64_t since_ms_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  int rounds_ = 0;     // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace idem::cli
