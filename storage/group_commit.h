#pragma once
// GroupCommit: the leader/follower queue both stores write through, so that
// concurrent writes share one transaction (one fsync, one COMMIT round trip).
//
// A caller hands Submit() its pending write (an Item of the store's own
// type) and waits. Whoever finds its item still queued and fewer than
// `max_leaders` leaders at work becomes a leader: it takes up to `max_group`
// queued items (its own among them, unless the queue is longer than a
// group), hands them to the store's `write` callback, marks them done and
// wakes each of them, then the first queued waiter if a leader's slot is
// free (each waiter sleeps on its own condition variable). One leader (SQLite: one writer
// connection) writes groups one after another; several (PostgreSQL) keep that many group
// transactions in flight at once, each on its own connection, so that one group's statements run
// while another's COMMIT waits for its flush. Two groups in flight never hold the same item; items
// of one saga in two groups are ordered by the store (PostgreSQL: the saga's row lock). The
// callback writes the group in one transaction, each item inside its own savepoint (a group of one
// needs none), and sets each item's own `status`: one item's failure rolls back that item alone, a
// failure of the transaction itself fails every item of the group. How a backend runs savepoints,
// retries and unknown COMMIT outcomes is the callback's business; this queue only decides who
// writes what, and that every caller returns after its item was written. Disabled (`enabled`
// false), Submit calls `write` with the caller's item alone, on the caller's thread.
//
// Item: any type with a `Status status` member, owned by the caller and
// alive until Submit returns.
//
// Thread safety: Submit may be called from many threads at once; `write` runs
// on at most `max_leaders` threads at a time when enabled (on each caller's
// own when disabled).
//
// Errors: those `write` sets. An exception from `write` (bad_alloc) sets
// kInternal on every item of its group and never leaves the queue leaderless.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace idem::storage {

/// Raises `*largest` to `value` if it is smaller (a statistics maximum).
inline void RaiseToAtLeast(std::atomic<int64_t>& largest, int64_t value) {
  int64_t seen = largest.load();
  while (value > seen && !largest.compare_exchange_weak(seen, value)) {
  }
}

template <typename Item>
class GroupCommit {
 public:
  /// Writes `group` (one item or several, in queue order) in one
  /// transaction and sets each item's status.
  using WriteGroup = std::function<void(const std::vector<Item*>& group)>;

  GroupCommit(bool enabled, int max_group, WriteGroup write, int max_leaders = 1)
      : enabled_(enabled),
        max_group_(max_group < 1 ? 1 : max_group),
        max_leaders_(max_leaders < 1 ? 1 : max_leaders),
        write_(std::move(write)) {}
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;
  GroupCommit(GroupCommit&&) = delete;
  GroupCommit& operator=(GroupCommit&&) = delete;

  /// Writes `item` (alone, or in a group) and returns once its status is set.
  void Submit(Item* item) {
    if (!enabled_) {
      Write({item});
      return;
    }
    Waiter me(item);
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(&me);
    queued_.fetch_add(1);
    for (;;) {
      if (me.done) return;
      // Taken into another leader's group: wait for it. Queued with every
      // leader busy: wait for one to finish.
      if (me.taken || leaders_ >= max_leaders_) {
        me.cv.wait(lock);
        continue;
      }
      ++leaders_;
      std::vector<Waiter*> taken;
      std::vector<Item*> group;
      while (!queue_.empty() && static_cast<int>(group.size()) < max_group_) {
        queue_.front()->taken = true;
        taken.push_back(queue_.front());
        group.push_back(queue_.front()->item);
        queue_.pop_front();
      }
      queued_.fetch_sub(static_cast<int64_t>(group.size()));
      WakeNextLeader();  // a slot still free: the rest need not wait for this group
      lock.unlock();
      Write(group);
      lock.lock();
      // Each waiter is woken alone, under the lock: it cannot return (and
      // take its condition variable with it) before the lock is let go.
      for (Waiter* w : taken) {
        w->done = true;
        if (w != &me) w->cv.notify_one();
      }
      --leaders_;
      WakeNextLeader();
    }
  }

  /// Items waiting for a leader now.
  int64_t Queued() const { return queued_.load(); }

 private:
  struct Waiter {
    explicit Waiter(Item* i) : item(i) {}
    Item* item;
    bool taken = false;  // in a leader's group; GUARDED_BY(mu_)
    bool done = false;   // GUARDED_BY(mu_)
    // Woken when its item is written, or when it is first in the queue and a
    // leader's slot is free: never all waiters for every group (64 threads
    // woken hundreds of times a second cost more than the writes).
    std::condition_variable cv;
  };

  // With a leader's slot free, wakes the first queued waiter to lead.
  // Called with mu_ held.
  void WakeNextLeader() {
    if (!queue_.empty() && leaders_ < max_leaders_) queue_.front()->cv.notify_one();
  }

  void Write(const std::vector<Item*>& group) {
    try {
      write_(group);
    } catch (const std::exception& e) {  // bad_alloc: the group fails, the queue goes on
      for (Item* item : group) item->status = Status::Internal("Commit: " + std::string(e.what()));
    }
  }

  const bool enabled_;
  const int max_group_;
  const int max_leaders_;
  const WriteGroup write_;
  std::mutex mu_;
  std::deque<Waiter*> queue_;  // GUARDED_BY(mu_)
  int leaders_ = 0;            // groups being written now; GUARDED_BY(mu_)
  std::atomic<int64_t> queued_{0};
};

}  // namespace idem::storage
