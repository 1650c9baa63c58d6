#include "storage/sqlite_store.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <exception>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include <sqlite3.h>

#include "storage/high_water_mark.h"
#include "storage/sqlite_errors.h"
#include "storage/sqlite_migrations.h"  // generated
#include "storage/sqlite_wal_vfs.h"
#include "storage/validate.h"

#include "common/clock.h"
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

namespace idem::storage {
namespace sqlite_internal {

// ---- Prepared statements ----------------------------------------------------
//
// Preparing a statement costs far more than running these one-row statements,
// so each connection keeps its prepared statements, keyed by SQL text, for
// its whole life. A cache is used only under the mutex that serialises its
// connection (SqliteStore::mu_).
//
// A statement is lent out as a Stmt, which resets it and clears its bindings
// when it goes out of scope, on every return and every throw: a SELECT left
// mid-step would keep the connection's read transaction (in WAL mode, its
// snapshot) open after COMMIT, hiding other connections' writes from later
// reads, failing later writes with SQLITE_BUSY_SNAPSHOT and holding back
// checkpoints.

/// One statement lent out by a StatementCache (or prepared for one use only).
class Stmt {
 public:
  // A cached statement; `*in_use` is cleared when this is destroyed.
  Stmt(SQLite::Statement* st, bool* in_use) noexcept : st_(st), in_use_(in_use) {}
  // A statement of its own, finalized when this is destroyed.
  explicit Stmt(std::unique_ptr<SQLite::Statement> owned) noexcept
      : owned_(std::move(owned)), st_(owned_.get()) {}
  ~Stmt() {
    st_->tryReset();  // noexcept; repeats the last step's error code, if any
    try {
      st_->clearBindings();  // sqlite3_clear_bindings cannot fail
    } catch (...) {          // NOLINT(bugprone-empty-catch): never throw from a destructor
    }
    if (in_use_ != nullptr) *in_use_ = false;
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt(Stmt&&) = delete;
  Stmt& operator=(Stmt&&) = delete;

  SQLite::Statement& operator*() const { return *st_; }
  SQLite::Statement* operator->() const { return st_; }

 private:
  std::unique_ptr<SQLite::Statement> owned_;  // only when not cached
  SQLite::Statement* st_;
  bool* in_use_ = nullptr;
};

class StatementCache {
 public:
  explicit StatementCache(SQLite::Database& db) : db_(db) {}

  /// A statement for `sql`, ready to bind. `cache` false: SQL of unbounded
  /// variety, prepared for this use only (as is a statement already lent out,
  /// and any once the cache is full).
  Stmt Get(std::string_view sql, bool cache = true) {
    auto it = entries_.find(sql);
    if (it != entries_.end() && !it->second.in_use) {
      it->second.in_use = true;
      return Stmt(it->second.st.get(), &it->second.in_use);
    }
    auto st = std::make_unique<SQLite::Statement>(db_, std::string(sql));
    if (it != entries_.end() || !cache || entries_.size() >= kMaxStatements) {
      return Stmt(std::move(st));
    }
    // The key views the statement's own copy of its SQL, which lives (on
    // the heap, unmoved) as long as the entry.
    const std::string_view key = st->getQuery();
    Entry& e = entries_.emplace(key, Entry{std::move(st), true}).first->second;
    return Stmt(e.st.get(), &e.in_use);
  }

  /// Runs a statement that returns no rows (BEGIN, COMMIT, SAVEPOINT...).
  void Exec(std::string_view sql) {
    Stmt st = Get(sql);
    st->exec();
  }

 private:
  // Far more than the store's distinct statements (some 30, plus a few
  // variants of the IN lists of ListSagas and ClaimSagas).
  static constexpr size_t kMaxStatements = 128;
  struct Entry {
    std::unique_ptr<SQLite::Statement> st;
    bool in_use = false;
  };
  SQLite::Database& db_;
  // References to elements (and so the in_use flags) survive rehashing.
  std::unordered_map<std::string_view, Entry> entries_;
};

}  // namespace sqlite_internal

namespace {

using sqlite_internal::StatementCache;
using sqlite_internal::Stmt;

// A transaction on a cached connection: BEGIN at construction, ROLLBACK at
// destruction unless committed (as SQLite::Transaction, with statements that
// are prepared once).
class Tx {
 public:
  enum class Mode { kDeferred, kImmediate };
  Tx(StatementCache& stmts, Mode mode) : stmts_(stmts) {
    stmts_.Exec(mode == Mode::kImmediate ? "BEGIN IMMEDIATE" : "BEGIN");
  }
  ~Tx() {
    if (committed_) return;
    try {
      stmts_.Exec("ROLLBACK");
    } catch (...) {  // NOLINT(bugprone-empty-catch): no transaction left to roll back
    }
  }
  Tx(const Tx&) = delete;
  Tx& operator=(const Tx&) = delete;
  Tx(Tx&&) = delete;
  Tx& operator=(Tx&&) = delete;

  void Commit() {
    stmts_.Exec("COMMIT");
    committed_ = true;
  }

