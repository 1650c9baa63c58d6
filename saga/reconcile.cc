#include "saga/reconcile.h"

#include <map>
#include <optional>
#include <set>
#include <utility>

#include "saga/states.h"

namespace idem::reconcile {
namespace {

// The journal's record of one saga, read once per run.
struct SagaView {
  bool found = false;
  std::map<std::string, std::string> step_state;  // step id -> state
  std::set<std::string> effect_keys;              // action effects' keys
};

class Views {
 public:
  explicit Views(storage::Store* store) : store_(store) {}
  const SagaView& Get(const std::string& saga_id) {
    auto it = views_.find(saga_id);
    if (it != views_.end()) return it->second;
    SagaView v;
    auto rec = store_->LoadSaga(saga_id);
    if (rec.ok()) {
      v.found = true;
      for (const storage::StepRecord& st : rec->steps) v.step_state[st.step_id] = st.state;
      auto effects = store_->ListEffects(saga_id);
      if (effects.ok()) {
        for (const storage::EffectRecord& f : *effects) {
          if (f.kind == "action") v.effect_keys.insert(f.idempotency_key);
        }
      }
    }
    return views_.emplace(saga_id, std::move(v)).first->second;
  }

 private:
  storage::Store* store_;
  std::map<std::string, SagaView> views_;
};

// The saga a step key names: keys are `<saga id>/<step id>`.
std::pair<std::string, std::string> SplitKey(const std::string& key) {
  const size_t slash = key.find('/');
  if (slash == std::string::npos) return {"", ""};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

}  // namespace

Result<DriftReport> FindDrift(storage::Store* store, const ToolRegistry& tools,
                              const DriftOptions& options) {
  Clock* clock = options.clock != nullptr ? options.clock : SystemClock::Get();
  auto effects = store->ListEffectsSince(options.since_ms, options.limit);
  if (!effects.ok()) return effects.status();
  DriftReport report;
  Views views(store);
  auto record = [&](storage::DriftFinding f) -> Status {
    f.found_ms = clock->NowMs();
    auto fresh = store->RecordDrift(f);
    if (!fresh.ok()) return fresh.status();
    if (*fresh && options.observer) {
      storage::JournalEntry e;
      e.saga_id = f.saga_id;
      e.step_id = f.step_id;
      e.event = "drift";
      e.data = {{"kind", f.kind}, {"tool", f.tool}, {"key", f.key}, {"detail", f.detail}};
      e.at_ms = f.found_ms;
      options.observer(e);
    }
    report.drifts.push_back({std::move(f), *fresh});
    return Status::Ok();
  };

  // The journal's effects against the providers' status.
  for (const storage::EffectRecord& eff : *effects) {
    Tool* tool = tools.Find(eff.tool);
    if (tool == nullptr || !tool->info().has_status) {
      ++report.skipped;
      continue;
    }
    const SagaView& view = views.Get(eff.saga_id);
    auto state = view.step_state.find(eff.step_id);
    if (state == view.step_state.end() || state->second != StepStateName(StepState::kSucceeded)) {
      continue;  // undone or being undone: the provider may rightly not hold it
    }
    ++report.checked;
    LookupOutcome look = tool->Lookup(eff.idempotency_key);
    if (look.kind == LookupKind::kNotApplied || look.kind == LookupKind::kFailed) {
      storage::DriftFinding f;
      f.kind = "effect_missing";
      f.tool = eff.tool;
      f.key = eff.idempotency_key;
      f.saga_id = eff.saga_id;
      f.step_id = eff.step_id;
      f.detail = std::string("the journal holds the effect; the provider answers ") +
                 LookupKindName(look.kind) + (look.error.empty() ? "" : ": " + look.error);
      IDEM_RETURN_IF_ERROR(record(std::move(f)));
    } else if (look.kind != LookupKind::kApplied) {
      report.errors.push_back(eff.tool + " " + eff.idempotency_key + ": status " +
                              LookupKindName(look.kind) +
                              (look.error.empty() ? "" : ": " + look.error));
    }
  }

  // The providers' effects against the journal.
  for (const ToolInfo& info : tools.List()) {
    if (!info.has_list) continue;
    Tool* tool = tools.Find(info.name);
    auto held = tool->ListEffects(options.since_ms);
    if (!held.ok()) {
      report.errors.push_back(info.name + ": list: " + held.status().message());
      continue;
    }
    for (const ProviderEffect& p : *held) {
      ++report.listed;
      auto [saga_id, step_id] = SplitKey(p.key);
      bool known = false;
      if (!saga_id.empty()) {
        const SagaView& view = views.Get(saga_id);
        known = view.found && view.effect_keys.count(p.key) > 0;
        if (!view.found) saga_id.clear();  // no such saga: a finding row only
      }
      if (known) continue;
      storage::DriftFinding f;
      f.kind = "orphan";
      f.tool = info.name;
      f.key = p.key;
      f.saga_id = saga_id;
      f.step_id = saga_id.empty() ? "" : step_id;
      f.detail = "the provider holds an effect" +
                 (p.external_ref.empty() ? std::string() : " (" + p.external_ref + ")") +
                 " the journal has no effect for";
      IDEM_RETURN_IF_ERROR(record(std::move(f)));
    }
  }
  return report;
}

}  // namespace idem::reconcile
