#include "saga/reconcile.h"

#include <map>
#include <optional>
#include <set>
#include <utility>

#include "saga/states.h"

#include "effect/call.h"
#include "effect/mutation.h"
#include "effect/protocol.h"

namespace idem::reconcile {
namespace {

// The journal's record of one saga, read once per run.
struct SagaView {
  bool found = false;
  std::map<std::string, std::string> step_state;  // step id -> state
  std::set<std::string> effect_keys;              // action effects' keys
  /// The key each step's calls carried, as its `submitted` journaled it: the
  /// saga/step key, or a business key (`charge:A-1001`). That is the key
  /// the provider knows.
  std::map<std::string, std::string> provider_key;
  /// Steps a guard found done by a read of another tool: no call was made,
  /// so the provider's lookup of the step's key rightly knows nothing.
  std::set<std::string> read_guarded;
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
      auto journal = store_->ReadJournal(saga_id);
      if (journal.ok()) {
        for (const storage::JournalEntry& e : *journal) {
          if (e.step_id.empty() || !e.data.is_object()) continue;
          const Json* key =
              e.data.contains("key") && e.data["key"].is_string() ? &e.data["key"] : nullptr;
          if (e.event == "submitted" && key != nullptr) {
            v.provider_key[e.step_id] = key->get<std::string>();
          } else if (e.event == "succeeded" && e.data.value("satisfied_by", "") == "guard") {
            const Json& g = e.data.contains("guard") ? e.data["guard"] : Json::object();
            if (!g.value("status_lookup", false)) v.read_guarded.insert(e.step_id);
            if (key != nullptr) v.provider_key[e.step_id] = key->get<std::string>();
          }
        }
      }
    }
    return views_.emplace(saga_id, std::move(v)).first->second;
  }

 private:
  storage::Store* store_;
  std::map<std::string, SagaView> views_;
};

// The key an effect's step sent its calls under (a business key, or the
// effects row's `<saga>/<step>`).
std::string ProviderKey(const SagaView& view, const storage::EffectRecord& eff) {
  if (effect::Mutated(effect::Mutation::kDriftAsksTheRowKey)) return eff.idempotency_key;
  auto it = view.provider_key.find(eff.step_id);
  return it != view.provider_key.end() ? it->second : eff.idempotency_key;
}

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

  // The journal's effects against the providers' status. `sent_keys`: the
  // keys the journal's effects were sent under, for the orphan check.
  std::set<std::string> sent_keys;
  for (const storage::EffectRecord& eff : *effects) {
    if (eff.kind == "action" && !effect::Mutated(effect::Mutation::kDriftAsksTheRowKey)) {
      sent_keys.insert(ProviderKey(views.Get(eff.saga_id), eff));
    }
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
    if (view.read_guarded.count(eff.step_id) > 0 &&
        !effect::Mutated(effect::Mutation::kDriftAsksTheRowKey)) {
      ++report.skipped;  // found by a guard's read: the provider was never called
      continue;
    }
    ++report.checked;
    const std::string key = ProviderKey(view, eff);
    LookupOutcome look = effect::Lookup(effect::CallKind::kDriftCheck, tool, key, nullptr);
    effect::Situation s;
    s.kind = effect::CallKind::kDriftCheck;
    s.caps = effect::Capabilities::Of(tool->info());
    s.answer = effect::AnswerOf(look);
    const effect::Decision dec = effect::Decide(s);
    if (dec.action == effect::Action::kRecordFailed) {
      storage::DriftFinding f;
      f.kind = "effect_missing";
      f.tool = eff.tool;
      f.key = key;
      f.saga_id = eff.saga_id;
      f.step_id = eff.step_id;
      f.detail = std::string("the journal holds the effect; the provider answers ") +
                 LookupKindName(look.kind) + (look.error.empty() ? "" : ": " + look.error);
      IDEM_RETURN_IF_ERROR(record(std::move(f)));
    } else if (dec.action != effect::Action::kRecordSucceeded) {
      report.errors.push_back(eff.tool + " " + key + ": status " + LookupKindName(look.kind) +
                              (look.error.empty() ? "" : ": " + look.error));
    }
  }

  // The providers' effects against the journal.
  for (const ToolInfo& info : tools.List()) {
    if (!info.has_list) continue;
    Tool* tool = tools.Find(info.name);
    auto held = effect::ListEffects(tool, options.since_ms, nullptr);
    if (!held.ok()) {
      report.errors.push_back(info.name + ": list: " + held.status().message());
      continue;
    }
    for (const ProviderEffect& p : *held) {
      ++report.listed;
      auto [saga_id, step_id] = SplitKey(p.key);
      bool known = sent_keys.count(p.key) > 0;
      if (!known && !saga_id.empty()) {
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
