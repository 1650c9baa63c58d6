#pragma once
// Simulated travel providers (flights, hotels, cars, payments, transfers) as in-process
// idem tools, each effect recorded in a durable SQLite ledger of their own.
//
// The ledger stands in for the providers' databases: it is a separate file
// from idem's journal, so tests and the demo can check what really happened
// in the world, whatever the journal says. Its tables:
//   effects(id, provider, operation, idempotency_key, applied_at, args, result)
//       one row per applied effect, with NO unique constraint: an effect
//       applied twice shows as two rows.
//   calls(id, provider, operation, idempotency_key, at, outcome)
//       every call received, including refused ones, status lookups
//       (operation "lookup") and previews (operation "preview"), so tests can
//       count blind retries. Outcomes:
//       applied, repeat (a key already applied: the first result replayed),
//       stale (a two-phase commit whose previewed version moved; no effect),
//       null_compensation, refused_after_compensation, rejected (bad args),
//       fault:fail, fault:reject, fault:lose_request, not_applied (lookup),
//       previewed and already_applied (preview), error; a lost response
//       appends ";response_lost" (e.g. "applied;response_lost").
//   barriers(provider, idempotency_key, op)
//       the dtm-style barrier: (provider, A, 'null_compensated') records that
//       the compensation of action key A arrived before the action did.
//   versions(provider, resource, version)
//       the version of each resource a two-phase tool previews (see below);
//       a resource without a row is at version 1.
//   acceptances(provider, operation, idempotency_key, args, job_id,
//               accepted_ms, ready_ms, outcome)
//       the calls a slow provider took and finishes later (transfers.book,
//       below); outcome pending, done (its effect row written) or declined.
// The ledger runs in WAL mode with synchronous=FULL; each effect is committed
// (with its `calls` row) before the tool answers. Several processes may share
// one ledger file: writes take an immediate transaction and wait on a busy
// timeout.
//
// The tools:
//   tool              effect      keys honoured  status lookup  preview
//   flights.reserve   write       yes            yes            yes
//   flights.cancel    idempotent  yes            no             no
//   hotels.book       write       NO             yes            no
//   hotels.cancel     idempotent  yes            yes            no
//   cars.rent         write       NO             no             no
//   cars.return       idempotent  yes            no             no
//   payments.charge   write       yes            yes            yes
//   payments.refund   idempotent  yes            no             no
//   transfers.book    write       yes            yes            no   accepts: finishes later
//   transfers.cancel  idempotent  yes            no             no
// A tool that honours keys answers a repeated key with the first result and
// no new effect row. hotels.book and cars.rent apply a repeated key again (a
// second row): idem must never send them a blind retry.
//
// A slow provider (transfers.book, an airport transfer). It takes the call
// at once and answers Accepted (the job id, and when to ask: HTTP 202 with
// Retry-After over the wire), and finishes it ProviderOptions::
// confirm_delay_ms later. The acceptance is a ledger row, so the job
// finishes whichever process asks. A status lookup before then answers
// pending (with the time left); the first lookup after it writes the effect
// row (outcome `done`, call outcome "confirmed") and answers applied; a
// declined job answers failed. A repeated key is answered from the ledger:
// accepted again while pending, the first result once done: never a second
// job. Its completion window is 30 minutes (checks every 1 to 10 s).
//
// Previews and versions (two-phase calls). flights.reserve and
// payments.charge answer Preview(call): what a commit would do, as a one-line
// summary ("charge EUR 1,840.00 to Ana (Trip LIS-NRT 2026-12-01 for Ana)",
// "reserve LIS → NRT on 2026-12-01 for Ana, EUR 885.00"), structured
// `changes` and the resource's version ("v1", "v2", ...). A preview has no
// effect: it writes no `effects` row and only logs a `calls` row (operation
// "preview"). The versioned resource is the traveller's account for payments
// ("account/Ana") and the route and date for flights ("LIS-NRT/2026-12-01");
// a flight's fare rises EUR 25.00 with each version after the first. A commit
// (Invoke) carrying ToolCall::expected_version is checked in the same
// transaction as its effect: when the resource's version differs, it is
// refused with ToolOutcome::Stale and no effect (outcome "stale"). An empty
// expected_version is a one-phase call: no check. A key that was already
// applied is answered with the stored result first (dedup), without a check.
// Commits do not move versions; only the `reprice` fault and
// Ledger::BumpVersion do (another party changing the price or the account).
//
// Compensations and the barrier. idem calls a compensation with the key
// `<action key>:compensate`. When the ledger has no effect of the action
// under that action key, the compensation is a null compensation: it records
// a barrier row, applies nothing and succeeds with {"null_compensation":
// true}. An action that later arrives under a barred key is refused
// (permanent failure, no effect): the hanging action of RELIABILITY.md #22.
// A preview of a barred key answers !ok the same way.
// A compensation key without the suffix is applied without barrier checks.
//
// Faults (ProviderOptions::faults) are injected per tool and per call; the
// call count is kept per registration (that is, per process for the CLI) and
// counts Invoke calls only. Status lookups and previews never fault, never
// sleep and do not advance the count. Failpoints: "provider.after_apply"
// right after an action's new effect is committed, "provider.after_undo"
// right after a compensation's; an `err` there makes the tool answer unknown.
//
// Thread safety: the tools may be called from several threads at once; a
// Ledger serialises its own connection with a mutex.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::travel {

