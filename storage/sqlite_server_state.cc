// SqliteStore's server state (storage/server_state.h): the tables
// `idempotency` and `server_specs` of migration 5, on the write connection.

#include <mutex>
#include <utility>

#include <sqlite3.h>

#include "storage/sqlite_errors.h"
#include "storage/sqlite_store.h"

#include "common/json_util.h"
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

namespace idem::storage {
namespace {

using sqlite_errors::Guarded;

std::string ColumnBytes(SQLite::Statement& q, int index) {
  SQLite::Column c = q.getColumn(index);
  const void* data = c.getBlob();
  int n = c.getBytes();
  return data == nullptr || n <= 0 ? std::string() : std::string(static_cast<const char*>(data), n);
}

constexpr const char* kKeyColumns =
    "SELECT fingerprint, state, status, content_type, body, created_ms, claimed_ms"
    " FROM idempotency WHERE scope = ? AND key = ?";

// A row of kKeyColumns.
KeyRecord ReadKey(SQLite::Statement& q) {
  KeyRecord r;
  r.fingerprint = q.getColumn(0).getString();
  r.state = q.getColumn(1).getString();
  r.status = q.getColumn(2).getInt();
  r.content_type = q.getColumn(3).getString();
  r.body = ColumnBytes(q, 4);
  r.created_ms = q.getColumn(5).getInt64();
  return r;
}

constexpr const char* kSpecColumns =
    "SELECT name, version, doc, fingerprint, created_ms, created_by FROM server_specs";

StoredSpec ReadSpec(SQLite::Statement& q) {
  StoredSpec v;
  v.name = q.getColumn(0).getString();
  v.version = q.getColumn(1).getInt();
  v.doc = Json::parse(q.getColumn(2).getString());
  v.fingerprint = q.getColumn(3).getString();
  v.created_ms = q.getColumn(4).getInt64();
  v.created_by = q.getColumn(5).getString();
  return v;
}

}  // namespace

Result<KeyClaim> SqliteStore::ClaimKey(const std::string& scope, const std::string& key,
                                       const std::string& fingerprint,
                                       const KeyClaimPolicy& policy) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  return Guarded<Result<KeyClaim>>("claim idempotency key", [&]() -> Result<KeyClaim> {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = policy.now_ms;
    KeyClaim claim;
    claim.token = NewId("clm_");
    SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
    // Change instead of check: the INSERT is the claim; the primary key lets
    // exactly one request win.
    SQLite::Statement ins(*db_,
                          "INSERT INTO idempotency (scope, key, fingerprint, state, created_ms,"
                          " claimed_ms, claim_token) VALUES (?, ?, ?, 'in_flight', ?, ?, ?)"
                          " ON CONFLICT (scope, key) DO NOTHING");
    ins.bind(1, scope);
    ins.bind(2, key);
    ins.bind(3, fingerprint);
    ins.bind(4, static_cast<int64_t>(now));
    ins.bind(5, static_cast<int64_t>(now));
    ins.bind(6, claim.token);
    if (ins.exec() == 1) {
      tx.commit();
      claim.kind = KeyClaim::Kind::kClaimed;
      return claim;
    }
    SQLite::Statement q(*db_, kKeyColumns);
    q.bind(1, scope);
    q.bind(2, key);
    if (!q.executeStep()) return Status::Internal("the conflicting idempotency row vanished");
    KeyRecord r = ReadKey(q);
    const int64_t claimed_ms = q.getColumn(6).getInt64();
    q.reset();

    const ExistingKey decided = DecideExistingKey(r, claimed_ms, fingerprint, policy);
    if (decided == ExistingKey::kRestart || decided == ExistingKey::kTakeOver) {
      SQLite::Statement up(*db_,
                           "UPDATE idempotency SET fingerprint = ?, state = 'in_flight',"
                           " status = 0, content_type = '', body = x'',"
                           " created_ms = CASE WHEN ? THEN ? ELSE created_ms END,"
                           " claimed_ms = ?, claim_token = ? WHERE scope = ? AND key = ?");
      up.bind(1, fingerprint);
      up.bind(2, decided == ExistingKey::kRestart ? 1 : 0);
      up.bind(3, static_cast<int64_t>(now));
      up.bind(4, static_cast<int64_t>(now));
      up.bind(5, claim.token);
      up.bind(6, scope);
      up.bind(7, key);
      up.exec();
      tx.commit();
      claim.kind = KeyClaim::Kind::kClaimed;
      return claim;
    }
    tx.commit();
    return UnclaimedKey(decided, std::move(r));
  });
}

