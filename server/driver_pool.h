#pragma once
// DriverPool: the threads that drive the sagas the API hands over, and the
// sweeper that finds the rest. Internal to the server.
//
// Without leases (SQLite: this process is the one driver) `workers` threads
// drive queued sagas, one thread per saga at a time, and the sweeper queues
// every saga that Engine's NeedsDrive says a drive would move (startup
// recovery, store hiccups, decided or expired approvals). With leases
// (PostgreSQL) Engine::Work claims sagas beside other workers, Enqueue wakes
// one of its idle workers (saga/work_signal.h: it claims at once instead of
// at its next poll), and the sweeper only drives sagas waiting on an
// approval.
//
// BeginDrive / EndDrive mark a saga as held by this process (a driver, or a
// handler that decides or cancels it) so that no driver takes it meanwhile.
//
// Post hands a pool thread a drive the API starts itself: a submission whose
// caller waits for the outcome (`Prefer: wait`) is recorded by the drive's
// first write (Engine::SubmitAndRun), on a driver thread, while the handler
// waits only for that write. Without leases the driver threads take posted
// drives before queued sagas; with leases (where Engine::Work claims the
// rest) `workers` threads of their own run them.
//
// Thread safety: Start and Stop from one thread; Enqueue, BeginDrive and
// EndDrive from any. The engine, store and clock are not owned.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "saga/engine.h"
#include "storage/store.h"

#include "common/clock.h"

namespace idem::server {

struct DriverPoolOptions {
  int workers = 4;          ///< sagas driven at once
  bool use_leases = false;  ///< Engine::Work with leases
  int64_t poll_ms = 100;    ///< Engine::Work's wait between empty claims
  int64_t sweep_ms = 2'000;
};

class DriverPool {
 public:
  DriverPool(Engine* engine, storage::Store* store, Clock* clock, DriverPoolOptions options)
      : engine_(engine), store_(store), clock_(clock), options_(options) {}
  ~DriverPool() { Stop(); }
  DriverPool(const DriverPool&) = delete;
  DriverPool& operator=(const DriverPool&) = delete;

  /// Starts the drivers (or Engine::Work) and the sweeper.
  void Start();
  /// Joins every thread; the engine's stop flag must be set first, so that
  /// drives stop between steps. Idempotent.
  void Stop();

  /// Queues a saga for a driver (not when queued, held or stopping).
  void Enqueue(const std::string& saga_id);
  /// Runs `job` on a driver thread, after the drives posted before it. False
  /// when stopping (the job will not run). Jobs still queued when the pool
  /// stops are dropped unrun.
  bool Post(std::function<void()> job);
  /// Sweeps now instead of at the next period (after a control request was
  /// recorded: the sweeper drives the sagas a request moves).
  void Kick();
  /// Holds `saga_id`; false if it is held already.
  bool BeginDrive(const std::string& saga_id);
  void EndDrive(const std::string& saga_id);

 private:
  void DriverLoop();
  void SweepOnce();
  void SweeperLoop();

  Engine* engine_;
  storage::Store* store_;
  Clock* clock_;
  DriverPoolOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;              // drivers: a saga was queued, or stopping
  std::condition_variable sweep_cv_;        // the sweeper: stopping
  std::deque<std::string> queue_;           // GUARDED_BY(mu_)
  std::deque<std::function<void()>> jobs_;  // GUARDED_BY(mu_) posted drives
  std::set<std::string> queued_;            // GUARDED_BY(mu_)
  std::set<std::string> driving_;           // GUARDED_BY(mu_)
  bool stopping_ = false;                   // GUARDED_BY(mu_)
  bool sweep_now_ = false;                  // GUARDED_BY(mu_)
  bool started_ = false;
  std::vector<std::thread> drivers_;
  std::thread sweeper_;
  std::thread work_thread_;
  WorkSignal wake_;  // with leases: Enqueue wakes an idle worker of Work
};

}  // namespace idem::server