 private:
  StatementCache& stmts_;
  bool committed_ = false;
};

// ---- Schema -----------------------------------------------------------------
//
// kSqliteMigrations[i] takes the database from version i to version i + 1: the
// scripts of storage/migrations/sqlite/, embedded by the build (a generated
// header). Add a new file at the end; never edit one that has shipped.
//
// String columns are NOT NULL ('' for "none"); JSON columns hold canonical
// text (CanonicalJson) or SQL NULL for a JSON null.
constexpr auto& kMigrations = kSqliteMigrations;

constexpr int kLatestVersion = static_cast<int>(kMigrations.size());

// The accepted PRAGMA synchronous values, each with its whole statement so
// that no SQL text is ever assembled from an option string.
struct SyncMode {
  const char* name;
  const char* pragma;
  int level;  // what PRAGMA synchronous reads back
};
constexpr std::array<SyncMode, 4> kSyncModes = {{
    {"OFF", "PRAGMA synchronous = OFF", 0},
    {"NORMAL", "PRAGMA synchronous = NORMAL", 1},
    {"FULL", "PRAGMA synchronous = FULL", 2},
    {"EXTRA", "PRAGMA synchronous = EXTRA", 3},
}};

// ---- Error translation ------------------------------------------------------

using sqlite_errors::DataError;
using sqlite_errors::Guarded;
using sqlite_errors::IsConstraint;

// ---- Binding and reading ----------------------------------------------------

void BindJson(SQLite::Statement& st, int index, const Json& value) {
  if (value.is_null()) {
    st.bind(index);  // SQL NULL
  } else {
    st.bind(index, CanonicalJson(value));
  }
}

Json ColumnJson(SQLite::Statement& st, int index, const char* column) {
  SQLite::Column c = st.getColumn(index);
  if (c.isNull()) return {};  // JSON null
  Json value = Json::parse(c.getString(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    throw DataError(std::string("column ") + column + " holds invalid JSON");
  }
  return value;
}

std::string ColumnText(SQLite::Statement& st, int index) {
  SQLite::Column c = st.getColumn(index);
  return c.isNull() ? std::string() : c.getString();
}

bool SagaExists(StatementCache& stmts, const std::string& saga_id) {
  Stmt q = stmts.Get("SELECT 1 FROM sagas WHERE saga_id = ?");
  q->bind(1, saga_id);
  return q->executeStep();
}

Status SagaNotFound(const std::string& saga_id) {
  return Status::NotFound("saga " + Quote(saga_id) + " not found");
}

// Where the journal stands: its highest seq and, when `identity` is "-" (not
// known yet), the identity of its first entry.
JournalPosition ReadPosition(StatementCache& c, const std::string& identity) {
  JournalPosition pos;
  {
    Stmt q = c.Get("SELECT COALESCE(MAX(seq), 0) FROM journal");
    q->executeStep();
    pos.seq = q->getColumn(0).getInt64();
  }
  pos.identity = identity;
  if (pos.identity == "-" && pos.seq > 0) {
    Stmt q = c.Get("SELECT seq, saga_id FROM journal ORDER BY seq LIMIT 1");
    if (q->executeStep())
      pos.identity = JournalIdentity(q->getColumn(0).getInt64(), ColumnText(*q, 1));
  }
  return pos;
}

void InsertJournal(SQLite::Statement& ins, const std::string& saga_id, const JournalEntry& e) {
  ins.reset();
  ins.bind(1, saga_id);
  ins.bind(2, e.step_id);
  ins.bind(3, e.event);
  BindJson(ins, 4, e.data);
  ins.bind(5, static_cast<int64_t>(e.at_ms));
  ins.exec();
}

// Statements with an IN list of one placeholder per state are cached for
// lists up to this long (a few variants each); longer ones are prepared for
// one use.
constexpr size_t kMaxCachedInList = 8;

constexpr const char* kInsertJournalSql =
    "INSERT INTO journal (saga_id, step_id, event, data, at_ms) VALUES (?, ?, ?, ?, ?)";

// ---- Migrations -------------------------------------------------------------

int CurrentVersion(SQLite::Database& db) {
  SQLite::Statement q(db, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations");
  q.executeStep();
  return q.getColumn(0).getInt();
}

Status TooNew(int version) {
  return Status::FailedPrecondition("database schema version " + std::to_string(version) +
                                    " is newer than this build of idem knows (" +
                                    std::to_string(kLatestVersion) +
                                    "); upgrade idem before opening it");
}

bool Applied(SQLite::Database& db, int version) {
  SQLite::Statement q(db, "SELECT 1 FROM schema_migrations WHERE version = ?");
  q.bind(1, version);
  return q.executeStep();
}

// Applies every migration this build has and the database has not recorded,
// in order, each in its own IMMEDIATE transaction that checks again, so that
// two processes opening a fresh file at once apply each script exactly once.
// By set, not by the highest version: a version merged after a later one (a
// branch's 0006 arriving beside 0007) is still applied. Returns the highest
// version recorded.
Result<int> Migrate(SQLite::Database& db, Clock* clock) {
  db.exec(
      "CREATE TABLE IF NOT EXISTS schema_migrations ("
      " version INTEGER PRIMARY KEY,"
      " applied_at INTEGER NOT NULL)");
  int version = CurrentVersion(db);
  if (version > kLatestVersion) return TooNew(version);
  for (int next = 1; next <= kLatestVersion; ++next) {
    if (kMigrations[next - 1] == nullptr || Applied(db, next)) continue;
    SQLite::Transaction tx(db, SQLite::TransactionBehavior::IMMEDIATE);
    if (CurrentVersion(db) > kLatestVersion) return TooNew(CurrentVersion(db));
    if (Applied(db, next)) continue;  // another process got there first
    db.exec(kMigrations[next - 1]);
    SQLite::Statement ins(db, "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)");
    ins.bind(1, next);
    ins.bind(2, static_cast<int64_t>(clock->NowMs()));
    ins.exec();
    tx.commit();
  }
  return CurrentVersion(db);
}

std::string ToUpper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string ToLower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const SyncMode* FindSyncMode(const std::string& name) {
  std::string upper = ToUpper(name);
  for (const SyncMode& m : kSyncModes) {
    if (upper == m.name) return &m;
  }
  return nullptr;
}

const char* SyncName(int level) {
  for (const SyncMode& m : kSyncModes) {
    if (level == m.level) return m.name;
  }
  return "UNKNOWN";
}

constexpr const char* kSagaColumns =
    "saga_id, intent_key, spec_name, state, reason, created_ms, updated_ms";

SagaSummary ReadSummary(SQLite::Statement& q) {
  SagaSummary s;
  s.saga_id = ColumnText(q, 0);
  s.intent_key = ColumnText(q, 1);
  s.spec_name = ColumnText(q, 2);
  s.state = ColumnText(q, 3);
  s.reason = ColumnText(q, 4);
  s.created_ms = q.getColumn(5).getInt64();
  s.updated_ms = q.getColumn(6).getInt64();
  return s;
}

// The spec a saga runs (kSpecRefColumns at `first`): schema version 7.
constexpr const char* kSpecRefColumns = "spec_version, spec_sha256";

void ReadSpecRef(SQLite::Statement& q, int first, SagaSummary* s) {
  SQLite::Column v = q.getColumn(first);
  s->spec_version = v.isNull() ? 0 : v.getInt();
  s->spec_sha256 = ColumnText(q, first + 1);
}

}  // namespace

// ---- Open -------------------------------------------------------------------

int SqliteStore::LatestSchemaVersion() { return kLatestVersion; }

int SqliteStore::KnownSchemaVersions() {
  return static_cast<int>(
      std::count_if(kMigrations.begin(), kMigrations.end(), [](const char* m) { return m; }));
}

SqliteStore::SqliteStore(std::unique_ptr<SQLite::Database> db,
                         std::unique_ptr<SQLite::Database> reader, int schema_version,
                         const SqliteOptions& options, std::unique_ptr<HighWaterMark> hwm)
    : db_(std::move(db)),
      stmts_(std::make_unique<sqlite_internal::StatementCache>(*db_)),
      read_db_(std::move(reader)),
      read_stmts_(std::make_unique<sqlite_internal::StatementCache>(*read_db_)),
      schema_version_(schema_version),
      clock_(options.clock != nullptr ? options.clock : SystemClock::Get()),
      hwm_(std::move(hwm)),
      identity_(hwm_ != nullptr ? hwm_->mark().identity : "-"),
      group_commit_(options.group_commit, options.max_group_batches,
                    [this](const std::vector<PendingCommit*>& group) { CommitGroup(group); }) {}

SqliteStore::~SqliteStore() {
  {
    std::lock_guard<std::mutex> lock(read_mu_);
    read_stmts_.reset();  // every statement finalized before read_db_ closes
  }
  std::lock_guard<std::mutex> lock(mu_);
  stmts_.reset();  // every statement finalized before db_ closes
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::Open(const SqliteOptions& options) {
  if (options.path.empty()) {
    return Status::InvalidArgument("SQLite store: the database path is empty");
  }
  if (options.path == ":memory:") {
    return Status::InvalidArgument(
        "SQLite store: \":memory:\" is not durable and cannot run in WAL mode; give a file path");
  }
  const SyncMode* sync = FindSyncMode(options.synchronous);
  if (sync == nullptr) {
    return Status::InvalidArgument("SQLite store: synchronous " + Quote(options.synchronous) +
                                   " is not one of OFF, NORMAL, FULL, EXTRA");
  }
  if (options.busy_timeout_ms < 0) {
    return Status::InvalidArgument("SQLite store: busy_timeout_ms must be >= 0, got " +
                                   std::to_string(options.busy_timeout_ms));
  }
  if (options.max_group_batches < 1) {
    return Status::InvalidArgument("SQLite store: max_group_batches must be >= 1, got " +
                                   std::to_string(options.max_group_batches));
  }
  if (options.page_size != 0 && (options.page_size < 512 || options.page_size > 65536 ||
                                 (options.page_size & (options.page_size - 1)) != 0)) {
    return Status::InvalidArgument(
        "SQLite store: page_size must be 0 or a power of two from 512 to 65536, got " +
        std::to_string(options.page_size));
  }
  const std::string op = "open SQLite store " + Quote(options.path);
  // Several processes opening a new file at once race to turn it into WAL;
  // SQLite answers the losers SQLITE_BUSY without waiting on the busy
  // handler. Opening is harmless to repeat: try again for a while.
  Result<std::unique_ptr<SqliteStore>> opened = Status::Unavailable(op);
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10 + 5 * attempt));
    opened = OpenOnce(options, op);
    if (opened.ok() || opened.status().code() != Code::kUnavailable) break;
  }
  return opened;
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::OpenOnce(const SqliteOptions& options,
                                                           const std::string& op) {
  const SyncMode* sync = FindSyncMode(options.synchronous);  // checked by Open
  return Guarded<Result<std::unique_ptr<SqliteStore>>>(
      op, [&]() -> Result<std::unique_ptr<SqliteStore>> {
        // Every commit syncs the WAL (FULL, EXTRA): its frames go out in one
        // write (storage/sqlite_wal_vfs.h).
        const std::string vfs =
            options.gather_wal_writes && sync->level >= 2 ? WalGatheringVfsName() : "";
        auto db = std::make_unique<SQLite::Database>(
            options.path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE | SQLite::OPEN_FULLMUTEX,
            options.busy_timeout_ms, vfs);

        // A new file takes its page size before its first write (WAL mode
        // writes the header); SQLite ignores the PRAGMA on a file that exists.
        if (options.page_size != 0) {
          db->exec("PRAGMA page_size = " + std::to_string(options.page_size));
        }
        // WAL: the mode is persistent in the file; the PRAGMA answers with the
        // mode actually in force, which is not WAL when the VFS or the file
        // cannot do it.
        std::string mode = ToLower(db->execAndGet("PRAGMA journal_mode = WAL").getString());
        if (mode != "wal") {
          return Status::FailedPrecondition(op + ": journal_mode is " + Quote(mode) +
                                            ", not \"wal\"; the store needs WAL for durability");
        }
        db->exec(sync->pragma);
        int level = db->execAndGet("PRAGMA synchronous").getInt();
        if (level != sync->level) {
          return Status::FailedPrecondition(op + ": synchronous is " + SyncName(level) +
                                            " after setting it to " + sync->name);
        }
        db->exec("PRAGMA foreign_keys = ON");
        if (db->execAndGet("PRAGMA foreign_keys").getInt() != 1) {
          return Status::FailedPrecondition(op + ": SQLite refused to enable foreign keys");
        }

        Result<int> version =
            Migrate(*db, options.clock != nullptr ? options.clock : SystemClock::Get());
        if (!version.ok()) {
          return Status(version.status().code(), op + ": " + version.status().message());
        }
        // A second connection for reads: they run beside the writer (WAL
        // gives each its snapshot) instead of queueing behind its fsyncs.
        auto reader = std::make_unique<SQLite::Database>(
            options.path, SQLite::OPEN_READWRITE | SQLite::OPEN_FULLMUTEX, options.busy_timeout_ms,
            vfs);
        reader->exec("PRAGMA query_only = 1");
        // The journal against its high-water mark: a regression found here
        // refuses every write (WritesAllowed).
        std::unique_ptr<HighWaterMark> hwm;
        if (options.high_water_mark) {
          StatementCache probe(*db);
          auto mark = HighWaterMark::Open(options.path, ReadPosition(probe, "-"));
          if (!mark.ok()) return Status(mark.status().code(), op + ": " + mark.status().message());
          hwm = std::move(mark).value();
        }
        return std::unique_ptr<SqliteStore>(
            new SqliteStore(std::move(db), std::move(reader), *version, options, std::move(hwm)));
      });
}

int SqliteStore::SchemaVersion() { return schema_version_; }

Status SqliteStore::WritesAllowed() const {
  return hwm_ != nullptr ? hwm_->regression() : Status::Ok();
}

Status SqliteStore::JournalIntegrity() { return WritesAllowed(); }

std::string SqliteStore::HighWaterMarkPath() const {
  return hwm_ != nullptr ? hwm_->path() : std::string();
}

void SqliteStore::AdvanceMark() {
  if (hwm_ == nullptr) return;
  try {
    JournalPosition pos = ReadPosition(*stmts_, identity_);
    identity_ = pos.identity;
    hwm_->Advance(pos);
  } catch (const std::exception&) {
    // The commit stands; the mark stays behind it (a weaker check only).
  }
}

Status SqliteStore::AcceptRegression(const std::string& who, const std::string& reason) {
  if (hwm_ == nullptr) {
    return Status::FailedPrecondition("this store keeps no high-water mark: nothing to accept");
  }
  return Guarded<Status>("accept the journal's regression", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    JournalPosition pos = ReadPosition(*stmts_, "-");
    IDEM_RETURN_IF_ERROR(hwm_->Accept(pos, who, reason, clock_->NowMs()));
    identity_ = pos.identity;
    return Status::Ok();
  });
}

Result<SqliteSettings> SqliteStore::EffectiveSettings() {
  return Guarded<Result<SqliteSettings>>("read SQLite settings", [&]() -> Result<SqliteSettings> {
    std::lock_guard<std::mutex> lock(mu_);
    SqliteSettings s;
    s.journal_mode = ToLower(db_->execAndGet("PRAGMA journal_mode").getString());
    s.synchronous = SyncName(db_->execAndGet("PRAGMA synchronous").getInt());
    s.foreign_keys = db_->execAndGet("PRAGMA foreign_keys").getInt() == 1;
    s.busy_timeout_ms = db_->execAndGet("PRAGMA busy_timeout").getInt();
    return s;
  });
}

// ---- Writes -----------------------------------------------------------------

namespace {

// The intent's saga if its key was submitted before (kConflict when with
// other content); nullopt if the key is new.
Result<std::optional<CreateOutcome>> FindIntent(StatementCache& c, const NewSaga& saga) {
  Stmt q = c.Get("SELECT fingerprint, saga_id FROM intents WHERE intent_key = ?");
  q->bind(1, saga.intent_key);
  if (!q->executeStep()) return std::optional<CreateOutcome>();
  std::string fingerprint = ColumnText(*q, 0);
  std::string existing = ColumnText(*q, 1);
  if (fingerprint == saga.fingerprint) {
    return std::optional<CreateOutcome>(CreateOutcome{existing, false});
  }
  return Status::Conflict("intent key " + Quote(saga.intent_key) +
                          " was already submitted with other content (saga " + Quote(existing) +
                          ", fingerprint " + fingerprint + ")");
}

// How a batch that creates its saga (WriteBatch::create) shapes the rows
// ApplyCreate writes: the saga's state, reason and update time as the
// batch leaves them, the lease, and the steps the batch writes itself.
struct CreateShape {
  std::string state;
  std::string reason;
  int64_t updated_ms = 0;
  std::string lease_owner;
  int64_t lease_expires_ms = 0;
  int64_t lease_epoch = 0;
  std::set<int> written_steps;  // not inserted as planned: the batch writes them
};

// Writes a new intent, its saga, steps and journal inside the caller's
// transaction; a non-OK status means the caller must roll back. With a
// shape (a batch's create), the key must be new.
Result<CreateOutcome> ApplyCreate(StatementCache& c, const NewSaga& saga,
                                  const CreateShape* shape = nullptr) {
  auto found = FindIntent(c, saga);
  if (shape != nullptr && (!found.ok() || found->has_value())) {
    return Status::Conflict("intent key " + Quote(saga.intent_key) +
                            " was submitted before; nothing of the batch was written");
  }
  if (!found.ok()) return found.status();
  if (found->has_value()) return **found;
  try {
    Stmt ins = c.Get(
        "INSERT INTO intents (intent_key, fingerprint, saga_id, created_ms) "
        "VALUES (?, ?, ?, ?)");
    ins->bind(1, saga.intent_key);
    ins->bind(2, saga.fingerprint);
    ins->bind(3, saga.saga_id);
    ins->bind(4, static_cast<int64_t>(saga.created_ms));
    ins->exec();
  } catch (const SQLite::Exception& e) {
    if (!IsConstraint(e)) throw;
    return Status::Conflict("saga id " + Quote(saga.saga_id) + " is already in use (" + e.what() +
                            ")");
  }
  {
    Stmt ins = c.Get(
        "INSERT INTO sagas (saga_id, intent_key, fingerprint, spec_name, spec,"
        " input, state, reason, created_ms, updated_ms, spec_version, spec_sha256,"
        " lease_owner, lease_expires_ms, lease_epoch) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    ins->bind(1, saga.saga_id);
    ins->bind(2, saga.intent_key);
    ins->bind(3, saga.fingerprint);
    ins->bind(4, saga.spec_name);
    BindJson(*ins, 5, saga.spec);
    BindJson(*ins, 6, saga.input);
    ins->bind(7, shape != nullptr ? shape->state : saga.state);
    ins->bind(8, shape != nullptr ? shape->reason : std::string());
    ins->bind(9, static_cast<int64_t>(saga.created_ms));
    ins->bind(10, static_cast<int64_t>(shape != nullptr ? shape->updated_ms : saga.created_ms));
    if (saga.spec_version > 0) {
      ins->bind(11, saga.spec_version);
    } else {
      ins->bind(11);  // NULL: inline
    }
    ins->bind(12, saga.spec_sha256);
    ins->bind(13, shape != nullptr ? shape->lease_owner : std::string());
    ins->bind(14, static_cast<int64_t>(shape != nullptr ? shape->lease_expires_ms : 0));
    ins->bind(15, static_cast<int64_t>(shape != nullptr ? shape->lease_epoch : 0));
    ins->exec();
  }
  {
    Stmt ins = c.Get(
        "INSERT INTO steps (saga_id, idx, step_id, tool, state, attempt,"
        " step_key, updated_ms) VALUES (?, ?, ?, ?, ?, 0, ?, ?)");
    for (const NewStep& step : saga.steps) {
      if (shape != nullptr && shape->written_steps.count(step.index) > 0) continue;
      ins->reset();
      ins->bind(1, saga.saga_id);
      ins->bind(2, step.index);
      ins->bind(3, step.step_id);
      ins->bind(4, step.tool);
      ins->bind(5, step.state);
      ins->bind(6, step.step_key);
      ins->bind(7, static_cast<int64_t>(saga.created_ms));
      try {
        ins->exec();
      } catch (const SQLite::Exception& e) {
        if (!IsConstraint(e)) throw;
        return Status::Conflict("step key " + Quote(step.step_key) + " of step " +
                                Quote(step.step_id) + " is already in use (" + e.what() + ")");
      }
    }
  }
  {
    Stmt ins = c.Get(kInsertJournalSql);
    for (const JournalEntry& e : saga.journal) InsertJournal(*ins, saga.saga_id, e);
  }
  return CreateOutcome{saga.saga_id, true};
}

}  // namespace

/// One Commit or new intent waiting in (or led through) the group commit queue.
struct SqliteStore::PendingCommit {
  const WriteBatch* batch = nullptr;  // a batch, or
  const NewSaga* saga = nullptr;      // a new intent and its saga
  CreateOutcome created;              // for `saga`, when status is OK
  Status status;
};

Result<CreateOutcome> SqliteStore::CreateIntent(const NewSaga& saga) {
  IDEM_RETURN_IF_ERROR(ValidateNewSaga(saga));

  // A key submitted before is answered by a read: no write lock, no flush.
  const std::string op = "CreateIntent " + Quote(saga.intent_key);
  auto existing = Guarded<Result<std::optional<CreateOutcome>>>(
      op, [&]() -> Result<std::optional<CreateOutcome>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        return storage::FindIntent(*read_stmts_, saga);
      });
  if (!existing.ok()) return existing.status();
  if (existing->has_value()) return **existing;
  // A new one is written like a batch: through the group commit, so many
  // submissions share a transaction (the lookup is repeated inside it).
  PendingCommit me;
  me.saga = &saga;
  group_commit_.Submit(&me);
  if (!me.status.ok()) return me.status;
  return me.created;
}

Result<std::optional<CreateOutcome>> SqliteStore::FindIntent(const NewSaga& saga) {
  return Guarded<Result<std::optional<CreateOutcome>>>(
      "FindIntent " + Quote(saga.intent_key), [&]() -> Result<std::optional<CreateOutcome>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        return storage::FindIntent(*read_stmts_, saga);
      });
}

namespace {

Status LeaseLost(const std::string& saga_id, int64_t epoch, int64_t fence) {
  return Status::Aborted("lease lost: saga " + Quote(saga_id) + " is at lease epoch " +
                         std::to_string(epoch) + ", the batch is fenced on epoch " +
                         std::to_string(fence) + "; nothing of the batch was written");
}

// The saga's update time a batch that moves it writes: its newest journal
// entry's, else now.
int64_t BatchUpdatedMs(const WriteBatch& batch, int64_t now_ms) {
  int64_t updated_ms = 0;
  for (const JournalEntry& e : batch.journal) updated_ms = std::max(updated_ms, e.at_ms);
  return updated_ms > 0 ? updated_ms : now_ms;
}

// Writes one batch inside the caller's transaction. A non-OK status means the
// caller must roll the batch back (some of it may have been written); SQLite
// errors other than constraint violations are thrown.
//
// `row_written`: the saga's row was inserted by this batch's create with the
// state and lease the batch leaves (ApplyCreateBatch), so neither is
// written again.
Status ApplyBatch(StatementCache& c, const WriteBatch& batch, int64_t now_ms,
                  bool row_written = false) {
  {
    // The IMMEDIATE transaction holds the write lock: the epoch read here
    // cannot change before COMMIT.
    Stmt q = c.Get("SELECT lease_epoch FROM sagas WHERE saga_id = ?");
    q->bind(1, batch.saga_id);
    if (!q->executeStep()) return SagaNotFound(batch.saga_id);
    const int64_t epoch = q->getColumn(0).getInt64();
    if (batch.fence_epoch != 0 && epoch != batch.fence_epoch) {
      return LeaseLost(batch.saga_id, epoch, batch.fence_epoch);
    }
  }

  if (batch.saga_state.has_value() && !row_written) {
    const int64_t updated_ms = BatchUpdatedMs(batch, now_ms);
    Stmt up = c.Get(
        "UPDATE sagas SET state = ?, reason = ?, updated_ms = ? "
        "WHERE saga_id = ?");
    up->bind(1, *batch.saga_state);
    up->bind(2, batch.saga_reason);
    up->bind(3, static_cast<int64_t>(updated_ms));
    up->bind(4, batch.saga_id);
    up->exec();
  }

  for (const StepRecord& s : batch.steps) {
    // The usual case: the row exists with this key. Leaving step_key (and
    // the key columns) out of the SET spares a write to its unique index.
    // Both statements number their parameters alike: ?1 saga, ?2 index,
    // ?3.. the row's columns in table order.
    auto bind = [&](Stmt& st) {
      st->bind(1, batch.saga_id);
      st->bind(2, s.index);
      st->bind(3, s.step_id);
      st->bind(4, s.tool);
      st->bind(5, s.state);
      st->bind(6, s.attempt);
      st->bind(7, s.step_key);
      BindJson(*st, 8, s.args);
      st->bind(9, s.args_fingerprint);
      BindJson(*st, 10, s.result);
      st->bind(11, s.external_ref);
      st->bind(12, s.error);
      st->bind(13, s.comp_attempt);
      BindJson(*st, 14, s.comp_result);
      st->bind(15, static_cast<int64_t>(s.updated_ms));
      BindJson(*st, 16, s.phase);
    };
    {
      Stmt up = c.Get(
          "UPDATE steps SET step_id = ?3, tool = ?4, state = ?5, attempt = ?6, args = ?8,"
          " args_fingerprint = ?9, result = ?10, external_ref = ?11, error = ?12,"
          " comp_attempt = ?13, comp_result = ?14, updated_ms = ?15, phase = ?16"
          " WHERE saga_id = ?1 AND idx = ?2 AND step_key = ?7");
      bind(up);
      if (up->exec() == 1) continue;
    }
    // A new row, or a new key for it.
    Stmt up = c.Get(
        "INSERT INTO steps (saga_id, idx, step_id, tool, state, attempt, step_key, args,"
        " args_fingerprint, result, external_ref, error, comp_attempt, comp_result, updated_ms,"
        " phase)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
        " ON CONFLICT (saga_id, idx) DO UPDATE SET"
        " step_id = excluded.step_id, tool = excluded.tool, state = excluded.state,"
        " attempt = excluded.attempt, step_key = excluded.step_key, args = excluded.args,"
        " args_fingerprint = excluded.args_fingerprint, result = excluded.result,"
        " external_ref = excluded.external_ref, error = excluded.error,"
        " comp_attempt = excluded.comp_attempt, comp_result = excluded.comp_result,"
        " updated_ms = excluded.updated_ms, phase = excluded.phase");
    bind(up);
    try {
      up->exec();
    } catch (const SQLite::Exception& e) {
      if (!IsConstraint(e)) throw;
      return Status::Conflict("step key " + Quote(s.step_key) + " of step " + Quote(s.step_id) +
                              " is used by another step (" + e.what() + ")");
    }
  }

  if (!batch.journal.empty()) {
    Stmt ins = c.Get(kInsertJournalSql);
    for (const JournalEntry& e : batch.journal) InsertJournal(*ins, batch.saga_id, e);
  }

  if (!batch.consume_token.empty()) {
    Stmt ins = c.Get(
        "INSERT INTO consumed_tokens (nonce, saga_id, step_id, at_ms)"
        " VALUES (?, ?, ?, ?)");
    ins->bind(1, batch.consume_token);
    ins->bind(2, batch.saga_id);
    ins->bind(3, batch.consume_token_step);
    ins->bind(4, static_cast<int64_t>(now_ms));
    try {
      ins->exec();
    } catch (const SQLite::Exception& e) {
      if (!IsConstraint(e)) throw;
      return Status::Conflict("commit token already used; nothing of the batch was written");
    }
  }

  if (!batch.effects.empty()) {
    Stmt ins = c.Get(
        "INSERT INTO effects (idempotency_key, saga_id, step_id, kind, tool,"
        " result, external_ref, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    for (const EffectRecord& f : batch.effects) {
      ins->reset();
      ins->bind(1, f.idempotency_key);
      ins->bind(2, batch.saga_id);
      ins->bind(3, f.step_id);
      ins->bind(4, f.kind);
      ins->bind(5, f.tool);
      BindJson(*ins, 6, f.result);
      ins->bind(7, f.external_ref);
      ins->bind(8, static_cast<int64_t>(f.at_ms));
      try {
        ins->exec();
      } catch (const SQLite::Exception& e) {
        if (!IsConstraint(e)) throw;
        return Status::Conflict("effect idempotency key " + Quote(f.idempotency_key) +
                                " is already recorded; nothing of the batch was written");
      }
    }
  }

  if (batch.spec.has_value()) {
    Stmt up = c.Get("UPDATE sagas SET spec = ? WHERE saga_id = ?");
    BindJson(*up, 1, *batch.spec);
    up->bind(2, batch.saga_id);
    up->exec();
  }
  if (batch.open_call.has_value()) {
    const WriteBatch::OpenCall& oc = *batch.open_call;
    Stmt ins = c.Get(
        "INSERT INTO open_calls (saga_id, call_id, step_idx, created_ms) VALUES (?, ?, ?, ?)");
    ins->bind(1, batch.saga_id);
    ins->bind(2, oc.call_id);
    ins->bind(3, oc.step_index);
    ins->bind(4, static_cast<int64_t>(oc.at_ms));
    try {
      ins->exec();
    } catch (const SQLite::Exception& e) {
      if (!IsConstraint(e)) throw;
      return Status::Conflict("call id " + Quote(oc.call_id) + " is already a step of saga " +
                              Quote(batch.saga_id) + "; nothing of the batch was written");
    }
  }
  for (const std::string& step_id : batch.checks_done) {
    Stmt del = c.Get("DELETE FROM step_checks WHERE saga_id = ? AND step_id = ?");
    del->bind(1, batch.saga_id);
    del->bind(2, step_id);
    del->exec();
  }
  for (const StepCheck& k : batch.checks) {
    Stmt up = c.Get(
        "INSERT INTO step_checks (saga_id, step_id, next_check_ms, deadline_ms, checks, since_ms)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (saga_id, step_id) DO UPDATE SET"
        " next_check_ms = excluded.next_check_ms, deadline_ms = excluded.deadline_ms,"
        " checks = excluded.checks, since_ms = excluded.since_ms");
    up->bind(1, batch.saga_id);
    up->bind(2, k.step_id);
    up->bind(3, static_cast<int64_t>(k.next_check_ms));
    up->bind(4, static_cast<int64_t>(k.deadline_ms));
    up->bind(5, k.checks);
    up->bind(6, static_cast<int64_t>(k.since_ms));
    up->exec();
  }

  if (batch.release_lease && !row_written) {  // fenced above: the lease is this batch's to give up
    Stmt up = c.Get("UPDATE sagas SET lease_expires_ms = 0 WHERE saga_id = ?");
    up->bind(1, batch.saga_id);
    up->exec();
  }

  return Status::Ok();
}

// Writes a batch that creates its saga (WriteBatch::create) inside the
// caller's transaction: the intent, the saga's row as the batch leaves it
// (one insert, no update after it), the planned steps the batch does not
// write, then the batch. A non-OK status means roll it back.
Status ApplyCreateBatch(StatementCache& c, const WriteBatch& batch, int64_t now_ms) {
  const NewSaga& saga = *batch.create;
  CreateShape shape;
  shape.state = batch.saga_state.value_or(saga.state);
  shape.reason = batch.saga_state.has_value() ? batch.saga_reason : std::string();
  shape.updated_ms = batch.saga_state.has_value() ? BatchUpdatedMs(batch, now_ms) : saga.created_ms;
  if (!saga.lease_owner.empty()) {
    shape.lease_owner = saga.lease_owner;
    shape.lease_expires_ms = batch.release_lease ? 0 : now_ms + saga.lease_ms;
    shape.lease_epoch = 1;
  }
  for (const StepRecord& st : batch.steps) shape.written_steps.insert(st.index);
  auto created = ApplyCreate(c, saga, &shape);
  if (!created.ok()) return created.status();
  return ApplyBatch(c, batch, now_ms, /*row_written=*/true);
}

}  // namespace

Status SqliteStore::Commit(const WriteBatch& batch) {
  IDEM_RETURN_IF_ERROR(ValidateWriteBatch(batch));
  PendingCommit me;
  me.batch = &batch;
  group_commit_.Submit(&me);
  return me.status;
}

void SqliteStore::CommitGroup(const std::vector<PendingCommit*>& group) {
  const bool single = group.size() == 1;
  const std::string op =
      !single ? "Commit of a group of " + std::to_string(group.size()) + " batches"
      : group[0]->saga != nullptr ? "CreateIntent " + Quote(group[0]->saga->intent_key)
                                  : "Commit to saga " + Quote(group[0]->batch->saga_id);
  // Applies one batch or intent; a non-OK status means roll it back.
  auto apply = [&](StatementCache& c, PendingCommit* p, int64_t now_ms) {
    if (p->saga == nullptr) {
      return p->batch->create ? ApplyCreateBatch(c, *p->batch, now_ms)
                              : ApplyBatch(c, *p->batch, now_ms);
    }
    auto created = ApplyCreate(c, *p->saga);
    if (!created.ok()) return created.status();
    p->created = *created;
    return Status::Ok();
  };
  if (Status refused = WritesAllowed(); !refused.ok()) {
    for (PendingCommit* p : group) p->status = refused;
    return;
  }
  auto failure = Guarded<Status>(op, [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    StatementCache& c = *stmts_;
    const int64_t now_ms = clock_->NowMs();
    commit_transactions_.fetch_add(1);
    // Not committed means rolled back, on every return and every throw.
    Tx tx(c, Tx::Mode::kImmediate);
    if (single) {
      group[0]->status = apply(c, group[0], now_ms);
      if (!group[0]->status.ok()) return Status::Ok();  // rolled back; the status is set
    } else {
      for (PendingCommit* p : group) {
        c.Exec("SAVEPOINT idem_batch");
        p->status = apply(c, p, now_ms);
        if (!p->status.ok()) c.Exec("ROLLBACK TO idem_batch");
        c.Exec("RELEASE idem_batch");
      }
    }
    tx.Commit();
    AdvanceMark();
    return Status::Ok();
  });
  if (!failure.ok()) {
    // The transaction itself failed: nothing of any batch was written.
    for (PendingCommit* p : group) p->status = failure;
    return;
  }
  commit_batches_.fetch_add(static_cast<int64_t>(group.size()));
  RaiseToAtLeast(largest_group_, static_cast<int64_t>(group.size()));
}

SqliteStats SqliteStore::Stats() const {
  SqliteStats s;
  s.commit_batches = commit_batches_.load();
  s.commit_transactions = commit_transactions_.load();
  s.largest_group = largest_group_.load();
  return s;
}

// ---- Leases -------------------------------------------------------------------
//
// Each call is one IMMEDIATE transaction, so claims from several threads or
// processes are serialised by the database write lock: no saga is claimed
// twice, and the epoch read back is the one written.

namespace {

// Writes a claim: the lease's owner, expiry and (bumped) epoch.
void TakeLease(StatementCache& c, const Lease& l) {
  Stmt up = c.Get(
      "UPDATE sagas SET lease_owner = ?, lease_expires_ms = ?, lease_epoch = ? WHERE saga_id = ?");
  up->bind(1, l.owner);
  up->bind(2, static_cast<int64_t>(l.expires_ms));
  up->bind(3, static_cast<int64_t>(l.epoch));
  up->bind(4, l.saga_id);
  up->exec();
}

}  // namespace

Result<std::vector<Lease>> SqliteStore::ClaimSagas(const std::vector<std::string>& states,
                                                   const std::string& owner, int64_t lease_ms,
                                                   int limit) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  if (states.empty()) return Status::InvalidArgument("ClaimSagas: no states given");
  if (owner.empty()) return Status::InvalidArgument("ClaimSagas: owner is empty");
  if (lease_ms <= 0) {
    return Status::InvalidArgument("ClaimSagas: lease_ms must be positive, got " +
                                   std::to_string(lease_ms));
  }
  if (limit <= 0) {
    return Status::InvalidArgument("ClaimSagas: limit must be positive, got " +
                                   std::to_string(limit));
  }
  // Only placeholders are appended, one per state; the values are bound.
  std::string sql =
      "SELECT saga_id, lease_epoch FROM sagas WHERE lease_expires_ms < ? AND state IN (?";
  for (size_t i = 1; i < states.size(); ++i) sql += ", ?";
  sql += ") ORDER BY updated_ms, saga_id LIMIT ?";

