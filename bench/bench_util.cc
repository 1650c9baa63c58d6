#include "bench/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>

#include <sqlite3.h>

#include <sys/resource.h>

namespace idem::bench {

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t ProcessCpuNs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto ns = [](const timeval& tv) {
    return int64_t{tv.tv_sec} * 1'000'000'000 + tv.tv_usec * 1000;
  };
  return ns(ru.ru_utime) + ns(ru.ru_stime);
}

int64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

double Quantile(std::vector<double>* v, double q) {
  if (v->empty()) return 0;
  std::sort(v->begin(), v->end());
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v->size())));
  if (i > 0) --i;
  return (*v)[std::min(i, v->size() - 1)];
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---- the counting VFS ---------------------------------------------------------
//
// A shim in front of the default VFS: every file it opens is the real file
// followed by a small header; the io methods forward to the real ones and
// count xSync calls and -wal bytes.

namespace {

std::atomic<int64_t> g_wal_syncs{0};
std::atomic<int64_t> g_other_syncs{0};
std::atomic<int64_t> g_wal_bytes{0};

// The WAL frames written while recording (RecordWalFrames): SQLite writes a
// frame's 24-byte header (page number, then the database size in pages on a
// commit's last frame, 0 on the others) and its page in two calls.
std::atomic<bool> g_record_frames{false};
std::mutex g_frames_mu;
std::vector<WalFrame> g_frames;

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

sqlite3_vfs* g_orig = nullptr;
sqlite3_vfs g_vfs;

struct CountingFile {
  sqlite3_file base;
  sqlite3_file* real;
  bool wal;
  uint32_t page_size;  // a -wal file's, from its header (0: not seen yet)
};

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<CountingFile*>(f)->real; }

int FClose(sqlite3_file* f) {
  sqlite3_file* r = Real(f);
  int rc = r->pMethods ? r->pMethods->xClose(r) : SQLITE_OK;
  return rc;
}
int FRead(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  return Real(f)->pMethods->xRead(Real(f), buf, n, off);
}
int FWrite(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  auto* cf = reinterpret_cast<CountingFile*>(f);
  if (cf->wal) {
    g_wal_bytes.fetch_add(n);
    const auto* p = static_cast<const unsigned char*>(buf);
    if (off == 0 && n >= 32) cf->page_size = BigEndian32(p + 8);  // the WAL header's
    if (g_record_frames.load()) {
      if (cf->page_size == 0) {
        unsigned char head[32];
        if (Real(f)->pMethods->xRead(Real(f), head, 32, 0) == SQLITE_OK) {
          cf->page_size = BigEndian32(head + 8);
        }
      }
      // The frame headers this write holds: SQLite writes one frame's
      // header alone, a gathering VFS (storage/sqlite_wal_vfs.h) whole
      // commits.
      const int64_t frame = 24 + static_cast<int64_t>(cf->page_size);
      if (cf->page_size > 0) {
        int64_t k = off <= 32 ? 0 : (off - 32 + frame - 1) / frame;
        std::lock_guard<std::mutex> lock(g_frames_mu);
        for (int64_t at = 32 + k * frame; at + 24 <= off + n; at += frame) {
          const unsigned char* h = p + (at - off);
          g_frames.push_back(WalFrame{BigEndian32(h), BigEndian32(h + 4) != 0});
        }
      }
    }
  }
  return Real(f)->pMethods->xWrite(Real(f), buf, n, off);
}
int FTruncate(sqlite3_file* f, sqlite3_int64 size) {
  return Real(f)->pMethods->xTruncate(Real(f), size);
}
int FSync(sqlite3_file* f, int flags) {
  if (reinterpret_cast<CountingFile*>(f)->wal) {
    g_wal_syncs.fetch_add(1);
  } else {
    g_other_syncs.fetch_add(1);
  }
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int FFileSize(sqlite3_file* f, sqlite3_int64* size) {
  return Real(f)->pMethods->xFileSize(Real(f), size);
}
int FLock(sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); }
int FUnlock(sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); }
int FCheckReserved(sqlite3_file* f, int* out) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int FFileControl(sqlite3_file* f, int op, void* arg) {
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int FSectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int FDeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int FShmMap(sqlite3_file* f, int pg, int pgsz, int extend, void volatile** pp) {
  return Real(f)->pMethods->xShmMap(Real(f), pg, pgsz, extend, pp);
}
int FShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void FShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int FShmUnmap(sqlite3_file* f, int del) { return Real(f)->pMethods->xShmUnmap(Real(f), del); }
int FFetch(sqlite3_file* f, sqlite3_int64 off, int amt, void** pp) {
  return Real(f)->pMethods->xFetch(Real(f), off, amt, pp);
}
int FUnfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), off, p);
}

