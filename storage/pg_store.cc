#include "storage/pg_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <pqxx/pqxx>

#include "storage/pg_migrations.h"  // generated
#include "storage/validate.h"

#include "common/clock.h"
#include <libpq-fe.h>

namespace idem::storage {
namespace {

// ---- Schema -----------------------------------------------------------------
//
// kPgMigrations[i] takes the database from version i to version i + 1: the
// scripts of storage/migrations/postgresql/, embedded by the build (a
// generated header). Add a new file at the end; never edit one that has
// shipped. Version numbers are those of SqliteStore: version N has the same
// tables and meaning on both.
//
// String columns are NOT NULL ('' for "none"); JSON columns hold canonical
// text (CanonicalJson) or SQL NULL for a JSON null. effects.seq has no SQLite
// counterpart: it stands in for SQLite's rowid (the commit order).
constexpr auto& kMigrations = kPgMigrations;

constexpr int kLatestVersion = static_cast<int>(kMigrations.size());

// The key of the advisory lock that serialises migrations ("idem" in ASCII).
constexpr int64_t kMigrationLockKey = 0x6964656d;

// Serialization failures and deadlocks: how many times a transaction runs.
constexpr int kMaxAttempts = 5;

// ---- Statements ---------------------------------------------------------------
//
// Prepared on every pooled connection. Values are always bound parameters.

struct Statement {
  const char* name;
  const char* sql;
};

// Write statements return txid_current() where they can (RETURNING), so that
// Run need not ask for it in a round trip of its own before COMMIT.

constexpr Statement kSagaExists = {"saga_exists", "SELECT 1 FROM sagas WHERE saga_id = $1"};
constexpr Statement kLockSaga = {
    "lock_saga", "SELECT lease_epoch, txid_current() FROM sagas WHERE saga_id = $1 FOR UPDATE"};
// The server's clock in ms since the epoch: leases are judged by it alone.
#define IDEM_PG_NOW_MS "(extract(epoch from clock_timestamp()) * 1000)::bigint"
constexpr Statement kRenewLease = {
    "renew_lease", "UPDATE sagas SET lease_expires_ms = " IDEM_PG_NOW_MS
                   " + $4 WHERE saga_id = $1 AND lease_owner = $2 AND lease_epoch = $3"
                   " RETURNING txid_current()"};
constexpr Statement kClaimSaga = {
    "claim_saga", "UPDATE sagas SET lease_owner = $2, lease_expires_ms = " IDEM_PG_NOW_MS
                  " + $3, lease_epoch = lease_epoch + 1 WHERE saga_id = $1 AND"
                  " (lease_expires_ms < " IDEM_PG_NOW_MS
                  " OR lease_owner = $2)"
                  " RETURNING lease_owner, lease_epoch, lease_expires_ms, txid_current()"};
constexpr Statement kLeaseHolder = {
    "lease_holder", "SELECT lease_owner, lease_expires_ms FROM sagas WHERE saga_id = $1"};
constexpr Statement kReleaseLease = {"release_lease",
                                     "UPDATE sagas SET lease_expires_ms = 0"
                                     " WHERE saga_id = $1 AND lease_owner = $2 AND lease_epoch = $3"
                                     " RETURNING txid_current()"};
constexpr Statement kInsertIntent = {
    "insert_intent",
    "INSERT INTO intents (intent_key, fingerprint, saga_id, created_ms) VALUES ($1, $2, $3, $4)"
    " ON CONFLICT (intent_key) DO NOTHING RETURNING txid_current()"};
constexpr Statement kSelectIntent = {
    "select_intent", "SELECT fingerprint, saga_id FROM intents WHERE intent_key = $1"};
constexpr Statement kInsertSaga = {
    "insert_saga",
    "INSERT INTO sagas (saga_id, intent_key, fingerprint, spec_name, spec, input, state, reason,"
    " created_ms, updated_ms, spec_version, spec_sha256)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, '', $8, $8, NULLIF($9, 0), $10)"};
// A saga created by a batch (WriteBatch::create): its row as the batch
// leaves it. $13 owner, $14 lease_ms (0: free), $15 epoch.
constexpr Statement kInsertCreatedSaga = {
    "insert_created_saga",
    "INSERT INTO sagas (saga_id, intent_key, fingerprint, spec_name, spec, input, state, reason,"
    " created_ms, updated_ms, spec_version, spec_sha256, lease_owner, lease_expires_ms,"
    " lease_epoch)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULLIF($11, 0), $12, $13,"
    " CASE WHEN $14::bigint > 0 THEN " IDEM_PG_NOW_MS " + $14::bigint ELSE 0 END, $15)"};
constexpr Statement kInsertStep = {
    "insert_step",
    "INSERT INTO steps (saga_id, idx, step_id, tool, state, attempt, step_key, updated_ms)"
    " VALUES ($1, $2, $3, $4, $5, 0, $6, $7)"};
constexpr Statement kInsertJournal = {
    "insert_journal",
    "INSERT INTO journal (saga_id, step_id, event, data, at_ms) VALUES ($1, $2, $3, $4, $5)"};
// The saga's new state, fenced ($5: the batch's fence epoch, 0 for none), and
// the batch's first journal entry, written only if the update was: no rows
// returned means that the saga is missing or the fence failed. The UPDATE
// locks the saga's row as kLockSaga does.
// $10: the batch releases its lease (expiry 0, owner and epoch kept, as
// kReleaseLease), which the fence covers.
constexpr Statement kUpdateSagaAndJournal = {
    "update_saga_and_journal",
    "WITH u AS (UPDATE sagas SET state = $1, reason = $2, updated_ms = $3,"
    " lease_expires_ms = CASE WHEN $10::boolean THEN 0 ELSE lease_expires_ms END"
    " WHERE saga_id = $4 AND ($5::bigint = 0 OR lease_epoch = $5::bigint) RETURNING saga_id)"
    " INSERT INTO journal (saga_id, step_id, event, data, at_ms)"
    " SELECT saga_id, $6::text, $7::text, $8::text, $9::bigint FROM u RETURNING txid_current()"};
constexpr Statement kUpdateSaga = {
    "update_saga",
    "UPDATE sagas SET state = $1, reason = $2, updated_ms = $3,"
    " lease_expires_ms = CASE WHEN $6::boolean THEN 0 ELSE lease_expires_ms END"
    " WHERE saga_id = $4 AND ($5::bigint = 0 OR lease_epoch = $5::bigint)"
    " RETURNING txid_current()"};
// A batch without a new state that releases its lease: the fenced release
// locks the row as kLockSaga does. No rows: no such saga, or another epoch.
constexpr Statement kReleaseFenced = {
    "release_fenced",
    "UPDATE sagas SET lease_expires_ms = 0 WHERE saga_id = $1 AND lease_epoch = $2"
    " RETURNING txid_current()"};
// Upserts a step: $1 saga, $2 index, $3..$16 the row's columns. A plain
// UPDATE of the row when it exists (every write but a step's first on an
// open saga): INSERT ... ON CONFLICT DO UPDATE would first lock the row it
// conflicts with (a WAL record of its own) and build the whole row to insert
// before it finds the conflict. The INSERT runs only when the UPDATE found
// nothing; its ON CONFLICT covers a row inserted since the snapshot.
#define IDEM_UPDATE_STEP_CTE                                                            \
  "u AS (UPDATE steps SET step_id = $3, tool = $4, state = $5, attempt = $6,"           \
  " step_key = $7, args = $8, args_fingerprint = $9, result = $10, external_ref = $11," \
  " error = $12, comp_attempt = $13, comp_result = $14, updated_ms = $15, phase = $16"  \
  " WHERE saga_id = $1 AND idx = $2 RETURNING 1) "
#define IDEM_INSERT_STEP_SQL                                                               \
  "INSERT INTO steps (saga_id, idx, step_id, tool, state, attempt, step_key, args,"        \
  " args_fingerprint, result, external_ref, error, comp_attempt, comp_result, updated_ms," \
  " phase) SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16"   \
  " WHERE NOT EXISTS (SELECT 1 FROM u)"                                                    \
  " ON CONFLICT (saga_id, idx) DO UPDATE SET"                                              \
  " step_id = excluded.step_id, tool = excluded.tool, state = excluded.state,"             \
  " attempt = excluded.attempt, step_key = excluded.step_key, args = excluded.args,"       \
  " args_fingerprint = excluded.args_fingerprint, result = excluded.result,"               \
  " external_ref = excluded.external_ref, error = excluded.error,"                         \
  " comp_attempt = excluded.comp_attempt, comp_result = excluded.comp_result,"             \
  " updated_ms = excluded.updated_ms, phase = excluded.phase"
constexpr Statement kUpsertStep = {"upsert_step",
                                   "WITH " IDEM_UPDATE_STEP_CTE IDEM_INSERT_STEP_SQL};
// kUpsertStep and one journal entry ($17..$20) in one statement. Only the
// step can conflict (journal.seq is a sequence's).
constexpr Statement kUpsertStepAndJournal = {
    "upsert_step_and_journal",
    "WITH j AS (INSERT INTO journal (saga_id, step_id, event, data, at_ms)"
    " VALUES ($1, $17, $18, $19, $20)), " IDEM_UPDATE_STEP_CTE IDEM_INSERT_STEP_SQL};
#undef IDEM_UPDATE_STEP_CTE
#undef IDEM_INSERT_STEP_SQL
constexpr Statement kConsumeToken = {
    "consume_token",
    "INSERT INTO consumed_tokens (nonce, saga_id, step_id, at_ms) VALUES ($1, $2, $3, $4)"};
constexpr Statement kInsertEffect = {
    "insert_effect",
    "INSERT INTO effects (idempotency_key, saga_id, step_id, kind, tool, result, external_ref,"
    " at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"};
// The reads below are one statement each (one snapshot, one round trip). A
// saga with its steps: one row per step (one with NULL step columns if it has
// none), spec and input in the first row only.
constexpr Statement kSelectSagaWithSteps = {
    "select_saga_with_steps",
    "SELECT s.saga_id, s.intent_key, s.spec_name, s.state, s.reason, s.created_ms, s.updated_ms,"
    " s.fingerprint,"
    " CASE WHEN row_number() OVER (ORDER BY t.idx) = 1 THEN s.spec END,"
    " CASE WHEN row_number() OVER (ORDER BY t.idx) = 1 THEN s.input END,"
    " t.idx, t.step_id, t.tool, t.state, t.attempt, t.step_key, t.args, t.args_fingerprint,"
    " t.result, t.external_ref, t.error, t.comp_attempt, t.comp_result, t.updated_ms, t.phase,"
    " s.spec_version, s.spec_sha256, s.pruned_at_ms"
    " FROM sagas s LEFT JOIN steps t ON t.saga_id = s.saga_id WHERE s.saga_id = $1"
    " ORDER BY t.idx"};
// No rows: no such saga; one row with a NULL seq: no entries.
constexpr Statement kSelectJournal = {
    "select_journal",
    "SELECT j.seq, j.step_id, j.event, j.data, j.at_ms FROM sagas s"
    " LEFT JOIN journal j ON j.saga_id = s.saga_id WHERE s.saga_id = $1 ORDER BY j.seq"};
constexpr Statement kSelectEffects = {
    "select_effects",
    "SELECT f.step_id, f.kind, f.tool, f.idempotency_key, f.result, f.external_ref, f.at_ms,"
    " f.seq FROM sagas s LEFT JOIN effects f ON f.saga_id = s.saga_id WHERE s.saga_id = $1"
    " ORDER BY f.seq"};

// kSelectIntent under another name, for the pqxx read path (the two sets of
// names must not overlap: pqxx prepares its own statements lazily).
constexpr Statement kReadIntent = {"read_intent", kSelectIntent.sql};
#define IDEM_PG_CONTROL_COLUMNS \
  "SELECT saga_id, request_id, kind, requested_by, reason, requested_ms FROM saga_controls"
// A saga's pending control request: read by every drive between steps.
constexpr Statement kReadControl = {"read_control", IDEM_PG_CONTROL_COLUMNS " WHERE saga_id = $1"};
// Why a fenced write was refused (read after the batch was undone).
constexpr Statement kSagaEpoch = {"saga_epoch", "SELECT lease_epoch FROM sagas WHERE saga_id = $1"};

// Run through pqxx (one statement on its own each).
constexpr std::array kReadStatements = {
    kReadIntent, kReadControl, kSelectSagaWithSteps, kSelectJournal, kSelectEffects,
};

// Server state (storage/server_state.h). Bodies travel as hex text (bytea
// column), so that any bytes round-trip whatever bytea_output is.
constexpr Statement kClaimKey = {
    "claim_key",
    "INSERT INTO idempotency (scope, key, fingerprint, state, created_ms, claimed_ms,"
    " claim_token) VALUES ($1, $2, $3, 'in_flight', $4, $4, $5)"
    " ON CONFLICT (scope, key) DO NOTHING RETURNING txid_current()"};
// After a claim's INSERT found the key taken: the row, locked until COMMIT
// (READ COMMITTED: a fresh snapshot, so a concurrent claimer's row is seen).
constexpr Statement kLockKey = {
    "lock_key",
    "SELECT fingerprint, state, status, content_type, encode(body, 'hex'), created_ms,"
    " claimed_ms FROM idempotency WHERE scope = $1 AND key = $2 FOR UPDATE"};
constexpr Statement kReclaimKey = {
    "reclaim_key",
    "UPDATE idempotency SET fingerprint = $3, state = 'in_flight', status = 0,"
    " content_type = '', body = ''::bytea,"
    " created_ms = CASE WHEN $4::boolean THEN $5 ELSE created_ms END, claimed_ms = $5,"
    " claim_token = $6 WHERE scope = $1 AND key = $2 RETURNING txid_current()"};
constexpr Statement kCompleteKey = {
    "complete_key",
    "UPDATE idempotency SET state = 'done', status = $4, content_type = $5,"
    " body = decode($6, 'hex') WHERE scope = $1 AND key = $2 AND claim_token = $3"
    " AND state = 'in_flight' RETURNING txid_current()"};
constexpr Statement kReleaseKey = {
    "release_key",
    "DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND claim_token = $3"
    " AND state = 'in_flight' RETURNING txid_current()"};
constexpr Statement kRenewKey = {
    "renew_key",
    "UPDATE idempotency SET claimed_ms = $4 WHERE scope = $1 AND key = $2"
    " AND claim_token = $3 AND state = 'in_flight' RETURNING txid_current()"};
constexpr Statement kPurgeKeys = {
    "purge_keys",
    "DELETE FROM idempotency WHERE state = 'done' AND created_ms <= $1"
    " RETURNING txid_current()"};
constexpr Statement kInsertSpec = {
    "insert_spec",
    "INSERT INTO server_specs (name, version, doc, fingerprint, created_ms, created_by)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name, version) DO NOTHING"
    " RETURNING txid_current()"};
#define IDEM_PG_SPEC_COLUMNS \
  "SELECT name, version, doc, fingerprint, created_ms, created_by FROM server_specs"
constexpr Statement kSelectSpec = {"select_spec",
                                   IDEM_PG_SPEC_COLUMNS " WHERE name = $1 AND version = $2"};
constexpr Statement kClaimSpecName = {
    "claim_spec_name",
    "INSERT INTO spec_owners (name, owner, shared, created_ms) VALUES ($1, $2, $3, $4)"
    " ON CONFLICT (name) DO NOTHING RETURNING txid_current()"};
#define IDEM_PG_OWNER_COLUMNS "SELECT name, owner, shared, created_ms FROM spec_owners"
constexpr Statement kSelectSpecOwner = {"select_spec_owner",
                                        IDEM_PG_OWNER_COLUMNS " WHERE name = $1"};
constexpr Statement kSetSpecShared = {
    "set_spec_shared",
    "UPDATE spec_owners SET shared = $2 WHERE name = $1 RETURNING txid_current()"};

// Control requests (storage/control_store.h).
constexpr Statement kInsertControl = {
    "insert_control",
    "INSERT INTO saga_controls (saga_id, request_id, kind, requested_by, reason, requested_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (saga_id) DO NOTHING RETURNING txid_current()"};
// Asynchronous completion (migration 11): a waiting step's check, written
// with its batch.
constexpr Statement kUpsertCheck = {
    "upsert_check",
    "INSERT INTO step_checks (saga_id, step_id, next_check_ms, deadline_ms, checks, since_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (saga_id, step_id) DO UPDATE SET"
    " next_check_ms = excluded.next_check_ms, deadline_ms = excluded.deadline_ms,"
    " checks = excluded.checks, since_ms = excluded.since_ms"};
constexpr Statement kDeleteCheck = {"delete_check",
                                    "DELETE FROM step_checks WHERE saga_id = $1 AND step_id = $2"};
constexpr Statement kInsertDrift = {
    "insert_drift",
    "INSERT INTO drift_findings (kind, tool, key, saga_id, step_id, detail, found_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING txid_current()"};
constexpr Statement kLockControl = {"lock_control",
                                    IDEM_PG_CONTROL_COLUMNS " WHERE saga_id = $1 FOR UPDATE"};
constexpr Statement kReplaceControl = {
    "replace_control",
    "UPDATE saga_controls SET request_id = $2, kind = $3, requested_by = $4, reason = $5,"
    " requested_ms = $6 WHERE saga_id = $1 RETURNING txid_current()"};
constexpr Statement kSettleControl = {
    "settle_control",
    "DELETE FROM saga_controls WHERE saga_id = $1 AND request_id = $2 RETURNING txid_current()"};

// An open saga's call (saga/open_saga.h): its plan grows, and the call id
// names the new step once (open_calls' primary key).
constexpr Statement kUpdateSpec = {"update_spec", "UPDATE sagas SET spec = $2 WHERE saga_id = $1"};
constexpr Statement kInsertOpenCall = {
    "insert_open_call",
    "INSERT INTO open_calls (saga_id, call_id, step_idx, created_ms) VALUES ($1, $2, $3, $4)"};

// Reads in a write's pipeline (the same SQL as the reads run through pqxx,
// under names of their own): ClaimAndLoad's saga, and the control request
// read by ClaimAndLoad and CommitReadingControl.
constexpr Statement kClaimedSaga = {"claimed_saga", kSelectSagaWithSteps.sql};
constexpr Statement kPipedControl = {"piped_control", kReadControl.sql};

// Run through libpq pipelines (see Pipe), prepared at a connection's first write.
constexpr std::array kWriteStatements = {
    kClaimedSaga,
    kPipedControl,
    kSagaExists,
    kLockSaga,
    kSagaEpoch,
    kInsertIntent,
    kSelectIntent,
    kInsertSaga,
    kInsertCreatedSaga,
    kInsertStep,
    kInsertJournal,
    kUpdateSaga,
    kUpdateSagaAndJournal,
    kReleaseFenced,
    kUpsertStep,
    kUpsertStepAndJournal,
    kConsumeToken,
    kInsertEffect,
    kRenewLease,
    kReleaseLease,
    kClaimSaga,
    kLeaseHolder,
    kClaimKey,
    kLockKey,
    kReclaimKey,
    kCompleteKey,
    kReleaseKey,
    kRenewKey,
    kPurgeKeys,
    kInsertSpec,
    kSelectSpec,
    kInsertControl,
    kLockControl,
    kReplaceControl,
    kSettleControl,
    kClaimSpecName,
    kSelectSpecOwner,
    kSetSpecShared,
    kUpdateSpec,
    kInsertOpenCall,
    kUpsertCheck,
    kDeleteCheck,
    kInsertDrift,
};

// ---- Errors -----------------------------------------------------------------

// Stored data that cannot be decoded (a corrupt JSON column). Thrown inside
// this file only and translated at the edge.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// SQLSTATEs after which the session is gone or going: class 08 (connection
// exception) and 57P01..57P03 (admin shutdown, crash shutdown, cannot connect).
bool IsConnectionSqlstate(const std::string& state) {
  return StartsWith(state, "08") || state == "57P01" || state == "57P02" || state == "57P03";
}

bool IsConnectionError(const std::exception& e) {
  if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr) return true;
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    return IsConnectionSqlstate(sql->sqlstate());
  }
  return false;
}

