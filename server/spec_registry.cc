#include "server/spec_registry.h"

#include <exception>
#include <utility>

#include <sqlite3.h>

#include "storage/sqlite_errors.h"

#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

namespace idem::server {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS server_specs (
  name        TEXT    NOT NULL,
  version     INTEGER NOT NULL,
  doc         TEXT    NOT NULL,
  fingerprint TEXT    NOT NULL,
  created_ms  INTEGER NOT NULL,
  created_by  TEXT    NOT NULL,
  PRIMARY KEY (name, version)
);
)sql";

using sqlite_errors::Guarded;

SpecVersion Row(SQLite::Statement& q) {
  SpecVersion v;
  v.name = q.getColumn(0).getString();
  v.version = q.getColumn(1).getInt();
  v.doc = Json::parse(q.getColumn(2).getString());
  v.fingerprint = q.getColumn(3).getString();
  v.created_ms = q.getColumn(4).getInt64();
  v.created_by = q.getColumn(5).getString();
  return v;
}

constexpr const char* kColumns = "SELECT name, version, doc, fingerprint, created_ms, created_by";

}  // namespace

SpecRegistry::SpecRegistry(std::unique_ptr<SQLite::Database> db, Clock* clock)
    : db_(std::move(db)), clock_(clock) {}

SpecRegistry::~SpecRegistry() = default;

Result<std::unique_ptr<SpecRegistry>> SpecRegistry::Open(const std::string& path, Clock* clock) {
  return Guarded<Result<std::unique_ptr<SpecRegistry>>>("spec registry", [&]() {
    auto db =
        std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db->setBusyTimeout(5'000);
    db->exec("PRAGMA journal_mode = WAL");
    db->exec("PRAGMA synchronous = FULL");
    db->exec(kSchema);
    return Result<std::unique_ptr<SpecRegistry>>(
        std::unique_ptr<SpecRegistry>(new SpecRegistry(std::move(db), clock)));
  });
}

Result<SpecPut> SpecRegistry::Put(const std::string& name, int version, const Json& doc,
                                  const std::string& by) {
  std::lock_guard<std::mutex> lock(mu_);
  return Guarded<Result<SpecPut>>("spec registry", [&]() -> Result<SpecPut> {
    SQLite::Transaction tx(*db_);
    SQLite::Statement q(
        *db_, std::string(kColumns) + " FROM server_specs WHERE name = ? AND version = ?");
    q.bind(1, name);
    q.bind(2, version);
    const std::string fp = Fingerprint(doc);
    if (q.executeStep()) {
      SpecVersion v = Row(q);
      if (v.fingerprint != fp) {
        return Status::Conflict("spec " + name + " version " + std::to_string(version) +
                                " exists with other content; versions never change (use a "
                                "new version)");
      }
      return SpecPut{std::move(v), false};
    }
    SpecVersion v{name, version, doc, fp, clock_->NowMs(), by};
    SQLite::Statement ins(*db_,
                          "INSERT INTO server_specs (name, version, doc, fingerprint, created_ms,"
                          " created_by) VALUES (?, ?, ?, ?, ?, ?)");
    ins.bind(1, name);
    ins.bind(2, version);
    ins.bind(3, CanonicalJson(doc));
    ins.bind(4, fp);
    ins.bind(5, static_cast<int64_t>(v.created_ms));
    ins.bind(6, by);
    ins.exec();
    tx.commit();
    return SpecPut{std::move(v), true};
  });
}

Result<SpecVersion> SpecRegistry::Get(const std::string& name, int version) {
  std::lock_guard<std::mutex> lock(mu_);
  return Guarded<Result<SpecVersion>>("spec registry", [&]() -> Result<SpecVersion> {
    std::string sql = std::string(kColumns) + " FROM server_specs WHERE name = ?" +
                      (version > 0 ? " AND version = ?" : " ORDER BY version DESC LIMIT 1");
    SQLite::Statement q(*db_, sql);
    q.bind(1, name);
    if (version > 0) q.bind(2, version);
    if (!q.executeStep()) {
      return Status::NotFound("no spec " + name +
                              (version > 0 ? " version " + std::to_string(version) : ""));
    }
    return Row(q);
  });
}

Result<std::vector<SpecVersion>> SpecRegistry::List() {
  std::lock_guard<std::mutex> lock(mu_);
  return Guarded<Result<std::vector<SpecVersion>>>(
      "spec registry", [&]() -> Result<std::vector<SpecVersion>> {
        SQLite::Statement q(*db_,
                            std::string(kColumns) + " FROM server_specs ORDER BY name, version");
        std::vector<SpecVersion> out;
        while (q.executeStep()) out.push_back(Row(q));
        return out;
      });
}

}  // namespace idem::server