const sqlite3_io_methods kMethods = {
    3,
    FClose,
    FRead,
    FWrite,
    FTruncate,
    FSync,
    FFileSize,
    FLock,
    FUnlock,
    FCheckReserved,
    FFileControl,
    FSectorSize,
    FDeviceCharacteristics,
    FShmMap,
    FShmLock,
    FShmBarrier,
    FShmUnmap,
    FFetch,
    FUnfetch,
};

int VOpen(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  auto* cf = reinterpret_cast<CountingFile*>(f);
  cf->base.pMethods = nullptr;
  cf->real = reinterpret_cast<sqlite3_file*>(cf + 1);
  cf->wal = (flags & SQLITE_OPEN_WAL) != 0;
  cf->page_size = 0;
  int rc = g_orig->xOpen(g_orig, name, cf->real, flags, out_flags);
  if (cf->real->pMethods != nullptr) cf->base.pMethods = &kMethods;
  return rc;
}
int VDelete(sqlite3_vfs*, const char* name, int sync) {
  return g_orig->xDelete(g_orig, name, sync);
}
int VAccess(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_orig->xAccess(g_orig, name, flags, out);
}
int VFullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return g_orig->xFullPathname(g_orig, name, n, out);
}
void* VDlOpen(sqlite3_vfs*, const char* name) { return g_orig->xDlOpen(g_orig, name); }
void VDlError(sqlite3_vfs*, int n, char* msg) { g_orig->xDlError(g_orig, n, msg); }
void (*VDlSym(sqlite3_vfs*, void* h, const char* sym))(void) {
  return g_orig->xDlSym(g_orig, h, sym);
}
void VDlClose(sqlite3_vfs*, void* h) { g_orig->xDlClose(g_orig, h); }
int VRandomness(sqlite3_vfs*, int n, char* out) { return g_orig->xRandomness(g_orig, n, out); }
int VSleep(sqlite3_vfs*, int us) { return g_orig->xSleep(g_orig, us); }
int VCurrentTime(sqlite3_vfs*, double* out) { return g_orig->xCurrentTime(g_orig, out); }
int VGetLastError(sqlite3_vfs*, int n, char* out) { return g_orig->xGetLastError(g_orig, n, out); }
int VCurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* out) {
  return g_orig->xCurrentTimeInt64(g_orig, out);
}

}  // namespace

void InstallCountingVfs() {
  if (g_orig != nullptr) return;
  sqlite3_initialize();
  g_orig = sqlite3_vfs_find(nullptr);
  std::memset(&g_vfs, 0, sizeof(g_vfs));
  g_vfs.iVersion = 2;
  g_vfs.szOsFile = static_cast<int>(sizeof(CountingFile)) + g_orig->szOsFile;
  g_vfs.mxPathname = g_orig->mxPathname;
  g_vfs.zName = "idem-bench-counting";
  g_vfs.xOpen = VOpen;
  g_vfs.xDelete = VDelete;
  g_vfs.xAccess = VAccess;
  g_vfs.xFullPathname = VFullPathname;
  g_vfs.xDlOpen = VDlOpen;
  g_vfs.xDlError = VDlError;
  g_vfs.xDlSym = VDlSym;
  g_vfs.xDlClose = VDlClose;
  g_vfs.xRandomness = VRandomness;
  g_vfs.xSleep = VSleep;
  g_vfs.xCurrentTime = VCurrentTime;
  g_vfs.xGetLastError = VGetLastError;
  g_vfs.xCurrentTimeInt64 = VCurrentTimeInt64;
  sqlite3_vfs_register(&g_vfs, /*makeDflt=*/1);
}

