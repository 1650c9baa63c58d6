// The WAL-gathering VFS (storage/sqlite_wal_vfs.h) on real files: a commit's
// frames reach the file system in one write, every reader (the same process,
// another connection, another process) sees exactly what was committed, a
// transaction larger than the gathering bound stays whole, and a process
// SIGKILLed while committing leaves a database that holds every commit it
// reported and passes SQLite's integrity check.

#include "storage/sqlite_wal_vfs.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "tests/test_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace idem::storage {
namespace {

// ---- a VFS under the gathering one that counts the writes to -wal files ----

std::atomic<int64_t> g_wal_writes{0};
sqlite3_vfs* g_base = nullptr;
sqlite3_vfs g_counting;

struct CountingFile {
  sqlite3_file base;
  sqlite3_file* real;
  bool wal;
};
sqlite3_file* RealOf(sqlite3_file* f) { return reinterpret_cast<CountingFile*>(f)->real; }

sqlite3_io_methods g_methods;

int CountingOpen(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out) {
  auto* cf = reinterpret_cast<CountingFile*>(f);
  cf->base.pMethods = nullptr;
  cf->real = reinterpret_cast<sqlite3_file*>(cf + 1);
  cf->wal = (flags & SQLITE_OPEN_WAL) != 0;
  int rc = g_base->xOpen(g_base, name, cf->real, flags, out);
  if (cf->real->pMethods == nullptr) return rc;
  // The real file's methods, with xWrite counted and every other call
  // forwarded: copy the table once, then point each entry at a forwarder.
  static bool made = false;
  if (!made) {
    made = true;
    g_methods = *cf->real->pMethods;
    g_methods.iVersion = cf->real->pMethods->iVersion;
    g_methods.xClose = [](sqlite3_file* f) { return RealOf(f)->pMethods->xClose(RealOf(f)); };
    g_methods.xRead = [](sqlite3_file* f, void* b, int n, sqlite3_int64 o) {
      return RealOf(f)->pMethods->xRead(RealOf(f), b, n, o);
    };
    g_methods.xWrite = [](sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
      if (reinterpret_cast<CountingFile*>(f)->wal) g_wal_writes.fetch_add(1);
      return RealOf(f)->pMethods->xWrite(RealOf(f), b, n, o);
    };
    g_methods.xTruncate = [](sqlite3_file* f, sqlite3_int64 s) {
      return RealOf(f)->pMethods->xTruncate(RealOf(f), s);
    };
    g_methods.xSync = [](sqlite3_file* f, int fl) {
      return RealOf(f)->pMethods->xSync(RealOf(f), fl);
    };
    g_methods.xFileSize = [](sqlite3_file* f, sqlite3_int64* s) {
      return RealOf(f)->pMethods->xFileSize(RealOf(f), s);
    };
    g_methods.xLock = [](sqlite3_file* f, int l) {
      return RealOf(f)->pMethods->xLock(RealOf(f), l);
    };
    g_methods.xUnlock = [](sqlite3_file* f, int l) {
      return RealOf(f)->pMethods->xUnlock(RealOf(f), l);
    };
    g_methods.xCheckReservedLock = [](sqlite3_file* f, int* o) {
      return RealOf(f)->pMethods->xCheckReservedLock(RealOf(f), o);
    };
    g_methods.xFileControl = [](sqlite3_file* f, int op, void* a) {
      return RealOf(f)->pMethods->xFileControl(RealOf(f), op, a);
    };
    g_methods.xSectorSize = [](sqlite3_file* f) {
      return RealOf(f)->pMethods->xSectorSize(RealOf(f));
    };
    g_methods.xDeviceCharacteristics = [](sqlite3_file* f) {
      return RealOf(f)->pMethods->xDeviceCharacteristics(RealOf(f));
    };
    g_methods.xShmMap = [](sqlite3_file* f, int p, int s, int e, void volatile** pp) {
      return RealOf(f)->pMethods->xShmMap(RealOf(f), p, s, e, pp);
    };
    g_methods.xShmLock = [](sqlite3_file* f, int o, int n, int fl) {
      return RealOf(f)->pMethods->xShmLock(RealOf(f), o, n, fl);
    };
    g_methods.xShmBarrier = [](sqlite3_file* f) { RealOf(f)->pMethods->xShmBarrier(RealOf(f)); };
    g_methods.xShmUnmap = [](sqlite3_file* f, int d) {
      return RealOf(f)->pMethods->xShmUnmap(RealOf(f), d);
    };
    g_methods.xFetch = [](sqlite3_file* f, sqlite3_int64 o, int n, void** pp) {
      return RealOf(f)->pMethods->xFetch(RealOf(f), o, n, pp);
    };
    g_methods.xUnfetch = [](sqlite3_file* f, sqlite3_int64 o, void* p) {
      return RealOf(f)->pMethods->xUnfetch(RealOf(f), o, p);
    };
  }
  cf->base.pMethods = &g_methods;
  return rc;
}

// Registers the counting VFS as the default before the gathering VFS wraps
// the default (its first use), so that the gathering VFS writes through it.
class CountingEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    sqlite3_initialize();
    g_base = sqlite3_vfs_find(nullptr);
    std::memset(&g_counting, 0, sizeof(g_counting));
    g_counting.iVersion = 2;
    g_counting.zName = "idem-test-counting";
    g_counting.szOsFile = static_cast<int>(sizeof(CountingFile)) + g_base->szOsFile;
    g_counting.mxPathname = g_base->mxPathname;
    g_counting.xOpen = CountingOpen;
    // The rest forward to the base VFS, with its own pointer.
    g_counting.xDelete = [](sqlite3_vfs*, const char* n, int s) {
      return g_base->xDelete(g_base, n, s);
    };
    g_counting.xAccess = [](sqlite3_vfs*, const char* n, int f, int* o) {
      return g_base->xAccess(g_base, n, f, o);
    };
    g_counting.xFullPathname = [](sqlite3_vfs*, const char* n, int k, char* o) {
      return g_base->xFullPathname(g_base, n, k, o);
    };
    g_counting.xDlOpen = [](sqlite3_vfs*, const char* n) { return g_base->xDlOpen(g_base, n); };
    g_counting.xDlError = [](sqlite3_vfs*, int n, char* m) { g_base->xDlError(g_base, n, m); };
    g_counting.xDlSym = [](sqlite3_vfs*, void* h, const char* s) {
      return g_base->xDlSym(g_base, h, s);
    };
    g_counting.xDlClose = [](sqlite3_vfs*, void* h) { g_base->xDlClose(g_base, h); };
    g_counting.xRandomness = [](sqlite3_vfs*, int n, char* o) {
      return g_base->xRandomness(g_base, n, o);
    };
    g_counting.xSleep = [](sqlite3_vfs*, int us) { return g_base->xSleep(g_base, us); };
    g_counting.xCurrentTime = [](sqlite3_vfs*, double* o) {
      return g_base->xCurrentTime(g_base, o);
    };
    g_counting.xGetLastError = [](sqlite3_vfs*, int n, char* o) {
      return g_base->xGetLastError(g_base, n, o);
    };
    g_counting.xCurrentTimeInt64 = [](sqlite3_vfs*, sqlite3_int64* o) {
      return g_base->xCurrentTimeInt64(g_base, o);
    };
    sqlite3_vfs_register(&g_counting, /*makeDflt=*/1);
    ASSERT_STREQ(WalGatheringVfsName(), "idem-wal-gather");
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new CountingEnvironment);

