#include "chaos/checker.h"

#include <fstream>
#include <set>
#include <sstream>

namespace idem::chaos {

namespace {

const char kCompensateSuffix[] = ":compensate";

bool IsUndoKey(const std::string& key) {
  const size_t n = sizeof(kCompensateSuffix) - 1;
  return key.size() > n && key.compare(key.size() - n, n, kCompensateSuffix) == 0;
}

std::string ActionKey(const std::string& key) {
  return IsUndoKey(key) ? key.substr(0, key.size() - (sizeof(kCompensateSuffix) - 1)) : key;
}

bool IsTerminal(const std::string& s) {
  return s == "succeeded" || s == "compensated" || s == "cancelled" || s == "failed";
}

bool WaitsForPerson(const std::string& s) {
  return s == "needs_attention" || s == "awaiting_approval" || s == "paused";
}

bool RolledBack(const std::string& s) { return s == "compensated" || s == "cancelled"; }

// Whether step `index` of the frozen spec declares a compensation.
bool HasCompensation(const Json& spec, int index) {
  if (!spec.is_object() || !spec.contains("steps") || !spec["steps"].is_array()) return false;
  const Json& steps = spec["steps"];
  if (index < 0 || static_cast<size_t>(index) >= steps.size()) return false;
  const Json& st = steps[static_cast<size_t>(index)];
  return st.is_object() && st.contains("compensate") && st["compensate"].is_object();
}

}  // namespace

const std::vector<std::string>& CheckNames() {
  static const std::vector<std::string> kNames = {"duplicate_effects",
                                                  "lost_sagas",
                                                  "intent_key_split",
                                                  "orphan_effects",
                                                  "missing_compensations",
                                                  "effects_left_behind",
                                                  "missing_effects",
                                                  "missing_effect_rows",
                                                  "unsettled_jobs",
                                                  "not_terminal_or_parked",
                                                  "parked_without_reason",
                                                  "parked_unsettled",
                                                  "late_writes"};
  return kNames;
}

int CheckResult::Count(const std::string& check) const {
  for (const auto& [name, n] : counts) {
    if (name == check) return n;
  }
  return 0;
}

CheckResult Check(const CheckData& data, const CheckOptions& options) {
  CheckResult r;
  r.sagas = static_cast<int>(data.sagas.size());
  r.effects = static_cast<int>(data.effects.size());
  r.journal_writes = static_cast<int>(data.journal_writes.size());
  std::set<std::string> acked_ids;
  for (const auto& a : data.acked) acked_ids.insert(a.saga_id);
  r.acked = static_cast<int>(acked_ids.size());
  auto add = [&](const std::string& check, const std::string& saga, const std::string& detail) {
    r.findings.push_back({check, saga, detail});
  };

  // Ledger effects by key: rows per (provider, operation, key), and which
  // keys have any row.
  std::map<std::string, int> rows;
  std::map<std::string, const travel::LedgerEffect*> by_key;
  for (const auto& e : data.effects) {
    rows[e.provider + "." + e.operation + " " + e.idempotency_key] += 1;
    by_key.emplace(e.idempotency_key, &e);
  }
  for (const auto& [what, n] : rows) {
    if (n > 1) add("duplicate_effects", "", what + " applied " + std::to_string(n) + " times");
  }

  std::set<std::string> saga_ids;
  std::set<std::string> step_keys;
  for (const auto& s : data.sagas) {
    saga_ids.insert(s.summary.saga_id);
    r.states[s.summary.state] += 1;
    for (const auto& st : s.steps) step_keys.insert(st.step_key);
  }
  for (const auto& a : data.acked) {
    if (!saga_ids.count(a.saga_id)) {
      add("lost_sagas", a.saga_id,
          "acknowledged (intent key " + a.intent_key + ") but not in the journal");
    }
  }
  // A resubmission with the same intent key (an agent's retry after a
  // kill) must answer the saga the first answer named.
  std::map<std::string, std::set<std::string>> by_intent;
  for (const auto& a : data.acked) by_intent[a.intent_key].insert(a.saga_id);
  std::map<std::string, std::string> intent_of;
  for (const auto& s : data.sagas) intent_of[s.summary.saga_id] = s.summary.intent_key;
  for (const auto& a : data.acked) {
    auto it = intent_of.find(a.saga_id);
    if (it != intent_of.end() && it->second != a.intent_key) {
      add("intent_key_split", a.saga_id,
          "acknowledged for intent key " + a.intent_key + ", but the journal has it under " +
              it->second);
    }
  }
  for (const auto& [intent, ids] : by_intent) {
    if (ids.size() > 1) {
      add("intent_key_split", *ids.begin(),
          "intent key " + intent + " was answered with " + std::to_string(ids.size()) +
              " different sagas");
    }
  }
  for (const auto& e : data.effects) {
    if (!step_keys.count(ActionKey(e.idempotency_key))) {
      add("orphan_effects", "",
          e.provider + "." + e.operation + " under key " + e.idempotency_key +
              ": no step of the journal has that key");
    }
  }

  std::set<std::string> action_rows;  // the journal's action effects, by key
  for (const auto& e : data.journal_effects) {
    if (e.kind == "action") action_rows.insert(e.idempotency_key);
  }

  for (const auto& s : data.sagas) {
    const std::string& id = s.summary.saga_id;
    const std::string& state = s.summary.state;
    for (const auto& st : s.steps) {
      if (!HasCompensation(s.spec, st.index)) continue;
      if (st.state == "succeeded" && !action_rows.count(st.step_key)) {
        add("missing_effect_rows", id,
            "step " + st.step_id + " succeeded, but the journal has no effect row under key " +
                st.step_key);
      }
      const bool applied = by_key.count(st.step_key) > 0;
      const bool undone = by_key.count(st.step_key + kCompensateSuffix) > 0;
      if ((RolledBack(state) || state == "failed") && applied && !undone) {
        if (RolledBack(state) && st.state == "compensated") {
          add("missing_compensations", id,
              "step " + st.step_id +
                  " is compensated in the journal, but the ledger has its "
                  "effect (key " +
                  st.step_key + ") and no undo");
        } else {
          add("effects_left_behind", id,
              "saga " + state + ", step " + st.step_id + " (" + st.state +
                  "): the ledger has its effect (key " + st.step_key + ") and no undo");
        }
      }
      if (state == "succeeded" && st.state == "succeeded" && !applied) {
        add("missing_effects", id,
            "step " + st.step_id + " succeeded, but the ledger has no effect under key " +
                st.step_key);
      }
    }
    if (!IsTerminal(state) && !WaitsForPerson(state)) {
      add("not_terminal_or_parked", id, "state " + state);
    }
    if (state == "needs_attention" && s.summary.reason.empty()) {
      add("parked_without_reason", id, "needs_attention with no reason");
    }
    if (options.after_resolve && WaitsForPerson(state)) {
      add("parked_unsettled", id,
          "still " + state + " after the person's pass" +
              (s.summary.reason.empty() ? "" : ": " + s.summary.reason));
    }
  }

  // A slow provider's job still pending once its saga has ended: the saga
  // stopped asking how it ended, and the provider may still carry it out.
  std::map<std::string, std::pair<std::string, std::string>> step_of_key;  // key: (saga, state)
  for (const auto& s : data.sagas) {
    for (const auto& st : s.steps) step_of_key[st.step_key] = {s.summary.saga_id, s.summary.state};
  }
  for (const auto& j : data.jobs) {
    if (j.outcome != "pending") continue;
    auto it = step_of_key.find(j.idempotency_key);
    if (it == step_of_key.end() || !IsTerminal(it->second.second)) continue;
    add("unsettled_jobs", it->second.first,
        "saga " + it->second.second + ", but " + j.provider + "." + j.operation + " job " +
            j.job_id + " (key " + j.idempotency_key + ") is still pending at its provider");
  }

  // A leasing process writes only while it holds the saga's lease: the
  // fence (lease epoch) refuses a write after someone else claimed it.
  for (const auto& w : data.journal_writes) {
    if (!w.writer.empty() && w.writer != w.lease_owner) {
      add("late_writes", w.saga_id,
          "journal entry " + std::to_string(w.seq) + " (" + w.event + ") written by " + w.writer +
              " while " + (w.lease_owner.empty() ? "nobody" : w.lease_owner) +
              " held the saga's lease");
    }
  }

  for (const auto& name : CheckNames()) {
    int n = 0;
    for (const auto& f : r.findings) n += f.check == name ? 1 : 0;
    r.counts.emplace_back(name, n);
  }
  return r;
}

Result<std::vector<JournalWrite>> ReadJournalAudit(const std::string& audit_file) {
  std::ifstream in(audit_file);
  if (!in) return Status::NotFound("audit file " + audit_file + ": cannot be read");
  std::vector<JournalWrite> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    std::vector<std::string> f;
    size_t pos = 0;
    while (true) {
      size_t tab = line.find('\t', pos);
      f.push_back(line.substr(pos, tab == std::string::npos ? std::string::npos : tab - pos));
      if (tab == std::string::npos) break;
      pos = tab + 1;
    }
    JournalWrite w;
    bool ok = f.size() == 5 && !f[0].empty() &&
              f[0].find_first_not_of("0123456789") == std::string::npos && f[0].size() < 19;
    if (!ok) {
      return Status::InvalidArgument(audit_file + ":" + std::to_string(n) +
                                     ": expected SEQ<TAB>SAGA<TAB>EVENT<TAB>WRITER<TAB>OWNER");
    }
    w.seq = std::stoll(f[0]);
    w.saga_id = f[1];
    w.event = f[2];
    w.writer = f[3];
    w.lease_owner = f[4];
    out.push_back(std::move(w));
  }
  return out;
}