std::string OneLine(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// Translates an exception that is not a lost connection (those are retried by
// Run) into a Status. The one place where pqxx's exceptions become values.
Status Translate(const std::string& op, const std::exception& e) {
  const std::string what = OneLine(e.what());
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    const std::string& state = sql->sqlstate();
    if (dynamic_cast<const pqxx::unique_violation*>(&e) != nullptr) {
      return Status::Conflict(op + ": " + what);
    }
    if (StartsWith(state, "22")) {  // data exception: text PostgreSQL cannot hold
      return Status::InvalidArgument(op + ": PostgreSQL refused a value (SQLSTATE " + state +
                                     "): " + what);
    }
    if (StartsWith(state, "53") || IsConnectionSqlstate(state)) {  // disk full, out of memory, ...
      return Status::Unavailable(op + ": PostgreSQL is unavailable (SQLSTATE " + state +
                                 "): " + what + "; retry later");
    }
    return Status::Internal(op + ": PostgreSQL error (SQLSTATE " + state + "): " + what);
  }
  if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr ||
      dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr) {
    return Status::Unavailable(op + ": connection to PostgreSQL lost: " + what + "; retry later");
  }
  if (dynamic_cast<const pqxx::transaction_rollback*>(&e) != nullptr) {
    return Status::Aborted(op + ": " + what);
  }
  if (dynamic_cast<const DataError*>(&e) != nullptr) return Status::Internal(op + ": " + what);
  return Status::Internal(op + ": unexpected error: " + what);
}

// PostgreSQL text cannot hold a NUL byte, and libpq would cut the value there.
Status CheckText(const std::string& value, const std::string& what) {
  if (value.find('\0') == std::string::npos) return Status::Ok();
  return Status::InvalidArgument(what + " contains a NUL byte, which PostgreSQL text cannot hold");
}

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

using TextField = std::pair<const std::string*, const char*>;

// CheckText for each field, named `at` + its name.
Status CheckTexts(const std::string& at, std::initializer_list<TextField> fields) {
  for (const TextField& f : fields) IDEM_RETURN_IF_ERROR(CheckText(*f.first, at + f.second));
  return Status::Ok();
}

// ---- Binding and reading ----------------------------------------------------

Json FieldJson(const pqxx::field& f, const char* column) {
  if (f.is_null()) return {};  // JSON null
  Json value = Json::parse(f.c_str(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    throw DataError(std::string("column ") + column + " holds invalid JSON");
  }
  return value;
}

std::string FieldText(const pqxx::field& f) { return f.is_null() ? std::string() : f.c_str(); }

SagaSummary ReadSummary(const pqxx::row& r) {
  SagaSummary s;
  s.saga_id = FieldText(r[0]);
  s.intent_key = FieldText(r[1]);
  s.spec_name = FieldText(r[2]);
  s.state = FieldText(r[3]);
  s.reason = FieldText(r[4]);
  s.created_ms = r[5].as<int64_t>();
  s.updated_ms = r[6].as<int64_t>();
  return s;
}

// The spec a saga runs (spec_version, spec_sha256 at `first`): schema 7.
void ReadSpecRef(const pqxx::row& r, int first, SagaSummary* s) {
  s->spec_version = r[first].is_null() ? 0 : r[first].as<int>();
  s->spec_sha256 = FieldText(r[first + 1]);
}

Status SagaNotFound(const std::string& saga_id) {
  return Status::NotFound("saga " + Quote(saga_id) + " not found");
}

// The answer to a submission whose intent key is taken, from its row
// (fingerprint, saga_id): the same saga if the fingerprints match.
Result<CreateOutcome> ExistingIntent(const NewSaga& saga, const pqxx::row& r) {
  std::string fingerprint = FieldText(r[0]);
  std::string existing = FieldText(r[1]);
  if (fingerprint == saga.fingerprint) return CreateOutcome{existing, false};
  return Status::Conflict("intent key " + Quote(saga.intent_key) +
                          " was already submitted with other content (saga " + Quote(existing) +
                          ", fingerprint " + fingerprint + ")");
}

// ---- Connection string ----------------------------------------------------------

bool IsUri(const std::string& url) {
  return StartsWith(url, "postgresql://") || StartsWith(url, "postgres://");
}

// Adds a libpq parameter unless the string already sets it.
void AddParam(std::string& conninfo, const std::string& key, const std::string& value) {
  if (conninfo.find(key + "=") != std::string::npos) return;
  if (IsUri(conninfo)) {
    conninfo += (conninfo.find('?') == std::string::npos ? "?" : "&") + key + "=" + value;
  } else {
    conninfo += " " + key + "=" + value;
  }
}

// The URL without its password, for messages.
std::string Redacted(const std::string& url) {
  if (!IsUri(url)) return "(connection string)";
  size_t scheme = url.find("://") + 3;
  size_t at = url.find('@', scheme);
  size_t slash = url.find('/', scheme);
  if (at == std::string::npos || (slash != std::string::npos && slash < at)) return url;
  size_t colon = url.find(':', scheme);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon) + ":***" + url.substr(at);
}

Status TooNew(int version) {
  return Status::FailedPrecondition("database schema version " + std::to_string(version) +
                                    " is newer than this build of idem knows (" +
                                    std::to_string(kLatestVersion) +
                                    "); upgrade idem before opening it");
}

// ---- libpq pipelines ----------------------------------------------------------
//
// Write transactions talk to libpq directly, in pipeline mode: BEGIN and the
// statements of a batch go out together and their replies come back in one
// round trip (libpqxx 6.4 has no pipelines for bound parameters and sends
// BEGIN on its own). COMMIT and ROLLBACK stay simple queries of their own.
// The build links libpq itself (libpqxx's own dependency) for them.

// The libpq handle of the connection being made on this thread (libpqxx 6.4
// keeps its own private): captured by the connection policy below.
thread_local PGconn* t_new_handle = nullptr;

// connect_direct that notes the handle, and refuses to connect a second time:
// a connection that broke is discarded, never silently reopened by libpqxx
// (its statements and the handle would be gone).
class HandleNotingConnect : public pqxx::connect_direct {
 public:
  explicit HandleNotingConnect(const std::string& options) : pqxx::connect_direct(options) {}
  handle do_startconnect(handle orig) override {
    if (orig == nullptr && connected_) {
      throw pqxx::broken_connection("connection lost (not reopened)");
    }
    handle h = pqxx::connect_direct::do_startconnect(orig);
    connected_ = true;
    t_new_handle = h;
    return h;
  }

 private:
  bool connected_ = false;
};

// The connection broke: libpq's message.
[[noreturn]] void ThrowBroken(PGconn* c, const char* what) {
  throw pqxx::broken_connection(std::string(what) + ": " + OneLine(PQerrorMessage(c)));
}

// The reply to one statement of a pipeline: its rows, or the error it raised.
class Reply {
 public:
  Reply() = default;
  explicit Reply(PGresult* r) : r_(r) {}
  ~Reply() {
    if (r_ != nullptr) PQclear(r_);
  }
  Reply(Reply&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Reply& operator=(Reply&& o) noexcept {
    std::swap(r_, o.r_);
    return *this;
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;

  ExecStatusType status() const { return PQresultStatus(r_); }
  bool ok() const {
    ExecStatusType st = PQresultStatus(r_);
    return st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK;
  }
  int rows() const { return PQntuples(r_); }
  bool null(int row, int col) const { return PQgetisnull(r_, row, col) != 0; }
  std::string text(int row, int col) const {
    return null(row, col) ? std::string() : std::string(PQgetvalue(r_, row, col));
  }
  int64_t i64(int row, int col) const {
    return std::strtoll(PQgetvalue(r_, row, col), nullptr, 10);
  }
  const char* c_str(int row, int col) const { return PQgetvalue(r_, row, col); }
  std::string message() const { return PQresultErrorMessage(r_); }
  std::string sqlstate() const {
    const char* st = PQresultErrorField(r_, PG_DIAG_SQLSTATE);
    return st == nullptr ? std::string() : std::string(st);
  }

  /// The error as the exception libpqxx would have thrown (what Run and
  /// Translate know how to handle).
  [[noreturn]] void Throw(PGconn* c, const char* query) const {
    if (PQstatus(c) != CONNECTION_OK) ThrowBroken(c, query);
    if (PQresultStatus(r_) == PGRES_PIPELINE_ABORTED) {
      throw pqxx::sql_error("statement skipped after an error in its pipeline", query);
    }
    const std::string msg = PQresultErrorMessage(r_);
    const std::string st = sqlstate();
    if (st == "23505") throw pqxx::unique_violation(msg, query, st.c_str());
    if (st == "40001") throw pqxx::serialization_failure(msg);
    if (st == "40P01") throw pqxx::deadlock_detected(msg);
    if (StartsWith(st, "40")) throw pqxx::transaction_rollback(msg);
    throw pqxx::sql_error(msg, query, st.empty() ? nullptr : st.c_str());
  }

 private:
  PGresult* r_ = nullptr;
};

// A pqxx result read through the accessors of a Reply, so that one reader
// (ReadSagaWithSteps) serves both.
class PqxxRows {
 public:
  explicit PqxxRows(const pqxx::result& r) : r_(r) {}
  int rows() const { return static_cast<int>(r_.size()); }
  bool null(int row, int col) const { return r_[row][col].is_null(); }
  std::string text(int row, int col) const { return FieldText(r_[row][col]); }
  int64_t i64(int row, int col) const { return r_[row][col].as<int64_t>(); }
  const char* c_str(int row, int col) const { return r_[row][col].c_str(); }

 private:
  const pqxx::result& r_;
};

template <typename Rows>
Json JsonAt(const Rows& q, int row, int col, const char* column) {
  if (q.null(row, col)) return {};  // JSON null
  Json value = Json::parse(q.c_str(row, col), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    throw DataError(std::string("column ") + column + " holds invalid JSON");
  }
  return value;
}

// A control request from its columns (IDEM_PG_CONTROL_COLUMNS).
ControlRequest ReadControl(const std::string& saga_id, const std::string& request_id,
                           const std::string& kind, const std::string& by,
                           const std::string& reason, int64_t requested_ms) {
  ControlRequest r;
  r.saga_id = saga_id;
  r.request_id = request_id;
  r.kind = kind;
  r.by = by;
  r.reason = reason;
  r.requested_ms = requested_ms;
  return r;
}

// What kPipedControl's reply says, into `out` (nothing read if it failed:
// skipped after an error in its pipeline).
void ReadBack(const std::string& saga_id, const Reply& r, ControlReadback* out) {
  if (!r.ok()) return;
  out->read = true;
  if (r.rows() == 0) return;
  out->pending =
      ReadControl(saga_id, r.text(0, 1), r.text(0, 2), r.text(0, 3), r.text(0, 4), r.i64(0, 5));
}

// The saga `saga_id` from the rows of kSelectSagaWithSteps (at least one:
// none means no such saga).
template <typename Rows>
SagaRecord ReadSagaWithSteps(const Rows& q, const std::string& saga_id) {
  SagaRecord rec;
  SagaSummary& s = rec.summary;
  s.saga_id = q.text(0, 0);
  s.intent_key = q.text(0, 1);
  s.spec_name = q.text(0, 2);
  s.state = q.text(0, 3);
  s.reason = q.text(0, 4);
  s.created_ms = q.i64(0, 5);
  s.updated_ms = q.i64(0, 6);
  rec.fingerprint = q.text(0, 7);
  rec.spec = JsonAt(q, 0, 8, "sagas.spec");
  rec.input = JsonAt(q, 0, 9, "sagas.input");
  s.spec_version = q.null(0, 25) ? 0 : static_cast<int>(q.i64(0, 25));  // schema 7
  s.spec_sha256 = q.text(0, 26);
  s.pruned_at_ms = q.null(0, 27) ? 0 : q.i64(0, 27);  // schema 9
  for (int i = 0; i < q.rows(); ++i) {
    if (q.null(i, 10)) continue;  // no steps
    StepRecord t;
    t.saga_id = saga_id;
    t.index = static_cast<int>(q.i64(i, 10));
    t.step_id = q.text(i, 11);
    t.tool = q.text(i, 12);
    t.state = q.text(i, 13);
    t.attempt = static_cast<int>(q.i64(i, 14));
    t.step_key = q.text(i, 15);
    t.args = JsonAt(q, i, 16, "steps.args");
    t.args_fingerprint = q.text(i, 17);
    t.result = JsonAt(q, i, 18, "steps.result");
    t.external_ref = q.text(i, 19);
    t.error = q.text(i, 20);
    t.comp_attempt = static_cast<int>(q.i64(i, 21));
    t.comp_result = JsonAt(q, i, 22, "steps.comp_result");
    t.updated_ms = q.i64(i, 23);
    t.phase = JsonAt(q, i, 24, "steps.phase");
    rec.steps.push_back(std::move(t));
  }
  return rec;
}

}  // namespace

// ---- Connection pool --------------------------------------------------------------

/// One server session with its prepared statements. Notices go nowhere: what
/// matters reaches the caller as a Status.
// Which run of the server a connection talks to: the postmaster's start, and
// the shared statistics' last reset, which crash recovery does (also after
// one backend crashed and the postmaster stayed up). See ResolveCommit.
constexpr const char* kServerRunSql =
    "SELECT pg_postmaster_start_time()::text || ' / ' ||"
    " coalesce((SELECT stats_reset::text FROM pg_stat_bgwriter), '')";

struct PgConnection {
  explicit PgConnection(const std::string& conninfo)
      : conn((t_new_handle = nullptr, conninfo)), quiet(conn), raw(t_new_handle) {
    if (raw == nullptr) throw pqxx::broken_connection("no libpq handle");
    conn.set_client_encoding("UTF8");
    // A process frozen (SIGSTOP, a long GC-like pause) inside a transaction
    // must not hold its row locks for ever: FOR UPDATE SKIP LOCKED claims
    // skip locked sagas, so the server ends such a session after a while and
    // the sagas become claimable once their leases expire.
    conn.set_variable("idle_in_transaction_session_timeout", "'10s'");
    for (const Statement& s : kReadStatements) conn.prepare(s.name, s.sql);
    pid = conn.backendpid();
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec(kServerRunSql);
    if (!r.empty() && !r[0][0].is_null()) server_run = r[0][0].c_str();
  }

  /// Prepares the write statements (once; after the migrations made their
  /// tables), in one round trip.
  void PrepareWrites() {
    if (writes_prepared) return;
    if (PQenterPipelineMode(raw) != 1) ThrowBroken(raw, "pipeline");
    for (const Statement& s : kWriteStatements) {
      if (PQsendPrepare(raw, s.name, s.sql, 0, nullptr) != 1) ThrowBroken(raw, "prepare");
    }
    if (PQpipelineSync(raw) != 1) ThrowBroken(raw, "prepare");
    for (const Statement& s : kWriteStatements) {
      PGresult* r = PQgetResult(raw);
      if (r == nullptr) ThrowBroken(raw, "prepare");
      Reply reply(r);
      while (PGresult* extra = PQgetResult(raw)) PQclear(extra);
      if (!reply.ok()) reply.Throw(raw, s.sql);
    }
    Reply sync(PQgetResult(raw));
    if (sync.status() != PGRES_PIPELINE_SYNC) ThrowBroken(raw, "prepare");
    if (PQexitPipelineMode(raw) != 1) ThrowBroken(raw, "prepare");
    writes_prepared = true;
  }

  pqxx::basic_connection_base<HandleNotingConnect> conn;
  pqxx::quiet_errorhandler quiet;  // after conn: unregisters before conn closes
  PGconn* raw;                     // conn's libpq handle
  int pid = 0;
  std::string server_run;  // kServerRunSql when connected
  bool writes_prepared = false;
};

/// A fixed-capacity pool: connections are made on demand up to `size`, kept
/// idle after use, and discarded when broken. Thread-safe.
class PgStore::Pool {
 public:
  Pool(std::string conninfo, std::string where, int size, int acquire_timeout_ms)
      : conninfo_(std::move(conninfo)),
        where_(std::move(where)),
        size_(size),
        acquire_timeout_ms_(acquire_timeout_ms) {}

  ~Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  Pool(Pool&&) = delete;
  Pool& operator=(Pool&&) = delete;

  /// An idle connection, or a new one if fewer than `size` are open.
  /// kUnavailable if none frees up in time or the server cannot be reached.
  Result<std::unique_ptr<PgConnection>> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    bool ready = cv_.wait_for(lock, std::chrono::milliseconds(acquire_timeout_ms_),
                              [&] { return !idle_.empty() || open_ < size_; });
    if (!ready) {
      return Status::Unavailable("no free PostgreSQL connection after " +
                                 std::to_string(acquire_timeout_ms_) + " ms (pool_size " +
                                 std::to_string(size_) + ")");
    }
    if (!idle_.empty()) {
      std::unique_ptr<PgConnection> c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    ++open_;
    lock.unlock();
    try {
      auto c = std::make_unique<PgConnection>(conninfo_);
      counters.opened.fetch_add(1);
      return c;
    } catch (const std::exception& e) {
      lock.lock();
      --open_;
      cv_.notify_one();
      return Status::Unavailable("cannot connect to PostgreSQL at " + where_ + ": " +
                                 OneLine(e.what()));
    }
  }

