#pragma once
// SpecRegistry: named, versioned saga specs the server's callers submit by
// name. Internal to the server (server/server.h is the module's API).
//
// Versions are kept: a version, once stored, never changes. Putting a
// version that exists with the same canonical document is a no-op (created
// false); with another document, kConflict.
//
// Storage: the table `server_specs` in the server's SQLite state file (WAL).
// Thread safety: every method may be called from several threads at once.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/json_util.h"
#include "common/status.h"

namespace SQLite {  // NOLINT(readability-identifier-naming): SQLiteCpp's name
class Database;
}  // namespace SQLite

namespace idem::server {

struct SpecVersion {
  std::string name;
  int version = 0;
  Json doc;
  std::string fingerprint;  ///< Fingerprint(doc)
  int64_t created_ms = 0;
  std::string created_by;
};

struct SpecPut {
  SpecVersion version;
  bool created = false;
};

class SpecRegistry {
 public:
  /// Opens (creating) the registry in the SQLite file at `path`. `clock` is
  /// not owned. kInternal / kUnavailable on SQLite failures.
  static Result<std::unique_ptr<SpecRegistry>> Open(const std::string& path, Clock* clock);
  ~SpecRegistry();

  /// Stores `doc` as `name` version `version`. kConflict: that version
  /// exists with another document.
  Result<SpecPut> Put(const std::string& name, int version, const Json& doc, const std::string& by);
  /// `version` 0: the latest. kNotFound when absent.
  Result<SpecVersion> Get(const std::string& name, int version);
  /// Every version of every spec, by name then version.
  Result<std::vector<SpecVersion>> List();

 private:
  SpecRegistry(std::unique_ptr<SQLite::Database> db, Clock* clock);
  std::mutex mu_;  // guards db_
  std::unique_ptr<SQLite::Database> db_;
  Clock* clock_;
};

}  // namespace idem::server
