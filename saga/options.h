#pragma once
// EngineOptions: how an Engine (saga/engine.h) drives sagas. Its own header
// so that the drivers below the engine (saga/run.h, compensation/undo.h,
// preview_commit/two_phase.h) are written against it without the engine.
//
// Thread safety: a value type; the engine reads it from every drive.

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "saga/limits.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/clock.h"

namespace idem {
namespace preview_commit {
class TokenSigner;
}  // namespace preview_commit

struct EngineOptions {
  Clock* clock = SystemClock::Get();
  /// Seeds backoff jitter (per saga: seed ^ hash(saga id)).
  uint64_t seed = 0x1de3;
  /// Called after each journal entry commits, in journal order, from the
  /// driving thread (or, while steps run at once, from one of a saga's
  /// branch threads, never two of one saga at a time).
  std::function<void(const storage::JournalEntry&)> observer;
  /// Called when a request is answered from the journal instead of being
  /// done again, with how: "existing_intent" (Submit of a known intent). A
  /// provider's replay of a key is in the journal (`replayed` on the
  /// step's `succeeded`), so `observer` sees it. observability::ReportTo
  /// sets both for metrics.
  std::function<void(std::string_view how)> duplicate_observer;
  /// Called from the lease renewer's thread for each renewal that failed:
  /// lost = true when it was refused (the lease is gone, the drive stops),
  /// false when the store did not answer (tried again next period).
  std::function<void(bool lost)> lease_renew_observer;
  /// Status lookups tried (with backoff) before an unknown outcome is parked.
  int lookup_attempts = 5;
  /// Backoff between status lookups.
  RetryPolicy lookup_backoff{5, 50, 2'000};
  /// Mints and checks commit tokens of two-phase steps. Not owned; required
  /// only by sagas with two-phase steps (kFailedPrecondition without it).
  const preview_commit::TokenSigner* signer = nullptr;
  /// Lifetime of the commit token of a two-phase step without approval.
  int64_t commit_token_ttl_ms = 3'600'000;
  /// Bounds on steps and on what templates expand to (saga/limits.h),
  /// checked at Submit and before each step's arguments are journaled.
  SagaLimits limits;
  /// Leases: every drive of a saga holds its lease (renewed in the
  /// background every lease_ms / 3) and every write is fenced on its epoch.
  /// `owner` names this engine in the store (default: a fresh id).
  std::string owner;
  int64_t lease_ms = 30'000;
  /// False where one process alone drives the journal (the CLI on the
  /// embedded store holds a file lock instead): then a lease left by a
  /// process that died must not delay its recovery, and none is taken.
  bool use_leases = true;
  /// Saga ids: false (the default), time-ordered (common/time_ordered_id.h:
  /// a millisecond prefix, then 80 random bits), so that the sagas created
  /// together share index pages; true, 128 random bits as before (kept for
  /// the benchmark's before/after, docs/bench.md). The same text either way.
  bool random_saga_ids = false;
  /// The most steps of one saga in flight at once, when its step graph lets
  /// several run (saga/branches.h); 1 runs them one after another.
  int max_parallel_steps = 8;
  /// When set and true, drives stop between steps (the current step
  /// finishes) and give their leases back: a worker's graceful shutdown.
  const std::atomic<bool>* stop = nullptr;
};

}  // namespace idem
