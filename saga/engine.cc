#include "saga/engine.h"

#include <exception>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "saga/drive.h"
#include "saga/lease_renewer.h"
#include "saga/park.h"
#include "saga/run.h"
#include "saga/states.h"
#include "saga/step_key.h"

#include "common/failpoint.h"
#include "common/time_ordered_id.h"

namespace idem {

using storage::SagaRecord;

struct Engine::SpecCache {
  static constexpr size_t kMaxEntries = 256;
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const SagaSpec>> specs;  // GUARDED_BY(mu)
};

struct Engine::DriveBook {
  std::mutex mu;
  std::unordered_map<std::string, int> driving;  // GUARDED_BY(mu) saga -> drives here
  std::unordered_set<std::string> held;          // GUARDED_BY(mu) without leases: TryHold
};

bool Engine::TryHold(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(drives_->mu);
  return drives_->held.insert(saga_id).second;
}

void Engine::Unhold(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(drives_->mu);
  drives_->held.erase(saga_id);
}

void Engine::BeginDrive(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(drives_->mu);
  ++drives_->driving[saga_id];
}

void Engine::EndDrive(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(drives_->mu);
  auto it = drives_->driving.find(saga_id);
  if (it != drives_->driving.end() && --it->second == 0) drives_->driving.erase(it);
}

bool Engine::DrivenHere(const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(drives_->mu);
  return drives_->driving.count(saga_id) > 0;
}

Engine::Engine(storage::Store* store, const ToolRegistry* tools, EngineOptions options)
    : store_(store),
      tools_(tools),
      options_(std::move(options)),
      spec_cache_(std::make_unique<SpecCache>()),
      drives_(std::make_unique<DriveBook>()) {
  if (options_.owner.empty()) options_.owner = NewId("drv_");
  LeaseRenewer::Observer on_failure;
  if (options_.lease_renew_observer) {
    on_failure = [observe = options_.lease_renew_observer](LeaseRenewer::Failure f) {
      observe(f == LeaseRenewer::Failure::kLost);
    };
  }
  renewer_ = std::make_unique<LeaseRenewer>(store_, options_.lease_ms, std::move(on_failure));
}

Engine::~Engine() = default;

Result<SagaSpec> Engine::CachedSpec(const Json& spec) {
  std::string text = spec.dump();
  {
    std::lock_guard<std::mutex> lock(spec_cache_->mu);
    auto it = spec_cache_->specs.find(text);
    if (it != spec_cache_->specs.end()) return *it->second;
  }
  auto parsed = ParseStoredPlan(spec, *tools_);  // an open saga's plan too
  if (!parsed.ok()) return parsed.status();
  std::lock_guard<std::mutex> lock(spec_cache_->mu);
  if (spec_cache_->specs.size() >= SpecCache::kMaxEntries) spec_cache_->specs.clear();
  spec_cache_->specs.emplace(std::move(text), std::make_shared<const SagaSpec>(*parsed));
  return parsed;
}

Result<storage::NewSaga> Engine::NewIntent(const SagaSpec& spec, const Json& input,
                                           const std::string& intent_key,
                                           const std::optional<ModelDecision>& decision) {
  if (intent_key.empty()) return Status::InvalidArgument("intent key: must not be empty");
  if (intent_key.size() > 255) return Status::InvalidArgument("intent key: longer than 255 bytes");
  if (!input.is_object()) return Status::InvalidArgument("input: expected a JSON object");
  IDEM_RETURN_IF_ERROR(CheckSubmitLimits(spec, input, options_.limits));
  IDEM_RETURN_IF_ERROR(CheckStepKeys(spec, input));  // business keys render (saga/step_key.h)
  storage::NewSaga ns;
  ns.saga_id = NewSagaId(options_.random_saga_ids);  // time-ordered by default
  ns.intent_key = intent_key;
  ns.fingerprint = Fingerprint({{"spec", spec.raw}, {"input", input}});
  ns.spec_name = spec.name;
  ns.spec_version = spec.registered_version;
  ns.spec_sha256 = Fingerprint(spec.raw);
  ns.spec = spec.raw;
  ns.input = input;
  ns.state = SagaStateName(SagaState::kPending);
  ns.created_ms = options_.clock->NowMs();
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    storage::NewStep s;
    s.index = static_cast<int>(i);
    s.step_id = spec.steps[i].id;
    s.tool = spec.steps[i].tool;
    s.step_key = StepKey(ns.saga_id, s.step_id);
    s.state = StepStateName(StepState::kPlanned);
    ns.steps.push_back(s);
  }
  storage::JournalEntry created;
  created.saga_id = ns.saga_id;
  created.event = "saga_created";
  created.data = {
      {"intent_key", intent_key},
      {"spec", spec.name},
      {"spec_version", spec.registered_version > 0 ? Json(spec.registered_version) : Json()},
      {"spec_sha256", ns.spec_sha256},
      {"fingerprint", ns.fingerprint}};
  if (decision) created.data["decision"] = decision->ToJson();
  created.at_ms = ns.created_ms;
  ns.journal.push_back(created);
  return ns;
}