  return Guarded<Result<std::vector<Lease>>>(
      "ClaimSagas for " + Quote(owner), [&]() -> Result<std::vector<Lease>> {
        std::lock_guard<std::mutex> lock(mu_);
        StatementCache& c = *stmts_;
        Tx tx(c, Tx::Mode::kImmediate);
        const int64_t now_ms = clock_->NowMs();
        std::vector<Lease> out;
        {
          Stmt q = c.Get(sql, /*cache=*/states.size() <= kMaxCachedInList);
          int i = 1;
          q->bind(i++, static_cast<int64_t>(now_ms));
          for (const std::string& state : states) q->bind(i++, state);
          q->bind(i, limit);
          while (q->executeStep()) {
            Lease l;
            l.saga_id = ColumnText(*q, 0);
            l.owner = owner;
            l.epoch = q->getColumn(1).getInt64() + 1;
            l.expires_ms = now_ms + lease_ms;
            out.push_back(std::move(l));
          }
        }
        for (const Lease& l : out) TakeLease(c, l);
        tx.Commit();
        return out;
      });
}

Result<Lease> SqliteStore::ClaimSaga(const std::string& saga_id, const std::string& owner,
                                     int64_t lease_ms) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  if (owner.empty()) return Status::InvalidArgument("ClaimSaga: owner is empty");
  if (lease_ms <= 0) {
    return Status::InvalidArgument("ClaimSaga: lease_ms must be positive, got " +
                                   std::to_string(lease_ms));
  }
  return Guarded<Result<Lease>>(
      "ClaimSaga " + Quote(saga_id) + " for " + Quote(owner), [&]() -> Result<Lease> {
        std::lock_guard<std::mutex> lock(mu_);
        StatementCache& c = *stmts_;
        Tx tx(c, Tx::Mode::kImmediate);
        const int64_t now_ms = clock_->NowMs();
        Lease l;
        {
          Stmt q = c.Get(
              "SELECT lease_owner, lease_expires_ms, lease_epoch FROM sagas WHERE saga_id = ?");
          q->bind(1, saga_id);
          if (!q->executeStep()) return SagaNotFound(saga_id);
          const std::string holder = ColumnText(*q, 0);
          const int64_t expires_ms = q->getColumn(1).getInt64();
          if (expires_ms >= now_ms && holder != owner) {
            return Status::Aborted("saga " + Quote(saga_id) + " is leased to " + Quote(holder) +
                                   " until " + std::to_string(expires_ms));
          }
          l.saga_id = saga_id;
          l.owner = owner;
          l.epoch = q->getColumn(2).getInt64() + 1;
          l.expires_ms = now_ms + lease_ms;
        }
        TakeLease(c, l);
        tx.Commit();
        return l;
      });
}

