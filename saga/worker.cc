// Engine::Work: the worker pool. `concurrency` threads each claim one
// runnable saga at a time (pending, running, compensating; when there is none,
// a paused saga with a resume or cancel request pending) with a lease and
// drive it, until EngineOptions::stop turns true. A drive that throws parks
// its saga (Engine::RunLeased); anything else a thread throws (a claim, the
// on_done callback) is kept as the first error and the thread goes on.

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "saga/engine.h"
#include "saga/states.h"

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
  auto claim_and_drive = [&] {
    auto claimed = store_->ClaimSagas(states, options_.owner, options_.lease_ms, 1);
    if (claimed.ok() && claimed->empty()) {
      // Nothing runnable: a paused saga with a resume or cancel pending?
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
      options_.clock->SleepMs(worker.poll_ms);
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
