#pragma once
// ControlStore: a person's or a caller's durable requests to cancel, pause or
// resume a saga, kept in the journal's database (table `saga_controls`,
// migration 6) so that whichever process drives the saga honours them: another
// server, a worker, or the same process after a restart. The engine reads the
// pending request before a drive and between steps (saga/control.cc) and
// settles it once the saga's state says it was carried out.
//
// A saga has at most one pending request. Which one wins is one rule both
// backends apply (ControlReplaces): a pending cancel is never replaced; a
// request of the pending kind is the same request (recorded once); otherwise
// (pause after resume, resume after pause, cancel after either) the new one
// replaces the old. Each recorded request also appends a journal entry
// `<kind>_requested` {by, reason, request} to the saga's journal, in the same
// transaction, so the history of requests (who, why, when) is the journal's.
//
// Implementations: SqliteStore and PgStore (storage/sqlite_control.cc,
// storage/pg_store.cc), checked by the conformance suite
// (tests/store_conformance.h); Store::Controls() returns them (nullptr for a
// store without them, e.g. a test double: the engine then keeps no requests).
//
// Thread safety: every method may be called from several threads, and
// several processes, at once.
//
// Errors: kNotFound for a saga that does not exist (RequestControl);
// kInvalidArgument for a kind that is not cancel, pause or resume, or text
// the database cannot store; kUnavailable when the database is busy or
// unreachable; kInternal otherwise.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace idem::storage {

/// One request, as stored.
struct ControlRequest {
  std::string saga_id;
  std::string request_id;  ///< chosen by the caller (unique); settles it
  std::string kind;        ///< "cancel", "pause" or "resume"
  std::string by;          ///< who asked
  std::string reason;      ///< why ("" allowed)
  int64_t requested_ms = 0;
};

/// What RequestControl did.
struct ControlOutcome {
  ControlRequest pending;  ///< the saga's pending request after the call
  bool recorded = false;   ///< false: an equal or stronger request was pending
};

class ControlStore {
 public:
  virtual ~ControlStore() = default;

  /// Records `request` as the saga's pending request (with its journal
  /// entry) unless the pending one wins (ControlReplaces). kNotFound if the
  /// saga does not exist.
  virtual Result<ControlOutcome> RequestControl(const ControlRequest& request) = 0;

  /// The saga's pending request, if any.
  virtual Result<std::optional<ControlRequest>> PendingControl(const std::string& saga_id) = 0;

  /// Removes the request `request_id` of the saga, once carried out (or
  /// found moot). OK when it is gone already or was replaced by a newer one
  /// (which stays pending).
  virtual Status SettleControl(const std::string& saga_id, const std::string& request_id) = 0;

  /// Every pending request, oldest first, at most `limit`.
  virtual Result<std::vector<ControlRequest>> ListControls(int limit) = 0;
};

/// True if a request of kind `wanted` replaces a pending one of kind
/// `pending`: never a pending cancel, never the same kind.
bool ControlReplaces(const std::string& pending, const std::string& wanted);

/// kInvalidArgument (naming the field) for a request that cannot be stored:
/// an unknown kind, an empty saga, request id or `by`.
Status CheckControlRequest(const ControlRequest& request);

}  // namespace idem::storage