Status SqliteStore::UpdateLease(const char* what, const Lease& lease, int64_t lease_ms,
                                bool release) {
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  if (!release && lease_ms <= 0) {
    return Status::InvalidArgument(std::string(what) + ": lease_ms must be positive, got " +
                                   std::to_string(lease_ms));
  }
  const std::string op = std::string(what) + " of saga " + Quote(lease.saga_id);
  return Guarded<Status>(op, [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    StatementCache& c = *stmts_;
    Tx tx(c, Tx::Mode::kImmediate);
    Stmt up = c.Get(
        "UPDATE sagas SET lease_expires_ms = ?"
        " WHERE saga_id = ? AND lease_owner = ? AND lease_epoch = ?");
    up->bind(1, static_cast<int64_t>(release ? 0 : clock_->NowMs() + lease_ms));
    up->bind(2, lease.saga_id);
    up->bind(3, lease.owner);
    up->bind(4, static_cast<int64_t>(lease.epoch));
    if (up->exec() == 0) {
      if (!SagaExists(c, lease.saga_id)) return SagaNotFound(lease.saga_id);
      return Status::Aborted("lease lost: saga " + Quote(lease.saga_id) +
                             " is no longer leased to " + Quote(lease.owner) + " at epoch " +
                             std::to_string(lease.epoch));
    }
    tx.Commit();
    return Status::Ok();
  });
}

