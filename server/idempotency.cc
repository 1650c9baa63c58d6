#include "server/idempotency.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <exception>
#include <utility>

#include <sqlite3.h>

#include "storage/sqlite_errors.h"

#include "common/json_util.h"
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

namespace idem::server {
namespace {

// One table; the claim token fences a holder whose claim was taken over.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS idempotency (
  scope        TEXT    NOT NULL,
  key          TEXT    NOT NULL,
  fingerprint  TEXT    NOT NULL,
  state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'done')),
  status       INTEGER NOT NULL DEFAULT 0,
  content_type TEXT    NOT NULL DEFAULT '',
  body         BLOB    NOT NULL DEFAULT x'',
  created_ms   INTEGER NOT NULL,
  claimed_ms   INTEGER NOT NULL,
  claim_token  TEXT    NOT NULL,
  PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idempotency_by_created ON idempotency (created_ms);
)sql";

struct SyncMode {
  const char* name;
  const char* pragma;
  int level;
};
constexpr std::array<SyncMode, 3> kSyncModes = {{
    {"NORMAL", "PRAGMA synchronous = NORMAL", 1},
    {"FULL", "PRAGMA synchronous = FULL", 2},
    {"EXTRA", "PRAGMA synchronous = EXTRA", 3},
}};

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string Quote(const std::string& s) { return "\"" + PrintableText(s) + "\""; }

using sqlite_errors::Guarded;

std::string ColumnBytes(SQLite::Statement& q, int index) {
  SQLite::Column c = q.getColumn(index);
  const void* data = c.getBlob();
  int n = c.getBytes();
  return data == nullptr || n <= 0 ? std::string() : std::string(static_cast<const char*>(data), n);
}

// A row whose first columns are fingerprint, state, status, content_type,
// body, created_ms.
IdempotencyRecord ReadRecord(SQLite::Statement& q) {
  IdempotencyRecord r;
  r.fingerprint = q.getColumn(0).getString();
  r.state = q.getColumn(1).getString();
  r.status = q.getColumn(2).getInt();
  r.content_type = q.getColumn(3).getString();
  r.body = ColumnBytes(q, 4);
  r.created_ms = q.getColumn(5).getInt64();
  return r;
}

void BindBytes(SQLite::Statement& st, int index, const std::string& bytes) {
  st.bind(index, bytes.data(), static_cast<int>(bytes.size()));
}

// ---- Requests ------------------------------------------------------------------

void Problem(IdempotentResponse& res, int status, const char* type, const std::string& title,
             const std::string& detail) {
  Json doc = {{"type", type}, {"title", title}, {"status", status}, {"detail", detail}};
  res = IdempotentResponse();
  res.status = status;
  res.content_type = "application/problem+json";
  res.body = doc.dump();
}

// The key from the header value: an RFC 8941 sf-string is unescaped, any
// other value is taken as sent. Every byte must be printable ASCII.
Result<std::string> ParseKey(const std::string& value) {
  std::string key;
  if (!value.empty() && value.front() == '"') {
    bool closed = false;
    for (size_t i = 1; i < value.size(); ++i) {
      char c = value[i];
      if (c == '\\') {
        if (i + 1 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
          return Status::InvalidArgument(
              "the Idempotency-Key is a malformed sf-string (bad escape)");
        }
        key.push_back(value[++i]);
      } else if (c == '"') {
        if (i + 1 != value.size()) {
          return Status::InvalidArgument(
              "the Idempotency-Key is a malformed sf-string (text after the closing quote)");
        }
        closed = true;
      } else {
        key.push_back(c);
      }
    }
    if (!closed) {
      return Status::InvalidArgument(
          "the Idempotency-Key is a malformed sf-string (no closing quote)");
    }
  } else {
    key = value;
  }
  if (key.empty()) return Status::InvalidArgument("the Idempotency-Key is empty");
  if (key.size() > kMaxIdempotencyKeyLength) {
    return Status::InvalidArgument("the Idempotency-Key is longer than " +
                                   std::to_string(kMaxIdempotencyKeyLength) + " characters");
  }
  for (char c : key) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      return Status::InvalidArgument(
          "the Idempotency-Key holds a control character or a byte outside printable ASCII");
    }
  }
  return key;
}