Result<SubmitResult> Engine::Submit(const SagaSpec& spec, const Json& input,
                                    const std::string& intent_key,
                                    const std::optional<ModelDecision>& decision) {
  auto ns = NewIntent(spec, input, intent_key, decision);
  if (!ns.ok()) return ns.status();
  IDEM_FAILPOINT("intent.before_commit");
  auto out = store_->CreateIntent(*ns);
  if (!out.ok()) return out.status();
  IDEM_FAILPOINT("intent.after_commit");
  if (out->created && options_.observer) options_.observer(ns->journal.front());
  if (!out->created && options_.duplicate_observer) options_.duplicate_observer("existing_intent");
  return SubmitResult{out->saga_id, out->created};
}

Result<SagaRecord> Engine::SubmitAndRun(
    const SagaSpec& spec, const Json& input, const std::string& intent_key,
    const std::optional<ModelDecision>& decision,
    const std::function<void(const SubmitResult&)>& on_recorded) {
  auto ns = NewIntent(spec, input, intent_key, decision);
  if (!ns.ok()) return ns.status();
  // A key submitted before is answered by a read, then driven as Run would.
  auto found = store_->FindIntent(*ns);
  if (!found.ok()) return found.status();
  if (!found->has_value()) {
    const std::string saga_id = ns->saga_id;
    // What FindIntent reads of it, kept: the drive takes `ns`.
    storage::NewSaga probe;
    probe.intent_key = ns->intent_key;
    probe.fingerprint = ns->fingerprint;
    storage::Lease lease{saga_id, options_.owner, 0, 0};
    if (options_.use_leases) {
      ns->lease_owner = options_.owner;
      ns->lease_ms = options_.lease_ms;
      lease.epoch = 1;  // what the create writes
    }
    bool recorded = false;
    auto out = DriveOne(lease, /*held=*/false, std::move(ns).value(), [&] {
      recorded = true;
      if (on_recorded) on_recorded(SubmitResult{saga_id, true});
    });
    if (recorded || out.ok() || out.status().code() != Code::kConflict) return out;
    // Refused at its first write: another submitter recorded the key in
    // between (nothing of this drive was written, no tool was called).
    found = store_->FindIntent(probe);
    if (!found.ok()) return found.status();
    if (!found->has_value()) return out.status();
  }
  if (options_.duplicate_observer) options_.duplicate_observer("existing_intent");
  const SubmitResult existing{(*found)->saga_id, false};
  if (on_recorded) on_recorded(existing);
  return Run(existing.saga_id);
}

Result<SagaRecord> Engine::Run(const std::string& saga_id) {
  if (options_.use_leases) {
    // A finished or parked saga is answered from the journal: no lease, no
    // write (a duplicate call costs a read).
    auto rec = store_->LoadSaga(saga_id);
    if (!rec.ok()) return rec.status();
    auto state = ParseSagaState(rec->summary.state);
    if (state && (IsTerminal(*state) || *state == SagaState::kNeedsAttention)) return rec;
  }
  return Drive(saga_id);
}