Status SqliteStore::CompleteKey(const std::string& scope, const std::string& key,
                                const std::string& token, int status,
                                const std::string& content_type, const std::string& body) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  return Guarded<Status>("store idempotent response", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement up(*db_,
                         "UPDATE idempotency SET state = 'done', status = ?, content_type = ?,"
                         " body = ? WHERE scope = ? AND key = ? AND claim_token = ?"
                         " AND state = 'in_flight'");
    up.bind(1, status);
    up.bind(2, content_type);
    up.bind(3, body.data(), static_cast<int>(body.size()));
    up.bind(4, scope);
    up.bind(5, key);
    up.bind(6, token);
    if (up.exec() != 1) {
      return Status::Aborted("the claim on this key was taken over; the response is not stored");
    }
    return Status::Ok();
  });
}

Status SqliteStore::ReleaseKey(const std::string& scope, const std::string& key,
                               const std::string& token) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  return Guarded<Status>("release idempotency key", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement del(*db_,
                          "DELETE FROM idempotency WHERE scope = ? AND key = ? AND claim_token = ?"
                          " AND state = 'in_flight'");
    del.bind(1, scope);
    del.bind(2, key);
    del.bind(3, token);
    del.exec();
    return Status::Ok();
  });
}

Result<std::vector<size_t>> SqliteStore::RenewKeys(const std::vector<KeyLease>& claims,
                                                   int64_t now_ms) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  if (claims.empty()) return std::vector<size_t>();
  return Guarded<Result<std::vector<size_t>>>(
      "renew idempotency claims", [&]() -> Result<std::vector<size_t>> {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<size_t> lost;
        SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
        SQLite::Statement up(*db_,
                             "UPDATE idempotency SET claimed_ms = ? WHERE scope = ? AND key = ?"
                             " AND claim_token = ? AND state = 'in_flight'");
        for (size_t i = 0; i < claims.size(); ++i) {
          up.reset();
          up.bind(1, static_cast<int64_t>(now_ms));
          up.bind(2, claims[i].scope);
          up.bind(3, claims[i].key);
          up.bind(4, claims[i].token);
          if (up.exec() != 1) lost.push_back(i);
        }
        tx.commit();
        return lost;
      });
}

Result<KeyRecord> SqliteStore::FindKey(const std::string& scope, const std::string& key) {
  return Guarded<Result<KeyRecord>>("read idempotency record", [&]() -> Result<KeyRecord> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement q(*db_, kKeyColumns);
    q.bind(1, scope);
    q.bind(2, key);
    if (!q.executeStep()) return Status::NotFound("no idempotency record for this key");
    return ReadKey(q);
  });
}

Result<int64_t> SqliteStore::PurgeKeys(int64_t created_at_or_before_ms) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  return Guarded<Result<int64_t>>("purge idempotency records", [&]() -> Result<int64_t> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement del(*db_, "DELETE FROM idempotency WHERE state = 'done' AND created_ms <= ?");
    del.bind(1, static_cast<int64_t>(created_at_or_before_ms));
    return static_cast<int64_t>(del.exec());
  });
}

Result<SpecPutOutcome> SqliteStore::PutSpec(const StoredSpec& spec) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  return Guarded<Result<SpecPutOutcome>>("spec registry", [&]() -> Result<SpecPutOutcome> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
    SQLite::Statement q(*db_, std::string(kSpecColumns) + " WHERE name = ? AND version = ?");
    q.bind(1, spec.name);
    q.bind(2, spec.version);
    if (q.executeStep()) return SettleExistingSpec(ReadSpec(q), spec);
    q.reset();
    SQLite::Statement ins(*db_,
                          "INSERT INTO server_specs (name, version, doc, fingerprint, created_ms,"
                          " created_by) VALUES (?, ?, ?, ?, ?, ?)");
    ins.bind(1, spec.name);
    ins.bind(2, spec.version);
    ins.bind(3, CanonicalJson(spec.doc));
    ins.bind(4, spec.fingerprint);
    ins.bind(5, static_cast<int64_t>(spec.created_ms));
    ins.bind(6, spec.created_by);
    ins.exec();
    tx.commit();
    return SpecPutOutcome{spec, true};
  });
}

