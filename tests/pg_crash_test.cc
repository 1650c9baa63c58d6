// A COMMIT cut by a PostgreSQL crash, on a server of this test's own
// (scripts/pg-test-server.sh on a private port: the crash would break every
// other test's connections on the shared one).
//
// PostgreSQL logs a transaction's id with its first WAL record, and that
// record may still be in memory when the server crashes: crash recovery then
// hands the same id to a new transaction, and txid_status(id) answers that
// transaction's outcome. The store must not take such a "committed" for its
// own lost COMMIT (storage/pg_store.cc, ResolveCommit): the batch would be
// reported durable and be gone, as the step effect that multi_worker_restart
// once lost was (899 effect rows for 900 steps).

#include <cstdlib>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "storage/pg_store.h"
#include "tests/test_util.h"

#include <libpq-fe.h>

namespace idem::storage {
namespace {

const std::string kScript = std::string(IDEM_SOURCE_DIR) + "/scripts/pg-test-server.sh";

/// The private server: started in the constructor, stopped (its directory
/// removed) in the destructor.
class PrivateServer {
 public:
  explicit PrivateServer(const std::string& dir) : dir_(dir) {
    ok_ = Script("start");
    if (ok_) url_ = test::ReadFile(dir_ + "/url");
    while (!url_.empty() && (url_.back() == '\n' || url_.back() == ' ')) url_.pop_back();
    ok_ = ok_ && !url_.empty();
  }
  ~PrivateServer() { Script("stop"); }
  PrivateServer(const PrivateServer&) = delete;
  PrivateServer& operator=(const PrivateServer&) = delete;

  bool ok() const { return ok_; }
  const std::string& url() const { return url_; }
  /// pg_ctl restart -m immediate: a crash, then crash recovery.
  bool Crash() { return Script("restart"); }

 private:
  bool Script(const std::string& verb) {
    const std::string cmd =
        "bash '" + kScript + "' " + verb + " '" + dir_ + "' >'" + dir_ + "." + verb + ".log' 2>&1";
    return std::system(cmd.c_str()) == 0;
  }

  std::string dir_;
  std::string url_;
  bool ok_ = false;
};

/// One statement on a connection of its own; its first value, or "" (and
/// `error` says why).
std::string Scalar(const std::string& url, const std::string& sql, std::string* error) {
  PGconn* c = PQconnectdb(url.c_str());
  std::string out;
  if (PQstatus(c) != CONNECTION_OK) {
    *error = PQerrorMessage(c);
  } else {
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) {
      out = PQgetvalue(r, 0, 0);
    } else {
      *error = PQresultErrorMessage(r);
    }
    PQclear(r);
  }
  PQfinish(c);
  return out;
}

NewSaga Saga(const std::string& saga_id) {
  NewSaga s;
  s.saga_id = saga_id;
  s.intent_key = "intent-" + saga_id;
  s.spec_name = "trip";
  s.spec = Json{{"name", "trip"}};
  s.input = Json::object();
  s.fingerprint = "fp-" + saga_id;
  s.state = "pending";
  s.created_ms = 1000;
  NewStep step;
  step.step_id = "step0";
  step.tool = "flights.reserve";
  step.step_key = saga_id + "/step0";
  step.state = "planned";
  s.steps.push_back(step);
  JournalEntry created;
  created.saga_id = saga_id;
  created.event = "saga_created";
  created.at_ms = 1000;
  s.journal.push_back(created);
  return s;
}

// The step's outcome and its effect, as a drive commits them.
WriteBatch Batch(const std::string& saga_id) {
  WriteBatch b;
  b.saga_id = saga_id;
  b.saga_state = "running";
  JournalEntry e;
  e.saga_id = saga_id;
  e.step_id = "step0";
  e.event = "succeeded";
  e.data = Json{{"attempt", 1}};
  e.at_ms = 2000;
  b.journal.push_back(e);
  EffectRecord f;
  f.saga_id = saga_id;
  f.step_id = "step0";
  f.kind = "action";
  f.tool = "flights.reserve";
  f.idempotency_key = saga_id + "/step0";
  f.result = Json{{"reservation_id", "r-1"}};
  f.at_ms = 2000;
  b.effects = {f};
  return b;
}

TEST(PgCrashTest, ACommitCutByACrashIsNotTakenAsDoneByTheTransactionThatReusedItsId) {
  test::TempDir tmp("idem-pg-crash");
  chmod(tmp.path().c_str(), 0755);  // the server runs as `postgres` when we are root
  PrivateServer server(tmp.File("pg"));
  ASSERT_TRUE(server.ok()) << "the private PostgreSQL server did not start (see " << tmp.path()
                           << "/pg.start.log)";
  std::string error;
  // The WAL writer flushes every 10 s at most: the batch's records stay in
  // memory until the crash, as they would with a busy server's timing.
  Scalar(server.url(), "ALTER SYSTEM SET wal_writer_delay = '10s'", &error);
  ASSERT_EQ("t", Scalar(server.url(), "SELECT pg_reload_conf()", &error)) << error;

  bool armed = false;
  bool crashed = false;
  std::string lost_xid, reused_by;
  PgOptions options;
  options.url = server.url();
  options.group_commit = false;
  options.resolve_timeout_ms = 5000;
  options.before_commit_hook = [&](int pid) {
    if (!armed) return;
    armed = false;
    std::string e;
    lost_xid =
        Scalar(server.url(),
               "SELECT backend_xid FROM pg_stat_activity WHERE pid = " + std::to_string(pid), &e);
    crashed = server.Crash();
    // New transactions after recovery, until one is given the lost id.
    for (int i = 0; i < 50 && !lost_xid.empty(); ++i) {
      std::string xid = Scalar(server.url(), "SELECT txid_current() & 4294967295", &e);
      if (xid == lost_xid) {
        reused_by = xid;
        break;
      }
    }
  };
  Result<std::unique_ptr<PgStore>> store = PgStore::Open(options);
  ASSERT_OK(store);
  ASSERT_OK((*store)->CreateIntent(Saga("saga-1")));

  armed = true;
  Status cut = (*store)->Commit(Batch("saga-1"));
  ASSERT_TRUE(crashed) << "the server did not restart (see " << tmp.path() << "/pg.restart.log)";
  ASSERT_FALSE(lost_xid.empty()) << "the transaction had no id before COMMIT";
  ASSERT_EQ(lost_xid, reused_by) << "no transaction after the crash was given id " << lost_xid
                                 << ": the batch's WAL reached the disk, nothing to test";

  // Nothing of the batch is there, and the store does not say it is.
  EXPECT_EQ(Code::kUnavailable, cut.code()) << cut.ToString();
  EXPECT_NE(std::string::npos, cut.message().find("crash recovery")) << cut.message();
  ASSERT_OK_AND_ASSIGN(auto effects, (*store)->ListEffects("saga-1"));
  EXPECT_TRUE(effects.empty());
  ASSERT_OK_AND_ASSIGN(auto rec, (*store)->LoadSaga("saga-1"));
  EXPECT_EQ("pending", rec.summary.state);
  EXPECT_EQ(1, (*store)->Stats().unresolved);

  // The caller retries (a drive reloads the saga and runs the step again
  // under its key): written once.
  ASSERT_OK((*store)->Commit(Batch("saga-1")));
  ASSERT_OK_AND_ASSIGN(effects, (*store)->ListEffects("saga-1"));
  EXPECT_EQ(1u, effects.size());
}

}  // namespace
}  // namespace idem::storage