  /// Returns a connection; a broken one is closed and its slot freed.
  void Release(std::unique_ptr<PgConnection> c, bool broken) {
    if (broken || !c->conn.is_open()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        --open_;
      }
      counters.discarded.fetch_add(1);
      cv_.notify_one();
      c.reset();  // closes outside the lock
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

  /// Closes every idle connection: after one broke (a server restart, a
  /// failover) the others are most likely dead too.
  void DiscardIdle() {
    std::vector<std::unique_ptr<PgConnection>> dead;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead.swap(idle_);
      open_ -= static_cast<int>(dead.size());
    }
    counters.discarded.fetch_add(static_cast<int64_t>(dead.size()));
    cv_.notify_all();
  }

  const std::string& Where() const { return where_; }

  /// What PgStore::Stats() reports.
  struct Counters {
    std::atomic<int64_t> opened{0};
    std::atomic<int64_t> discarded{0};
    std::atomic<int64_t> retries{0};
    std::atomic<int64_t> in_doubt{0};
    std::atomic<int64_t> resolved_committed{0};
    std::atomic<int64_t> resolved_aborted{0};
    std::atomic<int64_t> unresolved{0};
    std::atomic<int64_t> commit_batches{0};
    std::atomic<int64_t> commit_transactions{0};
    std::atomic<int64_t> largest_group{0};
    std::atomic<int64_t> group_fallbacks{0};
  };
  Counters counters;

 private:
  const std::string conninfo_;
  const std::string where_;
  const int size_;
  const int acquire_timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<PgConnection>> idle_;  // GUARDED_BY(mu_)
  int open_ = 0;                                     // GUARDED_BY(mu_): idle + in use
};

namespace {

/// A connection borrowed from the pool for one transaction; returned (or
/// discarded, if marked broken) when this object goes. Move-only.
class Borrowed {
 public:
  Borrowed(PgStore::Pool* pool, std::unique_ptr<PgConnection> conn)
      : pool_(pool), conn_(std::move(conn)) {}
  ~Borrowed() { Return(); }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  Borrowed(Borrowed&&) = default;
  Borrowed& operator=(Borrowed&&) = delete;

  PgConnection& operator*() { return *conn_; }
  PgConnection* operator->() { return conn_.get(); }
  void MarkBroken() { broken_ = true; }
  void Return() {
    if (conn_) pool_->Release(std::move(conn_), broken_);
  }

 private:
  PgStore::Pool* pool_;
  std::unique_ptr<PgConnection> conn_;
  bool broken_ = false;
};

/// A savepoint statement of a group failed: the group's transaction as a
/// whole is in no state to go on.
class GroupBroken : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A write transaction on a borrowed connection, run through libpq: the
/// first pipeline begins it; Run commits or rolls it back.
class WriteTx {
 public:
  explicit WriteTx(PgConnection& c) : c_(c) {}
  PGconn* raw() const { return c_.raw; }
  PgConnection& conn() { return c_; }
  bool begun() const { return begun_; }
  void MarkBegun() { begun_ = true; }
  /// The transaction was ended by the body (rolled back).
  void MarkEnded() { begun_ = false; }

 private:
  PgConnection& c_;
  bool begun_ = false;
};

/// Statements sent together and answered in one round trip. The first pipe
/// of a WriteTx starts with its BEGIN. String arguments are borrowed (they
/// must outlive Run); numbers and JSON are converted into the pipe.
class Pipe {
 public:
  /// kImplicit: no BEGIN on a transaction not begun; the pipeline's
  /// statements are then one implicit transaction, committed by its Sync
  /// (or rolled back whole by an error), and the WriteTx stays not begun.
  enum class Mode { kInTransaction, kImplicit };

  explicit Pipe(WriteTx& tx, Mode mode = Mode::kInTransaction) : tx_(tx) {
    calls_.reserve(8);
    if (!tx_.begun() && mode == Mode::kInTransaction) {
      AddSql("BEGIN");
      begins_ = true;
    }
  }

  /// Queues the prepared statement `s`; returns its reply's index.
  template <typename... Args>
  size_t Add(const Statement& s, const Args&... args) {
    Call& c = calls_.emplace_back();
    c.name = s.name;
    c.sql = s.sql;
    c.values.reserve(sizeof...(Args));
    (Push(c, args), ...);
    return calls_.size() - 1 - (begins_ ? 1 : 0);
  }
  /// Queues SQL text with bound parameters.
  size_t AddSql(const char* sql, const std::vector<const char*>& values = {}) {
    Call& c = calls_.emplace_back();
    c.sql = sql;
    c.values = values;
    return calls_.size() - 1 - (begins_ ? 1 : 0);
  }
  /// Converted into the pipe: a parameter that Run may point at.
  const char* Own(std::string value) {
    owned_.push_back(std::move(value));
    return owned_.back().c_str();
  }

  /// Sends what is queued and returns the replies (BEGIN's checked and left
  /// out). After an error, the pipeline's later statements come back
  /// skipped (PGRES_PIPELINE_ABORTED). Throws broken_connection.
  std::vector<Reply> Run() {
    PGconn* c = tx_.raw();
    tx_.conn().PrepareWrites();
    if (PQenterPipelineMode(c) != 1) ThrowBroken(c, "pipeline");
    for (const Call& call : calls_) {
      const int n = static_cast<int>(call.values.size());
      const int sent =
          call.name != nullptr
              ? PQsendQueryPrepared(c, call.name, n, call.values.data(), nullptr, nullptr, 0)
              : PQsendQueryParams(c, call.sql, n, nullptr, call.values.data(), nullptr, nullptr, 0);
      if (sent != 1) ThrowBroken(c, call.sql);
    }
    if (PQpipelineSync(c) != 1) ThrowBroken(c, "pipeline sync");
    if (begins_) tx_.MarkBegun();  // a failed BEGIN leaves nothing to roll back anyway
    std::vector<Reply> out;
    out.reserve(calls_.size());
    for (const Call& call : calls_) {
      PGresult* r = PQgetResult(c);
      if (r == nullptr) ThrowBroken(c, call.sql);
      out.emplace_back(r);
      while (PGresult* extra = PQgetResult(c)) PQclear(extra);
    }
    Reply sync(PQgetResult(c));
    if (sync.status() != PGRES_PIPELINE_SYNC) ThrowBroken(c, "pipeline sync");
    if (PQexitPipelineMode(c) != 1) ThrowBroken(c, "pipeline end");
    if (begins_) {
      if (!out[0].ok()) out[0].Throw(c, "BEGIN");
      out.erase(out.begin());
    }
    return out;
  }

  /// The SQL of the reply at `index` (for messages).
  const char* Sql(size_t index) const { return calls_[index + (begins_ ? 1 : 0)].sql; }

 private:
  struct Call {
    const char* name = nullptr;  // prepared statement, or nullptr: sql
    const char* sql = nullptr;
    std::vector<const char*> values;
  };

  void Push(Call& c, const std::string& v) { c.values.push_back(v.c_str()); }
  void Push(Call& c, const char* v) { c.values.push_back(v); }  // nullptr: SQL NULL
  void Push(Call& c, bool v) { c.values.push_back(v ? "t" : "f"); }
  void Push(Call& c, const Json& v) {
    c.values.push_back(v.is_null() ? nullptr : Own(CanonicalJson(v)));
  }
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  void Push(Call& c, I v) {
    c.values.push_back(Own(std::to_string(v)));
  }

  WriteTx& tx_;
  bool begins_ = false;
  std::vector<Call> calls_;
  std::deque<std::string> owned_;  // stable addresses
};

// Throws the first error among `replies` from `from` on (skipped statements
// after it are not errors of their own).
void ThrowFirstError(const Pipe& pipe, PGconn* c, const std::vector<Reply>& replies,
                     size_t from = 0) {
  for (size_t i = from; i < replies.size(); ++i) {
    if (!replies[i].ok() && replies[i].status() != PGRES_PIPELINE_ABORTED) {
      replies[i].Throw(c, pipe.Sql(i));
    }
  }
  for (size_t i = from; i < replies.size(); ++i) {
    if (!replies[i].ok()) replies[i].Throw(c, pipe.Sql(i));
  }
}

// Ends the write transaction on `c` if one is open. False: the connection is
// in no state to be reused.
bool RollbackRaw(PGconn* c) {
  if (PQstatus(c) != CONNECTION_OK || PQpipelineStatus(c) != PQ_PIPELINE_OFF) return false;
  const PGTransactionStatusType ts = PQtransactionStatus(c);
  if (ts == PQTRANS_IDLE) return true;
  if (ts != PQTRANS_INTRANS && ts != PQTRANS_INERROR) return false;
  Reply r(PQexec(c, "ROLLBACK"));
  return r.ok() && PQtransactionStatus(c) == PQTRANS_IDLE;
}

// Sends COMMIT (a simple query of its own). True: committed. False: the
// connection was lost with COMMIT in flight (the outcome is unknown). Throws
// what the server answered instead of committing.
bool CommitRaw(PGconn* c) {
  PGresult* res = PQexec(c, "COMMIT");
  if (res == nullptr || PQstatus(c) != CONNECTION_OK) {
    if (res != nullptr) PQclear(res);
    return false;
  }
  Reply r(res);
  if (!r.ok()) r.Throw(c, "COMMIT");
  // A transaction in error answers COMMIT with ROLLBACK: never the case here
  // (an error fails the body), but never report such a COMMIT as done.
  if (std::strcmp(PQcmdStatus(res), "COMMIT") != 0) {
    throw pqxx::sql_error(std::string("COMMIT was answered with ") + PQcmdStatus(res), "COMMIT");
  }
  return true;
}

enum class CommitOutcome { kCommitted, kAborted, kUnknown };

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Backoff before retrying a serialization failure or deadlock: a few ms,
// doubling, with jitter so that the contenders do not collide again.
void Backoff(int attempt) {
  thread_local std::minstd_rand rng(std::random_device{}());
  int base = 2 << std::min(attempt, 6);
  SleepMs(base / 2 + static_cast<int>(rng() % static_cast<unsigned>(base)));
}

// What the connection that broke during COMMIT left behind: asks a new
// connection for txid_status(txid) until it is final. A transaction still "in
// progress" after a grace period belongs to a backend that has not noticed its
// client is gone; it is terminated (only if it still runs that very xid) so
// that the status becomes final.
//
// After a crash (the server, or one backend, killed) txid_status cannot prove
// a commit: PostgreSQL logs a transaction id with the transaction's first WAL
// record, which sits in memory until a flush, so crash recovery may hand the
// same id to a new transaction, and "committed" is then that one's outcome
// (tests/pg_crash_test.cc reproduces it). So when the server's run
// (kServerRunSql) is not the one the transaction ran on, only "aborted" is
// believed: a commit that was flushed also flushed its id, which is then
// never handed out again. Anything else is kUnknown.
CommitOutcome ResolveCommit(PgStore::Pool& pool, int64_t txid, int old_pid,
                            const std::string& old_server_run, int timeout_ms,
                            std::string* detail) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  const auto grace = std::chrono::milliseconds(std::min(1000, timeout_ms / 4));
  bool terminated = false;
  for (;;) {
    Result<std::unique_ptr<PgConnection>> acquired = pool.Acquire();
    if (!acquired.ok()) {
      *detail = acquired.status().message();
    } else {
      Borrowed c(&pool, std::move(acquired).value());
      try {
        pqxx::work tx(c->conn);
        pqxx::result r = tx.exec_params("SELECT txid_status($1)", txid);
        if (r.empty() || r[0][0].is_null()) {
          *detail = "txid_status(" + std::to_string(txid) + ") is NULL (transaction too old)";
          return CommitOutcome::kUnknown;
        }
        const std::string status = r[0][0].c_str();
        if (status == "aborted") return CommitOutcome::kAborted;
        if (c->server_run != old_server_run) {
          *detail = "the server went through crash recovery since the transaction began (" +
                    old_server_run + ", now " + c->server_run + "), so txid_status(" +
                    std::to_string(txid) + ") = " + Quote(status) +
                    " may be another transaction's, which was given the same id";
          return CommitOutcome::kUnknown;
        }
        if (status == "committed") return CommitOutcome::kCommitted;
        *detail = "txid_status(" + std::to_string(txid) + ") is " + Quote(status);
        if (!terminated && Clock::now() - start >= grace) {
          // backend_xid is the 32-bit xid; txid_current() adds the epoch above it.
          tx.exec_params(
              "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
              " WHERE pid = $1 AND backend_xid IS NOT NULL"
              " AND backend_xid::text::bigint = $2",
              old_pid, txid & 0xffffffffLL);
          terminated = true;
        }
        tx.commit();
      } catch (const std::exception& e) {
        c.MarkBroken();
        *detail = OneLine(e.what());
      }
    }
    if (Clock::now() >= deadline) return CommitOutcome::kUnknown;
    SleepMs(50);
  }
}

// What a write body may tell Run about its transaction (bodies that take a
// WriteNote* as their second argument).
struct WriteNote {
  // txid_current(), if a statement of the body returned it; 0: Run asks.
  int64_t txid = 0;
  // The body wrote nothing its result depends on: the result holds whether or
  // not COMMIT happens, so Run takes no transaction id for it and an unknown
  // COMMIT outcome needs no resolving.
  bool nothing_written = false;
};

// Calls body(tx, note) or body(tx), whichever the body takes; a body made
// for another kind of transaction is never run with this one.
template <typename T, typename Tx, typename Body>
Result<T> CallBody(Body& body, Tx& tx, WriteNote* note) {
  if constexpr (std::is_invocable_v<Body&, Tx&, WriteNote*>) {
    return body(tx, note);
  } else if constexpr (std::is_invocable_v<Body&, Tx&>) {
    return body(tx);
  } else {
    return Status::Internal("PgStore: a body run with the wrong access");
  }
}

}  // namespace

// ---- Transactions ------------------------------------------------------------------

// Runs `body(tx)` in one transaction on a pooled connection and commits it if
// the body returned OK; any other return or throw rolls it back (pqxx's
// transactions abort in their destructor). kOneStatement: the body must run
// a single statement (it runs without BEGIN/COMMIT, in autocommit). Retries,
// each from the start on a new transaction:
//  - serialization failure / deadlock: up to kMaxAttempts runs, then kAborted;
//  - lost connection before COMMIT: once, on a new connection;
//  - lost connection during COMMIT: the outcome is looked up (ResolveCommit);
//    committed -> the body's result; aborted -> once, like a lost connection.
template <typename T, typename Body>
Result<T> PgStore::Run(const std::string& op, Access access, Body&& body) {
  enum class Next { kRetryContention, kRetryBroken, kResolve };
  bool retried_broken = false;
  for (int attempt = 1;; ++attempt) {
    Next next = Next::kRetryBroken;
    Status failure;
    std::optional<Result<T>> pending;  // the body's result while COMMIT is in doubt
    int64_t txid = 0;
    int pid = 0;
    std::string server_run;
    {
      Result<std::unique_ptr<PgConnection>> acquired = pool_->Acquire();
      if (!acquired.ok()) {
        return Status(acquired.status().code(), op + ": " + acquired.status().message());
      }
      Borrowed c(pool_.get(), std::move(acquired).value());
      pid = c->pid;
      server_run = c->server_run;
      try {
        if (access == Access::kWrite) {
          WriteTx tx(*c);
          WriteNote note;
          Result<T> r = CallBody<T>(body, tx, &note);
          if (!r.ok()) {
            if (!RollbackRaw(c->raw)) c.MarkBroken();
            return r;
          }
          if (!tx.begun()) return r;  // the body wrote nothing (and began nothing)
          if (note.txid != 0) {
            txid = note.txid;
          } else if (!note.nothing_written) {
            Pipe p(tx);
            p.AddSql("SELECT txid_current()");
            std::vector<Reply> got = p.Run();
            ThrowFirstError(p, c->raw, got);
            txid = got[0].i64(0, 0);
          }
          if (options_.before_commit_hook) options_.before_commit_hook(pid);
          // With the connection still up, a refused COMMIT throws: not
          // committed, handled below like any error. Without it, nobody knows.
          if (CommitRaw(c->raw)) return r;
          if (note.nothing_written && note.txid == 0) {
            // Committed or not, the result stands.
            c.MarkBroken();
            return r;
          }
          failure = Status::Unavailable(op + ": connection to PostgreSQL at " + pool_->Where() +
                                        " lost while COMMIT was in flight");
          pending.emplace(std::move(r));
          next = Next::kResolve;
        } else {
          pqxx::nontransaction tx(c->conn);
          return CallBody<T>(body, tx, nullptr);
        }
      } catch (const std::exception& e) {
        const bool lost =
            !c->conn.is_open() || PQstatus(c->raw) != CONNECTION_OK || IsConnectionError(e);
        // A write transaction the error left open is rolled back here (the
        // connection goes back to the pool clean, or not at all).
        if (!lost && access == Access::kWrite && !RollbackRaw(c->raw)) c.MarkBroken();
        if (lost) {
          next = Next::kRetryBroken;
          failure = Status::Unavailable(op + ": connection to PostgreSQL at " + pool_->Where() +
                                        " lost: " + OneLine(e.what()) + "; retry later");
        } else if (dynamic_cast<const pqxx::transaction_rollback*>(&e) != nullptr) {
          next = Next::kRetryContention;
          failure = Translate(op, e);
        } else {
          return Translate(op, e);
        }
      }
      if (next != Next::kRetryContention) c.MarkBroken();
    }  // the connection goes back to the pool (or away) here

    switch (next) {
      case Next::kRetryContention:
        if (attempt >= kMaxAttempts) {
          return Status(Code::kAborted,
                        failure.message() + " (after " + std::to_string(attempt) + " attempts)");
        }
        pool_->counters.retries.fetch_add(1);
        Backoff(attempt);
        continue;
      case Next::kRetryBroken:
        pool_->DiscardIdle();
        if (retried_broken || attempt > kMaxAttempts) return failure;
        retried_broken = true;
        pool_->counters.retries.fetch_add(1);
        continue;
      case Next::kResolve: {
        pool_->DiscardIdle();
        pool_->counters.in_doubt.fetch_add(1);
        std::string detail;
        CommitOutcome outcome =
            ResolveCommit(*pool_, txid, pid, server_run, options_.resolve_timeout_ms, &detail);
        if (outcome == CommitOutcome::kCommitted) {
          pool_->counters.resolved_committed.fetch_add(1);
          return std::move(*pending);
        }
        if (outcome == CommitOutcome::kAborted) {
          pool_->counters.resolved_aborted.fetch_add(1);
          if (retried_broken || attempt > kMaxAttempts) {
            return Status::Unavailable(failure.message() + "; txid " + std::to_string(txid) +
                                       " was rolled back and nothing was written; retry later");
          }
          retried_broken = true;
          pool_->counters.retries.fetch_add(1);
          continue;
        }
        pool_->counters.unresolved.fetch_add(1);
        return Status::Unavailable(failure.message() + "; the outcome of txid " +
                                   std::to_string(txid) + " is unknown (" + detail +
                                   "): the write may or may not have happened");
      }
    }
  }
}