// Method, path, sorted query parameters and the body (canonical JSON when it
// parses, raw bytes otherwise).
std::string RequestFingerprint(const IdempotentRequest& req) {
  std::vector<std::pair<std::string, std::string>> params(req.params.begin(), req.params.end());
  std::sort(params.begin(), params.end());
  std::string text = req.method;
  text.append("\n").append(std::to_string(req.path.size())).append(":").append(req.path);
  text.append("\n");
  for (const auto& [k, v] : params) {  // length-prefixed: no two lists encode alike
    text.append(std::to_string(k.size())).append(":").append(k);
    text.append("=").append(std::to_string(v.size())).append(":").append(v).append("&");
  }
  text += "\n";
  Result<Json> doc = req.body.empty() ? Result<Json>(Status::InvalidArgument("empty"))
                                      : ParseJson(req.body, "body", 64);
  if (doc.ok()) {
    text += "json:" + CanonicalJson(*doc);
  } else {
    text += "raw:" + req.body;
  }
  return "sha256:" + Sha256Hex(text);
}

}  // namespace

// ---- Claims --------------------------------------------------------------------

struct IdempotencyLayer::Claim {
  enum class Kind { kClaimed, kInFlight, kMismatch, kReplay };
  Kind kind = Kind::kInFlight;
  std::string token;         // kClaimed: fences Complete and Release
  IdempotencyRecord stored;  // kReplay
};

IdempotencyLayer::IdempotencyLayer(std::unique_ptr<SQLite::Database> db, IdempotencyOptions options)
    : db_(std::move(db)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : SystemClock::Get()) {}

IdempotencyLayer::~IdempotencyLayer() = default;

Result<std::unique_ptr<IdempotencyLayer>> IdempotencyLayer::Open(const std::string& sqlite_path,
                                                                 IdempotencyOptions options) {
  const std::string op = "open idempotency store " + Quote(sqlite_path);
  if (sqlite_path.empty() || sqlite_path == ":memory:") {
    return Status::InvalidArgument(op + ": give a database file path");
  }
  if (options.lock_timeout_ms < 1) {
    return Status::InvalidArgument(op + ": lock_timeout_ms must be >= 1");
  }
  if (options.ttl_ms < options.lock_timeout_ms) {
    return Status::InvalidArgument(op + ": ttl_ms must be >= lock_timeout_ms");
  }
  if (options.retry_after_s < 0 || options.busy_timeout_ms < 0) {
    return Status::InvalidArgument(op + ": retry_after_s and busy_timeout_ms must be >= 0");
  }
  const SyncMode* sync = nullptr;
  for (const SyncMode& m : kSyncModes) {
    if (Upper(options.synchronous) == m.name) sync = &m;
  }
  if (sync == nullptr) {
    return Status::InvalidArgument(op + ": synchronous " + Quote(options.synchronous) +
                                   " is not one of NORMAL, FULL, EXTRA");
  }
  return Guarded<Result<std::unique_ptr<IdempotencyLayer>>>(
      op, [&]() -> Result<std::unique_ptr<IdempotencyLayer>> {
        auto db = std::make_unique<SQLite::Database>(
            sqlite_path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE | SQLite::OPEN_FULLMUTEX,
            options.busy_timeout_ms);
        std::string mode = db->execAndGet("PRAGMA journal_mode = WAL").getString();
        if (mode != "wal") {
          return Status::FailedPrecondition(op + ": journal_mode is " + Quote(mode) +
                                            ", not \"wal\"");
        }
        db->exec(sync->pragma);
        if (db->execAndGet("PRAGMA synchronous").getInt() != sync->level) {
          return Status::FailedPrecondition(op + ": SQLite refused synchronous " + sync->name);
        }
        SQLite::Transaction tx(*db, SQLite::TransactionBehavior::IMMEDIATE);
        db->exec(kSchema);
        tx.commit();
        return std::unique_ptr<IdempotencyLayer>(
            new IdempotencyLayer(std::move(db), std::move(options)));
      });
}