Status SqliteStore::RenewLease(const Lease& lease, int64_t lease_ms) {
  return UpdateLease("RenewLease", lease, lease_ms, /*release=*/false);
}

Status SqliteStore::ReleaseLease(const Lease& lease) {
  return UpdateLease("ReleaseLease", lease, 0, /*release=*/true);
}

// ---- Reads ------------------------------------------------------------------
//
// Each read runs in a (deferred) read transaction so that it sees one
// snapshot even while other processes write to the file.

Result<SagaRecord> SqliteStore::LoadSaga(const std::string& saga_id) {
  return Guarded<Result<SagaRecord>>("LoadSaga " + Quote(saga_id), [&]() -> Result<SagaRecord> {
    std::lock_guard<std::mutex> lock(read_mu_);
    StatementCache& c = *read_stmts_;
    Tx tx(c, Tx::Mode::kDeferred);
    SagaRecord rec;
    {
      static const std::string sql = std::string("SELECT ") + kSagaColumns +
                                     ", fingerprint, spec, input, " + kSpecRefColumns +
                                     ", pruned_at_ms FROM sagas WHERE saga_id = ?";
      Stmt q = c.Get(sql);
      q->bind(1, saga_id);
      if (!q->executeStep()) return SagaNotFound(saga_id);
      rec.summary = ReadSummary(*q);
      rec.fingerprint = ColumnText(*q, 7);
      rec.spec = ColumnJson(*q, 8, "sagas.spec");
      rec.input = ColumnJson(*q, 9, "sagas.input");
      ReadSpecRef(*q, 10, &rec.summary);
      SQLite::Column pruned = q->getColumn(12);  // schema 9 (storage/prune.h)
      rec.summary.pruned_at_ms = pruned.isNull() ? 0 : pruned.getInt64();
    }
    {
      Stmt q = c.Get(
          "SELECT idx, step_id, tool, state, attempt, step_key, args,"
          " args_fingerprint, result, external_ref, error, comp_attempt,"
          " comp_result, updated_ms, phase FROM steps WHERE saga_id = ?"
          " ORDER BY idx");
      q->bind(1, saga_id);
      while (q->executeStep()) {
        StepRecord s;
        s.saga_id = saga_id;
        s.index = q->getColumn(0).getInt();
        s.step_id = ColumnText(*q, 1);
        s.tool = ColumnText(*q, 2);
        s.state = ColumnText(*q, 3);
        s.attempt = q->getColumn(4).getInt();
        s.step_key = ColumnText(*q, 5);
        s.args = ColumnJson(*q, 6, "steps.args");
        s.args_fingerprint = ColumnText(*q, 7);
        s.result = ColumnJson(*q, 8, "steps.result");
        s.external_ref = ColumnText(*q, 9);
        s.error = ColumnText(*q, 10);
        s.comp_attempt = q->getColumn(11).getInt();
        s.comp_result = ColumnJson(*q, 12, "steps.comp_result");
        s.updated_ms = q->getColumn(13).getInt64();
        s.phase = ColumnJson(*q, 14, "steps.phase");
        rec.steps.push_back(std::move(s));
      }
    }
    tx.Commit();
    return rec;
  });
}

