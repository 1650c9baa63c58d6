#pragma once
// Helpers of the idem benchmarks: clocks, percentiles, process memory, a
// SQLite VFS that counts disk flushes and WAL bytes, and a Store decorator
// that measures the CPU spent inside the store.
//
// Thread safety: the counters are atomics; everything else is plain data.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "storage/store.h"

namespace idem::bench {

/// Seconds on the monotonic clock.
double NowS();
/// CPU time of the calling thread, in nanoseconds.
int64_t ThreadCpuNs();
/// CPU time (user + system) of the whole process, in nanoseconds.
int64_t ProcessCpuNs();
/// The process's resident set (VmRSS), in bytes.
int64_t RssBytes();

/// The q-quantile (0..1) of `v` (sorted in place); 0 when empty.
double Quantile(std::vector<double>* v, double q);
double Median(std::vector<double> v);

/// Disk activity counted by the VFS below, for every SQLite connection of the
/// process (the stores' and the raw anchors').
struct IoCounts {
  int64_t wal_syncs = 0;    ///< fsyncs of a -wal file (one per durable commit)
  int64_t other_syncs = 0;  ///< fsyncs of database files (checkpoints)
  int64_t wal_bytes = 0;    ///< bytes written to -wal files
  int64_t syncs() const { return wal_syncs + other_syncs; }
};
/// Registers the counting VFS as SQLite's default (it forwards to the one
/// that was the default). Call before any SQLite database is opened.
void InstallCountingVfs();
IoCounts ReadIoCounts();

/// One frame appended to a -wal file: the page it holds, and whether it is
/// the last frame of a commit.
struct WalFrame {
  uint32_t page = 0;
  bool commit = false;
};
/// Starts (clearing what was recorded) or stops recording the frames every
/// -wal file of the process is written; the counts above go on either way.
void RecordWalFrames(bool on);
std::vector<WalFrame> RecordedWalFrames();
IoCounts operator-(const IoCounts& a, const IoCounts& b);

/// A Store that forwards to another and adds the calling thread's CPU time
/// inside each call to a thread-local counter (StoreCpuNs). `after_commit`,
/// when set, is called after each successful Commit and may replace its
/// status (the crash scenario uses it to stop drives at a chosen point).
class ForwardingStore : public storage::Store {
 public:
  explicit ForwardingStore(storage::Store* inner) : inner_(inner) {}
  std::function<Status(const storage::WriteBatch&)> after_commit;

  /// CPU time the calling thread has spent inside store calls.
  static int64_t StoreCpuNs();

  Result<storage::CreateOutcome> CreateIntent(const storage::NewSaga& saga) override;
  Result<std::optional<storage::CreateOutcome>> FindIntent(const storage::NewSaga& saga) override;
  Result<storage::SagaRecord> LoadSaga(const std::string& saga_id) override;
  Status Commit(const storage::WriteBatch& batch) override;
  Result<std::vector<storage::SagaSummary>> ListSagas(const storage::SagaFilter& filter) override;
  Result<std::vector<storage::JournalEntry>> ReadJournal(const std::string& saga_id) override;
  Result<std::vector<storage::EffectRecord>> ListEffects(const std::string& saga_id) override;
  int SchemaVersion() override;
  Result<std::vector<storage::Lease>> ClaimSagas(const std::vector<std::string>& states,
                                                 const std::string& owner, int64_t lease_ms,
                                                 int limit) override;
  Result<storage::Lease> ClaimSaga(const std::string& saga_id, const std::string& owner,
                                   int64_t lease_ms) override;
  Status RenewLease(const storage::Lease& lease, int64_t lease_ms) override;
  Status ReleaseLease(const storage::Lease& lease) override;

 private:
  storage::Store* inner_;
};

}  // namespace idem::bench
