#pragma once
// HighWaterMark: a record, beside an SQLite journal, of how far the journal
// had come, so that a journal that went back in time is noticed at open
// instead of trusted.
//
// A journal goes back when its WAL is truncated to an earlier commit (a disk
// that lied about an fsync, a copy of the files taken mid-run and restored)
// or lost (deleted, not restored with the database file). SQLite opens such
// a journal without complaint, and a recovery would then drive sagas again
// from an earlier state: steps whose effects happened are found pending and
// called again, whole sagas are missing and an agent's retry starts new
// ones. The journal itself cannot tell; the mark lives outside it.
//
// The mark is the highest journal seq the store has committed (the journal
// is append-only and its seq only grows) and the journal's identity (a hash
// of its first entry, "-" while it has none). File `<db>.hwm`, one line
// padded with spaces to kFileBytes:
//
//   idem-hwm 1 <seq> <identity>
//
// Advance rewrites it in place after a commit (one pwrite, no fsync: it
// survives any crash of the process, since the kernel holds the page) and
// fdatasyncs it every kSyncEvery advances and at destruction, so that the
// hot path costs no extra fsync; after a power loss the mark may lag the
// journal by up to kSyncEvery commits, and a regression smaller than that
// goes unnoticed. The mark is written only after the journal's commit
// returned, so it never claims more than the journal holds durably.
//
// Check at open (Open): no mark file yet: the mark is created from the
// journal (a new journal, or one made before marks existed; deleting the
// mark therefore disables the check once). The journal behind the mark, or
// with another identity: `regression()` is kFailedPrecondition (kJournalRegressionMessage) with
// what happened and what the operator can do (restore the lost WAL, or accept the journal as it is:
// Accept). A mark file that cannot be parsed is kFailedPrecondition (kJournalRegressionMessage)
// too.
//
// Accept records the decision (who, why, the mark and the journal's
// position) as one JSON line appended to `<db>.hwm.log`, fsync'ed, then moves
// the mark back to the journal.
//
// Several processes may open one journal (SqliteStore allows it); each
// advances the mark from its own commits and never lowers it below what it
// wrote itself, so an interleaving can leave the mark behind the journal
// (a weaker check), never ahead of it.
//
// Thread safety: every method may be called from several threads at once.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"

namespace idem::storage {

/// The start of every regression's message (kFailedPrecondition): the CLI
/// answers it with its own exit code.
inline constexpr std::string_view kJournalRegressionMessage = "journal regression: ";

/// Where a journal stands: its highest seq and its identity.
struct JournalPosition {
  int64_t seq = 0;
  std::string identity = "-";  ///< JournalIdentity of its first entry; "-" when empty
};

/// The identity of a journal whose first entry has `first_seq` and `saga_id`.
std::string JournalIdentity(int64_t first_seq, const std::string& saga_id);

class HighWaterMark {
 public:
  static constexpr size_t kFileBytes = 128;
  static constexpr int kSyncEvery = 64;

  /// Opens (or creates from `found`) the mark of the journal at `db_path`
  /// and checks `found` against it. kInternal for a failed system call; a
  /// regression is not an error of Open but `regression()`.
  static Result<std::unique_ptr<HighWaterMark>> Open(const std::string& db_path,
                                                     const JournalPosition& found);

  ~HighWaterMark();  ///< fdatasyncs a mark written since the last sync
  HighWaterMark(const HighWaterMark&) = delete;
  HighWaterMark& operator=(const HighWaterMark&) = delete;

  /// OK, or kFailedPrecondition (kJournalRegressionMessage): the journal went back (the message
  /// says what to do).
  Status regression() const;

  /// Records that the journal now stands at `now` (after a commit). A no-op
  /// when the mark is not behind it, or while a regression is unaccepted.
  void Advance(const JournalPosition& now);

  /// An operator (`who`, `reason`, both required) accepts the journal as it
  /// stands (`found`): logged to `<db>.hwm.log`, then the mark moves to it.
  /// kFailedPrecondition when there is no regression to accept.
  Status Accept(const JournalPosition& found, const std::string& who, const std::string& reason,
                int64_t now_ms);

  /// The mark as last written (for tests and `idem journal check`).
  JournalPosition mark() const;
  const std::string& path() const { return path_; }

 private:
  HighWaterMark(std::string path, int fd, JournalPosition mark);
  // Writes `pos` over the file; fdatasync when `sync` or every kSyncEvery.
  Status WriteLocked(const JournalPosition& pos, bool sync);

  const std::string path_;
  const int fd_;
  mutable std::mutex mu_;
  JournalPosition mark_;  // GUARDED_BY(mu_)
  Status regression_;     // GUARDED_BY(mu_)
  int unsynced_ = 0;      // GUARDED_BY(mu_)
};

}  // namespace idem::storage