Result<std::vector<SagaSummary>> SqliteStore::ListSagas(const SagaFilter& filter) {
  IDEM_RETURN_IF_ERROR(ValidateSagaFilter(filter));
  return Guarded<Result<std::vector<SagaSummary>>>(
      "ListSagas", [&]() -> Result<std::vector<SagaSummary>> {
        // Only placeholders are appended; the values are bound. The owner's
        // expression is sagas_by_owner's (migration 14), so that index
        // serves it; an unfiltered listing walks sagas_by_created.
        std::string sql =
            std::string("SELECT ") + kSagaColumns + ", " + kSpecRefColumns + " FROM sagas";
        std::vector<std::string> text;  // bound in order after the states
        const char* glue = " WHERE ";
        auto where = [&](const std::string& cond) {
          sql += glue + cond;
          glue = " AND ";
        };
        if (!filter.states.empty()) {
          std::string in = "state IN (?";
          for (size_t i = 1; i < filter.states.size(); ++i) in += ", ?";
          where(in + ")");
        }
        if (filter.owner) {
          where("substr(intent_key, 1, instr(intent_key, ':') - 1) = ?");
          text.push_back(*filter.owner);
        }
        if (!filter.spec_name.empty()) {
          where("spec_name = ?");
          text.push_back(filter.spec_name);
        }
        if (!filter.key_contains.empty()) {
          where("instr(substr(intent_key, instr(intent_key, ':') + 1), ?) > 0");
          text.push_back(filter.key_contains);
        }
        if (filter.created_from_ms > 0) where("created_ms >= ?");
        if (filter.created_to_ms > 0) where("created_ms <= ?");
        sql += " ORDER BY created_ms DESC, saga_id ASC LIMIT ? OFFSET ?";

        std::lock_guard<std::mutex> lock(read_mu_);
        Stmt q = read_stmts_->Get(sql, /*cache=*/filter.states.size() <= kMaxCachedInList);
        int i = 1;
        for (const std::string& state : filter.states) q->bind(i++, state);
        for (const std::string& t : text) q->bind(i++, t);
        if (filter.created_from_ms > 0) q->bind(i++, static_cast<int64_t>(filter.created_from_ms));
        if (filter.created_to_ms > 0) q->bind(i++, static_cast<int64_t>(filter.created_to_ms));
        q->bind(i++, filter.limit);
        q->bind(i, filter.offset);
        std::vector<SagaSummary> out;
        while (q->executeStep()) {
          out.push_back(ReadSummary(*q));
          ReadSpecRef(*q, 7, &out.back());
        }
        return out;
      });
}

