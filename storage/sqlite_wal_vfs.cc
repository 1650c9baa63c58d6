#include "storage/sqlite_wal_vfs.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include <sqlite3.h>

namespace idem::storage {
namespace {

// Every file this VFS opens: SQLite's file object of the wrapped VFS follows
// it in the same allocation (szOsFile is the sum).
struct GatherFile {
  sqlite3_file base;     // pMethods: kMethods, or nullptr if the open failed
  sqlite3_file* real;    // the wrapped VFS's file, right after this struct
  bool wal;              // a -wal file: appends are gathered
  std::string gathered;  // appended frames not written yet
  sqlite3_int64 at = 0;  // the file offset of gathered[0]
  GatherFile* partner;   // the WAL's database file, or the database's WAL
  const char* db_name;   // main database files: the name SQLite opened it by
};

sqlite3_vfs* g_inner = nullptr;
sqlite3_vfs g_vfs;

// Main database files by the name pointer SQLite opened them with, so that a
// connection's WAL finds its database file (sqlite3_filename_database gives
// the same pointer). Touched only at open and close.
std::mutex g_open_mu;
std::map<const char*, GatherFile*> g_databases;

GatherFile* Self(sqlite3_file* f) { return reinterpret_cast<GatherFile*>(f); }
sqlite3_file* Real(sqlite3_file* f) { return Self(f)->real; }

// The most one call to the wrapped VFS writes: SQLite's unix VFS takes a
// write's length modulo 128 KiB (its writes are pages and frame headers), so
// a longer one must go in pieces.
constexpr size_t kMaxWriteCall = 64 * 1024;

// Writes out what is gathered; SQLITE_OK when nothing is.
int WriteOut(GatherFile* g) {
  if (g == nullptr || g->gathered.empty()) return SQLITE_OK;
  int rc = SQLITE_OK;
  for (size_t done = 0; done < g->gathered.size() && rc == SQLITE_OK; done += kMaxWriteCall) {
    const size_t n = std::min(kMaxWriteCall, g->gathered.size() - done);
    rc = g->real->pMethods->xWrite(g->real, g->gathered.data() + done, static_cast<int>(n),
                                   g->at + static_cast<sqlite3_int64>(done));
  }
  g->gathered.clear();
  return rc;
}

// The WAL file: writes out what it gathered before anything else reaches it.
int Out(sqlite3_file* f) { return WriteOut(Self(f)); }
// The database file: writes out what its connection's WAL gathered.
int PartnerOut(sqlite3_file* f) { return WriteOut(Self(f)->partner); }

int Close(sqlite3_file* f) {
  GatherFile* g = Self(f);
  int rc = WriteOut(g);
  {
    std::lock_guard<std::mutex> lock(g_open_mu);
    if (g->partner != nullptr) g->partner->partner = nullptr;
    if (!g->wal && g->db_name != nullptr) {
      auto it = g_databases.find(g->db_name);
      if (it != g_databases.end() && it->second == g) g_databases.erase(it);
    }
  }
  int closed = g->real->pMethods->xClose(g->real);
  g->~GatherFile();
  return rc != SQLITE_OK ? rc : closed;
}

int Read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xRead(Real(f), buf, n, off);
}

int Write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  GatherFile* g = Self(f);
  if (!g->wal || g->partner == nullptr) return g->real->pMethods->xWrite(g->real, buf, n, off);
  const bool appends =
      !g->gathered.empty() && off == g->at + static_cast<sqlite3_int64>(g->gathered.size());
  if (appends && g->gathered.size() + static_cast<size_t>(n) <= kMaxGatheredBytes) {
    g->gathered.append(static_cast<const char*>(buf), static_cast<size_t>(n));
    return SQLITE_OK;
  }
  if (int rc = WriteOut(g); rc != SQLITE_OK) return rc;
  if (static_cast<size_t>(n) > kMaxGatheredBytes)
    return g->real->pMethods->xWrite(g->real, buf, n, off);
  g->gathered.assign(static_cast<const char*>(buf), static_cast<size_t>(n));
  g->at = off;
  return SQLITE_OK;
}