Result<IdempotencyLayer::Claim> IdempotencyLayer::TryClaim(const std::string& scope,
                                                           const std::string& key,
                                                           const std::string& fingerprint) {
  return Guarded<Result<Claim>>("claim idempotency key", [&]() -> Result<Claim> {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = clock_->NowMs();
    Claim claim;
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
      claim.kind = Claim::Kind::kClaimed;
      return claim;
    }
    SQLite::Statement q(*db_,
                        "SELECT fingerprint, state, status, content_type, body, created_ms,"
                        " claimed_ms FROM idempotency WHERE scope = ? AND key = ?");
    q.bind(1, scope);
    q.bind(2, key);
    if (!q.executeStep()) return Status::Internal("the conflicting idempotency row vanished");
    IdempotencyRecord r = ReadRecord(q);
    const int64_t claimed_ms = q.getColumn(6).getInt64();
    q.reset();

    const bool expired = r.state == "done" && now - r.created_ms >= options_.ttl_ms;
    const bool abandoned = r.state == "in_flight" && now - claimed_ms >= options_.lock_timeout_ms;
    if (expired || (abandoned && r.fingerprint == fingerprint)) {
      // An expired key starts a new request; an abandoned claim (a crashed
      // or hung holder) passes to this request, and the old token is fenced.
      SQLite::Statement up(*db_,
                           "UPDATE idempotency SET fingerprint = ?, state = 'in_flight',"
                           " status = 0, content_type = '', body = x'',"
                           " created_ms = CASE WHEN ? THEN ? ELSE created_ms END,"
                           " claimed_ms = ?, claim_token = ? WHERE scope = ? AND key = ?");
      up.bind(1, fingerprint);
      up.bind(2, expired ? 1 : 0);
      up.bind(3, static_cast<int64_t>(now));
      up.bind(4, static_cast<int64_t>(now));
      up.bind(5, claim.token);
      up.bind(6, scope);
      up.bind(7, key);
      up.exec();
      tx.commit();
      claim.kind = Claim::Kind::kClaimed;
      return claim;
    }
    tx.commit();
    claim.token.clear();
    if (r.fingerprint != fingerprint) {
      claim.kind = Claim::Kind::kMismatch;
    } else if (r.state == "done") {
      claim.kind = Claim::Kind::kReplay;
      claim.stored = std::move(r);
    } else {
      claim.kind = Claim::Kind::kInFlight;
    }
    return claim;
  });
}

Status IdempotencyLayer::Complete(const std::string& scope, const std::string& key,
                                  const std::string& token, const IdempotentResponse& res) {
  return Guarded<Status>("store idempotent response", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement up(*db_,
                         "UPDATE idempotency SET state = 'done', status = ?, content_type = ?,"
                         " body = ? WHERE scope = ? AND key = ? AND claim_token = ?"
                         " AND state = 'in_flight'");
    up.bind(1, res.status);
    up.bind(2, res.content_type);
    BindBytes(up, 3, res.body);
    up.bind(4, scope);
    up.bind(5, key);
    up.bind(6, token);
    if (up.exec() != 1) {
      return Status::Aborted("the claim on this key was taken over; the response is not stored");
    }
    return Status::Ok();
  });
}

Status IdempotencyLayer::Release(const std::string& scope, const std::string& key,
                                 const std::string& token) {
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

Result<IdempotencyRecord> IdempotencyLayer::Find(const std::string& scope_text,
                                                 const std::string& key) {
  return Guarded<Result<IdempotencyRecord>>(
      "read idempotency record", [&]() -> Result<IdempotencyRecord> {
        std::lock_guard<std::mutex> lock(mu_);
        SQLite::Statement q(*db_,
                            "SELECT fingerprint, state, status, content_type, body, created_ms"
                            " FROM idempotency WHERE scope = ? AND key = ?");
        q.bind(1, Sha256Hex(scope_text));
        q.bind(2, key);
        if (!q.executeStep()) return Status::NotFound("no idempotency record for this key");
        return ReadRecord(q);
      });
}

Result<int64_t> IdempotencyLayer::PurgeExpired() {
  return Guarded<Result<int64_t>>("purge idempotency records", [&]() -> Result<int64_t> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement del(*db_, "DELETE FROM idempotency WHERE state = 'done' AND created_ms <= ?");
    del.bind(1, static_cast<int64_t>(clock_->NowMs() - options_.ttl_ms));
    return static_cast<int64_t>(del.exec());
  });
}

// ---- Serving -------------------------------------------------------------------