Result<StoreGauges> SqliteStore::ReadGauges(const GaugeQuery& query) {
  return Guarded<Result<StoreGauges>>("ReadGauges", [&]() -> Result<StoreGauges> {
    StoreGauges out;
    out.now_ms = clock_->NowMs();
    const int64_t created_before = query.age_ms > 0 ? out.now_ms - query.age_ms : INT64_MIN;
    std::lock_guard<std::mutex> lock(read_mu_);
    StatementCache& c = *read_stmts_;
    Tx tx(c, Tx::Mode::kDeferred);  // one snapshot for both statements
    const std::vector<std::string>& details = query.detail_states;
    if (!details.empty()) {
      // The counts the writes keep (migration 15: a row per state, however
      // many sagas have finished), then the details of the states asked for.
      Stmt q = c.Get("SELECT state, sagas FROM saga_state_counts WHERE sagas > 0");
      while (q->executeStep()) {
        out.by_state[q->getColumn(0).getString()].sagas = q->getColumn(1).getInt64();
      }
    }
    {
      // Only placeholders are appended, one per state; the values are bound.
      std::string sql =
          "SELECT state, COUNT(*), MIN(updated_ms), SUM(created_ms < ?),"
          " SUM(lease_expires_ms > 0 AND lease_expires_ms < ?) FROM sagas";
      if (!details.empty()) {
        sql += " WHERE state IN (?";
        for (size_t i = 1; i < details.size(); ++i) sql += ", ?";
        sql += ")";
      }
      sql += " GROUP BY state";
      Stmt q = c.Get(sql, /*cache=*/details.size() <= kMaxCachedInList);
      q->bind(1, created_before);
      q->bind(2, out.now_ms);
      int i = 3;
      for (const std::string& state : details) q->bind(i++, state);
      while (q->executeStep()) {
        StateGauges& g = out.by_state[q->getColumn(0).getString()];
        g.sagas = q->getColumn(1).getInt64();
        g.oldest_updated_ms = q->getColumn(2).getInt64();
        g.created_before = q->getColumn(3).getInt64();
        g.leases_expired = q->getColumn(4).getInt64();
      }
    }
    if (!query.waiting_state.empty()) {
      // From the waiting sagas (sagas_by_state_lease) to their steps (the
      // primary key): CROSS JOIN keeps that order, so the steps of the
      // finished sagas are never read.
      Stmt q = c.Get(
          "SELECT COUNT(*) FROM sagas s CROSS JOIN steps t ON t.saga_id = s.saga_id"
          " WHERE s.state = ?1 AND t.state = ?1");
      q->bind(1, query.waiting_state);
      if (q->executeStep()) out.waiting_steps = q->getColumn(0).getInt64();
    }
    tx.Commit();
    return out;
  });
}

