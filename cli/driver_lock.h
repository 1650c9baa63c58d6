#pragma once
// DriverLock: one process at a time drives the sagas of an embedded journal.
//
// `run`, `recover`, `resolve`, `approve`, `reject`, `worker` and `serve` on
// a SQLite journal hold an exclusive flock on "<db>.lock" (released by the
// kernel when the process dies, SIGKILL included); without it a `recover`
// beside a live `run` could drive the same step twice. Several processes on
// one journal is what the PostgreSQL store's leases are for.
//
// The holder writes "<pid> <command>" into the lock file, so that a process
// that finds the lock taken can say who holds it. It never waits without
// end: a long-running holder (`serve`, `worker`) is answered at once; a
// one-shot command (`run`, `approve`, ...), which ends by itself, is waited
// for up to kOneShotWaitMs (two approvals of one token started together
// still both get the saga's outcome), then refused too.
//
// Thread safety: one per process, used from main().

#include <cstdint>
#include <string>

#include "common/status.h"
#include <sys/types.h>

namespace idem::cli {

class DriverLock {
 public:
  /// How long a one-shot holder (or one that says nothing) is waited for.
  static constexpr int64_t kOneShotWaitMs = 10'000;

  /// Who holds the lock, as the lock file says (pid 0: not known).
  struct Holder {
    pid_t pid = 0;
    std::string command;
    /// `serve` or `worker`: it will not let go by itself.
    bool LongRunning() const { return command == "serve" || command == "worker"; }
  };

  DriverLock() = default;
  DriverLock(const DriverLock&) = delete;
  DriverLock& operator=(const DriverLock&) = delete;
  ~DriverLock();

  /// Takes the lock of journal `db` for `command`, waiting up to `wait_ms`
  /// for a one-shot holder. kAborted when another process holds it (message
  /// "the journal DB is being driven by another process (pid N, `serve`)";
  /// holder() says who); kUnavailable when the lock file cannot be opened or
  /// locked.
  Status Acquire(const std::string& db, const std::string& command,
                 int64_t wait_ms = kOneShotWaitMs);

  /// After kAborted from Acquire: the process that holds the lock.
  const Holder& holder() const { return holder_; }

 private:
  Holder ReadHolder() const;
  void WriteHolder(const std::string& command) const;

  int fd_ = -1;
  Holder holder_;
};

}  // namespace idem::cli
