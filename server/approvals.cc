// The approval resource: commits waiting for a person, and their decisions.

#include <string>
#include <utility>

#include "preview_commit/token.h"
#include "saga/engine.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"

namespace idem::server {
namespace {

// Token errors: forged and tampered 403 (one answer for all), expired or
// mis-bound 403 with their own types, a step no longer waiting 409.
void TokenProblem(HttpResponse& res, const Status& s) {
  const std::string& m = s.message();
  if (s.code() == Code::kInvalidArgument && m == preview_commit::kInvalidTokenMessage) {
    return Problem(res, 403, "invalid-commit-token", "Invalid commit token", m);
  }
  if (s.code() == Code::kFailedPrecondition) {
    if (m == preview_commit::kExpiredTokenMessage) {
      return Problem(res, 403, "commit-token-expired", "Commit token expired", m);
    }
    if (m == preview_commit::kMismatchedTokenMessage ||
        m == preview_commit::kNotYetValidTokenMessage) {
      return Problem(res, 403, "commit-token-mismatch", "Commit token refused", m);
    }
    return Problem(res, 409, "approval-not-pending", "Approval not pending", m);
  }
  ProblemFor(res, s);
}

}  // namespace

Result<std::vector<PendingApproval>> ListPendingApprovals(ServerContext& ctx) {
  storage::SagaFilter f;
  f.states = {SagaStateName(SagaState::kAwaitingApproval)};
  f.limit = 100'000;
  auto list = ctx.store->ListSagas(f);
  if (!list.ok()) return list.status();
  std::vector<PendingApproval> out;
  for (const auto& sum : *list) {
    auto rec = ctx.store->LoadSaga(sum.saga_id);
    if (!rec.ok()) return rec.status();
    for (const auto& st : rec->steps) {
      auto view = ApprovalView(sum.saga_id, st);
      if (!view) continue;
      (*view)["requested_by"] = OwnerOf(sum.intent_key);
      (*view)["spec"] = sum.spec_name;
      out.push_back({*rec, st, std::move(*view)});
    }
  }
  return out;
}

void ListApprovals(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  if (ctx.auth->Authorize(req, res, {kRoleApprover}) == nullptr) return;
  auto pending = ListPendingApprovals(ctx);
  if (!pending.ok()) return ProblemFor(res, pending.status());
  Json out = Json::array();
  for (auto& a : *pending) out.push_back(std::move(a.view));
  SendJson(res, 200, {{"approvals", out}});
}

void DecideApproval(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, bool approve) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleApprover});
  if (p == nullptr) return;
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth, Json::object());
  if (!body) return;
  const char* field = approve ? "note" : "reason";
  if (!body->is_object()) {
    return Problem(res, 400, "invalid-request", "Invalid request", "body: expected an object");
  }
  for (const auto& [k, v] : body->items()) {
    if (k != field || !v.is_string()) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     std::string("body: expected {\"") + field + "\": \"...\"}");
    }
  }
  const std::string note = body->value(field, "");
  if (!approve && note.empty()) {
    return Problem(res, 400, "invalid-request", "Invalid request",
                   "reason: required to reject a commit");
  }
  const preview_commit::TokenSigner* signer = ctx.options->signer;
  if (signer == nullptr) {
    return Problem(res, 503, "approvals-unavailable", "Approvals unavailable",
                   "the server has no commit-token keys");
  }
  const std::string token = req.matches[1];
  auto claims = signer->Open(token);
  if (!claims.ok()) return TokenProblem(res, claims.status());
  auto rec = ctx.store->LoadSaga(claims->saga_id);
  if (!rec.ok()) return TokenProblem(res, rec.status());
  if (ctx.auth->enabled() && OwnerOf(rec->summary.intent_key) == p->name) {
    return Problem(res, 403, "self-approval", "Forbidden",
                   "a caller cannot decide on a commit of its own saga");
  }
  if (!ctx.pool->BeginDrive(claims->saga_id)) {
    res.SetHeader("Retry-After", "1");
    return Problem(res, 409, "saga-busy", "Saga is being driven",
                   "the saga is busy; decide again in a moment");
  }
  ApprovalDecision d;
  d.approve = approve;
  d.who = p->name;
  d.note = note;
  auto out = ctx.engine->Decide(token, d);
  ctx.pool->EndDrive(claims->saga_id);
  if (!out.ok()) return TokenProblem(res, out.status());
  SendSaga(ctx, res, 200, *out);
}

}  // namespace idem::server