Result<std::vector<JournalEntry>> SqliteStore::ReadJournal(const std::string& saga_id) {
  return Guarded<Result<std::vector<JournalEntry>>>(
      "ReadJournal " + Quote(saga_id), [&]() -> Result<std::vector<JournalEntry>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        StatementCache& c = *read_stmts_;
        Tx tx(c, Tx::Mode::kDeferred);
        if (!SagaExists(c, saga_id)) return SagaNotFound(saga_id);
        std::vector<JournalEntry> out;
        {
          Stmt q = c.Get(
              "SELECT seq, step_id, event, data, at_ms FROM journal"
              " WHERE saga_id = ? ORDER BY seq");
          q->bind(1, saga_id);
          while (q->executeStep()) {
            JournalEntry e;
            e.seq = q->getColumn(0).getInt64();
            e.saga_id = saga_id;
            e.step_id = ColumnText(*q, 1);
            e.event = ColumnText(*q, 2);
            e.data = ColumnJson(*q, 3, "journal.data");
            e.at_ms = q->getColumn(4).getInt64();
            out.push_back(std::move(e));
          }
        }
        tx.Commit();
        return out;
      });
}

Result<std::vector<EffectRecord>> SqliteStore::ListEffects(const std::string& saga_id) {
  return Guarded<Result<std::vector<EffectRecord>>>(
      "ListEffects " + Quote(saga_id), [&]() -> Result<std::vector<EffectRecord>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        StatementCache& c = *read_stmts_;
        Tx tx(c, Tx::Mode::kDeferred);
        if (!SagaExists(c, saga_id)) return SagaNotFound(saga_id);
        std::vector<EffectRecord> out;
        {
          // Effects are never updated or deleted, so rowid order is insertion
          // (commit) order.
          Stmt q = c.Get(
              "SELECT step_id, kind, tool, idempotency_key, result, external_ref,"
              " at_ms FROM effects WHERE saga_id = ? ORDER BY rowid");
          q->bind(1, saga_id);
          while (q->executeStep()) {
            EffectRecord f;
            f.saga_id = saga_id;
            f.step_id = ColumnText(*q, 0);
            f.kind = ColumnText(*q, 1);
            f.tool = ColumnText(*q, 2);
            f.idempotency_key = ColumnText(*q, 3);
            f.result = ColumnJson(*q, 4, "effects.result");
            f.external_ref = ColumnText(*q, 5);
            f.at_ms = q->getColumn(6).getInt64();
            out.push_back(std::move(f));
          }
        }
        tx.Commit();
        return out;
      });
}

}  // namespace idem::storage