Result<CheckData> LoadCheckData(const std::vector<std::string>& locators,
                                const std::vector<std::string>& ledgers,
                                const std::string& acked_file, const std::string& audit_file) {
  CheckData data;
  std::set<std::string> seen;
  for (const auto& locator : locators) {
    auto store = storage::OpenStore(locator);
    if (!store.ok()) return store.status();
    storage::SagaFilter filter;
    filter.limit = 1 << 30;
    auto list = (*store)->ListSagas(filter);
    if (!list.ok()) return list.status();
    for (const auto& sum : *list) {
      if (!seen.insert(sum.saga_id).second) continue;
      auto rec = (*store)->LoadSaga(sum.saga_id);
      if (!rec.ok()) return rec.status();
      auto effects = (*store)->ListEffects(sum.saga_id);
      if (!effects.ok()) return effects.status();
      for (auto& e : *effects) data.journal_effects.push_back(std::move(e));
      data.sagas.push_back(std::move(*rec));
    }
  }
  if (!audit_file.empty()) {
    auto writes = ReadJournalAudit(audit_file);
    if (!writes.ok()) return writes.status();
    data.journal_writes = std::move(*writes);
  }
  for (const auto& path : ledgers) {
    auto ledger = travel::Ledger::Open(path, /*create=*/false);
    if (!ledger.ok()) return Status::NotFound("ledger " + path + ": " + ledger.status().message());
    auto effects = (*ledger)->Effects();
    if (!effects.ok()) return effects.status();
    for (auto& e : *effects) data.effects.push_back(std::move(e));
    auto jobs = (*ledger)->Jobs();
    if (!jobs.ok()) return jobs.status();
    for (auto& j : *jobs) data.jobs.push_back(std::move(j));
  }
  if (!acked_file.empty()) {
    std::ifstream in(acked_file);
    if (!in) return Status::NotFound("acked file " + acked_file + ": cannot be read");
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty()) continue;
      std::istringstream fields(line);
      AckedSaga a;
      fields >> a.saga_id >> a.intent_key;
      if (a.saga_id.empty()) {
        return Status::InvalidArgument(acked_file + ":" + std::to_string(n) +
                                       ": expected SAGA_ID INTENT_KEY");
      }
      data.acked.push_back(std::move(a));
    }
  }
  return data;
}

Status AppendAcked(const std::string& acked_file, const AckedSaga& acked) {
  std::ofstream out(acked_file, std::ios::app);
  if (!out) return Status::Internal("acked file " + acked_file + ": cannot be opened");
  out << acked.saga_id << " " << acked.intent_key << "\n";
  out.flush();
  if (!out) return Status::Internal("acked file " + acked_file + ": write failed");
  return Status::Ok();
}

}  // namespace idem::chaos