httplib::Server::Handler IdempotencyLayer::Wrap(httplib::Server::Handler handler,
                                                WrapOptions options) {
  // A thin shim over Run: the handler writes the httplib response itself
  // (every header, a content provider), and Run sees its status,
  // Content-Type and body.
  return [this, handler = std::move(handler), options = std::move(options)](
             const httplib::Request& req, httplib::Response& res) {
    IdempotentRequest in;
    in.method = req.method;
    in.path = req.path;
    in.params.insert(req.params.begin(), req.params.end());
    const size_t count = req.get_header_value_count("Idempotency-Key");
    for (size_t i = 0; i < count; ++i) {
      in.keys.push_back(req.get_header_value("Idempotency-Key", i));
    }
    if (options.scope) {
      in.scope = options.scope(req);
    } else if (!options.scope_header.empty()) {
      in.scope = req.get_header_value(options.scope_header);
    }
    in.body = req.body;
    bool handled = false;  // the handler ran and returned: `res` is its answer
    IdempotentResponse out;
    Run(
        in,
        [&](IdempotentResponse& r) {
          handler(req, res);
          if (res.status == -1) res.status = 200;  // what httplib sends for an unset status
          handled = true;
          r.status = res.status;
          r.content_type = res.get_header_value("Content-Type");
          r.body = res.body;
        },
        options.key_required, options.released_statuses, out);
    if (handled) return;
    res = httplib::Response();
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k, v);
    if (out.content_type.empty()) {
      res.body = out.body;
    } else {
      res.set_content(out.body, out.content_type);
    }
  };
}

void IdempotencyLayer::Run(const IdempotentRequest& req,
                           const std::function<void(IdempotentResponse&)>& handler,
                           bool key_required, const std::vector<int>& released_statuses,
                           IdempotentResponse& res) {
  const size_t count = req.keys.size();
  if (count == 0) {
    if (!key_required) {
      handler(res);
      return;
    }
    Problem(res, 400, kProblemKeyMissing, "Idempotency-Key is missing",
            "this operation requires an Idempotency-Key header");
    return;
  }
  if (count > 1) {
    Problem(res, 400, kProblemKeyInvalid, "Idempotency-Key is invalid",
            "send exactly one Idempotency-Key header");
    return;
  }
  Result<std::string> key = ParseKey(req.keys.front());
  if (!key.ok()) {
    Problem(res, 400, kProblemKeyInvalid, "Idempotency-Key is invalid", key.status().message());
    return;
  }
  const std::string scope = Sha256Hex(req.scope);
  const std::string retry_after = std::to_string(options_.retry_after_s);

  Result<Claim> claim = TryClaim(scope, *key, RequestFingerprint(req));
  if (!claim.ok()) {
    Problem(res, 503, kProblemUnavailable, "Idempotency store unavailable",
            "the request was not processed; retry later");
    res.headers.emplace_back("Retry-After", retry_after);
    return;
  }
  switch (claim->kind) {
    case Claim::Kind::kMismatch:
      Problem(res, 422, kProblemKeyReused, "Idempotency-Key is already used",
              "this key was used with another request payload; use a new key for a new request");
      return;
    case Claim::Kind::kInFlight:
      Problem(res, 409, kProblemKeyInFlight, "A request is outstanding for this Idempotency-Key",
              "the first request with this key is still being processed; retry later");
      res.headers.emplace_back("Retry-After", retry_after);
      return;
    case Claim::Kind::kReplay: {
      const IdempotencyRecord& r = claim->stored;
      res = IdempotentResponse();
      res.status = r.status;
      res.content_type = r.content_type;
      res.body = r.body;
      res.headers.emplace_back("Idempotent-Replayed", "true");
      return;
    }
    case Claim::Kind::kClaimed:
      break;
  }

  // Execution begins: from here on the response is stored (the Stripe rule).
  try {
    handler(res);
  } catch (...) {
    Problem(res, 500, kProblemHandlerFailed, "The handler failed", "the request failed");
  }
  const auto& released = released_statuses;
  if (std::find(released.begin(), released.end(), res.status) != released.end()) {
    (void)Release(scope, *key, claim->token);  // a failed release expires with the lock timeout
    return;
  }
  // A failure here leaves the claim in flight: retries get 409 until the lock
  // timeout, never a second run before it. A fenced claim (taken over after
  // the lock timeout) keeps the newer holder's response.
  (void)Complete(scope, *key, claim->token, res);
}

}  // namespace idem::server
