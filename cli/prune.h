#pragma once
// Retention from the command line: `idem prune` once, and the background
// pruning of `serve` and `worker` (off by default). What is pruned and kept:
// storage/prune.h.
//
//   idem prune --older-than 30d [--redact card_number,passport] [--dry-run] [--json]
//   idem serve|worker ... --prune-older-than 30d [--prune-redact F,...] [--prune-every 1h]
//
// Sagas in a terminal state (succeeded, compensated, failed, cancelled)
// last updated more than --older-than ago are pruned; Idempotency-Key
// records of `serve` older than --key-records-older-than (default 24h, the
// server's key TTL) are removed with them.
//
// Thread safety: RunPrune is called once from RunCli; a BackgroundPruner
// runs its own thread and stops it when destroyed.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "storage/prune.h"
#include "storage/store.h"

#include "common/clock.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace idem::cli {

struct PruneFlags {
  std::string older_than;  ///< a duration ("30d"); empty: off (background)
  std::string redact;      ///< comma-separated field names; empty: everything
  std::string key_records_older_than = "24h";
  std::string every = "1h";  ///< background only
  int batch = 50;
  bool dry_run = false;
  bool json = false;
};

/// Adds `prune` and its flags to `app`.
CLI::App* AddPruneCommand(CLI::App* app, PruneFlags* flags);
/// Adds --prune-older-than, --prune-redact and --prune-every to `serve` or `worker`.
void AddBackgroundPruneFlags(CLI::App* command, PruneFlags* flags);

/// The request for `flags` at `now_ms`: the terminal states, the cutoff.
/// kInvalidArgument naming the flag for a bad duration or field list.
Result<storage::PruneRequest> MakePruneRequest(const PruneFlags& flags, int64_t now_ms,
                                               const char* older_than_flag = "--older-than");

/// `idem prune`: prunes (or, --dry-run, counts) and prints what it did to
/// `out` as a line of text or, --json, one JSON object.
Status RunPrune(const PruneFlags& flags, storage::Store* store, Clock* clock, std::FILE* out);

/// Prunes every `flags.every` on its own thread until destroyed (serve and
/// worker with --prune-older-than). Errors are logged and retried at the
/// next round. Start fails on bad flags.
class BackgroundPruner {
 public:
  static Result<std::unique_ptr<BackgroundPruner>> Start(const PruneFlags& flags,
                                                         storage::Store* store, Clock* clock);
  ~BackgroundPruner();
  BackgroundPruner(const BackgroundPruner&) = delete;
  BackgroundPruner& operator=(const BackgroundPruner&) = delete;

 private:
  BackgroundPruner() = default;
  void Loop();

  PruneFlags flags_;
  storage::Store* store_ = nullptr;
  Clock* clock_ = nullptr;
  int64_t every_ms_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace idem::cli