/// One injected fault: `TOOL=MODE[@N]`. Modes:
///   fail           a transient, retryable refusal; no effect
///   fail_times(K)  `fail` on the first K calls, then normal
///   reject         a permanent refusal; no effect
///   lose_request   the call never reaches the provider: no effect, and the
///                  tool answers unknown ("request lost")
///   lose_response  the provider applies the effect and commits it, then the
///                  answer is lost: the tool answers unknown ("response lost")
///   delay(MS)      the call is held MS milliseconds, then runs normally
///   reprice        the previewed resource changes just before the call is
///                  handled (its version is bumped, durably): a commit
///                  carrying the old version is refused as stale, and a
///                  re-preview sees the new version. Only for tools with a
///                  preview (flights.reserve, payments.charge).
///   decline        the call is taken (accepted), and the provider later
///                  refuses it: its lookup answers failed, with no effect.
///                  Only for a tool that accepts (transfers.book).
/// With @N the fault hits only the N-th call of that tool (1-based);
/// without it, every call (fail_times: the first K).
struct FaultRule {
  std::string tool;  ///< "flights.reserve"
  std::string mode;  ///< "fail", "fail_times", "reject", "lose_request", "reprice", ...
  int nth = 0;       ///< 0: every call
  int param = 0;     ///< K of fail_times(K), MS of delay(MS)
};

/// Parses `TOOL=MODE[@N]`. InvalidArgument quoting the text on a bad rule.
/// The tool name is checked later, by RegisterTravelTools.
Result<FaultRule> ParseFaultRule(const std::string& text);

struct ProviderOptions {
  std::string ledger_path;  ///< created if missing
  int latency_ms = 0;       ///< slept at the start of every call (not lookups, previews)
  std::vector<FaultRule> faults;
  /// How long the slow provider (transfers.book) takes to finish a call it
  /// accepted; 0: done by the first status lookup.
  int64_t confirm_delay_ms = 3'000;
};

/// One applied effect.
struct LedgerEffect {
  int64_t id = 0;
  std::string provider;   ///< "flights"
  std::string operation;  ///< "reserve"
  std::string idempotency_key;
  std::string applied_at;  ///< RFC 3339 UTC
  Json args;
  Json result;
};

/// One call received.
struct LedgerCall {
  int64_t id = 0;
  std::string provider;
  std::string operation;  ///< "lookup" for a status lookup
  std::string idempotency_key;
  std::string at;
  std::string outcome;  ///< see the header comment
};

/// A job the slow provider took (the acceptances table).
struct LedgerJob {
  std::string provider;   ///< "transfers"
  std::string operation;  ///< "book"
  std::string idempotency_key;
  std::string job_id;
  std::string outcome;  ///< pending, done or declined
};

/// A (provider, operation, key) with more than one effect row.
struct DuplicateEffect {
  std::string provider;
  std::string operation;
  std::string idempotency_key;
  int count = 0;
};

/// The providers' durable ledger. Owned by whoever opens it; the tools share
/// theirs. Every method returns Unavailable when SQLite is busy past the
/// timeout and Internal for other SQLite errors.
class Ledger {
 public:
  /// Opens (and with `create`, creates and migrates) the ledger at `path`.
  /// NotFound when `create` is false and there is no file.
  static Result<std::shared_ptr<Ledger>> Open(const std::string& path, bool create = true);
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  const std::string& path() const;

  /// Every effect, in the order applied.
  Result<std::vector<LedgerEffect>> Effects() const;
  /// Every call received, in order.
  Result<std::vector<LedgerCall>> Calls() const;
  /// Every job the slow provider took, in key order.
  Result<std::vector<LedgerJob>> Jobs() const;
  /// Effect rows under `key`, any provider and operation.
  Result<int> CountEffects(const std::string& key) const;
  /// Effect rows of `tool` ("hotels.book") under `key`.
  Result<int> CountEffects(const std::string& tool, const std::string& key) const;
  /// Calls (lookups excluded) of `tool` under `key`: attempts received.
  Result<int> CountCalls(const std::string& tool, const std::string& key) const;
  /// Whether a null compensation barred action key `key` of `provider`.
  Result<bool> IsBarred(const std::string& provider, const std::string& key) const;
  /// Every (provider, operation, key) applied more than once.
  Result<std::vector<DuplicateEffect>> Duplicates() const;
  /// The version of `resource` ("account/Ana", "LIS-NRT/2026-12-01") of
  /// `provider`, as previews answer it: "v1" when it never moved.
  Result<std::string> ResourceVersion(const std::string& provider,
                                      const std::string& resource) const;
  /// Moves `resource` to its next version (someone else changed it) and
  /// answers the new one. A commit previewed at the old version is now stale.
  Result<std::string> BumpVersion(const std::string& provider, const std::string& resource);

 private:
  struct Impl;  // the connection and its mutex; in providers.cc
  explicit Ledger(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class LedgerAccess;
};

/// Fixed-width text tables for terminals.
std::string FormatEffectsTable(const std::vector<LedgerEffect>& effects);
std::string FormatCallsTable(const std::vector<LedgerCall>& calls);

/// The names of the ten travel tools.
const std::vector<std::string>& TravelToolNames();

/// Opens the ledger and registers the ten tools in `registry`.
/// InvalidArgument for a fault naming an unknown tool, a `reprice` fault
/// for a tool without a preview, a `decline` fault for a tool that does not
/// accept, or a negative latency or confirm delay; Unavailable/Internal
/// when the ledger cannot be opened; Conflict when a name is taken.
Status RegisterTravelTools(ToolRegistry& registry, const ProviderOptions& options);

}  // namespace idem::travel
