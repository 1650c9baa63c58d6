#pragma once
// Helpers shared by idem's test binaries (library target idem_test_util,
// linked by every test): a temporary directory, stores on a fresh SQLite file
// or a fresh PostgreSQL database, assertions and gMock matchers for Status and
// Result<T>, and small file and network helpers.
//
// Everything lives in namespace idem::test (not `testing`, which inside
// namespace idem would hide ::testing).
//
//   test::TempDir dir("idem_engine");
//   ASSERT_OK_AND_ASSIGN(auto store, storage::OpenStore(dir.File("journal.db")));
//   ASSERT_OK(store->Commit(batch));
//   EXPECT_THAT(store->LoadSaga("nope"), test::StatusIs(Code::kNotFound, "nope"));
//   EXPECT_THAT(store->SchemaVersion(), 4);
//
// Thread safety: the free functions are safe to call from any thread; the
// classes are not shared between threads unless said so.

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "storage/pg_store.h"
#include "storage/sqlite_store.h"
#include "storage/store.h"

#include "common/status.h"

// ---- Status and Result -----------------------------------------------------

namespace idem {

// How googletest prints a Status or a Result in a failure message
// ("conflict: ...", "ok: <value>"). Found by argument-dependent lookup, so
// they live in namespace idem.
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
  if (!r.ok()) {
    *os << r.status().ToString();
    return;
  }
  *os << "ok: " << ::testing::PrintToString(*r);
}

namespace test {

/// The status of a Status (itself) or of a Result<T>.
inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

namespace internal {
/// The predicate-formatter behind ASSERT_OK and EXPECT_OK: fails with
/// "<expression> -> <status>".
template <typename T>
::testing::AssertionResult IsOkFormat(const char* expr_text, const T& value) {
  const Status& s = StatusOf(value);
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr_text << " -> " << s.ToString();
}
}  // namespace internal

/// Matches an OK Status or Result<T>; explains a failure with the status.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const Status& s = ::idem::test::StatusOf(arg);
  if (!s.ok()) *result_listener << "the status is " << s.ToString();
  return s.ok();
}

/// Matches a Status or Result<T> whose code is `code`.
MATCHER_P(StatusIs, code,
          std::string(negation ? "has no status " : "has status ") + ::idem::CodeName(code)) {
  const Status& s = ::idem::test::StatusOf(arg);
  *result_listener << "the status is " << s.ToString();
  return s.code() == code;
}

/// Matches a Status or Result<T> whose code is `code` and whose message
/// contains `substr`.
MATCHER_P2(StatusIs, code, substr,
           std::string(negation ? "has no status " : "has status ") + ::idem::CodeName(code) +
               " with a message containing \"" + std::string(substr) + "\"") {
  const Status& s = ::idem::test::StatusOf(arg);
  *result_listener << "the status is " << s.ToString();
  return s.code() == code && s.message().find(substr) != std::string::npos;
}

/// Matches an OK Result<T> whose value matches `matcher`.
MATCHER_P(IsOkAndHolds, matcher,
          negation ? "is not OK or holds a value that does not match"
                   : "is OK and holds a value that matches") {
  if (!arg.ok()) {
    *result_listener << "the status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

}  // namespace test
}  // namespace idem

/// Fails the test (ASSERT_: and returns) unless `expr`, a Status or a
/// Result<T>, is OK; the message is "<expr> -> <status>". Evaluates `expr`
/// once; more context can be streamed: `ASSERT_OK(s) << "after restart";`.
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::idem::test::internal::IsOkFormat, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::idem::test::internal::IsOkFormat, expr)

#define IDEM_TEST_CONCAT_INNER_(a, b) a##b
#define IDEM_TEST_CONCAT_(a, b) IDEM_TEST_CONCAT_INNER_(a, b)
#define IDEM_TEST_ASSERT_OK_AND_ASSIGN_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  ASSERT_OK(tmp);                                       \
  lhs = std::move(tmp).value()

/// Evaluates `expr` (a Result<T>), fails the test and returns unless it is
/// OK, then moves its value into `lhs`, which may declare a variable:
/// `ASSERT_OK_AND_ASSIGN(auto store, storage::OpenStore(path));`. Only in
/// functions returning void (like every ASSERT_).
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  IDEM_TEST_ASSERT_OK_AND_ASSIGN_(IDEM_TEST_CONCAT_(idem_test_result_, __LINE__), lhs, expr)