// ---- helpers ---------------------------------------------------------------

sqlite3* OpenDb(const std::string& path, const char* vfs) {
  sqlite3* db = nullptr;
  EXPECT_EQ(
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, vfs),
      SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  return db;
}

void Exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  ASSERT_EQ(rc, SQLITE_OK) << sql << ": " << (err != nullptr ? err : "");
  sqlite3_free(err);
}

int64_t One(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  int64_t v = -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

std::string Text(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  std::string v;
  if (sqlite3_step(st) == SQLITE_ROW) v = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return v;
}

sqlite3* OpenWal(const std::string& path) {
  sqlite3* db = OpenDb(path, WalGatheringVfsName());
  Exec(db, "PRAGMA journal_mode = WAL");
  Exec(db, "PRAGMA synchronous = FULL");
  return db;
}

// ---- tests -----------------------------------------------------------------

TEST(WalGatheringVfs, ACommitOfManyPagesIsOneWrite) {
  test::TempDir dir("idem_walvfs");
  sqlite3* db = OpenWal(dir.File("a.db"));
  Exec(db, "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)");
  Exec(db, "CREATE INDEX t_v ON t (v)");
  Exec(db, "INSERT INTO t (v) VALUES ('x')");
  Exec(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  // The WAL starts again: its header is written (and synced) on its own.
  Exec(db, "INSERT INTO t (v) VALUES ('y')");
  const std::string wal = dir.File("a.db-wal");
  const auto size_before = std::filesystem::file_size(wal);
  const int64_t before = g_wal_writes.load();
  // One transaction touching a dozen pages (table and index), well under
  // one write call's bound.
  Exec(db, "BEGIN IMMEDIATE");
  for (int i = 0; i < 24; ++i) {
    Exec(db, "INSERT INTO t (v) VALUES (printf('%04d', " + std::to_string(i) +
                 ") || hex(randomblob(400)))");
  }
  Exec(db, "COMMIT");
  const int64_t writes = g_wal_writes.load() - before;
  const int64_t frames = static_cast<int64_t>(std::filesystem::file_size(wal) - size_before) /
                         (One(db, "PRAGMA page_size") + 24);
  EXPECT_EQ(One(db, "SELECT count(*) FROM t"), 26);
  // SQLite alone writes each frame's header and page with a call each.
  EXPECT_GE(frames, 8);
  EXPECT_EQ(writes, 1) << "the commit's " << frames << " frames reach the file in one write";
  sqlite3_close(db);
}

TEST(WalGatheringVfs, ReadersSeeEveryCommitAtOnce) {
  test::TempDir dir("idem_walvfs");
  sqlite3* w = OpenWal(dir.File("b.db"));
  Exec(w, "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)");
  sqlite3* r = OpenDb(dir.File("b.db"), WalGatheringVfsName());  // another connection
  sqlite3* plain = OpenDb(dir.File("b.db"), nullptr);            // another VFS
  for (int i = 1; i <= 300; ++i) {
    Exec(w, "INSERT INTO t (k, v) VALUES (" + std::to_string(i) + ", hex(randomblob(" +
                std::to_string(50 * (i % 40)) + ")))");
    ASSERT_EQ(One(r, "SELECT max(k) FROM t"), i);
    ASSERT_EQ(One(plain, "SELECT count(*) FROM t"), i);
    // The writer reads its own pages back (from the WAL) too.
    ASSERT_EQ(One(w, "SELECT sum(length(v)) FROM t"), One(r, "SELECT sum(length(v)) FROM t"));
  }
  // A checkpoint in the middle, and the WAL restarting from its start.
  Exec(w, "PRAGMA wal_checkpoint(TRUNCATE)");
  Exec(w, "INSERT INTO t (k, v) VALUES (1000, 'after')");
  EXPECT_EQ(Text(plain, "SELECT v FROM t WHERE k = 1000"), "after");
  EXPECT_EQ(Text(r, "PRAGMA integrity_check"), "ok");
  sqlite3_close(plain);
  sqlite3_close(r);
  sqlite3_close(w);
}

TEST(WalGatheringVfs, ATransactionLargerThanTheBoundStaysWhole) {
  test::TempDir dir("idem_walvfs");
  sqlite3* w = OpenWal(dir.File("c.db"));
  Exec(w, "PRAGMA cache_size = 50");  // spills frames before COMMIT
  Exec(w, "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)");
  // About 3x the gathering bound in one transaction, read back within it.
  const int rows = static_cast<int>(3 * kMaxGatheredBytes / 4096);
  Exec(w, "BEGIN IMMEDIATE");
  for (int i = 0; i < rows; ++i) {
    Exec(w, "INSERT INTO t (k, v) VALUES (" + std::to_string(i) + ", randomblob(4000))");
  }
  EXPECT_EQ(One(w, "SELECT count(*) FROM t"), rows);
  Exec(w, "UPDATE t SET v = zeroblob(4000) WHERE k % 7 = 0");  // rewrites spilled frames
  Exec(w, "COMMIT");
  sqlite3* plain = OpenDb(dir.File("c.db"), nullptr);
  EXPECT_EQ(One(plain, "SELECT count(*) FROM t"), rows);
  EXPECT_EQ(One(plain, "SELECT count(*) FROM t WHERE v = zeroblob(4000)"), (rows + 6) / 7);
  EXPECT_EQ(Text(plain, "PRAGMA integrity_check"), "ok");
  sqlite3_close(plain);
  sqlite3_close(w);
}

// A child commits numbered transactions and reports each one after COMMIT
// returned; it is SIGKILLed mid-stream. Every reported commit is in the
// database, the database is whole, and no transaction is half there.
TEST(WalGatheringVfs, AKilledWriterLosesNoReportedCommit) {
  test::TempDir dir("idem_walvfs");
  const std::string path = dir.File("d.db");
  {
    sqlite3* db = OpenWal(path);
    Exec(db, "CREATE TABLE t (n INTEGER, part INTEGER, v BLOB, PRIMARY KEY (n, part))");
    sqlite3_close(db);
  }
  for (int round = 0; round < 5; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      sqlite3* db = OpenWal(path);
      int64_t n = One(db, "SELECT coalesce(max(n), 0) FROM t");
      for (;;) {
        ++n;
        // Each transaction: 10 rows of varying size, all or none.
        std::string sql = "BEGIN IMMEDIATE;";
        for (int part = 0; part < 10; ++part) {
          sql += "INSERT INTO t VALUES (" + std::to_string(n) + ", " + std::to_string(part) +
                 ", randomblob(" + std::to_string(100 + (n * 37 + part * 211) % 3000) + "));";
        }
        sql += "COMMIT;";
        if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) _exit(3);
        if (write(fds[1], &n, sizeof(n)) != sizeof(n)) _exit(4);
      }
    }
    close(fds[1]);
    // Once it has committed, let it go on for a while, then kill it
    // without warning.
    int64_t reported = 0, got = 0;
    if (read(fds[0], &got, sizeof(got)) == sizeof(got)) reported = got;
    usleep(100'000 + round * 50'000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "round " << round << ": the child exited by itself";
    while (read(fds[0], &got, sizeof(got)) == sizeof(got)) reported = got;
    close(fds[0]);
    ASSERT_GT(reported, 0) << "round " << round << ": the child committed nothing";
    sqlite3* db = OpenDb(path, nullptr);
    EXPECT_EQ(Text(db, "PRAGMA integrity_check"), "ok");
    EXPECT_GE(One(db, "SELECT max(n) FROM t"), reported) << "round " << round;
    EXPECT_EQ(One(db, "SELECT count(*) FROM (SELECT n FROM t GROUP BY n HAVING count(*) != 10)"), 0)
        << "round " << round << ": a transaction is half there";
    sqlite3_close(db);
  }
}

}  // namespace
}  // namespace idem::storage
