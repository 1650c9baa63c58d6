// Engine::Work: the worker pool. `concurrency` threads each claim one
// runnable saga at a time (pending, running, compensating; when there is none,
// a paused saga with a resume or cancel request pending) with a lease and
// drive it, and the sagas whose provider check is due (awaiting_completion:
// at least once per poll interval, busy or not), until EngineOptions::stop turns true. A drive that
// throws parks its saga (Engine::RunLeased); anything else a thread throws (a claim, the on_done
// callback) is kept as the first error and the thread goes on.

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "saga/completion.h"
#include "saga/engine.h"
#include "saga/states.h"
#include "saga/work_signal.h"

namespace idem {

Status Engine::Work(const WorkerOptions& worker) {
  const std::vector<std::string> states = {SagaStateName(SagaState::kPending),
                                           SagaStateName(SagaState::kRunning),
                                           SagaStateName(SagaState::kCompensating)};
  auto stopping = [&] { return options_.stop != nullptr && options_.stop->load(); };
  std::mutex mu;
  Status first_error;
  auto keep_error = [&](Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
  };
  // Sagas whose provider check is due (saga/completion.h) are looked for at
  // most once per poll interval while the worker is busy, and whenever it
  // finds nothing else to claim: a stream of new work cannot starve them.
  std::atomic<int64_t> next_due_scan{0};
  auto drive_due = [&](bool idle) {
    const int64_t now = options_.clock->NowMs();
    int64_t at = next_due_scan.load();
    if (!idle && (now < at || !next_due_scan.compare_exchange_strong(at, now + worker.poll_ms))) {
      return false;
    }
    std::vector<storage::SagaSummary> due;
    if (!completion::AddDue(store_, now, &due, 64).ok()) return false;
    int driven = 0;
    for (const storage::SagaSummary& s : due) {
      if (stopping()) break;
      auto r = Drive(s.saga_id);  // another holder answers kAborted
      if (!r.ok() && r.status().code() == Code::kAborted) continue;
      ++driven;
      if (worker.on_done) worker.on_done(s.saga_id, r.ok() ? Status::Ok() : r.status());
    }
    return driven > 0;
  };
  auto claim_and_drive = [&] {
    if (drive_due(/*idle=*/false)) return;
    auto claimed = store_->ClaimSagas(states, options_.owner, options_.lease_ms, 1);
    if (claimed.ok() && claimed->empty()) {
      // Nothing runnable: a saga whose provider check is due, or a paused
      // saga with a resume or cancel pending?
      if (drive_due(/*idle=*/true)) return;
      std::vector<storage::SagaSummary> paused;
      if (AddControlled(store_, &paused).ok() &&
          AddIdleDue(store_, options_.clock->NowMs(), &paused).ok()) {  // saga/open_saga.h
        for (const storage::SagaSummary& s : paused) {
          auto r = Drive(s.saga_id);  // another holder answers kAborted
          if (r.ok() || r.status().code() != Code::kAborted) {
            if (worker.on_done) worker.on_done(s.saga_id, r.ok() ? Status::Ok() : r.status());
            return;
          }
        }
      }
    }
    if (!claimed.ok() || claimed->empty()) {
      if (!claimed.ok() && claimed.status().code() != Code::kUnavailable &&
          claimed.status().code() != Code::kAborted) {
        keep_error(claimed.status());
      }
      if (worker.wake != nullptr) {
        worker.wake->WaitFor(worker.poll_ms);  // woken by new work here
      } else {
        options_.clock->SleepMs(worker.poll_ms);
      }
      return;
    }
    for (const storage::Lease& lease : *claimed) {
      auto r = RunLeased(lease);
      if (worker.on_done) worker.on_done(lease.saga_id, r.ok() ? Status::Ok() : r.status());
    }
  };
  auto loop = [&] {
    while (!stopping()) {
      try {
        claim_and_drive();
      } catch (const std::exception& e) {
        keep_error(Status::Internal(std::string("worker: ") + e.what()));
      } catch (...) {
        keep_error(Status::Internal("worker: unknown exception"));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, worker.concurrency); ++i) threads.emplace_back(loop);
  loop();
  for (auto& t : threads) t.join();
  return first_error;
}

}  // namespace idem