namespace idem::test {

// ---- Files and ports -------------------------------------------------------

/// A fresh directory under the system temp dir, named `<prefix>_XXXXXX`
/// (mkdtemp: unique across threads and processes), removed with everything in
/// it when the object goes, unless Keep() was called. If it cannot be created
/// the constructor adds a test failure and path() is empty.
/// Neither copyable nor movable.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "idem");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&&) = delete;
  TempDir& operator=(TempDir&&) = delete;

  /// The directory's absolute path.
  const std::string& path() const { return path_; }
  /// `path()/name`.
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  /// Leaves the tree in place when the object goes (to look at it after a
  /// failure).
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

/// The whole content of the file at `path`, or "" if it cannot be read.
std::string ReadFile(const std::string& path);

/// Starts `binary` with `args` (argv[0] is the binary itself): stdin from
/// /dev/null, stdout and stderr into the files `out` and `err`, and this
/// process's environment without its IDEM_* and TRAVEL_* variables (so a
/// test's settings cannot leak into the child), plus `extra_env`
/// ("NAME=value" each). Returns the child's pid, or -1 after adding a test
/// failure.
int SpawnProcess(const std::string& binary, const std::vector<std::string>& args,
                 const std::string& out, const std::string& err,
                 const std::vector<std::string>& extra_env = {});

/// A TCP port on 127.0.0.1 on which nothing listens (bound, then released).
/// Adds a test failure if no port can be bound.
int UnusedPort();

// ---- Stores ----------------------------------------------------------------

/// A SqliteStore on a fresh file in a TempDir of its own: the factory of the
/// Store conformance suite (tests/store_conformance.h), and a journal for any
/// test. Open() may be called again once the previous store is destroyed, to
/// see what survives a reopen. Destroy the stores before this object: it
/// removes the directory.
class SqliteTestStore {
 public:
  explicit SqliteTestStore(const std::string& file = "journal.db");

  /// A new store on the file, with `options` (their path is replaced).
  Result<std::unique_ptr<storage::Store>> Open(storage::SqliteOptions options = {});

  /// The database file.
  const std::string& path() const { return path_; }
  /// The directory the file is in (for files beside it).
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
  std::string path_;
};

/// The URL of the PostgreSQL test server that the ctest fixture `postgres`
/// started (read from the file it writes, IDEM_PG_URL_FILE at build time), or
/// from the environment variable IDEM_PG_TEST_URL when set (to run a binary
/// by hand against a server of one's own). FailedPrecondition, saying how to
/// get a server, when there is none.
Result<std::string> PgServerUrl();

/// The parts of postgresql://USER@HOST:PORT/DB that tests rewrite (to point a
/// store at another database or at a proxy).
struct PgUrlParts {
  std::string prefix;  ///< "postgresql://USER@"
  std::string host;
  int port = 0;
  std::string database;
  std::string Url() const { return prefix + host + ":" + std::to_string(port) + "/" + database; }
};

/// Splits a URL of the form above.
PgUrlParts SplitPgUrl(const std::string& url);

/// `prefix` followed by 16 random hex digits (thread-safe).
std::string RandomName(const std::string& prefix);

/// A fresh, empty database on the test server (CREATE DATABASE t_<random>),
/// dropped with any sessions still on it when the object goes. When there is
/// no server, or the database cannot be created, status() says why (and the
/// tests that use it fail saying so). Neither copyable nor movable.
class PgTestDatabase {
 public:
  PgTestDatabase();
  ~PgTestDatabase();
  PgTestDatabase(const PgTestDatabase&) = delete;
  PgTestDatabase& operator=(const PgTestDatabase&) = delete;
  PgTestDatabase(PgTestDatabase&&) = delete;
  PgTestDatabase& operator=(PgTestDatabase&&) = delete;

  /// OK, or why there is no database.
  const Status& status() const { return status_; }
  /// The database's URL.
  std::string Url() const { return Parts().Url(); }
  /// The URL parts, for tests that point the store elsewhere (a proxy).
  PgUrlParts Parts() const {
    PgUrlParts p = server_;
    p.database = name_;
    return p;
  }

 private:
  Status status_;
  PgUrlParts server_;
  std::string name_;
};

/// A PgStore on a fresh PgTestDatabase: the conformance suite's factory on
/// PostgreSQL. Open() may be called again once the previous store is
/// destroyed; the database is dropped when the object goes.
class PgTestStore {
 public:
  /// A new store on the database, with `options` (their url is replaced);
  /// the database's status when there is none.
  Result<std::unique_ptr<storage::Store>> Open(storage::PgOptions options = {});

  const PgTestDatabase& db() const { return db_; }

 private:
  PgTestDatabase db_;
};

}  // namespace idem::test