int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xTruncate(Real(f), size);
}
int Sync(sqlite3_file* f, int flags) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xFileSize(Real(f), size);
}
int Lock(sqlite3_file* f, int level) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xLock(Real(f), level);
}
int Unlock(sqlite3_file* f, int level) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xUnlock(Real(f), level);
}
int CheckReservedLock(sqlite3_file* f, int* out) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  int rc = Real(f)->pMethods->xFileControl(Real(f), op, arg);
  // The VFS's name, as SQLite's PRAGMA vfs_list / file_control report it.
  if (op == SQLITE_FCNTL_VFSNAME && rc == SQLITE_OK && arg != nullptr) {
    char** name = static_cast<char**>(arg);
    char* outer = sqlite3_mprintf("%s/%z", g_vfs.zName, *name);
    *name = outer;
  }
  return rc;
}
int SectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int DeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
// Shared memory belongs to the database file: its calls publish or read the
// WAL index, so the connection's gathered frames go out first.
int ShmMap(sqlite3_file* f, int page, int size, int extend, void volatile** out) {
  if (int rc = PartnerOut(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xShmMap(Real(f), page, size, extend, out);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  if (int rc = PartnerOut(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) {
  (void)PartnerOut(f);  // with FULL or EXTRA, xSync wrote everything out first
  Real(f)->pMethods->xShmBarrier(Real(f));
}
int ShmUnmap(sqlite3_file* f, int del) {
  if (int rc = PartnerOut(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xShmUnmap(Real(f), del);
}
int Fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
  if (int rc = Out(f); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xFetch(Real(f), off, n, out);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), off, p);
}

const sqlite3_io_methods kMethods = {
    3,
    Close,
    Read,
    Write,
    Truncate,
    Sync,
    FileSize,
    Lock,
    Unlock,
    CheckReservedLock,
    FileControl,
    SectorSize,
    DeviceCharacteristics,
    ShmMap,
    ShmLock,
    ShmBarrier,
    ShmUnmap,
    Fetch,
    Unfetch,
};

int Open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  auto* g = new (f) GatherFile{};
  g->base.pMethods = nullptr;
  g->real = reinterpret_cast<sqlite3_file*>(g + 1);
  g->wal = (flags & SQLITE_OPEN_WAL) != 0;
  g->partner = nullptr;
  g->db_name = nullptr;
  int rc = g_inner->xOpen(g_inner, name, g->real, flags, out_flags);
  if (g->real->pMethods == nullptr) {  // nothing to close: SQLite will not call xClose
    g->~GatherFile();
    return rc;
  }
  g->base.pMethods = &kMethods;
  if (rc != SQLITE_OK || name == nullptr) return rc;
  std::lock_guard<std::mutex> lock(g_open_mu);
  if ((flags & SQLITE_OPEN_MAIN_DB) != 0) {
    g->db_name = name;
    g_databases[name] = g;
  } else if (g->wal) {
    // Without its database file nothing would write the frames out on the
    // shared-memory calls: such a WAL writes through.
    auto it = g_databases.find(sqlite3_filename_database(name));
    if (it != g_databases.end() && it->second->partner == nullptr) {
      g->partner = it->second;
      it->second->partner = g;
    }
  }
  return rc;
}

int Delete(sqlite3_vfs*, const char* name, int sync) {
  return g_inner->xDelete(g_inner, name, sync);
}
int Access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_inner->xAccess(g_inner, name, flags, out);
}
int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return g_inner->xFullPathname(g_inner, name, n, out);
}
void* DlOpen(sqlite3_vfs*, const char* name) { return g_inner->xDlOpen(g_inner, name); }
void DlError(sqlite3_vfs*, int n, char* msg) { g_inner->xDlError(g_inner, n, msg); }
void (*DlSym(sqlite3_vfs*, void* h, const char* sym))(void) {
  return g_inner->xDlSym(g_inner, h, sym);
}
void DlClose(sqlite3_vfs*, void* h) { g_inner->xDlClose(g_inner, h); }
int Randomness(sqlite3_vfs*, int n, char* out) { return g_inner->xRandomness(g_inner, n, out); }
int Sleep(sqlite3_vfs*, int us) { return g_inner->xSleep(g_inner, us); }
int CurrentTime(sqlite3_vfs*, double* out) { return g_inner->xCurrentTime(g_inner, out); }
int GetLastError(sqlite3_vfs*, int n, char* out) { return g_inner->xGetLastError(g_inner, n, out); }
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* out) {
  return g_inner->xCurrentTimeInt64(g_inner, out);
}

}  // namespace

const char* WalGatheringVfsName() {
  static std::once_flag once;
  std::call_once(once, [] {
    sqlite3_initialize();
    g_inner = sqlite3_vfs_find(nullptr);
    std::memset(&g_vfs, 0, sizeof(g_vfs));
    g_vfs.iVersion = 2;
    g_vfs.szOsFile = static_cast<int>(sizeof(GatherFile)) + g_inner->szOsFile;
    g_vfs.mxPathname = g_inner->mxPathname;
    g_vfs.zName = "idem-wal-gather";
    g_vfs.xOpen = Open;
    g_vfs.xDelete = Delete;
    g_vfs.xAccess = Access;
    g_vfs.xFullPathname = FullPathname;
    g_vfs.xDlOpen = DlOpen;
    g_vfs.xDlError = DlError;
    g_vfs.xDlSym = DlSym;
    g_vfs.xDlClose = DlClose;
    g_vfs.xRandomness = Randomness;
    g_vfs.xSleep = Sleep;
    g_vfs.xCurrentTime = CurrentTime;
    g_vfs.xGetLastError = GetLastError;
    g_vfs.xCurrentTimeInt64 = CurrentTimeInt64;
    sqlite3_vfs_register(&g_vfs, /*makeDflt=*/0);
  });
  return g_vfs.zName;
}

}  // namespace idem::storage