void RecordWalFrames(bool on) {
  if (on) {
    std::lock_guard<std::mutex> lock(g_frames_mu);
    g_frames.clear();
  }
  g_record_frames.store(on);
}

std::vector<WalFrame> RecordedWalFrames() {
  std::lock_guard<std::mutex> lock(g_frames_mu);
  return g_frames;
}

IoCounts ReadIoCounts() {
  IoCounts c;
  c.wal_syncs = g_wal_syncs.load();
  c.other_syncs = g_other_syncs.load();
  c.wal_bytes = g_wal_bytes.load();
  return c;
}

IoCounts operator-(const IoCounts& a, const IoCounts& b) {
  IoCounts c;
  c.wal_syncs = a.wal_syncs - b.wal_syncs;
  c.other_syncs = a.other_syncs - b.other_syncs;
  c.wal_bytes = a.wal_bytes - b.wal_bytes;
  return c;
}

// ---- ForwardingStore -------------------------------------------------------------

namespace {
thread_local int64_t t_store_cpu_ns = 0;

// Adds the thread CPU time of its scope to t_store_cpu_ns.
struct CpuScope {
  int64_t start = ThreadCpuNs();
  ~CpuScope() { t_store_cpu_ns += ThreadCpuNs() - start; }
};
}  // namespace

int64_t ForwardingStore::StoreCpuNs() { return t_store_cpu_ns; }

Result<storage::CreateOutcome> ForwardingStore::CreateIntent(const storage::NewSaga& saga) {
  CpuScope s;
  return inner_->CreateIntent(saga);
}
Result<std::optional<storage::CreateOutcome>> ForwardingStore::FindIntent(
    const storage::NewSaga& saga) {
  CpuScope s;
  return inner_->FindIntent(saga);
}
Result<storage::SagaRecord> ForwardingStore::LoadSaga(const std::string& saga_id) {
  CpuScope s;
  return inner_->LoadSaga(saga_id);
}
Status ForwardingStore::Commit(const storage::WriteBatch& batch) {
  Status st;
  {
    CpuScope s;
    st = inner_->Commit(batch);
  }
  if (st.ok() && after_commit) return after_commit(batch);
  return st;
}
Result<std::vector<storage::SagaSummary>> ForwardingStore::ListSagas(
    const storage::SagaFilter& filter) {
  CpuScope s;
  return inner_->ListSagas(filter);
}
Result<std::vector<storage::JournalEntry>> ForwardingStore::ReadJournal(
    const std::string& saga_id) {
  CpuScope s;
  return inner_->ReadJournal(saga_id);
}
Result<std::vector<storage::EffectRecord>> ForwardingStore::ListEffects(
    const std::string& saga_id) {
  CpuScope s;
  return inner_->ListEffects(saga_id);
}
int ForwardingStore::SchemaVersion() { return inner_->SchemaVersion(); }
Result<std::vector<storage::Lease>> ForwardingStore::ClaimSagas(
    const std::vector<std::string>& states, const std::string& owner, int64_t lease_ms, int limit) {
  CpuScope s;
  return inner_->ClaimSagas(states, owner, lease_ms, limit);
}
Result<storage::Lease> ForwardingStore::ClaimSaga(const std::string& saga_id,
                                                  const std::string& owner, int64_t lease_ms) {
  CpuScope s;
  return inner_->ClaimSaga(saga_id, owner, lease_ms);
}
Status ForwardingStore::RenewLease(const storage::Lease& lease, int64_t lease_ms) {
  CpuScope s;
  return inner_->RenewLease(lease, lease_ms);
}
Status ForwardingStore::ReleaseLease(const storage::Lease& lease) {
  CpuScope s;
  return inner_->ReleaseLease(lease);
}

}  // namespace idem::bench
