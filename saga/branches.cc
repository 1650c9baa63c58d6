#include "saga/branches.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "saga/schedule.h"

#include "common/failpoint.h"

namespace idem {
namespace {

std::vector<std::vector<int>> Parents(const SagaSpec& spec) {
  std::vector<std::vector<int>> out;
  for (const StepSpec& s : spec.steps) out.push_back(s.after);
  return out;
}

std::vector<StepState> States(const SagaRun& run) {
  std::vector<StepState> out;
  for (int i = 0; i < run.step_count(); ++i) out.push_back(run.step_state(i));
  return out;
}

// A failed or parked step, whoever left it (first by index), else -1.
int FirstInState(const SagaRun& run, StepState state) {
  for (int i = 0; i < run.step_count(); ++i) {
    if (run.step_state(i) == state) return i;
  }
  return -1;
}

// Once a branch failed or parked, nothing new starts (in this drive or a
// later one); the branches in flight at their provider are still checked.
bool ForwardStopped(const SagaRun& run) {
  return FirstInState(run, StepState::kFailed) >= 0 ||
         FirstInState(run, StepState::kNeedsAttention) >= 0;
}

// The steps to drive now: ReadySteps (none once the forward path stopped),
// and the processing steps whose check is due (saga/completion.h), in index
// order.
Result<std::vector<int>> Ready(const SagaRun& run, const std::vector<std::vector<int>>& parents) {
  std::vector<int> ready;
  if (!ForwardStopped(run)) ready = ReadySteps(parents, States(run));
  auto due = run.DueProcessingSteps();
  if (!due.ok()) return due.status();
  ready.insert(ready.end(), due->begin(), due->end());
  std::sort(ready.begin(), ready.end());
  return ready;
}

// What the round came to, from the steps' states and what this round's
// branches ended with.
Result<ForwardRound> Summarize(const SagaRun& run, const std::map<int, StepEnd>& ends,
                               bool started_any, bool left_ready) {
  // A branch still at its provider when another failed or parked: the saga
  // waits for its check first. Rolling back now would leave it unchecked
  // and never undone, though its provider may still finish it.
  const int processing = FirstInState(run, StepState::kProcessing);
  if (int i = FirstInState(run, StepState::kFailed); i >= 0) {
    if (processing >= 0) return ForwardRound{ForwardRound::kProcessing, processing};
    return ForwardRound{ForwardRound::kFailed, i};
  }
  if (int i = FirstInState(run, StepState::kNeedsAttention); i >= 0) {
    if (processing >= 0) return ForwardRound{ForwardRound::kProcessing, processing};
    return ForwardRound{ForwardRound::kParked, i};
  }
  if (left_ready) return ForwardRound{ForwardRound::kMore, -1};
  for (const auto& [index, end] : ends) {
    if (end == StepEnd::kWaiting) return ForwardRound{ForwardRound::kWaiting, index};
  }
  // A branch in flight at its provider: the saga waits for its check.
  if (processing >= 0) return ForwardRound{ForwardRound::kProcessing, processing};
  bool all = run.step_count() > 0;
  for (int i = 0; i < run.step_count(); ++i) all &= run.step_state(i) == StepState::kSucceeded;
  if (all) return ForwardRound{ForwardRound::kAllSucceeded, -1};
  if (started_any) return ForwardRound{ForwardRound::kMore, -1};
  return Status::Internal("saga " + run.saga_id() + ": no step is ready and none has ended it");
}

// The branches of one round: threads that each drive one step, and the
// bookkeeping of what they came to. Everything here runs under the run's
// lock, except the waits.
class Branches {
 public:
  Branches(SagaRun* run, const StepDrivers& drivers)
      : run_(run), drivers_(drivers), parents_(Parents(run->spec())) {}

  Result<ForwardRound> Run() {
    std::unique_lock<std::mutex> lock(run_->branch_mutex());
    run_->set_parallel(true);
    Start();
    while (!threads_.empty()) {
      done_cv_.wait(lock, [&] { return !done_.empty(); });
      try {
        while (!done_.empty()) Finish();
        if (!halted_) CheckControl();
      } catch (...) {  // the branches still running must be joined first
        if (!fault_) fault_ = std::current_exception();
        halted_ = true;
      }
      Start();
    }
    run_->set_parallel(false);
    if (fault_) std::rethrow_exception(fault_);
    if (!error_.ok()) return error_;
    return Summarize(*run_, ends_, !started_.empty(), left_ready_);
  }

 private:
  struct Done {
    int index;
    std::optional<Result<StepEnd>> end;
    std::exception_ptr fault;
  };

