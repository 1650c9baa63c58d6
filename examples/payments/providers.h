#pragma once
// Simulated card-payment providers (issue 19) as in-process idem tools, each
// operation recorded in a durable SQLite ledger of their own, and the ledger
// checker that says whether the world is right.
//
// The ledger stands in for the acquirer's database, a file apart from idem's
// journal. Its tables:
//   ops(id, op, key, hold_id, ref, payment, amount, at_ms, result)
//       one row per applied operation (authorize, capture, void, refund,
//       receipt), with NO unique constraint: an operation applied twice
//       shows as two rows.
//   calls(id, op, key, outcome, at_ms)
//       every call received, lookups and previews included.
// WAL, synchronous=FULL; an operation is committed before its tool answers.
//
// The tools (every one honours keys: a repeated key answers the first result
// and applies nothing; every one has a status lookup by key):
//   tool                 effect        preview  what it does
//   payments.authorize   write         no       places a hold {hold_id,
//                                               expires_at_ms, amount}
//   payments.capture     write         yes      captures an open hold (refused
//                                               for a voided, captured or
//                                               expired hold)
//   payments.void        idempotent    no       releases an open hold; an
//                                               unknown hold is a null void
//                                               (no row); a captured one is
//                                               refused
//   payments.refund      idempotent    no       refunds a capture
//   receipts.send        irreversible  no       a receipt email
// Holds live `hold_lifetime_ms` on the provider's clock.
//
// Faults: `TOOL=MODE[@N]`, MODE lose_response (applied, then the answer is
// lost: unknown), lose_request (unknown, nothing applied), fail (retryable),
// reject (permanent); @N only the N-th call of that tool in this process.
//
// Thread safety: the tools may be called from several threads; the ledger
// serialises its connection with a mutex.

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tools/tool.h"

#include "common/clock.h"
#include "common/json_util.h"
#include "common/status.h"

namespace idem::payments {

/// One applied operation.
struct LedgerOp {
  int64_t id = 0;
  std::string op;  ///< authorize, capture, void, refund, receipt
  std::string key;
  std::string hold_id;
  std::string ref;  ///< capture id (capture), refund id, receipt id
  std::string payment;
  int64_t amount = 0;
  int64_t at_ms = 0;
};

class Ledger {
 public:
  static Result<std::shared_ptr<Ledger>> Open(const std::string& path, bool create = true);
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  /// Every operation, in the order applied.
  Result<std::vector<LedgerOp>> Ops() const;
  /// Calls received of `op` under `key` (lookups and previews excluded).
  Result<int> CountCalls(const std::string& op, const std::string& key) const;

  struct Impl;

 private:
  explicit Ledger(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class Tools;
};

/// What the checker found: one line per violation (empty: the ledger is right).
struct LedgerFindings {
  std::vector<std::string> violations;
  int holds = 0, captures = 0, voids = 0, refunds = 0, receipts = 0;
  bool ok() const { return violations.empty(); }
};

/// Checks the payment rules over `ops`: at most one capture per hold and per
/// payment; no capture of a voided hold; every void matches an authorization
/// and every refund a capture; no operation applied twice under one key; and
/// every hold captured or voided unless its saga is in `unfinished_sagas`
/// (an authorization's key is `<saga id>/<step>_hold`).
LedgerFindings CheckLedger(const std::vector<LedgerOp>& ops,
                           const std::set<std::string>& unfinished_sagas = {});

struct ProviderOptions {
  std::string ledger_path;
  Clock* clock = nullptr;  ///< the provider's clock (holds expire on it); system when null
  int64_t hold_lifetime_ms = 7LL * 24 * 3600 * 1000;
  std::vector<std::string> faults;  ///< TOOL=MODE[@N]
};

/// The names of the five tools.
const std::vector<std::string>& PaymentToolNames();

/// Opens the ledger and registers the five tools. InvalidArgument for a bad
/// fault; Unavailable/Internal when the ledger cannot be opened.
Status RegisterPaymentTools(ToolRegistry& registry, const ProviderOptions& options);

/// A fixed-width table of `ops` for terminals.
std::string FormatOps(const std::vector<LedgerOp>& ops);

}  // namespace idem::payments