Result<StoredSpec> SqliteStore::GetSpec(const std::string& name, int version) {
  return Guarded<Result<StoredSpec>>("spec registry", [&]() -> Result<StoredSpec> {
    std::lock_guard<std::mutex> lock(mu_);
    std::string sql = std::string(kSpecColumns) + " WHERE name = ?" +
                      (version > 0 ? " AND version = ?" : " ORDER BY version DESC LIMIT 1");
    SQLite::Statement q(*db_, sql);
    q.bind(1, name);
    if (version > 0) q.bind(2, version);
    if (!q.executeStep()) return SpecNotFound(name, version);
    return ReadSpec(q);
  });
}

Result<std::vector<StoredSpec>> SqliteStore::ListSpecs() {
  return Guarded<Result<std::vector<StoredSpec>>>(
      "spec registry", [&]() -> Result<std::vector<StoredSpec>> {
        std::lock_guard<std::mutex> lock(mu_);
        SQLite::Statement q(*db_, std::string(kSpecColumns) + " ORDER BY name, version");
        std::vector<StoredSpec> out;
        while (q.executeStep()) out.push_back(ReadSpec(q));
        return out;
      });
}

namespace {

constexpr const char* kOwnerColumns = "SELECT name, owner, shared, created_ms FROM spec_owners";

SpecOwner ReadOwner(SQLite::Statement& q) {
  SpecOwner o;
  o.name = q.getColumn(0).getString();
  o.owner = q.getColumn(1).getString();
  o.shared = q.getColumn(2).getInt() != 0;
  o.created_ms = q.getColumn(3).getInt64();
  return o;
}

Status NoOwner(const std::string& name) { return Status::NotFound("no spec " + name); }

}  // namespace

Result<SpecOwner> SqliteStore::ClaimSpecName(const SpecOwner& wanted) {
  return Guarded<Result<SpecOwner>>("spec registry", [&]() -> Result<SpecOwner> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
    SQLite::Statement ins(*db_,
                          "INSERT INTO spec_owners (name, owner, shared, created_ms)"
                          " VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING");
    ins.bind(1, wanted.name);
    ins.bind(2, wanted.owner);
    ins.bind(3, wanted.shared ? 1 : 0);
    ins.bind(4, static_cast<int64_t>(wanted.created_ms));
    ins.exec();
    SQLite::Statement q(*db_, std::string(kOwnerColumns) + " WHERE name = ?");
    q.bind(1, wanted.name);
    if (!q.executeStep()) return Status::Internal("the spec owner row vanished");
    SpecOwner stored = ReadOwner(q);
    q.reset();
    tx.commit();
    return stored;
  });
}

Result<SpecOwner> SqliteStore::GetSpecOwner(const std::string& name) {
  return Guarded<Result<SpecOwner>>("spec registry", [&]() -> Result<SpecOwner> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement q(*db_, std::string(kOwnerColumns) + " WHERE name = ?");
    q.bind(1, name);
    if (!q.executeStep()) return NoOwner(name);
    return ReadOwner(q);
  });
}

Result<std::vector<SpecOwner>> SqliteStore::ListSpecOwners() {
  return Guarded<Result<std::vector<SpecOwner>>>(
      "spec registry", [&]() -> Result<std::vector<SpecOwner>> {
        std::lock_guard<std::mutex> lock(mu_);
        SQLite::Statement q(*db_, std::string(kOwnerColumns) + " ORDER BY name");
        std::vector<SpecOwner> out;
        while (q.executeStep()) out.push_back(ReadOwner(q));
        return out;
      });
}

Status SqliteStore::SetSpecShared(const std::string& name, bool shared) {
  return Guarded<Status>("spec registry", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement up(*db_, "UPDATE spec_owners SET shared = ? WHERE name = ?");
    up.bind(1, shared ? 1 : 0);
    up.bind(2, name);
    if (up.exec() != 1) return NoOwner(name);
    return Status::Ok();
  });
}

}  // namespace idem::storage