// ---- Open -------------------------------------------------------------------------

int PgStore::LatestSchemaVersion() { return kLatestVersion; }

int PgStore::KnownSchemaVersions() {
  return static_cast<int>(
      std::count_if(kMigrations.begin(), kMigrations.end(), [](const char* m) { return m; }));
}

PgStore::PgStore(PgOptions options, std::unique_ptr<Pool> pool, int schema_version)
    : options_(std::move(options)),
      pool_(std::move(pool)),
      schema_version_(schema_version),
      clock_(options_.clock),
      group_commit_(
          options_.group_commit, options_.max_group_batches,
          [this](const std::vector<PendingCommit*>& group) { CommitGroup(group); },
          std::min(options_.group_commit_leaders, options_.pool_size)) {}

PgStore::~PgStore() = default;

namespace {

// Applies pending migrations, each in its own transaction holding the
// migration lock and re-reading the version, so that concurrent openers apply
// each script exactly once. Returns the resulting version.
// By set, not by the highest version, as on SQLite: a version merged after a
// later one is still applied.
Result<int> Migrate(pqxx::connection_base& conn, Clock* clock) {
  for (int next = 1;; ++next) {
    pqxx::work tx(conn);
    tx.exec_params("SELECT pg_advisory_xact_lock($1)", kMigrationLockKey);
    if (tx.exec("SELECT to_regclass('schema_migrations') IS NULL")[0][0].as<bool>()) {
      tx.exec(
          "CREATE TABLE schema_migrations ("
          " version INTEGER PRIMARY KEY,"
          " applied_at BIGINT NOT NULL)");
    }
    int version =
        tx.exec("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0][0].as<int>();
    if (version > kLatestVersion) return TooNew(version);
    if (next > kLatestVersion) {
      tx.commit();
      return version;
    }
    const bool applied =
        !tx.exec_params("SELECT 1 FROM schema_migrations WHERE version = $1", next).empty();
    if (!applied && kMigrations[next - 1] != nullptr) {
      tx.exec(kMigrations[next - 1]);
      tx.exec_params("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)", next,
                     static_cast<int64_t>(clock->NowMs()));
    }
    tx.commit();
  }
}

}  // namespace

Result<std::unique_ptr<PgStore>> PgStore::Open(const PgOptions& options) {
  if (options.url.empty()) return Status::InvalidArgument("PostgreSQL store: the URL is empty");
  if (HasNul(options.url)) {
    return Status::InvalidArgument("PostgreSQL store: the URL contains a NUL byte");
  }
  if (options.pool_size < 1) {
    return Status::InvalidArgument("PostgreSQL store: pool_size must be >= 1, got " +
                                   std::to_string(options.pool_size));
  }
  if (options.connect_timeout_s < 1) {
    // libpq reads 0 as "wait forever".
    return Status::InvalidArgument("PostgreSQL store: connect_timeout_s must be >= 1, got " +
                                   std::to_string(options.connect_timeout_s));
  }
  if (options.acquire_timeout_ms < 0 || options.resolve_timeout_ms < 0) {
    return Status::InvalidArgument(
        "PostgreSQL store: acquire_timeout_ms and resolve_timeout_ms must be >= 0");
  }
  if (options.max_group_batches < 1) {
    return Status::InvalidArgument("PostgreSQL store: max_group_batches must be >= 1, got " +
                                   std::to_string(options.max_group_batches));
  }
  if (options.group_commit_leaders < 1) {
    return Status::InvalidArgument("PostgreSQL store: group_commit_leaders must be >= 1, got " +
                                   std::to_string(options.group_commit_leaders));
  }
  PgOptions resolved = options;
  if (resolved.clock == nullptr) resolved.clock = SystemClock::Get();
  std::string conninfo = options.url;
  AddParam(conninfo, "connect_timeout", std::to_string(options.connect_timeout_s));
  AddParam(conninfo, "fallback_application_name", "idem");
  const std::string where = Redacted(options.url);
  const std::string op = "open PostgreSQL store at " + where;

  auto pool =
      std::make_unique<Pool>(conninfo, where, options.pool_size, options.acquire_timeout_ms);
  Result<int> version = Status::Internal("not migrated");
  {
    Result<std::unique_ptr<PgConnection>> acquired = pool->Acquire();
    if (!acquired.ok()) {
      return Status(acquired.status().code(), op + ": " + acquired.status().message());
    }
    Borrowed c(pool.get(), std::move(acquired).value());
    try {
      version = Migrate(c->conn, resolved.clock);
    } catch (const std::exception& e) {
      c.MarkBroken();
      if (!c->conn.is_open() || IsConnectionError(e)) {
        return Status::Unavailable(op + ": connection lost: " + OneLine(e.what()));
      }
      return Translate(op, e);
    }
  }
  if (!version.ok()) return Status(version.status().code(), op + ": " + version.status().message());
  return std::unique_ptr<PgStore>(new PgStore(std::move(resolved), std::move(pool), *version));
}

int PgStore::SchemaVersion() { return schema_version_; }

PgStats PgStore::Stats() const {
  PgStats s;
  s.connections_opened = pool_->counters.opened.load();
  s.connections_discarded = pool_->counters.discarded.load();
  s.retries = pool_->counters.retries.load();
  s.commits_in_doubt = pool_->counters.in_doubt.load();
  s.resolved_committed = pool_->counters.resolved_committed.load();
  s.resolved_aborted = pool_->counters.resolved_aborted.load();
  s.unresolved = pool_->counters.unresolved.load();
  s.commit_batches = pool_->counters.commit_batches.load();
  s.commit_transactions = pool_->counters.commit_transactions.load();
  s.largest_group = pool_->counters.largest_group.load();
  s.group_fallbacks = pool_->counters.group_fallbacks.load();
  s.commits_queued = group_commit_.Queued();
  return s;
}

// ---- Writes -----------------------------------------------------------------

namespace {

// A new saga's texts, which PostgreSQL's text columns refuse with a NUL.
Status CheckNewSagaTexts(const NewSaga& saga) {
  IDEM_RETURN_IF_ERROR(CheckText(saga.saga_id, "CreateIntent: saga_id"));
  IDEM_RETURN_IF_ERROR(CheckText(saga.lease_owner, "CreateIntent: lease_owner"));
  IDEM_RETURN_IF_ERROR(CheckText(saga.intent_key, "CreateIntent: intent_key"));
  IDEM_RETURN_IF_ERROR(CheckText(saga.fingerprint, "CreateIntent: fingerprint"));
  IDEM_RETURN_IF_ERROR(CheckText(saga.spec_name, "CreateIntent: spec_name"));
  IDEM_RETURN_IF_ERROR(CheckText(saga.spec_sha256, "CreateIntent: spec_sha256"));
  IDEM_RETURN_IF_ERROR(CheckText(saga.state, "CreateIntent: state"));
  for (size_t i = 0; i < saga.steps.size(); ++i) {
    const NewStep& s = saga.steps[i];
    IDEM_RETURN_IF_ERROR(
        CheckTexts("CreateIntent: steps[" + std::to_string(i) + "].", {{&s.step_id, "step_id"},
                                                                       {&s.tool, "tool"},
                                                                       {&s.step_key, "step_key"},
                                                                       {&s.state, "state"}}));
  }
  for (size_t i = 0; i < saga.journal.size(); ++i) {
    const std::string at = "CreateIntent: journal[" + std::to_string(i) + "].";
    IDEM_RETURN_IF_ERROR(CheckText(saga.journal[i].step_id, at + "step_id"));
    IDEM_RETURN_IF_ERROR(CheckText(saga.journal[i].event, at + "event"));
  }
  return Status::Ok();
}

}  // namespace

Result<std::optional<CreateOutcome>> PgStore::FindIntent(const NewSaga& saga) {
  IDEM_RETURN_IF_ERROR(CheckText(saga.intent_key, "FindIntent: intent_key"));
  return Run<std::optional<CreateOutcome>>(
      "FindIntent " + Quote(saga.intent_key), Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::optional<CreateOutcome>> {
        pqxx::result q = tx.exec_prepared(kReadIntent.name, saga.intent_key);
        if (q.empty()) return std::optional<CreateOutcome>();
        Result<CreateOutcome> existing = ExistingIntent(saga, q[0]);
        if (!existing.ok()) return existing.status();
        return std::optional<CreateOutcome>(std::move(existing).value());
      });
}

Result<CreateOutcome> PgStore::CreateIntent(const NewSaga& saga) {
  IDEM_RETURN_IF_ERROR(ValidateNewSaga(saga));
  IDEM_RETURN_IF_ERROR(CheckNewSagaTexts(saga));

  const std::string op = "CreateIntent " + Quote(saga.intent_key);
  // A repeated submission (the common case of a retry) is answered by one
  // SELECT on its own: no transaction id, nothing for the server to flush.
  Result<std::optional<CreateOutcome>> found = FindIntent(saga);
  if (!found.ok()) return found.status();
  if (found->has_value()) return std::move(**found);

  return Run<CreateOutcome>(
      op, Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<CreateOutcome> {
        // Race-free across processes: of concurrent inserts of one key (since
        // the look-up above), one wins; the others wait for it and then see
        // its committed row.
        // One round trip: the intent and everything else. If the key turned
        // out taken (no row back), the rest ran for nothing: rolled back, and
        // the winner's row read.
        Pipe p(tx);
        p.Add(kInsertIntent, saga.intent_key, saga.fingerprint, saga.saga_id,
              static_cast<int64_t>(saga.created_ms));
        p.Add(kInsertSaga, saga.saga_id, saga.intent_key, saga.fingerprint, saga.spec_name,
              saga.spec, saga.input, saga.state, static_cast<int64_t>(saga.created_ms),
              saga.spec_version, saga.spec_sha256);
        for (const NewStep& step : saga.steps) {
          p.Add(kInsertStep, saga.saga_id, step.index, step.step_id, step.tool, step.state,
                step.step_key, static_cast<int64_t>(saga.created_ms));
        }
        for (const JournalEntry& e : saga.journal) {
          p.Add(kInsertJournal, saga.saga_id, e.step_id, e.event, e.data,
                static_cast<int64_t>(e.at_ms));
        }
        std::vector<Reply> got = p.Run();
        const Reply& ins = got[0];
        if (!ins.ok()) {
          if (ins.sqlstate() == "23505") {
            return Status::Conflict("saga id " + Quote(saga.saga_id) + " is already in use (" +
                                    OneLine(ins.message()) + ")");
          }
          ins.Throw(tx.raw(), kInsertIntent.sql);
        }
        if (ins.rows() == 0) {
          Pipe again(tx);
          again.AddSql("ROLLBACK");
          again.Add(kSelectIntent, saga.intent_key);
          std::vector<Reply> q = again.Run();
          tx.MarkEnded();
          ThrowFirstError(again, tx.raw(), q);
          if (q[1].rows() == 0) {
            return Status::Internal("intent key " + Quote(saga.intent_key) +
                                    " conflicted on insert but cannot be read back");
          }
          // Another submitter's committed row: the answer, and nothing to commit.
          std::string fingerprint = q[1].text(0, 0);
          std::string existing = q[1].text(0, 1);
          if (fingerprint == saga.fingerprint) return CreateOutcome{existing, false};
          return Status::Conflict("intent key " + Quote(saga.intent_key) +
                                  " was already submitted with other content (saga " +
                                  Quote(existing) + ", fingerprint " + fingerprint + ")");
        }
        note->txid = ins.i64(0, 0);
        for (size_t i = 0; i < saga.steps.size(); ++i) {
          const Reply& r = got[2 + i];
          if (!r.ok() && r.sqlstate() == "23505") {
            const NewStep& step = saga.steps[i];
            return Status::Conflict("step key " + Quote(step.step_key) + " of step " +
                                    Quote(step.step_id) + " is already in use (" +
                                    OneLine(r.message()) + ")");
          }
        }
        ThrowFirstError(p, tx.raw(), got);
        return CreateOutcome{saga.saga_id, true};
      });
}

namespace {

// What a statement after a batch's head writes, for the status of its error.
enum class Kind { kStep, kJournal, kToken, kEffect, kSpec, kOpenCall, kCheck, kSaga, kPlannedStep };
using Kinds = std::vector<std::pair<Kind, size_t>>;

// Queues the batch's rows after its head: its steps (the first carrying the
// journal entries from `journal_done` on), the rest of its journal, the
// token, effects, plan, open call and checks; one `kinds` entry each.
void AddBatchRows(Pipe& p, const WriteBatch& batch, size_t journal_done, int64_t consumed_ms,
                  Kinds* kinds_out) {
  Kinds& kinds = *kinds_out;
  for (size_t k = 0; k < batch.steps.size(); ++k) {
    const StepRecord& s = batch.steps[k];
    if (journal_done < batch.journal.size()) {
      const JournalEntry& e = batch.journal[journal_done];
      p.Add(kUpsertStepAndJournal, batch.saga_id, s.index, s.step_id, s.tool, s.state, s.attempt,
            s.step_key, s.args, s.args_fingerprint, s.result, s.external_ref, s.error,
            s.comp_attempt, s.comp_result, static_cast<int64_t>(s.updated_ms), s.phase, e.step_id,
            e.event, e.data, static_cast<int64_t>(e.at_ms));
      ++journal_done;
    } else {
      p.Add(kUpsertStep, batch.saga_id, s.index, s.step_id, s.tool, s.state, s.attempt, s.step_key,
            s.args, s.args_fingerprint, s.result, s.external_ref, s.error, s.comp_attempt,
            s.comp_result, static_cast<int64_t>(s.updated_ms), s.phase);
    }
    kinds.emplace_back(Kind::kStep, k);
  }
  for (size_t k = journal_done; k < batch.journal.size(); ++k) {
    const JournalEntry& e = batch.journal[k];
    p.Add(kInsertJournal, batch.saga_id, e.step_id, e.event, e.data, static_cast<int64_t>(e.at_ms));
    kinds.emplace_back(Kind::kJournal, k);
  }
  if (!batch.consume_token.empty()) {
    p.Add(kConsumeToken, batch.consume_token, batch.saga_id, batch.consume_token_step, consumed_ms);
    kinds.emplace_back(Kind::kToken, 0);
  }
  for (size_t k = 0; k < batch.effects.size(); ++k) {
    const EffectRecord& f = batch.effects[k];
    p.Add(kInsertEffect, f.idempotency_key, batch.saga_id, f.step_id, f.kind, f.tool, f.result,
          f.external_ref, static_cast<int64_t>(f.at_ms));
    kinds.emplace_back(Kind::kEffect, k);
  }
  if (batch.spec.has_value()) {
    p.Add(kUpdateSpec, batch.saga_id, *batch.spec);
    kinds.emplace_back(Kind::kSpec, 0);
  }
  if (batch.open_call.has_value()) {
    const WriteBatch::OpenCall& oc = *batch.open_call;
    p.Add(kInsertOpenCall, batch.saga_id, oc.call_id, oc.step_index, oc.at_ms);
    kinds.emplace_back(Kind::kOpenCall, 0);
  }

  for (size_t k = 0; k < batch.checks_done.size(); ++k) {
    p.Add(kDeleteCheck, batch.saga_id, batch.checks_done[k]);
    kinds.emplace_back(Kind::kCheck, k);
  }
  for (size_t k = 0; k < batch.checks.size(); ++k) {
    const StepCheck& c = batch.checks[k];
    p.Add(kUpsertCheck, batch.saga_id, c.step_id, static_cast<int64_t>(c.next_check_ms),
          static_cast<int64_t>(c.deadline_ms), c.checks, static_cast<int64_t>(c.since_ms));
    kinds.emplace_back(Kind::kCheck, k);
  }
}

// Throws if one of the group's savepoint statements (got[0..first)) failed:
// the connection's or a serialization error as such, else GroupBroken.
void ThrowIfPrefixFailed(WriteTx& tx, const Pipe& p, const std::vector<Reply>& got, size_t first) {
  for (size_t k = 0; k < first; ++k) {
    if (got[k].ok()) continue;
    if (PQstatus(tx.raw()) != CONNECTION_OK) ThrowBroken(tx.raw(), p.Sql(k));
    if (got[k].sqlstate().rfind("40", 0) == 0) got[k].Throw(tx.raw(), p.Sql(k));
    throw GroupBroken(std::string(p.Sql(k)) + " failed: " + OneLine(got[k].message()));
  }
}

// The status of a batch's rows from their replies (got[from..]), `kinds`
// naming them: true, or the first error (the statements after it were
// skipped).
Result<bool> RowsOutcome(WriteTx& tx, const Pipe& p, const std::vector<Reply>& got, size_t from,
                         const Kinds& kinds, const WriteBatch& batch) {
  for (size_t k = from; k < got.size(); ++k) {
    const Reply& r = got[k];
    if (r.ok()) continue;
    const auto [kind, at] = kinds[k - from];
    if (r.sqlstate() == "23505") {
      if (kind == Kind::kSaga) {
        return Status::Conflict("saga id " + Quote(batch.saga_id) + " is already in use (" +
                                OneLine(r.message()) + ")");
      }
      if (kind == Kind::kPlannedStep) {
        const NewStep& s = batch.create->steps[at];
        return Status::Conflict("step key " + Quote(s.step_key) + " of step " + Quote(s.step_id) +
                                " is already in use (" + OneLine(r.message()) + ")");
      }
      if (kind == Kind::kStep) {
        const StepRecord& s = batch.steps[at];
        return Status::Conflict("step key " + Quote(s.step_key) + " of step " + Quote(s.step_id) +
                                " is used by another step (" + OneLine(r.message()) + ")");
      }
      if (kind == Kind::kToken) {
        return Status::Conflict("commit token already used; nothing of the batch was written");
      }
      if (kind == Kind::kOpenCall) {
        return Status::Conflict("call id " + Quote(batch.open_call->call_id) +
                                " is already a step of saga " + Quote(batch.saga_id) +
                                "; nothing of the batch was written");
      }
      if (kind == Kind::kEffect) {
        return Status::Conflict("effect idempotency key " +
                                Quote(batch.effects[at].idempotency_key) +
                                " is already recorded; nothing of the batch was written");
      }
    }
    r.Throw(tx.raw(), p.Sql(k));
  }
  return true;
}

// Where a batch's statements stand in a pipe, and what to read from them.
struct BatchPlan {
  size_t head = 0;                // the fenced or locking statement (a create: the intent's)
  bool create = false;            // the head inserts the intent: no row back, submitted before
  bool locked_by_select = false;  // the head is kLockSaga: its epoch is checked here
  Kinds kinds;                    // the statements after the head
};

// Queues a batch that creates its saga (WriteBatch::create): the intent first
// (its RETURNING gives the txid; no row back means the key was submitted
// before), the saga's row as the batch leaves it (one insert: no second
// version of it in the same transaction), the planned steps the batch does
// not write, the create's journal, then the batch's rows. No fence to check:
// the row is new.
BatchPlan AddCreateBatch(Pipe& p, const WriteBatch& batch, int64_t updated_ms,
                         int64_t consumed_ms) {
  const NewSaga& saga = *batch.create;
  BatchPlan plan;
  plan.create = true;
  plan.head = p.Add(kInsertIntent, saga.intent_key, saga.fingerprint, saga.saga_id,
                    static_cast<int64_t>(saga.created_ms));
  const bool moved = batch.saga_state.has_value();
  // The pipe points at its string parameters until Run: no temporaries.
  static const std::string kNoReason;
  const bool leased = !saga.lease_owner.empty();
  p.Add(kInsertCreatedSaga, saga.saga_id, saga.intent_key, saga.fingerprint, saga.spec_name,
        saga.spec, saga.input, moved ? *batch.saga_state : saga.state,
        moved ? batch.saga_reason : kNoReason, static_cast<int64_t>(saga.created_ms),
        moved ? updated_ms : static_cast<int64_t>(saga.created_ms), saga.spec_version,
        saga.spec_sha256, saga.lease_owner,
        static_cast<int64_t>(leased && !batch.release_lease ? saga.lease_ms : 0),
        static_cast<int64_t>(leased ? 1 : 0));
  plan.kinds.emplace_back(Kind::kSaga, 0);
  for (size_t k = 0; k < saga.steps.size(); ++k) {
    const NewStep& step = saga.steps[k];
    const bool written = std::any_of(batch.steps.begin(), batch.steps.end(),
                                     [&](const StepRecord& st) { return st.index == step.index; });
    if (written) continue;
    p.Add(kInsertStep, saga.saga_id, step.index, step.step_id, step.tool, step.state, step.step_key,
          static_cast<int64_t>(saga.created_ms));
    plan.kinds.emplace_back(Kind::kPlannedStep, k);
  }
  for (const JournalEntry& e : saga.journal) {
    p.Add(kInsertJournal, saga.saga_id, e.step_id, e.event, e.data, static_cast<int64_t>(e.at_ms));
    plan.kinds.emplace_back(Kind::kJournal, 0);
  }
  AddBatchRows(p, batch, 0, consumed_ms, &plan.kinds);
  return plan;
}

// Queues one batch: its head, then its rows. The saga's row lock serialises
// commits to one saga, as SQLite's write lock does: its journal seq order is
// its commit order. It also pins the lease epoch until COMMIT: a claim
// (which bumps it) waits for us or skips the row. The fenced UPDATE takes the
// same lock (and rechecks the epoch on the row's latest version after
// waiting for it). The head carries the saga's new state and first journal
// entry when the batch has a state; the first step carries the first journal
// entry otherwise.
BatchPlan AddBatch(Pipe& p, const WriteBatch& batch, int64_t updated_ms, int64_t consumed_ms) {
  if (batch.create) return AddCreateBatch(p, batch, updated_ms, consumed_ms);
  BatchPlan plan;
  size_t journal_done = 0;
  if (batch.saga_state.has_value()) {
    if (!batch.journal.empty()) {
      const JournalEntry& e = batch.journal[0];
      plan.head = p.Add(kUpdateSagaAndJournal, *batch.saga_state, batch.saga_reason, updated_ms,
                        batch.saga_id, batch.fence_epoch, e.step_id, e.event, e.data,
                        static_cast<int64_t>(e.at_ms), batch.release_lease);
      journal_done = 1;
    } else {
      plan.head = p.Add(kUpdateSaga, *batch.saga_state, batch.saga_reason, updated_ms,
                        batch.saga_id, batch.fence_epoch, batch.release_lease);
    }
  } else if (batch.release_lease) {
    // Fenced (Commit checked that there is an epoch) and released at once.
    plan.head = p.Add(kReleaseFenced, batch.saga_id, batch.fence_epoch);
  } else {
    plan.head = p.Add(kLockSaga, batch.saga_id);
    plan.locked_by_select = true;
  }
  AddBatchRows(p, batch, journal_done, consumed_ms, &plan.kinds);
  return plan;
}

// Whether the batch's head let it through: a row back and, for a SELECT ...
// FOR UPDATE, the epoch it is fenced on. *epoch: the saga's epoch when the
// head read it (-1: not read). The head's own error is thrown.
bool HeadPassed(WriteTx& tx, const Pipe& p, const std::vector<Reply>& got, const BatchPlan& plan,
                const WriteBatch& batch, int64_t* epoch) {
  const Reply& head = got[plan.head];
  if (!head.ok()) head.Throw(tx.raw(), p.Sql(plan.head));
  *epoch = -1;
  if (head.rows() == 0) return false;
  if (plan.locked_by_select) {
    *epoch = head.i64(0, 0);
    return batch.fence_epoch == 0 || *epoch == batch.fence_epoch;
  }
  return true;
}

// The txid_current() the head returned (it passed).
int64_t HeadTxid(const std::vector<Reply>& got, const BatchPlan& plan) {
  return got[plan.head].i64(0, plan.locked_by_select ? 1 : 0);
}

// Writes one batch inside `tx` and sets *txid to txid_current(). A non-OK
// result means the caller must roll the batch back (some of it may have been
// written), unless *undone says that it was.
//
// One round trip: every statement of the batch goes out in one pipeline (after
// `prefix`: the group's savepoint statements). If the fence, the saga's row
// or (for a create) the intent refused the batch, the rest ran for nothing:
// the batch is undone (`undo`: ROLLBACK, or back to the group's savepoint)
// and, for a fence, the saga's epoch read for the status.
Result<bool> ApplyBatch(WriteTx& tx, const WriteBatch& batch, int64_t updated_ms,
                        int64_t consumed_ms, int64_t* txid, const std::vector<const char*>& prefix,
                        const std::vector<const char*>& undo, bool* undone,
                        ControlReadback* control = nullptr) {
  *undone = false;
  Pipe p(tx);
  for (const char* sql : prefix) p.AddSql(sql);
  const size_t first = prefix.size();
  BatchPlan plan = AddBatch(p, batch, updated_ms, consumed_ms);
  if (control != nullptr) p.Add(kPipedControl, batch.saga_id);
  std::vector<Reply> got = p.Run();
  Reply control_reply;  // the last reply, taken out of the batch's
  if (control != nullptr) {
    control_reply = std::move(got.back());
    got.pop_back();
  }
  ThrowIfPrefixFailed(tx, p, got, first);
  int64_t epoch = -1;
  if (!HeadPassed(tx, p, got, plan, batch, &epoch)) {
    // The rest ran for nothing: undone, then why is looked up.
    Pipe u(tx);
    for (const char* sql : undo) u.AddSql(sql);
    const bool look = !plan.create && epoch < 0;
    const size_t at = look ? u.Add(kSagaEpoch, batch.saga_id) : 0;
    std::vector<Reply> why = u.Run();
    *undone = true;
    ThrowFirstError(u, tx.raw(), why);
    if (plan.create) {
      return Status::Conflict("intent key " + Quote(batch.create->intent_key) +
                              " was submitted before; nothing of the batch was written");
    }
    if (look) {
      if (why[at].rows() == 0) return SagaNotFound(batch.saga_id);
      epoch = why[at].i64(0, 0);
    }
    return Status::Aborted("lease lost: saga " + Quote(batch.saga_id) + " is at lease epoch " +
                           std::to_string(epoch) + ", the batch is fenced on epoch " +
                           std::to_string(batch.fence_epoch) +
                           "; nothing of the batch was written");
  }
  *txid = HeadTxid(got, plan);
  // The first error of the rest is the batch's (the statements after it were
  // skipped).
  Result<bool> rows = RowsOutcome(tx, p, got, plan.head + 1, plan.kinds, batch);
  if (rows.ok() && control != nullptr) ReadBack(batch.saga_id, control_reply, control);
  return rows;
}

// Writes a whole group in one round trip, without savepoints, betting that
// every batch goes through (the usual case: a fence lost, a key taken or a
// row refused is rare). True and *txid set: every batch is written (COMMIT
// is the caller's). False: some batch was refused or failed, and the
// transaction is rolled back: the caller writes the group again batch by
// batch, each in its savepoint, which tells each batch its own status.
// Contention and a lost connection are thrown, as everywhere.
bool ApplyGroupInOnePipeline(WriteTx& tx, const std::vector<const WriteBatch*>& batches,
                             const std::vector<std::pair<int64_t, int64_t>>& times,
                             const std::vector<ControlReadback*>& controls, int64_t* txid) {
  Pipe p(tx);
  std::vector<BatchPlan> plans;
  plans.reserve(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    plans.push_back(AddBatch(p, *batches[i], times[i].first, times[i].second));
  }
  // The control reads last, after every write of the group.
  std::vector<std::pair<size_t, size_t>> reads;  // (batch, reply)
  for (size_t i = 0; i < batches.size(); ++i) {
    if (controls[i] != nullptr) reads.emplace_back(i, p.Add(kPipedControl, batches[i]->saga_id));
  }
  std::vector<Reply> got = p.Run();
  bool clean = true;
  for (const Reply& r : got) {
    if (r.ok()) continue;
    // Contention or a lost connection fails the group as a whole (Run runs
    // it again or resolves it); any other error is one batch's.
    if (PQstatus(tx.raw()) != CONNECTION_OK) ThrowBroken(tx.raw(), "group pipeline");
    if (r.sqlstate().rfind("40", 0) == 0) r.Throw(tx.raw(), "group pipeline");
    clean = false;
  }
  for (size_t i = 0; clean && i < batches.size(); ++i) {
    int64_t epoch = -1;
    clean = HeadPassed(tx, p, got, plans[i], *batches[i], &epoch);
  }
  if (clean) {
    *txid = HeadTxid(got, plans.front());
    for (const auto& [i, at] : reads) ReadBack(batches[i]->saga_id, got[at], controls[i]);
    return true;
  }
  if (!RollbackRaw(tx.raw())) ThrowBroken(tx.raw(), "ROLLBACK");
  tx.MarkEnded();
  return false;
}

}  // namespace

/// One Commit call waiting in (or led through) group_commit_.
struct PgStore::PendingCommit {
  const WriteBatch* batch = nullptr;
  ControlReadback* control = nullptr;  // CommitReadingControl's; else nullptr
  int64_t updated_ms = 0;
  int64_t consumed_ms = 0;
  Status status;
};

Status PgStore::Commit(const WriteBatch& batch) { return CommitReadingControl(batch, nullptr); }

// `out` nullptr: Commit's call, nothing to read.
Status PgStore::CommitReadingControl(const WriteBatch& batch, ControlReadback* out) {
  if (out != nullptr) {
    out->read = false;
    out->pending.reset();
  }
  IDEM_RETURN_IF_ERROR(ValidateWriteBatch(batch));
  if (batch.create) IDEM_RETURN_IF_ERROR(CheckNewSagaTexts(*batch.create));
  IDEM_RETURN_IF_ERROR(CheckText(batch.saga_id, "Commit: saga_id"));
  if (batch.saga_state) IDEM_RETURN_IF_ERROR(CheckText(*batch.saga_state, "Commit: saga_state"));
  IDEM_RETURN_IF_ERROR(CheckText(batch.saga_reason, "Commit: saga_reason"));
  IDEM_RETURN_IF_ERROR(CheckText(batch.consume_token, "Commit: consume_token"));
  for (const StepCheck& c : batch.checks)
    IDEM_RETURN_IF_ERROR(CheckText(c.step_id, "Commit: checks"));
  for (const std::string& id : batch.checks_done) {
    IDEM_RETURN_IF_ERROR(CheckText(id, "Commit: checks_done"));
  }
  IDEM_RETURN_IF_ERROR(CheckText(batch.consume_token_step, "Commit: consume_token_step"));
  for (size_t i = 0; i < batch.steps.size(); ++i) {
    const StepRecord& s = batch.steps[i];
    IDEM_RETURN_IF_ERROR(CheckTexts("Commit: steps[" + std::to_string(i) + "].",
                                    {{&s.step_id, "step_id"},
                                     {&s.tool, "tool"},
                                     {&s.state, "state"},
                                     {&s.step_key, "step_key"},
                                     {&s.args_fingerprint, "args_fingerprint"},
                                     {&s.external_ref, "external_ref"},
                                     {&s.error, "error"}}));
  }
  for (size_t i = 0; i < batch.journal.size(); ++i) {
    const std::string at = "Commit: journal[" + std::to_string(i) + "].";
    IDEM_RETURN_IF_ERROR(CheckText(batch.journal[i].step_id, at + "step_id"));
    IDEM_RETURN_IF_ERROR(CheckText(batch.journal[i].event, at + "event"));
  }
  for (size_t i = 0; i < batch.effects.size(); ++i) {
    const EffectRecord& f = batch.effects[i];
    IDEM_RETURN_IF_ERROR(CheckTexts("Commit: effects[" + std::to_string(i) + "].",
                                    {{&f.step_id, "step_id"},
                                     {&f.kind, "kind"},
                                     {&f.tool, "tool"},
                                     {&f.idempotency_key, "idempotency_key"},
                                     {&f.external_ref, "external_ref"}}));
  }

  PendingCommit me;
  me.batch = &batch;
  me.control = out;
  for (const JournalEntry& e : batch.journal) me.updated_ms = std::max(me.updated_ms, e.at_ms);
  if (batch.saga_state.has_value() && me.updated_ms <= 0) me.updated_ms = clock_->NowMs();
  me.consumed_ms = batch.consume_token.empty() ? 0 : clock_->NowMs();
  group_commit_.Submit(&me);
  if (!me.status.ok() && out != nullptr) *out = ControlReadback();  // read only with a commit
  return me.status;
}

void PgStore::CommitGroup(std::vector<PendingCommit*> group) {
  Pool::Counters& counters = pool_->counters;
  counters.commit_batches.fetch_add(static_cast<int64_t>(group.size()));
  RaiseToAtLeast(counters.largest_group, static_cast<int64_t>(group.size()));

  if (group.size() == 1) {
    // The plain transaction: no savepoint needed.
    PendingCommit& p = *group[0];
    const std::string op = "Commit to saga " + Quote(p.batch->saga_id);
    static const std::vector<const char*> kNoPrefix;
    static const std::vector<const char*> kRollback = {"ROLLBACK"};
    Result<bool> done =
        Run<bool>(op, Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
          counters.commit_transactions.fetch_add(1);
          bool undone = false;
          if (p.control != nullptr) *p.control = ControlReadback();  // a run again reads again
          Result<bool> r = ApplyBatch(tx, *p.batch, p.updated_ms, p.consumed_ms, &note->txid,
                                      kNoPrefix, kRollback, &undone, p.control);
          if (undone) tx.MarkEnded();
          return r;
        });
    p.status = done.status();
    return;
  }

