#pragma once
// Server state beside the journal: the Idempotency-Key records of an HTTP
// layer (server/idempotency.h) and the registry of named, versioned specs
// (server/spec_registry.h). Both live in the journal's database, so that every
// `idem serve` process (and worker) on one database sees the same keys and
// the same specs: a retry that reaches another server behind a load balancer
// is answered from the first server's record.
//
// Implementations: SqliteStore and PgStore implement both interfaces on their
// own database (tables `idempotency` and `server_specs`, migration 5, and
// `spec_owners`, migration 7), checked
// by the same conformance suite (tests/store_conformance.h). Store::KeyRecords
// and Store::Specs return them (nullptr for a Store without server state,
// e.g. a test double).
//
// Thread safety: every method may be called from several threads, and
// several processes, at once.
//
// Errors: kUnavailable when the database is busy or unreachable (retry later);
// kInvalidArgument for text the database cannot store; kInternal otherwise.

#include <cstdint>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace idem::storage {

/// One Idempotency-Key record, as stored.
struct KeyRecord {
  std::string state;  ///< "in_flight" or "done"
  std::string fingerprint;
  int status = 0;
  std::string content_type;
  std::string body;  ///< bytes, stored as they are
  int64_t created_ms = 0;
};

/// How a claim judges an existing record (the caller's clock and policy).
struct KeyClaimPolicy {
  int64_t now_ms = 0;
  /// An in_flight record claimed or renewed this long ago (or longer) may be
  /// taken over by a request with the same fingerprint.
  int64_t lock_timeout_ms = 0;
  /// A done record created this long ago (or longer) is forgotten: the key
  /// starts a new request.
  int64_t ttl_ms = 0;
};

/// What ClaimKey found.
struct KeyClaim {
  enum class Kind {
    kClaimed,   ///< the caller holds the key: run the request
    kInFlight,  ///< another request holds it (409)
    kMismatch,  ///< the key was used with another fingerprint (422)
    kReplay,    ///< the request finished: `stored` is its response
  };
  Kind kind = Kind::kInFlight;
  std::string token;  ///< kClaimed: fences CompleteKey and ReleaseKey
  KeyRecord stored;   ///< kReplay
};

/// A live claim, as its holder knows it (for RenewKeys).
struct KeyLease {
  std::string scope;
  std::string key;
  std::string token;  ///< KeyClaim::token
};

/// The Idempotency-Key records: (scope, key) -> a claim, then a response.
/// A claim is a lease: its holder renews it (RenewKeys) while the request
/// runs; one not renewed for KeyClaimPolicy::lock_timeout_ms is abandoned
/// and may be taken over.
class KeyRecordStore {
 public:
  virtual ~KeyRecordStore() = default;

  /// Claims (scope, key) for a request with `fingerprint` ("change instead
  /// of check": the INSERT is the claim, so of concurrent claimers, in one
  /// process or several, exactly one wins). An existing record is judged by
  /// DecideExistingKey under `policy`.
  virtual Result<KeyClaim> ClaimKey(const std::string& scope, const std::string& key,
                                    const std::string& fingerprint,
                                    const KeyClaimPolicy& policy) = 0;

  /// Stores the response of the claim `token` and marks the record done.
  /// kAborted: the claim was taken over (or released); nothing is stored.
  virtual Status CompleteKey(const std::string& scope, const std::string& key,
                             const std::string& token, int status, const std::string& content_type,
                             const std::string& body) = 0;

  /// Deletes the in_flight record of the claim `token` (the request did
  /// nothing); OK if it is gone already.
  virtual Status ReleaseKey(const std::string& scope, const std::string& key,
                            const std::string& token) = 0;

  /// Renews every claim of `claims` still held (its record in_flight with
  /// its token): claimed_ms = now_ms, all in one transaction. Returns the
  /// indexes into `claims` of those lost (taken over, released, done or
  /// gone), in order; nothing written for them.
  virtual Result<std::vector<size_t>> RenewKeys(const std::vector<KeyLease>& claims,
                                                int64_t now_ms) = 0;

  /// The record of (scope, key); kNotFound when absent.
  virtual Result<KeyRecord> FindKey(const std::string& scope, const std::string& key) = 0;

  /// Deletes done records created at or before `created_at_or_before_ms`;
  /// returns how many.
  virtual Result<int64_t> PurgeKeys(int64_t created_at_or_before_ms) = 0;
};

/// What a claim does with an existing record: the one rule both backends
/// apply (inside the transaction that locked the record).
enum class ExistingKey {
  kRestart,   ///< done and expired: a new request, created now
  kTakeOver,  ///< in_flight, abandoned, same fingerprint: the claim passes
  kInFlight,
  kMismatch,
  kReplay,
};
ExistingKey DecideExistingKey(const KeyRecord& record, int64_t claimed_ms,
                              const std::string& fingerprint, const KeyClaimPolicy& policy);

/// The answer to a claim that found `record` and decided `decided` (not
/// kRestart or kTakeOver, which claim the key): kMismatch, kReplay (with the
/// record) or kInFlight, without a token.
KeyClaim UnclaimedKey(ExistingKey decided, KeyRecord record);

/// One version of a named spec. A version, once stored, never changes.
struct StoredSpec {
  std::string name;
  int version = 0;
  Json doc;
  std::string fingerprint;  ///< Fingerprint(doc)
  int64_t created_ms = 0;
  std::string created_by;
};

/// Who a spec name belongs to (table spec_owners, schema version 7): the
/// caller whose put created it. Only the owner adds versions; `shared` lets
/// every caller read and run them.
struct SpecOwner {
  std::string name;
  std::string owner;
  bool shared = false;
  int64_t created_ms = 0;
};

struct SpecPutOutcome {
  StoredSpec spec;       ///< as stored (the existing one when not created)
  bool created = false;  ///< false: the version existed with the same document
};

/// The spec registry's table.
class SpecStore {
 public:
  virtual ~SpecStore() = default;

  /// Stores `spec` (its doc as canonical JSON). The version exists with the
  /// same fingerprint: the stored one, created false. With another:
  /// kConflict, nothing written. Concurrent puts of one version: one wins.
  virtual Result<SpecPutOutcome> PutSpec(const StoredSpec& spec) = 0;

  /// `version` 0: the latest. kNotFound when absent.
  virtual Result<StoredSpec> GetSpec(const std::string& name, int version) = 0;

  /// Every version of every spec, by name then version.
  virtual Result<std::vector<StoredSpec>> ListSpecs() = 0;

  /// Claims `wanted.name` for `wanted.owner` unless it has an owner; returns
  /// the owner as stored (the earlier one when the name was taken: of
  /// concurrent claims, in any process, one wins).
  virtual Result<SpecOwner> ClaimSpecName(const SpecOwner& wanted) = 0;
  /// kNotFound when the name has no owner (no spec of that name).
  virtual Result<SpecOwner> GetSpecOwner(const std::string& name) = 0;
  /// Every owned name, by name.
  virtual Result<std::vector<SpecOwner>> ListSpecOwners() = 0;
  /// Sets whether every caller may read and run `name`. kNotFound when absent.
  virtual Status SetSpecShared(const std::string& name, bool shared) = 0;
};

/// The outcome of a put that found `existing` stored for its (name, version):
/// the rule both backends apply.
Result<SpecPutOutcome> SettleExistingSpec(StoredSpec existing, const StoredSpec& wanted);

/// kNotFound for a spec (version 0: any version) that is absent.
Status SpecNotFound(const std::string& name, int version);

}  // namespace idem::storage
