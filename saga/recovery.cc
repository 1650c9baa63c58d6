// Engine::Recover: the recovery pool, and NeedsDrive, its predicate for one
// saga (the server's sweeper asks it). Every saga that had not finished
// (pending, running, compensating, or waiting for an approval that may have
// been decided or expired), and every paused or open saga with a control
// request pending, is claimed and driven, `concurrency` at a time.
// A drive that throws parks its saga (Engine::RunLeased); anything else a
// thread throws is reported in RecoveryReport::errors and the thread goes on.

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "preview_commit/phase.h"
#include "saga/completion.h"
#include "saga/engine.h"
#include "saga/states.h"

namespace idem {

Status AddControlled(storage::Store* store, std::vector<storage::SagaSummary>* list) {
  if (store->Controls() == nullptr) return Status::Ok();
  auto controls = store->Controls()->ListControls(1'000'000);
  if (!controls.ok()) return controls.status();
  for (const storage::ControlRequest& c : *controls) {
    auto rec = store->LoadSaga(c.saga_id);
    if (!rec.ok()) continue;
    // A paused or open saga moves on any request (one that is moot is
    // settled): an open saga's cancel (`open rollback`) recorded while a
    // process that then died held its lease is carried out here, not only
    // when someone asks again. One awaiting approval moves on a cancel (its
    // commit is rejected).
    const std::string& state = rec->summary.state;
    if (state == SagaStateName(SagaState::kPaused) || state == SagaStateName(SagaState::kOpen) ||
        (state == SagaStateName(SagaState::kAwaitingApproval) && c.kind == "cancel")) {
      list->push_back(rec->summary);
    }
  }
  return Status::Ok();
}

Result<RecoveryReport> Engine::Recover(int concurrency) {
  storage::SagaFilter filter;
  filter.states = {SagaStateName(SagaState::kPending), SagaStateName(SagaState::kRunning),
                   SagaStateName(SagaState::kCompensating),
                   SagaStateName(SagaState::kAwaitingApproval),
                   SagaStateName(SagaState::kAwaitingCompletion)};
  filter.limit = 1'000'000;
  auto list = store_->ListSagas(filter);
  if (!list.ok()) return list.status();
  // Paused sagas with a request pending move too (and waiting ones with a
  // cancel, listed twice then: the second drive finds nothing to do).
  IDEM_RETURN_IF_ERROR(AddControlled(store_, &*list));
  IDEM_RETURN_IF_ERROR(AddIdleDue(store_, options_.clock->NowMs(), &*list));  // saga/open_saga.h
  RecoveryReport report;
  std::mutex mu;
  std::atomic<size_t> next{0};
  const int64_t now = options_.clock->NowMs();
  auto recover_one = [&](const std::string& id, const std::string& before) {
    if (before == SagaStateName(SagaState::kAwaitingCompletion)) {
      // Waiting for a provider: driven only once a check is due
      // (saga/completion.h); before that it is reported waiting, untouched.
      auto earliest = completion::EarliestCheck(store_, id);
      if (earliest.ok() && earliest->has_value() && **earliest > now) {
        std::lock_guard<std::mutex> lock(mu);
        report.sagas.push_back(
            {id, RecoveredSaga::Outcome::kWaiting, before,
             "waiting for its provider; next check at " + std::to_string(**earliest) + " ms"});
        ++report.waiting_completion;
        return;
      }
    }
    // Listed as unfinished: claimed at once, without Run's read first
    // (which spares finished sagas a lease when called again).
    auto r = Drive(id);
    std::lock_guard<std::mutex> lock(mu);
    RecoveredSaga one;
    one.saga_id = id;
    if (!r.ok() && r.status().code() == Code::kAborted) {
      ++report.skipped;  // another worker holds its lease and drives it
      one.outcome = RecoveredSaga::Outcome::kSkipped;
      one.reason = r.status().message();
      report.sagas.push_back(std::move(one));
      return;
    }
    report.saga_ids.push_back(id);
    one.state = before;
    if (!r.ok()) {
      report.errors.push_back(id + ": " + r.status().ToString());
      one.reason = r.status().ToString();
      // A drive that failed may still have moved the saga (a fault parks it).
      auto now = store_->LoadSaga(id);
      if (now.ok()) one.state = now->summary.state;
    } else {
      one.state = r->summary.state;
      one.reason = r->summary.reason;
    }
    if (one.state == SagaStateName(SagaState::kNeedsAttention)) {
      one.outcome = RecoveredSaga::Outcome::kParked;
      ++report.parked;
      ++report.resumed;
    } else if (!r.ok() && one.state == before) {
      one.outcome = RecoveredSaga::Outcome::kFailed;
    } else if (one.state == before && before == SagaStateName(SagaState::kAwaitingApproval)) {
      one.outcome = RecoveredSaga::Outcome::kWaiting;
    } else if (one.state == SagaStateName(SagaState::kAwaitingCompletion)) {
      one.outcome = RecoveredSaga::Outcome::kWaiting;  // checked; still waits for its provider
      ++report.waiting_completion;
    } else {
      ++report.resumed;
    }
    report.sagas.push_back(std::move(one));
  };
  auto worker = [&] {
    for (size_t i = next++; i < list->size(); i = next++) {
      const std::string& id = (*list)[i].saga_id;
      std::string fault;
      try {
        recover_one(id, (*list)[i].state);
        continue;
      } catch (const std::exception& e) {
        fault = e.what();
      } catch (...) {
        fault = "unknown exception";
      }
      std::lock_guard<std::mutex> lock(mu);
      report.errors.push_back(id + ": internal: " + fault);
      report.sagas.push_back(
          {id, RecoveredSaga::Outcome::kFailed, (*list)[i].state, "internal: " + fault});
    }
  };
  int n = std::max(1, std::min<int>(concurrency, static_cast<int>(list->size())));
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return report;
}

const char* RecoveryOutcomeName(RecoveredSaga::Outcome outcome) {
  switch (outcome) {
    case RecoveredSaga::Outcome::kMoved:
      return "moved";
    case RecoveredSaga::Outcome::kParked:
      return "parked";
    case RecoveredSaga::Outcome::kWaiting:
      return "waiting";
    case RecoveredSaga::Outcome::kFailed:
      return "failed";
    case RecoveredSaga::Outcome::kSkipped:
      return "skipped";
  }
  return "?";
}

bool NeedsDrive(const storage::SagaRecord& saga, int64_t now_ms) {
  auto state = ParseSagaState(saga.summary.state);
  if (!state) return false;
  switch (*state) {
    case SagaState::kPending:
    case SagaState::kRunning:
    case SagaState::kCompensating:
      return true;
    case SagaState::kAwaitingApproval:
      for (const storage::StepRecord& st : saga.steps) {
        auto phase = preview_commit::PhaseRecord::FromJson(st.phase);
        if (st.state == StepStateName(StepState::kAwaitingApproval) && phase &&
            phase->Settled(now_ms)) {
          return true;
        }
      }
      return false;
    case SagaState::kOpen:  // nothing to drive until the next call, or its idle timeout
      return OpenIdleDue(saga, now_ms);
    default:
      return false;
  }
}

}  // namespace idem