  // Row locks in saga id order, so that two groups (of two stores) never wait
  // for each other in a cycle. Stable: one saga's batches keep their order.
  std::stable_sort(group.begin(), group.end(), [](const PendingCommit* a, const PendingCommit* b) {
    return a->batch->saga_id < b->batch->saga_id;
  });
  const std::string op = "Commit of " + std::to_string(group.size()) + " batches (group commit)";
  // Each batch inside its own savepoint, by hand (libpqxx 6.4's
  // subtransaction does not roll back to its savepoint after a statement in
  // it failed). What ends a batch's savepoint goes out with the next batch.
  static const char* const kSavepoint = "SAVEPOINT idem_batch";
  static const char* const kRelease = "RELEASE SAVEPOINT idem_batch";
  static const char* const kRollbackTo = "ROLLBACK TO SAVEPOINT idem_batch";
  static const std::vector<const char*> kUndo = {kRollbackTo, kRelease};
  Result<std::vector<Status>> done = Run<std::vector<Status>>(
      op, Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<std::vector<Status>> {
        counters.commit_transactions.fetch_add(1);
        std::vector<Status> statuses;
        statuses.reserve(group.size());
        {
          // The usual case first: every batch goes through, in one round trip.
          std::vector<const WriteBatch*> batches;
          std::vector<std::pair<int64_t, int64_t>> times;
          std::vector<ControlReadback*> controls;
          for (PendingCommit* p : group) {
            batches.push_back(p->batch);
            times.emplace_back(p->updated_ms, p->consumed_ms);
            // A run again reads again; the fallback below reads nothing.
            if (p->control != nullptr) *p->control = ControlReadback();
            controls.push_back(p->control);
          }
          if (ApplyGroupInOnePipeline(tx, batches, times, controls, &note->txid)) {
            statuses.assign(group.size(), Status::Ok());
            return statuses;
          }
          counters.group_fallbacks.fetch_add(1);
          note->txid = 0;
        }
        std::vector<const char*> pending;  // ends the previous batch's savepoint
        for (PendingCommit* p : group) {
          std::vector<const char*> prefix = pending;
          prefix.push_back(kSavepoint);
          Status s;
          bool undone = false;
          try {
            // Rolling back to the savepoint keeps the transaction's id.
            int64_t txid = 0;
            s = ApplyBatch(tx, *p->batch, p->updated_ms, p->consumed_ms, &txid, prefix, kUndo,
                           &undone)
                    .status();
            if (txid != 0) note->txid = txid;
          } catch (const GroupBroken&) {
            throw;
          } catch (const std::exception& e) {
            // A lost connection or contention fails the whole transaction:
            // Run runs the group again or resolves it.
            if (PQstatus(tx.raw()) != CONNECTION_OK || IsConnectionError(e) ||
                dynamic_cast<const pqxx::transaction_rollback*>(&e) != nullptr) {
              throw;
            }
            s = Translate("Commit to saga " + Quote(p->batch->saga_id), e);
          }
          // Not OK: this batch's writes, and only they, are undone.
          if (undone) {
            pending.clear();
          } else if (s.ok()) {
            pending = {kRelease};
          } else {
            pending = kUndo;
          }
          statuses.push_back(std::move(s));
        }
        if (pending.size() > 1) {  // the last batch failed: undo it before COMMIT
          Pipe last(tx);
          for (const char* sql : pending) last.AddSql(sql);
          std::vector<Reply> got = last.Run();
          ThrowFirstError(last, tx.raw(), got);
        }
        return statuses;
      });
  if (!done.ok()) {
    // The group's transaction failed or its outcome is unknown: the same for
    // every batch in it.
    for (PendingCommit* p : group) {
      p->status = Status(done.status().code(),
                         "saga " + Quote(p->batch->saga_id) + ": " + done.status().message());
    }
    return;
  }
  for (size_t i = 0; i < group.size(); ++i) group[i]->status = std::move((*done)[i]);
}