Result<SagaRecord> Engine::Drive(const std::string& saga_id) {
  if (!options_.use_leases) return RunLeased(storage::Lease{saga_id, options_.owner, 0, 0});
  // The claim, the saga and its control request in one call (one round
  // trip on PostgreSQL).
  auto claimed = store_->ClaimAndLoad(saga_id, options_.owner, options_.lease_ms);
  if (!claimed.ok()) {
    if (claimed.status().code() == Code::kAborted) {
      return Status::Aborted("saga " + saga_id + " is being driven by another worker");
    }
    return claimed.status();
  }
  return DriveOne(claimed->lease, /*held=*/false, std::nullopt, nullptr, &*claimed);
}

Result<storage::Lease> Engine::Claim(const std::string& saga_id) {
  // Without leases: epoch 0, unfenced, nothing to renew or release.
  if (!options_.use_leases) return storage::Lease{saga_id, options_.owner, 0, 0};
  return store_->ClaimSaga(saga_id, options_.owner, options_.lease_ms);
}

Result<storage::Lease> Engine::ClaimForDecision(const std::string& saga_id) {
  auto lease = Claim(saga_id);
  if (!lease.ok() && lease.status().code() == Code::kAborted) {
    return Status::Unavailable("saga " + saga_id + " is busy; try again");
  }
  return lease;
}

Status Engine::CommitClaimed(const storage::Lease& lease, storage::WriteBatch* b) {
  b->fence_epoch = lease.epoch;
  IDEM_RETURN_IF_ERROR(store_->Commit(*b));
  if (options_.observer) {
    for (const auto& e : b->journal) options_.observer(e);
  }
  return Status::Ok();
}

namespace {

// After an exception out of a drive: parks the saga (when the run got that
// far) and says what happened.
Status Faulted(const std::string& saga_id, std::optional<SagaRun>* run, const std::string& what) {
  std::string reason = "internal error while driving: " + what;
  Status parked = Status::Ok();
  if (run->has_value()) {
    try {
      parked = (*run)->ParkAfterFault(reason);
    } catch (const std::exception& e) {
      parked = Status::Internal(e.what());
    } catch (...) {
      parked = Status::Internal("unknown exception");
    }
  }
  return Status::Internal("saga " + saga_id + ": " + reason +
                          (parked.ok() ? "" : " (not parked: " + parked.message() + ")"));
}

}  // namespace

Result<SagaRecord> Engine::ParkUnloadable(const LoadedSaga& saga, const Status& spec_error,
                                          int64_t fence_epoch) {
  const std::string& saga_id = saga.record.summary.saga_id;
  ParkCode code = spec_error.ok() ? ParkCode::kInvalidSpec : SpecParkCode(spec_error);
  std::string message = spec_error.ok()
                            ? "the frozen spec and the journal disagree on the steps"
                            : "the frozen spec no longer validates: " + spec_error.message();
  auto batch = ParkUnloadableBatch(saga, code, message, options_.clock->NowMs(), fence_epoch);
  if (!batch.ok()) return Status::FailedPrecondition("saga " + saga_id + ": " + message);
  IDEM_RETURN_IF_ERROR(store_->Commit(*batch));
  if (options_.observer) {
    for (const auto& e : batch->journal) options_.observer(e);
  }
  return store_->LoadSaga(saga_id);
}

namespace {

// The record LoadSaga would answer for `ns` right after CreateIntent.
SagaRecord RecordOf(const storage::NewSaga& ns) {
  SagaRecord rec;
  rec.summary.saga_id = ns.saga_id;
  rec.summary.intent_key = ns.intent_key;
  rec.summary.spec_name = ns.spec_name;
  rec.summary.spec_version = ns.spec_version;
  rec.summary.spec_sha256 = ns.spec_sha256;
  rec.summary.state = ns.state;
  rec.summary.created_ms = ns.created_ms;
  rec.summary.updated_ms = ns.created_ms;
  rec.fingerprint = ns.fingerprint;
  rec.spec = ns.spec;
  rec.input = ns.input;
  rec.steps.reserve(ns.steps.size());
  for (const storage::NewStep& s : ns.steps) {
    storage::StepRecord st;
    st.saga_id = ns.saga_id;
    st.index = s.index;
    st.step_id = s.step_id;
    st.tool = s.tool;
    st.state = s.state;
    st.step_key = s.step_key;
    st.updated_ms = ns.created_ms;
    rec.steps.push_back(std::move(st));
  }
  return rec;
}

}  // namespace

