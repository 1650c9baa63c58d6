#pragma once
// LeaseRenewer: keeps the leases of an engine's drives alive.
//
// One thread per engine (started with the first lease it keeps) renews
// every lease it keeps every lease_ms / 3; a renewal that is refused (the
// lease was lost: expired and claimed by another) turns the hold's lost()
// flag true for good, and the drive stops before its next tool call. One
// thread rather than one per drive: a drive registers its lease without
// starting a thread, and is never woken for it.
//
// A drive keeps its lease through a Hold (RAII): on every way out of the
// drive, exceptions included, the Hold's destructor first waits for a
// renewal of it in progress and stops any further one, then gives the lease
// back to the store unless the drive's last write already did
// (set_released()).
//
// Every renewal that fails is reported to the observer (if any), from the
// renewer's thread: kLost when it was refused (the drive stops), kError when
// the store did not answer (kept, tried again next period; the fenced
// writes refuse what the lease no longer covers). Metrics count them
// (idem_lease_renewals_failed_total): a renewer that keeps failing is a
// store in trouble before any saga shows it.
//
// Thread safety: Keep may be called from any thread; a Hold belongs to its
// drive's thread. The renewer must outlive its holds; the store must outlive
// the renewer.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/store.h"

namespace idem {

class LeaseRenewer {
 public:
  class Hold;

  enum class Failure { kLost, kError };
  using Observer = std::function<void(Failure)>;

  LeaseRenewer(storage::Store* store, int64_t lease_ms, Observer observer = nullptr);
  ~LeaseRenewer();  ///< stops and joins the thread
  LeaseRenewer(const LeaseRenewer&) = delete;
  LeaseRenewer& operator=(const LeaseRenewer&) = delete;

  /// Keeps `lease` (epoch != 0) renewed until the Hold is destroyed; the
  /// first renewal is due one period from now.
  Hold Keep(const storage::Lease& lease);

 private:
  struct Held;
  std::shared_ptr<Held> Add(const storage::Lease& lease);
  /// After Remove returns, no renewal of the lease is running or will run.
  void Remove(const std::shared_ptr<Held>& held);
  void Loop();

  storage::Store* store_;
  const Observer observer_;
  const std::chrono::milliseconds period_;
  const int64_t lease_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;                        // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<Held>> held_;  // GUARDED_BY(mu_)
  std::thread thread_;
};

/// A drive's hold on its lease; see LeaseRenewer. Move-only.
class LeaseRenewer::Hold {
 public:
  Hold(Hold&& other) noexcept;
  Hold& operator=(Hold&&) = delete;
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  /// Stops the renewals, then releases the lease unless set_released().
  ~Hold();

  /// Turns true (for good) once a renewal was refused: the lease is lost.
  const std::atomic<bool>* lost() const;
  /// The drive's last write gave the lease up with it: nothing to release.
  void set_released() { released_ = true; }

 private:
  friend class LeaseRenewer;
  Hold(LeaseRenewer* renewer, std::shared_ptr<Held> held);

  LeaseRenewer* renewer_;
  std::shared_ptr<Held> held_;
  bool released_ = false;
};

}  // namespace idem