// ---- Leases -----------------------------------------------------------------

Result<std::vector<Lease>> PgStore::ClaimSagas(const std::vector<std::string>& states,
                                               const std::string& owner, int64_t lease_ms,
                                               int limit) {
  if (states.empty()) return Status::InvalidArgument("ClaimSagas: no states given");
  if (owner.empty()) return Status::InvalidArgument("ClaimSagas: owner is empty");
  IDEM_RETURN_IF_ERROR(CheckText(owner, "ClaimSagas: owner"));
  if (lease_ms <= 0) {
    return Status::InvalidArgument("ClaimSagas: lease_ms must be positive, got " +
                                   std::to_string(lease_ms));
  }
  if (limit <= 0) {
    return Status::InvalidArgument("ClaimSagas: limit must be positive, got " +
                                   std::to_string(limit));
  }
  // A state with a NUL byte cannot be stored, so it matches nothing.
  std::vector<std::string> wanted;
  for (const std::string& st : states) {
    if (!HasNul(st)) wanted.push_back(st);
  }
  if (wanted.empty()) return std::vector<Lease>{};

  // Only placeholders are appended, one per state; the values are bound.
  // SKIP LOCKED: a row another claimer (or a commit) holds is left to it.
  std::string in;
  int n = 0;
  for (size_t i = 0; i < wanted.size(); ++i) in += (i == 0 ? "$" : ", $") + std::to_string(++n);
  const std::string owner_p = "$" + std::to_string(n + 1);
  const std::string lease_p = "$" + std::to_string(n + 2);
  const std::string limit_p = "$" + std::to_string(n + 3);
  const std::string sql =
      "UPDATE sagas SET lease_owner = " + owner_p + ", lease_expires_ms = " IDEM_PG_NOW_MS " + " +
      lease_p +
      ", lease_epoch = lease_epoch + 1 WHERE saga_id IN ("
      "SELECT saga_id FROM sagas WHERE state IN (" +
      in +
      ") AND lease_expires_ms < " IDEM_PG_NOW_MS
      " ORDER BY updated_ms, saga_id COLLATE \"C\""
      " LIMIT " +
      limit_p +
      " FOR UPDATE SKIP LOCKED)"
      " RETURNING saga_id, lease_owner, lease_epoch, lease_expires_ms, updated_ms,"
      " txid_current()";

  struct Claimed {
    Lease lease;
    int64_t updated_ms = 0;
  };
  std::vector<const char*> values;
  values.reserve(wanted.size() + 3);
  for (const std::string& st : wanted) values.push_back(st.c_str());
  const std::string lease_text = std::to_string(lease_ms);
  const std::string limit_text = std::to_string(limit);
  values.push_back(owner.c_str());
  values.push_back(lease_text.c_str());
  values.push_back(limit_text.c_str());
  Result<std::vector<Claimed>> claimed =
      Run<std::vector<Claimed>>("ClaimSagas for " + Quote(owner), Access::kWrite,
                                [&](WriteTx& tx, WriteNote* note) -> Result<std::vector<Claimed>> {
                                  Pipe p(tx);
                                  p.AddSql(sql.c_str(), values);
                                  std::vector<Reply> got = p.Run();
                                  ThrowFirstError(p, tx.raw(), got);
                                  std::vector<Claimed> out;
                                  for (int i = 0; i < got[0].rows(); ++i) {
                                    Claimed c;
                                    c.lease.saga_id = got[0].text(i, 0);
                                    c.lease.owner = got[0].text(i, 1);
                                    c.lease.epoch = got[0].i64(i, 2);
                                    c.lease.expires_ms = got[0].i64(i, 3);
                                    c.updated_ms = got[0].i64(i, 4);
                                    note->txid = got[0].i64(i, 5);
                                    out.push_back(std::move(c));
                                  }
                                  // Nothing claimed: nothing written, no transaction id to take.
                                  if (out.empty()) note->nothing_written = true;
                                  return out;
                                });
  if (!claimed.ok()) return claimed.status();
  // RETURNING has no order: oldest first, ties by the bytes of the id.
  std::sort(claimed->begin(), claimed->end(), [](const Claimed& a, const Claimed& b) {
    return a.updated_ms != b.updated_ms ? a.updated_ms < b.updated_ms
                                        : a.lease.saga_id < b.lease.saga_id;
  });
  std::vector<Lease> out;
  out.reserve(claimed->size());
  for (Claimed& c : *claimed) out.push_back(std::move(c.lease));
  return out;
}

namespace {

// ClaimSaga's and ClaimAndLoad's arguments.
Status CheckClaim(const std::string& owner, int64_t lease_ms) {
  if (owner.empty()) return Status::InvalidArgument("ClaimSaga: owner is empty");
  IDEM_RETURN_IF_ERROR(CheckText(owner, "ClaimSaga: owner"));
  if (lease_ms <= 0) {
    return Status::InvalidArgument("ClaimSaga: lease_ms must be positive, got " +
                                   std::to_string(lease_ms));
  }
  return Status::Ok();
}

// A claim of `saga_id` that took nothing, from kLeaseHolder's reply: no such
// saga, or who holds it until when.
Status ClaimRefused(const std::string& saga_id, const Reply& held) {
  if (held.rows() == 0) return SagaNotFound(saga_id);
  return Status::Aborted("saga " + Quote(saga_id) + " is leased to " + Quote(held.text(0, 0)) +
                         " until " + std::to_string(held.i64(0, 1)));
}

}  // namespace

Result<Lease> PgStore::ClaimSaga(const std::string& saga_id, const std::string& owner,
                                 int64_t lease_ms) {
  IDEM_RETURN_IF_ERROR(CheckClaim(owner, lease_ms));
  if (HasNul(saga_id)) return SagaNotFound(saga_id);
  return Run<Lease>("ClaimSaga " + Quote(saga_id) + " for " + Quote(owner), Access::kWrite,
                    [&](WriteTx& tx, WriteNote* note) -> Result<Lease> {
                      // Waits for the row (unlike ClaimSagas): a commit in flight ends soon.
                      Pipe p(tx);
                      p.Add(kClaimSaga, saga_id, owner, lease_ms);
                      std::vector<Reply> got = p.Run();
                      ThrowFirstError(p, tx.raw(), got);
                      const Reply& r = got[0];
                      if (r.rows() == 0) {
                        Pipe q(tx);
                        q.Add(kLeaseHolder, saga_id);
                        std::vector<Reply> held = q.Run();
                        ThrowFirstError(q, tx.raw(), held);
                        return ClaimRefused(saga_id, held[0]);
                      }
                      Lease l;
                      l.saga_id = saga_id;
                      l.owner = r.text(0, 0);
                      l.epoch = r.i64(0, 1);
                      l.expires_ms = r.i64(0, 2);
                      note->txid = r.i64(0, 3);
                      return l;
                    });
}

Result<ClaimedSaga> PgStore::ClaimAndLoad(const std::string& saga_id, const std::string& owner,
                                          int64_t lease_ms) {
  IDEM_RETURN_IF_ERROR(CheckClaim(owner, lease_ms));
  if (HasNul(saga_id)) return SagaNotFound(saga_id);
  return Run<ClaimedSaga>("ClaimSaga " + Quote(saga_id) + " for " + Quote(owner), Access::kWrite,
                          [&](WriteTx& tx) -> Result<ClaimedSaga> {
                            // Not a transaction of Run's (no BEGIN, no COMMIT, nothing to
                            // resolve): the Sync ends it, and a lost answer is claimed again.
                            Pipe p(tx, Pipe::Mode::kImplicit);
                            p.Add(kClaimSaga, saga_id, owner, lease_ms);
                            p.Add(kClaimedSaga, saga_id);
                            p.Add(kPipedControl, saga_id);
                            std::vector<Reply> got = p.Run();
                            ThrowFirstError(p, tx.raw(), got);
                            const Reply& claim = got[0];
                            const Reply& saga = got[1];
                            const Reply& control = got[2];
                            if (saga.rows() == 0) return SagaNotFound(saga_id);
                            if (claim.rows() == 0) {
                              // Held by another owner: who, read anew (a second round trip).
                              Pipe q(tx, Pipe::Mode::kImplicit);
                              q.Add(kLeaseHolder, saga_id);
                              std::vector<Reply> held = q.Run();
                              ThrowFirstError(q, tx.raw(), held);
                              return ClaimRefused(saga_id, held[0]);
                            }
                            ClaimedSaga out;
                            out.lease.saga_id = saga_id;
                            out.lease.owner = claim.text(0, 0);
                            out.lease.epoch = claim.i64(0, 1);
                            out.lease.expires_ms = claim.i64(0, 2);
                            try {
                              out.record = ReadSagaWithSteps(saga, saga_id);
                            } catch (const DataError&) {
                              // The claim is committed: given back (best
                              // effort), as a drive that cannot read its
                              // saga does.
                              Pipe r(tx, Pipe::Mode::kImplicit);
                              r.Add(kReleaseLease, saga_id, out.lease.owner, out.lease.epoch);
                              (void)r.Run();
                              throw;
                            }
                            out.control_read = true;
                            if (control.rows() > 0) {
                              out.control = ReadControl(control.text(0, 0), control.text(0, 1),
                                                        control.text(0, 2), control.text(0, 3),
                                                        control.text(0, 4), control.i64(0, 5));
                            }
                            return out;
                          });
}

Status PgStore::UpdateLease(const char* what, const Lease& lease, int64_t lease_ms, bool release) {
  if (!release && lease_ms <= 0) {
    return Status::InvalidArgument(std::string(what) + ": lease_ms must be positive, got " +
                                   std::to_string(lease_ms));
  }
  if (HasNul(lease.saga_id)) return SagaNotFound(lease.saga_id);
  IDEM_RETURN_IF_ERROR(CheckText(lease.owner, std::string(what) + ": owner"));
  const std::string op = std::string(what) + " of saga " + Quote(lease.saga_id);
  Result<bool> done =
      Run<bool>(op, Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
        Pipe p(tx);
        if (release) {
          p.Add(kReleaseLease, lease.saga_id, lease.owner, lease.epoch);
        } else {
          p.Add(kRenewLease, lease.saga_id, lease.owner, lease.epoch, lease_ms);
        }
        std::vector<Reply> got = p.Run();
        ThrowFirstError(p, tx.raw(), got);
        if (got[0].rows() == 0) {
          Pipe q(tx);
          q.Add(kSagaExists, lease.saga_id);
          std::vector<Reply> exists = q.Run();
          ThrowFirstError(q, tx.raw(), exists);
          if (exists[0].rows() == 0) return SagaNotFound(lease.saga_id);
          return Status::Aborted("lease lost: saga " + Quote(lease.saga_id) +
                                 " is no longer leased to " + Quote(lease.owner) + " at epoch " +
                                 std::to_string(lease.epoch));
        }
        note->txid = got[0].i64(0, 0);
        return true;
      });
  return done.status();
}

Status PgStore::RenewLease(const Lease& lease, int64_t lease_ms) {
  return UpdateLease("RenewLease", lease, lease_ms, /*release=*/false);
}

Status PgStore::ReleaseLease(const Lease& lease) {
  return UpdateLease("ReleaseLease", lease, 0, /*release=*/true);
}

// ---- Reads ------------------------------------------------------------------
//
// Each read is one statement on its own, so that a saga and its steps come
// from the same snapshot, in one round trip and without a transaction.

namespace {

// An effects row whose first seven columns are step_id, kind, tool,
// idempotency_key, result, external_ref and at_ms (kSelectEffects'
// order), of saga `saga_id`.
EffectRecord ReadEffect(const pqxx::row& r, std::string saga_id) {
  EffectRecord f;
  f.saga_id = std::move(saga_id);
  f.step_id = FieldText(r[0]);
  f.kind = FieldText(r[1]);
  f.tool = FieldText(r[2]);
  f.idempotency_key = FieldText(r[3]);
  f.result = FieldJson(r[4], "effects.result");
  f.external_ref = FieldText(r[5]);
  f.at_ms = r[6].as<int64_t>();
  return f;
}

}  // namespace

Result<SagaRecord> PgStore::LoadSaga(const std::string& saga_id) {
  if (HasNul(saga_id)) return SagaNotFound(saga_id);  // cannot be stored
  return Run<SagaRecord>("LoadSaga " + Quote(saga_id), Access::kOneStatement,
                         [&](pqxx::transaction_base& tx) -> Result<SagaRecord> {
                           pqxx::result q = tx.exec_prepared(kSelectSagaWithSteps.name, saga_id);
                           if (q.empty()) return SagaNotFound(saga_id);
                           return ReadSagaWithSteps(PqxxRows(q), saga_id);
                         });
}

Result<std::vector<SagaSummary>> PgStore::ListSagas(const SagaFilter& filter) {
  IDEM_RETURN_IF_ERROR(ValidateSagaFilter(filter));
  // A state with a NUL byte cannot be stored, so it matches nothing.
  std::vector<std::string> states;
  for (const std::string& s : filter.states) {
    if (!HasNul(s)) states.push_back(s);
  }
  if (!filter.states.empty() && states.empty()) return std::vector<SagaSummary>{};
  // Nor can an owner, a spec name or a key with one.
  if ((filter.owner && HasNul(*filter.owner)) || HasNul(filter.spec_name) ||
      HasNul(filter.key_contains)) {
    return std::vector<SagaSummary>{};
  }

  // Only placeholders are appended; the values are bound, all as text (the
  // time bounds cast in SQL). The owner's expression is sagas_by_owner's
  // (migration 14), so that index serves it; an unfiltered listing walks
  // sagas_by_created.
  std::string sql =
      "SELECT saga_id, intent_key, spec_name, state, reason, created_ms, updated_ms,"
      " spec_version, spec_sha256 FROM sagas";
  std::vector<std::string> params;
  const char* glue = " WHERE ";
  auto where = [&](const std::string& cond) {
    sql += glue + cond;
    glue = " AND ";
  };
  auto param = [&](std::string value) {
    params.push_back(std::move(value));
    return "$" + std::to_string(params.size());
  };
  if (!states.empty()) {
    std::string in = "state IN (";
    for (size_t i = 0; i < states.size(); ++i) in += (i == 0 ? "" : ", ") + param(states[i]);
    where(in + ")");
  }
  if (filter.owner) {
    where(
        "(CASE WHEN strpos(intent_key, ':') = 0 THEN ''"
        " ELSE substr(intent_key, 1, strpos(intent_key, ':') - 1) END) COLLATE \"C\" = " +
        param(*filter.owner));
  }
  if (!filter.spec_name.empty()) where("spec_name = " + param(filter.spec_name));
  if (!filter.key_contains.empty()) {
    where("strpos(substr(intent_key, strpos(intent_key, ':') + 1), " + param(filter.key_contains) +
          ") > 0");
  }
  if (filter.created_from_ms > 0) {
    where("created_ms >= " + param(std::to_string(filter.created_from_ms)) + "::bigint");
  }
  if (filter.created_to_ms > 0) {
    where("created_ms <= " + param(std::to_string(filter.created_to_ms)) + "::bigint");
  }
  // COLLATE "C": ties broken by the bytes of the id, as in SQLite.
  sql += " ORDER BY created_ms DESC, saga_id COLLATE \"C\" ASC LIMIT " +
         param(std::to_string(filter.limit)) + "::bigint OFFSET " +
         param(std::to_string(filter.offset)) + "::bigint";

  return Run<std::vector<SagaSummary>>(
      "ListSagas", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<SagaSummary>> {
        std::vector<SagaSummary> out;
        for (const pqxx::row& r : tx.exec_params(sql, pqxx::prepare::make_dynamic_params(params))) {
          out.push_back(ReadSummary(r));
          ReadSpecRef(r, 7, &out.back());
        }
        return out;
      });
}

void PgStore::FoldStateMoves() {
  // The moves a reader saw are deleted and added to their states' counts in
  // one transaction; a move written meanwhile is left for the next fold. A
  // failed fold costs nothing but speed: the read sums what is left.
  static const char* const kFold =
      "WITH moved AS (DELETE FROM saga_state_moves RETURNING state, delta)"
      " INSERT INTO saga_state_counts (state, sagas) SELECT state, sum(delta) FROM moved"
      " GROUP BY state ON CONFLICT (state) DO UPDATE SET"
      " sagas = saga_state_counts.sagas + excluded.sagas RETURNING txid_current()";
  Result<bool> folded = Run<bool>("fold saga state moves", Access::kWrite,
                                  [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
                                    Pipe p(tx);
                                    p.AddSql(kFold);
                                    std::vector<Reply> got = p.Run();
                                    ThrowFirstError(p, tx.raw(), got);
                                    if (got[0].rows() == 0) {
                                      note->nothing_written = true;
                                    } else {
                                      note->txid = got[0].i64(0, 0);
                                    }
                                    return true;
                                  });
  (void)folded;  // not folded: the next read tries again
}

