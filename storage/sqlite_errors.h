#pragma once
// SQLite errors as Status, for every class that keeps its data in SQLite
// (SqliteStore, the server's idempotency records and spec registry): no
// exception from SQLiteCpp, a stored value that does not decode, or the
// standard library leaves their methods.

#include <stdexcept>
#include <string>

#include <sqlite3.h>

#include "common/status.h"
#include <SQLiteCpp/Exception.h>

namespace idem::sqlite_errors {

/// Stored data that cannot be decoded (a corrupt JSON column): thrown inside
/// a Guarded body and turned into kInternal at its edge.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline int PrimaryCode(const SQLite::Exception& e) { return e.getErrorCode() & 0xff; }

inline bool IsConstraint(const SQLite::Exception& e) { return PrimaryCode(e) == SQLITE_CONSTRAINT; }

/// Busy or locked: kUnavailable (try again); anything else kInternal, with
/// SQLite's extended code.
inline Status FromSqlite(const std::string& op, const SQLite::Exception& e) {
  int code = PrimaryCode(e);
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return Status::Unavailable(op + ": database is busy (" + e.what() + "); retry later");
  }
  return Status::Internal(op + ": sqlite error " + std::to_string(e.getExtendedErrorCode()) + ": " +
                          e.what());
}

/// Runs `body` and turns any exception into a Status (`R` is Status or a
/// Result), naming `op`.
template <typename R, typename F>
R Guarded(const std::string& op, F&& body) {
  try {
    return body();
  } catch (const SQLite::Exception& e) {
    return FromSqlite(op, e);
  } catch (const DataError& e) {
    return Status::Internal(op + ": " + e.what());
  } catch (const std::exception& e) {
    return Status::Internal(op + ": unexpected error: " + e.what());
  }
}

}  // namespace idem::sqlite_errors
