#pragma once
// The ledger checker: joins idem's journal with the providers' ledger(s) and
// says what the outside world disagrees with. Runnable alone
// (`idem-chaos check --store LOCATOR --ledger PATH [--acked FILE]
// [--after-resolve]`) and by the sweep after each store.
//
// The checks, in report order (each names what would be a defect):
//   duplicate_effects      one (provider, operation, key) applied twice
//   lost_sagas             a saga id a command printed (acknowledged) that the
//                          journal does not hold
//   intent_key_split       one intent key acknowledged with two saga ids (a
//                          resubmission that made a second saga), or a saga
//                          acknowledged for an intent key the journal does
//                          not give it
//   orphan_effects         a ledger effect whose key (without ":compensate")
//                          is no step key of the journal
//   missing_compensations  a rolled-back saga (compensated, cancelled) whose
//                          step the journal calls compensated, with the
//                          forward effect in the ledger and no undo
//   effects_left_behind    a rolled-back or failed saga with a forward effect
//                          in the ledger that the journal does not hold as
//                          compensated, and no undo in the ledger
//   missing_effects        a succeeded saga whose succeeded step with a
//                          compensation (a write) has no effect in the ledger
//   missing_effect_rows    a succeeded step with a compensation (a write)
//                          whose journal holds no action effect row under
//                          its key: the journal says it happened but lost
//                          the record a rollback, a reconciliation and an
//                          audit read (a COMMIT reported durable and gone)
//   unsettled_jobs         a job a slow provider took (the ledger's
//                          acceptances) still pending when its saga has
//                          ended: nobody asks how it ended, and the provider
//                          may still carry it out
//   not_terminal_or_parked a saga neither terminal (succeeded, compensated,
//                          cancelled, failed) nor waiting for a person
//                          (needs_attention, awaiting_approval, paused)
//   parked_without_reason  needs_attention with an empty reason
//   parked_unsettled       with after_resolve: a saga still waiting for a
//                          person after the person's pass
//   late_writes            a journal entry written by a process that did not
//                          hold the saga's lease at that moment (a worker
//                          or server resumed after SIGSTOP past its lease
//                          whose write passed the fence); needs the journal
//                          audit of a PostgreSQL store (journal_writes)
//
// Open sagas are checked by the same rows: a call's step has the key
// `<saga>/c<n>` and its compensation in the plan, so a call id repeated by
// the model that booked twice is a duplicate effect, and a rolled-back open
// saga (cancelled) with a booking not undone is a missing compensation or
// an effect left behind. Branches that completed after a sibling failed are
// steps like any other: each must be undone in the ledger.
//
//   chaos::CheckData data = ...;              // or LoadCheckData(...)
//   chaos::CheckResult r = chaos::Check(data, {});
//   if (!r.ok()) std::cout << FormatFindings(r);
//
// Thread safety: Check is a pure function; LoadCheckData opens its own
// store and ledger connections.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "examples/travel_booking/providers.h"
#include "storage/store.h"

#include "common/status.h"

namespace idem::chaos {

/// A saga a command acknowledged (printed) before it ended or was killed.
struct AckedSaga {
  std::string saga_id;
  std::string intent_key;
};

/// One journal entry as the store's audit trigger saw it being written
/// (Runner installs it on PostgreSQL: InstallJournalAudit).
struct JournalWrite {
  int64_t seq = 0;
  std::string saga_id;
  std::string event;
  std::string writer;       ///< the writing process's lease owner name ("": not a leasing process)
  std::string lease_owner;  ///< the saga's lease owner when the entry was written
};

/// What the checker reads.
struct CheckData {
  std::vector<storage::SagaRecord> sagas;
  std::vector<travel::LedgerEffect> effects;           ///< every ledger's effects
  std::vector<travel::LedgerJob> jobs;                 ///< every ledger's slow-provider jobs
  std::vector<storage::EffectRecord> journal_effects;  ///< every saga's effect rows
  std::vector<AckedSaga> acked;
  std::vector<JournalWrite> journal_writes;  ///< empty without an audit
};

struct CheckOptions {
  /// The person's pass is over: every saga still waiting for a person is a
  /// finding (parked_unsettled).
  bool after_resolve = false;
};

struct Finding {
  std::string check;
  std::string saga_id;  ///< "" when the finding names no saga of the journal
  std::string detail;
};

/// The outcome for one store.
struct CheckResult {
  std::vector<std::pair<std::string, int>> counts;  ///< per check, in report order
  std::vector<Finding> findings;
  int sagas = 0;
  int effects = 0;
  int acked = 0;
  int journal_writes = 0;             ///< audited journal entries (0: no audit)
  std::map<std::string, int> states;  ///< sagas per state
  bool ok() const { return findings.empty(); }
  int Count(const std::string& check) const;
};

/// The check names, in report order.
const std::vector<std::string>& CheckNames();

/// Runs every check.
CheckResult Check(const CheckData& data, const CheckOptions& options);

/// Reads every saga of the stores at `locators` (a saga in two of them is
/// read once), the effects of each ledger, the acknowledged sagas of
/// `acked_file` (lines "SAGA_ID INTENT_KEY"; "" for none) and the journal
/// audit file `audit_file` (journal_writes, as DumpJournalAudit writes it;
/// "" for none). NotFound naming the file for a ledger, acked or audit file
/// that does not exist; the store's errors as they are.
Result<CheckData> LoadCheckData(const std::vector<std::string>& locators,
                                const std::vector<std::string>& ledgers,
                                const std::string& acked_file, const std::string& audit_file = "");

/// Parses the audit file: lines "SEQ<TAB>SAGA<TAB>EVENT<TAB>WRITER<TAB>OWNER".
/// InvalidArgument naming FILE:LINE for a malformed line.
Result<std::vector<JournalWrite>> ReadJournalAudit(const std::string& audit_file);

/// Appends "SAGA_ID INTENT_KEY\n" to `acked_file` (the runner's record).
Status AppendAcked(const std::string& acked_file, const AckedSaga& acked);

}  // namespace idem::chaos