namespace {

// `values` as a PostgreSQL text[] literal: each element double-quoted, with
// its backslashes and double quotes escaped (none holds a NUL byte).
std::string TextArrayLiteral(const std::vector<std::string>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

}  // namespace

Result<StoreGauges> PgStore::ReadGauges(const GaugeQuery& query) {
  // A state with a NUL byte cannot be stored, so it matches nothing.
  const std::string waiting = HasNul(query.waiting_state) ? "" : query.waiting_state;
  std::vector<std::string> details;
  for (const std::string& st : query.detail_states) {
    if (!HasNul(st)) details.push_back(st);
  }
  const bool all = query.detail_states.empty();
  if (!all) FoldStateMoves();
    // One statement (one snapshot, autocommit): a row per state with the
    // details asked for, a row per other state with its count alone (the
    // counts of migration 15 and the moves not folded into them yet: a few
    // rows per state however many sagas have finished), then one row
    // (is_steps) with the waiting steps; the store's clock read once. The
    // detail states come as a text[] ($3), so that the planner estimates them
    // from the column's statistics and reads only their sagas through
    // sagas_by_state_lease (a set-returning function over a JSON array was
    // estimated at 100 rows, and the plan scanned every saga).
#define IDEM_PG_GAUGE_CLOCK "WITH clock AS (SELECT " IDEM_PG_NOW_MS " AS now_ms) "
#define IDEM_PG_GAUGE_DETAILS                                                              \
  "SELECT false AS is_steps, state, count(*)::bigint, min(updated_ms)::bigint,"            \
  " (count(*) FILTER (WHERE $1::bigint > 0 AND created_ms < (SELECT now_ms FROM clock) - " \
  "$1::bigint))::bigint,"                                                                  \
  " (count(*) FILTER (WHERE lease_expires_ms > 0"                                          \
  " AND lease_expires_ms < (SELECT now_ms FROM clock)))::bigint,"                          \
  " (SELECT now_ms FROM clock) FROM sagas"
#define IDEM_PG_GAUGE_STEPS                                                                \
  "SELECT true, '', (SELECT count(*) FROM sagas s JOIN steps t ON t.saga_id = s.saga_id"   \
  " WHERE $2::text <> '' AND s.state = $2::text AND t.state = $2::text)::bigint, 0, 0, 0," \
  " (SELECT now_ms FROM clock)"
  static const char* const kAllSql =
      IDEM_PG_GAUGE_CLOCK IDEM_PG_GAUGE_DETAILS " GROUP BY state UNION ALL " IDEM_PG_GAUGE_STEPS;
  static const char* const kSomeSql = IDEM_PG_GAUGE_CLOCK IDEM_PG_GAUGE_DETAILS
      " WHERE state = ANY ($3::text[]) GROUP BY state UNION ALL "
      "SELECT false, state, sum(n)::bigint, 0, 0, 0, (SELECT now_ms FROM clock) FROM"
      " (SELECT state, sagas AS n FROM saga_state_counts"
      " UNION ALL SELECT state, delta FROM saga_state_moves) counted"
      " WHERE state <> ALL ($3::text[]) GROUP BY state HAVING sum(n) > 0 "
      "UNION ALL " IDEM_PG_GAUGE_STEPS;
#undef IDEM_PG_GAUGE_CLOCK
#undef IDEM_PG_GAUGE_DETAILS
#undef IDEM_PG_GAUGE_STEPS
  const std::string detail_array = TextArrayLiteral(details);
  return Run<StoreGauges>(
      "ReadGauges", Access::kOneStatement, [&](pqxx::transaction_base& tx) -> Result<StoreGauges> {
        StoreGauges out;
        pqxx::result rows = all ? tx.exec_params(kAllSql, query.age_ms, waiting)
                                : tx.exec_params(kSomeSql, query.age_ms, waiting, detail_array);
        for (const pqxx::row& r : rows) {
          out.now_ms = r[6].as<int64_t>();
          if (r[0].as<bool>()) {
            out.waiting_steps = r[2].as<int64_t>();
            continue;
          }
          StateGauges& g = out.by_state[FieldText(r[1])];
          g.sagas = r[2].as<int64_t>();
          g.oldest_updated_ms = r[3].as<int64_t>();
          g.created_before = r[4].as<int64_t>();
          g.leases_expired = r[5].as<int64_t>();
        }
        return out;
      });
}

Result<std::vector<JournalEntry>> PgStore::ReadJournal(const std::string& saga_id) {
  if (HasNul(saga_id)) return SagaNotFound(saga_id);
  return Run<std::vector<JournalEntry>>(
      "ReadJournal " + Quote(saga_id), Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<JournalEntry>> {
        pqxx::result q = tx.exec_prepared(kSelectJournal.name, saga_id);
        if (q.empty()) return SagaNotFound(saga_id);
        std::vector<JournalEntry> out;
        for (const pqxx::row& r : q) {
          if (r[0].is_null()) continue;  // a saga without entries
          JournalEntry e;
          e.seq = r[0].as<int64_t>();
          e.saga_id = saga_id;
          e.step_id = FieldText(r[1]);
          e.event = FieldText(r[2]);
          e.data = FieldJson(r[3], "journal.data");
          e.at_ms = r[4].as<int64_t>();
          out.push_back(std::move(e));
        }
        return out;
      });
}

Result<std::vector<EffectRecord>> PgStore::ListEffects(const std::string& saga_id) {
  if (HasNul(saga_id)) return SagaNotFound(saga_id);
  return Run<std::vector<EffectRecord>>(
      "ListEffects " + Quote(saga_id), Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<EffectRecord>> {
        pqxx::result q = tx.exec_prepared(kSelectEffects.name, saga_id);
        if (q.empty()) return SagaNotFound(saga_id);
        std::vector<EffectRecord> out;
        // Commits to one saga are serialised by its row lock, so seq order is
        // commit order.
        for (const pqxx::row& r : q) {
          if (r[7].is_null()) continue;  // a saga without effects
          out.push_back(ReadEffect(r, saga_id));
        }
        return out;
      });
}

// ---- Asynchronous completion and drift ----------------------------------------

Result<std::vector<StepCheck>> PgStore::ListStepChecks(const std::string& saga_id) {
  if (HasNul(saga_id)) return std::vector<StepCheck>();
  return Run<std::vector<StepCheck>>(
      "ListStepChecks " + Quote(saga_id), Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<StepCheck>> {
        std::vector<StepCheck> out;
        for (const pqxx::row& r :
             tx.exec_params("SELECT step_id, next_check_ms, deadline_ms, checks, since_ms"
                            " FROM step_checks WHERE saga_id = $1 ORDER BY step_id COLLATE \"C\"",
                            saga_id)) {
          StepCheck c;
          c.step_id = FieldText(r[0]);
          c.next_check_ms = r[1].as<int64_t>();
          c.deadline_ms = r[2].as<int64_t>();
          c.checks = r[3].as<int>();
          c.since_ms = r[4].as<int64_t>();
          out.push_back(std::move(c));
        }
        return out;
      });
}

Result<std::vector<DueCheck>> PgStore::ListDueChecks(const std::string& saga_state, int64_t now_ms,
                                                     int limit) {
  if (limit <= 0) {
    return Status::InvalidArgument("ListDueChecks: limit must be positive, got " +
                                   std::to_string(limit));
  }
  if (HasNul(saga_state)) return std::vector<DueCheck>();
  return Run<std::vector<DueCheck>>(
      "ListDueChecks", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<DueCheck>> {
        std::vector<DueCheck> out;
        for (const pqxx::row& r :
             tx.exec_params("SELECT c.saga_id, MIN(c.next_check_ms) AS due FROM step_checks c"
                            " JOIN sagas s ON s.saga_id = c.saga_id"
                            " WHERE c.next_check_ms <= $1 AND s.state = $2"
                            " GROUP BY c.saga_id ORDER BY due, c.saga_id COLLATE \"C\" LIMIT $3",
                            now_ms, saga_state, limit)) {
          out.push_back({FieldText(r[0]), r[1].as<int64_t>()});
        }
        return out;
      });
}

Result<std::vector<EffectRecord>> PgStore::ListEffectsSince(int64_t since_ms, int limit) {
  if (limit <= 0) {
    return Status::InvalidArgument("ListEffectsSince: limit must be positive, got " +
                                   std::to_string(limit));
  }
  return Run<std::vector<EffectRecord>>(
      "ListEffectsSince", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<EffectRecord>> {
        std::vector<EffectRecord> out;
        for (const pqxx::row& r : tx.exec_params(
                 "SELECT step_id, kind, tool, idempotency_key, result, external_ref, at_ms,"
                 " saga_id FROM effects WHERE kind = 'action' AND at_ms >= $1"
                 " ORDER BY at_ms, seq LIMIT $2",
                 since_ms, limit)) {
          out.push_back(ReadEffect(r, FieldText(r[7])));
        }
        return out;
      });
}

Result<bool> PgStore::RecordDrift(const DriftFinding& finding) {
  if (finding.kind != "effect_missing" && finding.kind != "orphan") {
    return Status::InvalidArgument("RecordDrift: kind " + Quote(finding.kind) +
                                   " is not effect_missing or orphan");
  }
  if (finding.tool.empty() || finding.key.empty()) {
    return Status::InvalidArgument("RecordDrift: a finding needs its tool and key");
  }
  IDEM_RETURN_IF_ERROR(CheckTexts("drift: ", {{&finding.tool, "tool"},
                                              {&finding.key, "key"},
                                              {&finding.saga_id, "saga_id"},
                                              {&finding.step_id, "step_id"},
                                              {&finding.detail, "detail"}}));
  const Json entry = {{"kind", finding.kind},
                      {"tool", finding.tool},
                      {"key", finding.key},
                      {"detail", finding.detail}};
  const std::string event = "drift";
  const int64_t at = finding.found_ms;
  return Run<bool>("record drift", Access::kWrite,
                   [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
                     Pipe p(tx);
                     p.Add(kInsertDrift, finding.kind, finding.tool, finding.key, finding.saga_id,
                           finding.step_id, finding.detail, at);
                     p.Add(kSagaExists, finding.saga_id);
                     std::vector<Reply> got = p.Run();
                     ThrowFirstError(p, tx.raw(), got);
                     if (got[0].rows() == 0) {
                       note->nothing_written = true;  // recorded before
                       return false;
                     }
                     note->txid = got[0].i64(0, 0);
                     if (got[1].rows() > 0) {
                       Pipe j(tx);
                       j.Add(kInsertJournal, finding.saga_id, finding.step_id, event, entry, at);
                       std::vector<Reply> wrote = j.Run();
                       ThrowFirstError(j, tx.raw(), wrote);
                     }
                     return true;
                   });
}

// ---- Server state -------------------------------------------------------------

namespace {

std::string HexEncode(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  throw DataError("idempotency.body: not hex");
}

std::string HexDecode(const std::string& hex) {
  if (hex.size() % 2 != 0) throw DataError("idempotency.body: odd hex length");
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    out.push_back(static_cast<char>(HexDigit(hex[i]) * 16 + HexDigit(hex[i + 1])));
  }
  return out;
}

// Columns fingerprint, state, status, content_type, hex body, created_ms.
KeyRecord ReadKey(const Reply& r) {
  KeyRecord k;
  k.fingerprint = r.text(0, 0);
  k.state = r.text(0, 1);
  k.status = static_cast<int>(r.i64(0, 2));
  k.content_type = r.text(0, 3);
  k.body = HexDecode(r.text(0, 4));
  k.created_ms = r.i64(0, 5);
  return k;
}

StoredSpec ReadSpec(const std::string& name, int version, const std::string& doc,
                    const std::string& fingerprint, int64_t created_ms,
                    const std::string& created_by) {
  StoredSpec v;
  v.name = name;
  v.version = version;
  Result<Json> parsed = ParseJson(doc, "server_specs.doc", 1 << 20);
  if (!parsed.ok()) throw DataError(parsed.status().message());
  v.doc = std::move(parsed).value();
  v.fingerprint = fingerprint;
  v.created_ms = created_ms;
  v.created_by = created_by;
  return v;
}

StoredSpec ReadSpec(const pqxx::row& r) {
  return ReadSpec(FieldText(r[0]), r[1].as<int>(), FieldText(r[2]), FieldText(r[3]),
                  r[4].as<int64_t>(), FieldText(r[5]));
}

}  // namespace

Result<KeyClaim> PgStore::ClaimKey(const std::string& scope, const std::string& key,
                                   const std::string& fingerprint, const KeyClaimPolicy& policy) {
  IDEM_RETURN_IF_ERROR(
      CheckTexts("claim idempotency key: ",
                 {{&scope, "scope"}, {&key, "key"}, {&fingerprint, "fingerprint"}}));
  return Run<KeyClaim>(
      "claim idempotency key", Access::kWrite,
      [&](WriteTx& tx, WriteNote* note) -> Result<KeyClaim> {
        KeyClaim claim;
        claim.token = NewId("clm_");
        // Change instead of check: the INSERT is the claim.
        Pipe p(tx);
        p.Add(kClaimKey, scope, key, fingerprint, policy.now_ms, claim.token);
        p.Add(kLockKey, scope, key);
        std::vector<Reply> got = p.Run();
        ThrowFirstError(p, tx.raw(), got);
        if (got[0].rows() == 1) {
          note->txid = got[0].i64(0, 0);
          claim.kind = KeyClaim::Kind::kClaimed;
          return claim;
        }
        if (got[1].rows() == 0) return Status::Internal("the conflicting idempotency row vanished");
        KeyRecord r = ReadKey(got[1]);
        const int64_t claimed_ms = got[1].i64(0, 6);
        const ExistingKey decided = DecideExistingKey(r, claimed_ms, fingerprint, policy);
        if (decided == ExistingKey::kRestart || decided == ExistingKey::kTakeOver) {
          Pipe u(tx);
          u.Add(kReclaimKey, scope, key, fingerprint, decided == ExistingKey::kRestart,
                policy.now_ms, claim.token);
          std::vector<Reply> up = u.Run();
          ThrowFirstError(u, tx.raw(), up);
          note->txid = up[0].i64(0, 0);
          claim.kind = KeyClaim::Kind::kClaimed;
          return claim;
        }
        note->nothing_written = true;
        return UnclaimedKey(decided, std::move(r));
      });
}

Status PgStore::CompleteKey(const std::string& scope, const std::string& key,
                            const std::string& token, int status, const std::string& content_type,
                            const std::string& body) {
  IDEM_RETURN_IF_ERROR(
      CheckTexts("store idempotent response: ",
                 {{&scope, "scope"}, {&key, "key"}, {&content_type, "content_type"}}));
  const std::string hex = HexEncode(body);
  Result<bool> done =
      Run<bool>("store idempotent response", Access::kWrite,
                [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
                  Pipe p(tx);
                  p.Add(kCompleteKey, scope, key, token, status, content_type, hex);
                  std::vector<Reply> got = p.Run();
                  ThrowFirstError(p, tx.raw(), got);
                  if (got[0].rows() != 1) {
                    return Status::Aborted(
                        "the claim on this key was taken over; the response is not stored");
                  }
                  note->txid = got[0].i64(0, 0);
                  return true;
                });
  return done.status();
}

Status PgStore::ReleaseKey(const std::string& scope, const std::string& key,
                           const std::string& token) {
  if (HasNul(scope) || HasNul(key) || HasNul(token)) return Status::Ok();  // cannot be stored
  Result<bool> done = Run<bool>("release idempotency key", Access::kWrite,
                                [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
                                  Pipe p(tx);
                                  p.Add(kReleaseKey, scope, key, token);
                                  std::vector<Reply> got = p.Run();
                                  ThrowFirstError(p, tx.raw(), got);
                                  if (got[0].rows() == 0) {
                                    note->nothing_written = true;
                                  } else {
                                    note->txid = got[0].i64(0, 0);
                                  }
                                  return true;
                                });
  return done.status();
}

Result<std::vector<size_t>> PgStore::RenewKeys(const std::vector<KeyLease>& claims,
                                               int64_t now_ms) {
  std::vector<size_t> lost;
  std::vector<size_t> sent;  // the claims that can be stored (no NUL): the rest are lost
  for (size_t i = 0; i < claims.size(); ++i) {
    const KeyLease& c = claims[i];
    if (HasNul(c.scope) || HasNul(c.key) || HasNul(c.token)) {
      lost.push_back(i);
    } else {
      sent.push_back(i);
    }
  }
  if (sent.empty()) return lost;
  Result<std::vector<size_t>> gone = Run<std::vector<size_t>>(
      "renew idempotency claims", Access::kWrite,
      [&](WriteTx& tx, WriteNote* note) -> Result<std::vector<size_t>> {
        Pipe p(tx);
        for (size_t i : sent)
          p.Add(kRenewKey, claims[i].scope, claims[i].key, claims[i].token, now_ms);
        std::vector<Reply> got = p.Run();
        ThrowFirstError(p, tx.raw(), got);
        std::vector<size_t> out;
        note->nothing_written = true;
        for (size_t j = 0; j < sent.size(); ++j) {
          if (got[j].rows() == 1) {
            note->nothing_written = false;
            note->txid = got[j].i64(0, 0);
          } else {
            out.push_back(sent[j]);
          }
        }
        return out;
      });
  if (!gone.ok()) return gone.status();
  lost.insert(lost.end(), gone->begin(), gone->end());
  std::sort(lost.begin(), lost.end());
  return lost;
}

Result<KeyRecord> PgStore::FindKey(const std::string& scope, const std::string& key) {
  if (HasNul(scope) || HasNul(key)) return Status::NotFound("no idempotency record for this key");
  return Run<KeyRecord>(
      "read idempotency record", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<KeyRecord> {
        pqxx::result q = tx.exec_params(
            "SELECT fingerprint, state, status, content_type, encode(body, 'hex'), created_ms"
            " FROM idempotency WHERE scope = $1 AND key = $2",
            scope, key);
        if (q.empty()) return Status::NotFound("no idempotency record for this key");
        KeyRecord k;
        k.fingerprint = FieldText(q[0][0]);
        k.state = FieldText(q[0][1]);
        k.status = q[0][2].as<int>();
        k.content_type = FieldText(q[0][3]);
        k.body = HexDecode(FieldText(q[0][4]));
        k.created_ms = q[0][5].as<int64_t>();
        return k;
      });
}

Result<int64_t> PgStore::PurgeKeys(int64_t created_at_or_before_ms) {
  return Run<int64_t>("purge idempotency records", Access::kWrite,
                      [&](WriteTx& tx, WriteNote* note) -> Result<int64_t> {
                        Pipe p(tx);
                        p.Add(kPurgeKeys, created_at_or_before_ms);
                        std::vector<Reply> got = p.Run();
                        ThrowFirstError(p, tx.raw(), got);
                        if (got[0].rows() == 0) {
                          note->nothing_written = true;
                        } else {
                          note->txid = got[0].i64(0, 0);
                        }
                        return static_cast<int64_t>(got[0].rows());
                      });
}

