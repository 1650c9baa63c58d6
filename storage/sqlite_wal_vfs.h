#pragma once
// The SQLite VFS that SqliteStore opens its connections with when every
// commit syncs the WAL (synchronous FULL or EXTRA): SQLite's default VFS,
// except that a connection's appends to its `-wal` file are gathered in
// memory and handed to the file system in one write.
//
// Why: SQLite writes each WAL frame with two calls (its 24-byte header, then
// the page), so a commit that touches 18 pages makes 36 pwrite system calls
// before its fsync; on a virtual machine each costs a hypervisor round
// (docs/bench.md, the profiles). Gathered, the commit's frames go out in one
// pwrite, then the fsync, as before.
//
// What is gathered, and when it goes out: only writes that append at the
// end of what is gathered (the next frame); any other write, and every
// other call on the WAL file (xRead, xSync, xTruncate, xFileSize, xLock,
// xUnlock, xFileControl, xClose, ...), writes out what is gathered first, so
// the file sees the same writes in the same order, only fewer calls. The
// connection's database file writes it out too on its shared-memory calls
// (xShmBarrier, xShmLock, xShmMap, xShmUnmap): a commit becomes visible to
// other connections through the shared-memory index only after that, and
// with synchronous FULL only after xSync of the WAL has written it out and
// reported any error. A write error therefore surfaces at the commit's
// xSync (IOERR: the commit fails, as when the write itself fails), never
// later. A crash loses at most frames of a commit that was not synced: the
// same as a crash in the middle of SQLite's own writes, which the WAL's
// checksums already cut off at recovery. At most kMaxGatheredBytes are held;
// a larger transaction writes out as it goes.
//
// Not for synchronous OFF or NORMAL: there a commit publishes its frames
// without an xSync, and xShmBarrier (which returns nothing) could not report
// a failed write; SqliteStore opens those connections with the default VFS.
//
// Thread safety: registration is once per process (the VFS wraps whatever
// is SQLite's default VFS at the first call); the file objects are used
// under their connection's mutex, as every VFS's are.

#include <cstddef>

namespace idem::storage {

/// The VFS's name for SQLite's open calls; registers it on the first call.
const char* WalGatheringVfsName();

/// Most bytes of appended frames held in memory per WAL file.
inline constexpr size_t kMaxGatheredBytes = 1 << 20;

}  // namespace idem::storage
