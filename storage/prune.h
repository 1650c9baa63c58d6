#pragma once
// Pruning: what a finished saga keeps once its personal data may go.
//
// Store::Prune takes the sagas in one of `states` (the engine passes its
// terminal states: succeeded, compensated, failed, cancelled; never a
// running, waiting, paused or parked one) last updated before
// `finished_before_ms` and not pruned yet, and in each:
//   - without `redact`: removes the input (sagas.input becomes {}), the
//     steps' arguments, results, compensation results and two-phase records
//     (preview and approval; NULL), the effects' results (NULL), and the members `args`, `result`,
//     `changes`, `summary`, `input` and `note` of its journal entries (set to null);
//   - with `redact` (field names, e.g. card_number, passport): replaces the
//     value of every member so named, at any depth of the same documents,
//     with "[redacted]", and keeps the rest;
//   - removes its consumed commit tokens (a finished saga spends none);
//   - records `pruned_at_ms` on the saga and appends a `saga_pruned` journal
//     entry ({"mode": "all"|"redact", "fields": [...]}).
// The intent, the saga row (state, spec, fingerprint) and the journal's
// entries themselves are kept, so an intent key still answers with its saga
// and a resubmission with other content is still a conflict. The journal
// and effects stay append-only except for this one rewrite of a pruned
// saga's data (migration 9's triggers).
//
// Batched: at most `batch_sagas` sagas per transaction, so the SQLite write
// lock is held for one batch at a time. Idempotent: a pruned saga is not
// taken again (a later call with other fields does not re-redact it).
// `dry_run` writes nothing and reports what would be pruned.
//
// Thread safety: the pure functions are safe from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "common/json_util.h"

namespace idem::storage {

struct PruneRequest {
  int64_t finished_before_ms = 0;   ///< sagas last updated before this
  std::vector<std::string> states;  ///< the states a saga may be pruned in
  std::vector<std::string> redact;  ///< empty: remove inputs and results
  bool dry_run = false;
  int batch_sagas = 50;  ///< sagas per transaction (1..1000)
  int64_t now_ms = 0;    ///< recorded as pruned_at_ms and on the journal entry
};

struct PruneReport {
  std::vector<std::string> saga_ids;  ///< pruned (dry run: would be)
  int64_t steps = 0;                  ///< step rows rewritten
  /// Journal entries rewritten (saga_pruned not counted); a dry run counts
  /// the entries with data, at most what a prune rewrites.
  int64_t journal_entries = 0;
  int64_t effects = 0;  ///< effects rows rewritten
  int64_t tokens = 0;   ///< consumed commit tokens removed
  int batches = 0;      ///< transactions
};

/// The text written in place of a redacted value.
constexpr const char* kRedacted = "[redacted]";

/// The members of a journal entry's data that a prune without `redact`
/// sets to null.
const std::vector<std::string>& PrunedJournalFields();

/// A JSON column of a pruned saga: without `redact`, null (input: {});
/// else `v` with every member named in `redact`, at any depth, replaced by
/// kRedacted.
Json PruneDocument(const Json& v, const std::vector<std::string>& redact);

/// A journal entry's data: without `redact`, the members args, result,
/// changes, summary, input and note set to null; else PruneDocument.
Json PruneJournalData(const Json& data, const std::vector<std::string>& redact);

/// The data of the `saga_pruned` journal entry.
Json PrunedEntryData(const PruneRequest& request);

/// kInvalidArgument for a request that cannot be run (no states, a batch
/// size out of range, a blank field name).
Status CheckPruneRequest(const PruneRequest& request);

}  // namespace idem::storage
