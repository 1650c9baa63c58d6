#include "server/resources.h"

#include <algorithm>
#include <utility>

#include "saga/approval_rights.h"
#include "saga/open_saga.h"
#include "saga/views.h"
#include "server/problem.h"

namespace idem::server {

std::string OwnerOf(const std::string& intent_key) { return IntentKeyOwner(intent_key); }

std::string ClientKeyOf(const std::string& intent_key) {
  size_t colon = intent_key.find(':');
  return colon == std::string::npos ? intent_key : intent_key.substr(colon + 1);
}

Json SummaryView(const storage::SagaSummary& s) {
  Json out = {{"saga_id", s.saga_id},
              {"intent_key", ClientKeyOf(s.intent_key)},
              {"spec", s.spec_name},
              {"state", s.state},
              {"reason", s.reason},
              {"created_at", FormatTimeMs(s.created_ms)},
              {"updated_at", FormatTimeMs(s.updated_ms)}};
  if (auto code = SagaParkCode(s)) out["park_code"] = *code;
  AddSpecRef(s, &out);
  return out;
}

Json SagaView(const storage::SagaRecord& rec, const std::vector<storage::EffectRecord>& effects) {
  Json out = SummaryView(rec.summary);
  AddPruned(rec.summary, &out);  // LoadSaga reads it, ListSagas does not
  Json steps = Json::array();
  for (const auto& st : rec.steps) steps.push_back(StepView(st));
  Json effs = Json::array();
  for (const auto& e : effects) effs.push_back(EffectView(e));
  out["input"] = rec.input;
  out["steps"] = std::move(steps);
  out["effects"] = std::move(effs);
  return out;
}

Json SpecView(const SpecVersion& v, bool with_doc) {
  Json out = {{"name", v.name},
              {"version", v.version},
              {"fingerprint", v.fingerprint},
              {"created_at", FormatTimeMs(v.created_ms)},
              {"created_by", v.created_by}};
  if (with_doc) out["spec"] = v.doc;
  return out;
}

bool HasRole(const Principal& p, const char* role) {
  return std::find(p.roles.begin(), p.roles.end(), role) != p.roles.end();
}

std::optional<storage::SagaRecord> ActOnSaga(const ServerContext& ctx, const Principal& p,
                                             const std::string& id, HttpResponse& res) {
  if (!HasRole(p, kRoleOperator)) return OwnedSaga(ctx, p, id, res);
  return AnySaga(ctx, id, res);
}

void SendSaga(const ServerContext& ctx, HttpResponse& res, int status,
              const storage::SagaRecord& rec) {
  auto effects = ctx.store->ListEffects(rec.summary.saga_id);
  if (!effects.ok()) return ProblemFor(res, effects.status());
  auto journal = ctx.store->ReadJournal(rec.summary.saga_id);
  if (!journal.ok()) return ProblemFor(res, journal.status());
  Json view = SagaView(rec, *effects);
  // The model decision of the submission, and an open saga's calls in order
  // with theirs (saga/open_saga.h).
  view["decision"] = SubmissionDecision(*journal);
  if (IsOpenPlan(rec.spec)) view["calls"] = OpenCallsView(rec, *journal);
  SendJson(res, status, view);
}

std::optional<storage::SagaRecord> AnySaga(const ServerContext& ctx, const std::string& id,
                                           HttpResponse& res) {
  auto rec = ctx.store->LoadSaga(id);
  if (!rec.ok()) {
    if (rec.status().code() == Code::kNotFound) {
      Problem(res, 404, "not-found", "Not found", "no saga " + id);
    } else {
      ProblemFor(res, rec.status());
    }
    return std::nullopt;
  }
  return std::move(rec).value();
}

std::optional<storage::SagaRecord> OwnedSaga(const ServerContext& ctx, const Principal& p,
                                             const std::string& id, HttpResponse& res) {
  auto rec = ctx.store->LoadSaga(id);
  if (!rec.ok() && rec.status().code() != Code::kNotFound) {
    ProblemFor(res, rec.status());
    return std::nullopt;
  }
  if (!rec.ok() || OwnerOf(rec->summary.intent_key) != p.name) {
    Problem(res, 404, "not-found", "Not found", "no saga " + id);
    return std::nullopt;
  }
  return std::move(rec).value();
}

}  // namespace idem::server
