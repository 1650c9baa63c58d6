#include "server/driver_pool.h"

#include <algorithm>
#include <chrono>

#include "saga/completion.h"
#include "saga/states.h"

namespace idem::server {

void DriverPool::Start() {
  if (started_) return;
  started_ = true;
  if (options_.use_leases) {
    work_thread_ = std::thread([this] {
      WorkerOptions wo;
      wo.concurrency = options_.workers;
      wo.poll_ms = options_.poll_ms;
      wo.wake = &wake_;
      (void)engine_->Work(wo);
    });
  }
  // With leases nothing is queued (Enqueue wakes Work): these threads run
  // posted drives only.
  for (int i = 0; i < options_.workers; ++i) drivers_.emplace_back([this] { DriverLoop(); });
  sweeper_ = std::thread([this] { SweeperLoop(); });
}

void DriverPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  sweep_cv_.notify_all();
  wake_.NotifyAll();
  for (auto& t : drivers_) t.join();
  drivers_.clear();
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(jobs_);
  }
  dropped.clear();  // outside the lock: a job's captures may notify its handler
  if (sweeper_.joinable()) sweeper_.join();
  if (work_thread_.joinable()) work_thread_.join();
}

void DriverPool::Enqueue(const std::string& id) {
  if (options_.use_leases) {
    wake_.Notify();  // Engine::Work claims it (or another runnable saga) at once
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || queued_.count(id) > 0 || driving_.count(id) > 0) return;
  queued_.insert(id);
  queue_.push_back(id);
  cv_.notify_one();
}

bool DriverPool::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void DriverPool::Kick() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sweep_now_ = true;
  }
  sweep_cv_.notify_all();
}

bool DriverPool::BeginDrive(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return driving_.insert(id).second;
}

void DriverPool::EndDrive(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  driving_.erase(id);
}

void DriverPool::DriverLoop() {
  for (;;) {
    std::string id;
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty() || !queue_.empty(); });
      if (stopping_) return;
      if (!jobs_.empty()) {
        job = std::move(jobs_.front());
        jobs_.pop_front();
      } else {
        id = queue_.front();
        queue_.pop_front();
        queued_.erase(id);
      }
    }
    if (job) {
      job();
      continue;
    }
    if (!BeginDrive(id)) continue;  // driven elsewhere; the sweeper comes back
    auto r = engine_->Run(id);
    (void)r;  // the journal says where it stands; the sweeper retries errors
    EndDrive(id);
  }
}

void DriverPool::SweepOnce() {
  storage::SagaFilter f;
  f.limit = 1'000'000;
  f.states = {SagaStateName(SagaState::kAwaitingApproval)};
  if (!options_.use_leases) {
    f.states.push_back(SagaStateName(SagaState::kPending));
    f.states.push_back(SagaStateName(SagaState::kRunning));
    f.states.push_back(SagaStateName(SagaState::kCompensating));
  }
  auto list = store_->ListSagas(f);
  if (!list.ok()) return;
  std::reverse(list->begin(), list->end());  // oldest first
  const size_t listed = list->size();
  (void)AddControlled(store_, &*list);                // moved by a control request (after those)
  (void)AddIdleDue(store_, clock_->NowMs(), &*list);  // open sagas past their idle timeout
  int64_t now = clock_->NowMs();
  (void)completion::AddDue(store_, now, &*list);  // a provider check is due (saga/completion.h)
  for (auto it = list->begin(); it != list->end(); ++it) {
    const bool controlled = static_cast<size_t>(it - list->begin()) >= listed;
    storage::SagaRecord rec;
    rec.summary = *it;
    if (!controlled && it->state == SagaStateName(SagaState::kAwaitingApproval)) {
      // Waiting: only a decided or expired approval has anything to drive.
      auto loaded = store_->LoadSaga(it->saga_id);
      if (!loaded.ok()) continue;
      rec = std::move(loaded).value();
    }
    if (!controlled && !NeedsDrive(rec, now)) continue;
    if (options_.use_leases) {
      (void)engine_->Run(it->saga_id);  // leased: another holder answers kAborted
    } else {
      Enqueue(it->saga_id);
    }
  }
}

void DriverPool::SweeperLoop() {
  for (;;) {
    SweepOnce();
    std::unique_lock<std::mutex> lock(mu_);
    sweep_cv_.wait_for(lock, std::chrono::milliseconds(options_.sweep_ms),
                       [&] { return stopping_ || sweep_now_; });
    if (stopping_) return;
    sweep_now_ = false;
  }
}

}  // namespace idem::server