  // Starts the ready steps that are not started yet, as far as the cap and
  // the round's state allow.
  void Start() {
    std::vector<int> ready;
    auto candidates = Ready(*run_, parents_);
    if (!candidates.ok()) {
      Halt(candidates.status());
      return;
    }
    for (int i : *candidates) {
      if (started_.count(i) == 0) ready.push_back(i);
    }
    if (ready.empty()) return;
    if (halted_ || run_->Stopping()) {
      left_ready_ = true;
      return;
    }
    const int cap = std::max(1, run_->options().max_parallel_steps);
    std::vector<std::pair<int, std::optional<StepDrive>>> batch;
    try {
      for (int i : ready) {
        if (static_cast<int>(threads_.size() + batch.size()) >= cap) break;  // when one ends
        started_.insert(i);
        auto staged = drivers_.stage(i);
        if (!staged.ok()) {
          Halt(staged.status());
          break;
        }
        batch.emplace_back(i, std::move(*staged));
      }
      // One transaction for the `submitted` of every branch that starts now,
      // durable before any of their tools is called.
      if (Status s = run_->Flush(); !s.ok()) {
        Halt(s);
        return;  // nothing of the batch is called
      }
      for (auto& [index, d] : batch) {
        if (d && !d->queue.empty() && d->queue.front() == StepCommand::kCallTool) {
          IDEM_FAILPOINT("step.after_submitted");
        }
      }
    } catch (...) {
      if (!fault_) fault_ = std::current_exception();
      halted_ = true;
      return;
    }
    for (auto& [index, d] : batch) Spawn(index, std::move(d));
  }

  void Spawn(int index, std::optional<StepDrive> staged) {
    SagaRun* run = run_;
    const StepDrivers* drivers = &drivers_;
    threads_.emplace(index,
                     std::thread([this, run, drivers, index, d = std::move(staged)]() mutable {
                       std::unique_lock<std::mutex> lock(run->branch_mutex());
                       Done out{index, std::nullopt, nullptr};
                       try {
                         out.end = d ? run->RunCommands(&*d) : drivers->drive(index);
                         // Before the lock goes: no sibling retries once this failure is known.
                         if (out.end->ok() && **out.end == StepEnd::kFailed) run->HaltForward();
                       } catch (...) {
                         out.fault = std::current_exception();
                       }
                       done_.push_back(std::move(out));
                       done_cv_.notify_all();
                     }));
  }

  void Finish() {
    Done out = std::move(done_.front());
    done_.pop_front();
    auto t = threads_.find(out.index);
    t->second.join();  // past its last use of the run: it only has to end
    threads_.erase(t);
    if (out.fault) {
      if (!fault_) fault_ = out.fault;
      halted_ = true;
      return;
    }
    if (!out.end->ok()) {
      Halt(out.end->status());
      return;
    }
    StepEnd end = **out.end;
    ends_[out.index] = end;
    if (end == StepEnd::kFailed || end == StepEnd::kParked) halted_ = true;
  }

  // A pending cancel or pause: nothing new starts; the loop between steps
  // (saga/drive.cc) carries it out once the branches in flight have ended.
  void CheckControl() {
    auto pending = run_->PendingControl();
    if (!pending.ok()) {
      Halt(pending.status());
    } else if (pending->has_value()) {
      halted_ = true;
    }
  }

  void Halt(const Status& s) {
    if (error_.ok()) error_ = s;
    halted_ = true;
  }

  SagaRun* run_;
  const StepDrivers& drivers_;
  const std::vector<std::vector<int>> parents_;
  std::set<int> started_;
  std::map<int, std::thread> threads_;
  std::deque<Done> done_;  // GUARDED_BY(run_->branch_mutex())
  std::condition_variable done_cv_;
  std::map<int, StepEnd> ends_;
  bool halted_ = false;
  bool left_ready_ = false;
  Status error_;
  std::exception_ptr fault_;
};

}  // namespace

Result<ForwardRound> RunReadySteps(SagaRun* run, const StepDrivers& drivers) {
  std::map<int, StepEnd> ends;
  // After a failure or a park only the due checks run (Ready).
  auto candidates = Ready(*run, Parents(run->spec()));
  if (!candidates.ok()) return candidates.status();
  const std::vector<int>& ready = *candidates;
  if (ready.size() <= 1 || run->options().max_parallel_steps <= 1) {
    // One at a time: on this thread, exactly as a sequential saga runs.
    if (ready.empty()) return Summarize(*run, ends, false, false);
    auto end = drivers.drive(ready[0]);
    if (!end.ok()) return end.status();
    ends[ready[0]] = *end;
    return Summarize(*run, ends, true, /*left_ready=*/ready.size() > 1);
  }
  Branches branches(run, drivers);
  return branches.Run();
}

}  // namespace idem