Result<SpecPutOutcome> PgStore::PutSpec(const StoredSpec& spec) {
  IDEM_RETURN_IF_ERROR(CheckTexts("spec registry: ", {{&spec.name, "spec name"},
                                                      {&spec.fingerprint, "fingerprint"},
                                                      {&spec.created_by, "created_by"}}));
  const std::string doc = CanonicalJson(spec.doc);
  return Run<SpecPutOutcome>(
      "spec registry", Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<SpecPutOutcome> {
        // The INSERT settles a race with a concurrent put of the version;
        // the SELECT after it (a fresh snapshot) sees the winner's row.
        Pipe p(tx);
        p.Add(kInsertSpec, spec.name, spec.version, doc, spec.fingerprint, spec.created_ms,
              spec.created_by);
        p.Add(kSelectSpec, spec.name, spec.version);
        std::vector<Reply> got = p.Run();
        ThrowFirstError(p, tx.raw(), got);
        if (got[0].rows() == 1) {
          note->txid = got[0].i64(0, 0);
          return SpecPutOutcome{spec, true};
        }
        note->nothing_written = true;
        if (got[1].rows() == 0) return Status::Internal("the conflicting spec row vanished");
        const Reply& r = got[1];
        return SettleExistingSpec(ReadSpec(r.text(0, 0), static_cast<int>(r.i64(0, 1)),
                                           r.text(0, 2), r.text(0, 3), r.i64(0, 4), r.text(0, 5)),
                                  spec);
      });
}

Result<StoredSpec> PgStore::GetSpec(const std::string& name, int version) {
  if (HasNul(name)) return SpecNotFound(name, version);
  return Run<StoredSpec>(
      "spec registry", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<StoredSpec> {
        pqxx::result q =
            version > 0
                ? tx.exec_params(IDEM_PG_SPEC_COLUMNS " WHERE name = $1 AND version = $2", name,
                                 version)
                : tx.exec_params(
                      IDEM_PG_SPEC_COLUMNS " WHERE name = $1 ORDER BY version DESC LIMIT 1", name);
        if (q.empty()) return SpecNotFound(name, version);
        return ReadSpec(q[0]);
      });
}

Result<std::vector<StoredSpec>> PgStore::ListSpecs() {
  return Run<std::vector<StoredSpec>>(
      "spec registry", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<StoredSpec>> {
        std::vector<StoredSpec> out;
        // COLLATE "C": by the bytes of the name, as in SQLite.
        for (const pqxx::row& r :
             tx.exec(IDEM_PG_SPEC_COLUMNS " ORDER BY name COLLATE \"C\", version")) {
          out.push_back(ReadSpec(r));
        }
        return out;
      });
}

// ---- Control requests (storage/control_store.h) ------------------------------

Result<ControlOutcome> PgStore::RequestControl(const ControlRequest& request) {
  IDEM_RETURN_IF_ERROR(CheckControlRequest(request));
  IDEM_RETURN_IF_ERROR(CheckTexts("control request: ", {{&request.saga_id, "saga_id"},
                                                        {&request.request_id, "request_id"},
                                                        {&request.by, "by"},
                                                        {&request.reason, "reason"}}));
  const Json entry = {
      {"by", request.by}, {"reason", request.reason}, {"request", request.request_id}};
  const std::string event = request.kind + "_requested";
  const std::string no_step;  // a saga-level entry (the pipe points at it)
  const int64_t at = request.requested_ms;
  return Run<ControlOutcome>(
      "record " + request.kind + " request", Access::kWrite,
      [&](WriteTx& tx, WriteNote* note) -> Result<ControlOutcome> {
        // Change instead of check: the INSERT is the request when none is
        // pending; else the pending row is locked and judged.
        Pipe p(tx);
        p.Add(kSagaExists, request.saga_id);
        p.Add(kInsertControl, request.saga_id, request.request_id, request.kind, request.by,
              request.reason, at);
        std::vector<Reply> got = p.Run();
        if (got[0].ok() && got[0].rows() == 0) {
          return Status::NotFound("saga " + Quote(request.saga_id) + " not found");
        }
        ThrowFirstError(p, tx.raw(), got);
        if (got[1].rows() == 0) {
          Pipe l(tx);
          l.Add(kLockControl, request.saga_id);
          std::vector<Reply> held = l.Run();
          ThrowFirstError(l, tx.raw(), held);
          if (held[0].rows() == 0) return Status::Unavailable("control request: busy; try again");
          const Reply& r = held[0];
          ControlRequest pending = ReadControl(r.text(0, 0), r.text(0, 1), r.text(0, 2),
                                               r.text(0, 3), r.text(0, 4), r.i64(0, 5));
          if (!ControlReplaces(pending.kind, request.kind)) {
            note->nothing_written = true;
            return ControlOutcome{std::move(pending), false};
          }
          Pipe u(tx);
          u.Add(kReplaceControl, request.saga_id, request.request_id, request.kind, request.by,
                request.reason, at);
          u.Add(kInsertJournal, request.saga_id, no_step, event, entry, at);
          std::vector<Reply> up = u.Run();
          ThrowFirstError(u, tx.raw(), up);
          note->txid = up[0].i64(0, 0);
          return ControlOutcome{request, true};
        }
        note->txid = got[1].i64(0, 0);
        Pipe j(tx);
        j.Add(kInsertJournal, request.saga_id, no_step, event, entry, at);
        std::vector<Reply> wrote = j.Run();
        ThrowFirstError(j, tx.raw(), wrote);
        return ControlOutcome{request, true};
      });
}

Result<std::optional<ControlRequest>> PgStore::PendingControl(const std::string& saga_id) {
  if (HasNul(saga_id)) return std::optional<ControlRequest>();
  return Run<std::optional<ControlRequest>>(
      "read control request", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::optional<ControlRequest>> {
        pqxx::result q = tx.exec_prepared(kReadControl.name, saga_id);
        if (q.empty()) return std::optional<ControlRequest>();
        return std::optional<ControlRequest>(
            ReadControl(FieldText(q[0][0]), FieldText(q[0][1]), FieldText(q[0][2]),
                        FieldText(q[0][3]), FieldText(q[0][4]), q[0][5].as<int64_t>()));
      });
}

Status PgStore::SettleControl(const std::string& saga_id, const std::string& request_id) {
  if (HasNul(saga_id) || HasNul(request_id)) return Status::Ok();  // cannot be stored
  Result<bool> done = Run<bool>("settle control request", Access::kWrite,
                                [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
                                  Pipe p(tx);
                                  p.Add(kSettleControl, saga_id, request_id);
                                  std::vector<Reply> got = p.Run();
                                  ThrowFirstError(p, tx.raw(), got);
                                  if (got[0].rows() == 0) {
                                    note->nothing_written = true;
                                  } else {
                                    note->txid = got[0].i64(0, 0);
                                  }
                                  return true;
                                });
  return done.status();
}

// ---- Retention (storage/prune.h) -------------------------------------------
//
// Each batch is one write transaction of two pipelines: the first picks and
// marks the sagas (FOR UPDATE SKIP LOCKED, so concurrent prunes share the
// work), the second rewrites their rows in the database (idem_redact and
// idem_null_members of migration 9) and journals them. $1 below is always
// the JSON array of the batch's saga ids.

namespace {

constexpr const char* kPrunePick =
    "UPDATE sagas SET pruned_at_ms = $4::bigint WHERE saga_id IN ("
    " SELECT saga_id FROM sagas WHERE pruned_at_ms IS NULL AND updated_ms < $2::bigint"
    " AND state IN (SELECT jsonb_array_elements_text($1::jsonb))"
    " ORDER BY updated_ms, saga_id LIMIT $3::int FOR UPDATE SKIP LOCKED)"
    " RETURNING saga_id, txid_current()";
#define IDEM_PG_PRUNE_IDS "(SELECT jsonb_array_elements_text($1::jsonb))"
#define IDEM_PG_PRUNE_FIELDS "ARRAY(SELECT jsonb_array_elements_text($2::jsonb))"
#define IDEM_PG_PRUNE_DOC(col)                                                             \
  "CASE WHEN $3::boolean THEN NULL ELSE idem_redact(" col "::jsonb, " IDEM_PG_PRUNE_FIELDS \
  ")::text END"
constexpr const char* kPruneInput =
    "UPDATE sagas SET input = CASE WHEN $3::boolean THEN '{}' ELSE "
    "idem_redact(input::jsonb, " IDEM_PG_PRUNE_FIELDS
    ")::text END WHERE saga_id IN " IDEM_PG_PRUNE_IDS;
constexpr const char* kPruneSteps =
    "UPDATE steps SET args = " IDEM_PG_PRUNE_DOC("args") ", result = " IDEM_PG_PRUNE_DOC(
        "result") ", comp_result = " IDEM_PG_PRUNE_DOC("comp_result") ", phase = "
    IDEM_PG_PRUNE_DOC("phase") " WHERE saga_id IN " IDEM_PG_PRUNE_IDS " RETURNING 1";
#define IDEM_PG_PRUNE_DATA                                                                     \
  "(CASE WHEN $3::boolean THEN idem_null_members(data::jsonb, ARRAY(SELECT "                   \
  "jsonb_array_elements_text($4::jsonb))) ELSE idem_redact(data::jsonb, " IDEM_PG_PRUNE_FIELDS \
  ") END)"
constexpr const char* kPruneJournal =
    "UPDATE journal SET data = " IDEM_PG_PRUNE_DATA "::text WHERE saga_id IN " IDEM_PG_PRUNE_IDS
    " AND data IS NOT NULL AND " IDEM_PG_PRUNE_DATA " IS DISTINCT FROM data::jsonb RETURNING 1";
constexpr const char* kPruneEffects = "UPDATE effects SET result = " IDEM_PG_PRUNE_DOC(
    "result") " WHERE saga_id IN " IDEM_PG_PRUNE_IDS " AND result IS NOT NULL RETURNING 1";
constexpr const char* kPruneTokens =
    "DELETE FROM consumed_tokens WHERE saga_id IN " IDEM_PG_PRUNE_IDS " RETURNING 1";
constexpr const char* kPruneEntries =
    "INSERT INTO journal (saga_id, step_id, event, data, at_ms)"
    " SELECT id, '', 'saga_pruned', $2, $3::bigint FROM jsonb_array_elements_text($1::jsonb) AS id";
constexpr const char* kPruneDryRun =
    "SELECT s.saga_id,"
    " (SELECT count(*) FROM steps t WHERE t.saga_id = s.saga_id),"
    " (SELECT count(*) FROM journal j WHERE j.saga_id = s.saga_id AND j.data IS NOT NULL),"
    " (SELECT count(*) FROM effects e WHERE e.saga_id = s.saga_id AND e.result IS NOT NULL),"
    " (SELECT count(*) FROM consumed_tokens c WHERE c.saga_id = s.saga_id)"
    " FROM sagas s WHERE s.pruned_at_ms IS NULL AND s.updated_ms < $2"
    " AND s.state IN (SELECT jsonb_array_elements_text($1::jsonb))"
    " ORDER BY s.updated_ms, s.saga_id";

}  // namespace

Result<PruneReport> PgStore::Prune(const PruneRequest& request) {
  IDEM_RETURN_IF_ERROR(CheckPruneRequest(request));
  for (const std::string& t : request.states) {
    if (HasNul(t)) return Status::InvalidArgument("prune: a state holds a NUL byte");
  }
  for (const std::string& t : request.redact) {
    if (HasNul(t)) return Status::InvalidArgument("prune: a field name holds a NUL byte");
  }
  const std::string states = Json(request.states).dump();
  const std::string fields = Json(request.redact).dump();
  const std::string full = request.redact.empty() ? "true" : "false";
  const std::string cutoff = std::to_string(request.finished_before_ms);
  const std::string now = std::to_string(request.now_ms);
  if (request.dry_run) {
    return Run<PruneReport>("prune (dry run)", Access::kOneStatement,
                            [&](pqxx::transaction_base& tx) -> Result<PruneReport> {
                              PruneReport report;
                              for (const pqxx::row& r : tx.exec_params(
                                       kPruneDryRun, states, request.finished_before_ms)) {
                                report.saga_ids.push_back(FieldText(r[0]));
                                report.steps += r[1].as<int64_t>();
                                report.journal_entries += r[2].as<int64_t>();
                                report.effects += r[3].as<int64_t>();
                                report.tokens += r[4].as<int64_t>();
                              }
                              return report;
                            });
  }
  PruneReport report;
  for (;;) {
    PruneReport batch;
    auto pruned =
        Run<size_t>("prune", Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<size_t> {
          batch = PruneReport();
          Pipe pick(tx);
          pick.AddSql(kPrunePick, {pick.Own(states), pick.Own(cutoff),
                                   pick.Own(std::to_string(request.batch_sagas)), pick.Own(now)});
          std::vector<Reply> got = pick.Run();
          ThrowFirstError(pick, tx.raw(), got);
          if (got[0].rows() == 0) {
            note->nothing_written = true;
            return size_t{0};
          }
          note->txid = got[0].i64(0, 1);
          Json ids = Json::array();
          for (int i = 0; i < got[0].rows(); ++i) {
            ids.push_back(got[0].text(i, 0));
            batch.saga_ids.push_back(got[0].text(i, 0));
          }
          Pipe rest(tx);
          const char* id_list = rest.Own(ids.dump());
          const char* field_list = rest.Own(fields);
          const char* full_flag = rest.Own(full);
          rest.AddSql(kPruneInput, {id_list, field_list, full_flag});
          const size_t steps = rest.AddSql(kPruneSteps, {id_list, field_list, full_flag});
          const size_t journal = rest.AddSql(
              kPruneJournal,
              {id_list, field_list, full_flag, rest.Own(Json(PrunedJournalFields()).dump())});
          const size_t effects = rest.AddSql(kPruneEffects, {id_list, field_list, full_flag});
          const size_t tokens = rest.AddSql(kPruneTokens, {id_list});
          rest.AddSql(kPruneEntries,
                      {id_list, rest.Own(CanonicalJson(PrunedEntryData(request))), rest.Own(now)});
          std::vector<Reply> done = rest.Run();
          ThrowFirstError(rest, tx.raw(), done);
          batch.steps = done[steps].rows();
          batch.journal_entries = done[journal].rows();
          batch.effects = done[effects].rows();
          batch.tokens = done[tokens].rows();
          return batch.saga_ids.size();
        });
    if (!pruned.ok()) return pruned.status();
    if (*pruned == 0) break;
    ++report.batches;
    report.saga_ids.insert(report.saga_ids.end(), batch.saga_ids.begin(), batch.saga_ids.end());
    report.steps += batch.steps;
    report.journal_entries += batch.journal_entries;
    report.effects += batch.effects;
    report.tokens += batch.tokens;
  }
  return report;
}

Result<std::vector<ControlRequest>> PgStore::ListControls(int limit) {
  if (limit <= 0) {
    return Status::InvalidArgument("ListControls: limit must be positive, got " +
                                   std::to_string(limit));
  }
  return Run<std::vector<ControlRequest>>(
      "list control requests", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<ControlRequest>> {
        std::vector<ControlRequest> out;
        for (const pqxx::row& r : tx.exec_params(
                 IDEM_PG_CONTROL_COLUMNS " ORDER BY requested_ms, saga_id COLLATE \"C\" LIMIT $1",
                 limit)) {
          out.push_back(ReadControl(FieldText(r[0]), FieldText(r[1]), FieldText(r[2]),
                                    FieldText(r[3]), FieldText(r[4]), r[5].as<int64_t>()));
        }
        return out;
      });
}

namespace {

SpecOwner ReadOwner(const std::string& name, const std::string& owner, int64_t shared,
                    int64_t created_ms) {
  return SpecOwner{name, owner, shared != 0, created_ms};
}

Status NoOwner(const std::string& name) { return Status::NotFound("no spec " + name); }

}  // namespace

Result<SpecOwner> PgStore::ClaimSpecName(const SpecOwner& wanted) {
  IDEM_RETURN_IF_ERROR(
      CheckTexts("spec registry: ", {{&wanted.name, "spec name"}, {&wanted.owner, "owner"}}));
  return Run<SpecOwner>(
      "spec registry", Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<SpecOwner> {
        // The INSERT is the claim; the SELECT after it sees the winner's row.
        Pipe p(tx);
        p.Add(kClaimSpecName, wanted.name, wanted.owner, wanted.shared ? 1 : 0, wanted.created_ms);
        p.Add(kSelectSpecOwner, wanted.name);
        std::vector<Reply> got = p.Run();
        ThrowFirstError(p, tx.raw(), got);
        if (got[0].rows() == 1) {
          note->txid = got[0].i64(0, 0);
        } else {
          note->nothing_written = true;
        }
        if (got[1].rows() == 0) return Status::Internal("the spec owner row vanished");
        const Reply& r = got[1];
        return ReadOwner(r.text(0, 0), r.text(0, 1), r.i64(0, 2), r.i64(0, 3));
      });
}

Result<SpecOwner> PgStore::GetSpecOwner(const std::string& name) {
  if (HasNul(name)) return NoOwner(name);
  return Run<SpecOwner>(
      "spec registry", Access::kOneStatement, [&](pqxx::transaction_base& tx) -> Result<SpecOwner> {
        pqxx::result q = tx.exec_params(IDEM_PG_OWNER_COLUMNS " WHERE name = $1", name);
        if (q.empty()) return NoOwner(name);
        return ReadOwner(FieldText(q[0][0]), FieldText(q[0][1]), q[0][2].as<int64_t>(),
                         q[0][3].as<int64_t>());
      });
}

Result<std::vector<SpecOwner>> PgStore::ListSpecOwners() {
  return Run<std::vector<SpecOwner>>(
      "spec registry", Access::kOneStatement,
      [&](pqxx::transaction_base& tx) -> Result<std::vector<SpecOwner>> {
        std::vector<SpecOwner> out;
        for (const pqxx::row& r : tx.exec(IDEM_PG_OWNER_COLUMNS " ORDER BY name COLLATE \"C\"")) {
          out.push_back(
              ReadOwner(FieldText(r[0]), FieldText(r[1]), r[2].as<int64_t>(), r[3].as<int64_t>()));
        }
        return out;
      });
}

Status PgStore::SetSpecShared(const std::string& name, bool shared) {
  if (HasNul(name)) return NoOwner(name);
  auto out =
      Run<bool>("spec registry", Access::kWrite, [&](WriteTx& tx, WriteNote* note) -> Result<bool> {
        Pipe p(tx);
        p.Add(kSetSpecShared, name, shared ? 1 : 0);
        std::vector<Reply> got = p.Run();
        ThrowFirstError(p, tx.raw(), got);
        if (got[0].rows() == 0) {
          note->nothing_written = true;
          return false;
        }
        note->txid = got[0].i64(0, 0);
        return true;
      });
  if (!out.ok()) return out.status();
  return *out ? Status::Ok() : NoOwner(name);
}

}  // namespace idem::storage