Result<SagaRecord> Engine::RunLeased(const storage::Lease& lease, bool held) {
  return DriveOne(lease, held, std::nullopt, nullptr);
}

Result<SagaRecord> Engine::DriveOne(const storage::Lease& lease, bool held,
                                    std::optional<storage::NewSaga> create,
                                    const std::function<void()>& on_created,
                                    storage::ClaimedSaga* claimed) {
  const std::string& saga_id = lease.saga_id;
  // Without leases, one driver per saga in this process (an open saga's call
  // and the server's pool may reach one saga at once).
  const bool hold_here = lease.epoch == 0 && !held;
  if (hold_here && !TryHold(saga_id)) {
    return Status::Aborted("saga " + saga_id + " is being driven by another thread");
  }
  struct Unholder {
    Engine* engine;
    const std::string* id;
    bool on;
    ~Unholder() {
      if (on) engine->Unhold(*id);
    }
  } unholder{this, &saga_id, hold_here};
  // Renewed while the drive runs, released on every way out (by the drive's
  // last write, else by the hold).
  // (A saga not in the store yet has no lease to renew before its create.)
  std::optional<LeaseRenewer::Hold> hold;
  if (lease.epoch != 0 && !create) hold.emplace(renewer_->Keep(lease));
  // For the control requests: one of this saga while it is driven here is
  // left to this drive, which reads the store between steps.
  DriveMark driving(this, saga_id);
  std::optional<SagaRun> run;
  Result<SagaRecord> out = Status::Internal("unset");
  try {
    auto rec = create    ? Result<SagaRecord>(RecordOf(*create))
               : claimed ? Result<SagaRecord>(std::move(claimed->record))
                         : store_->LoadSaga(saga_id);
    if (!rec.ok()) return rec.status();
    auto spec = CachedSpec(rec->spec);
    auto loaded = LoadedSaga::From(std::move(rec).value());
    if (!loaded.ok()) return loaded.status();
    if (create && !spec.ok()) return spec.status();  // nothing in the store to park
    if (!spec.ok() || spec->steps.size() != loaded->record.steps.size()) {
      // No drive can get past a plan it cannot read (saga/park.h).
      auto parked = ParkUnloadable(*loaded, spec.status(), lease.epoch);
      if (parked.ok() && hold) hold->set_released();
      return parked;
    }
    run.emplace(store_, tools_, options_, std::move(loaded).value(), std::move(spec).value());
    if (claimed != nullptr && claimed->control_read)
      run->PrefetchControl(std::move(claimed->control));
    if (create) {
      // Fenced on the epoch the create writes; the lease is kept from the
      // create on.
      run->Fence(lease.epoch, nullptr);
      run->CreateWithFirstFlush(std::move(create).value(), [&] {
        if (lease.epoch != 0) {
          hold.emplace(renewer_->Keep(lease));
          run->Fence(lease.epoch, hold->lost());
        }
        if (on_created) on_created();
      });
    } else if (hold) {
      run->Fence(lease.epoch, hold->lost());
      // With leases, another process may have driven the saga before;
      // without, the file lock proves the previous driver is gone.
      run->MarkTakenOver();
    }
    Status s = DriveSaga(&*run);
    if (s.ok()) {
      out = run->record();
    } else {
      out = s;
    }
  } catch (const std::exception& e) {
    out = Faulted(saga_id, &run, e.what());
  } catch (...) {
    out = Faulted(saga_id, &run, "unknown exception");
  }
  if (hold && run && run->released()) hold->set_released();
  return out;
}

}  // namespace idem
