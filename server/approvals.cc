// The approval resource: commits waiting for a person, and their decisions.

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "preview_commit/phase.h"
#include "preview_commit/token.h"
#include "preview_commit/two_phase.h"
#include "saga/engine.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/auth.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"

namespace idem::server {
namespace {

// Token errors: forged and tampered 403 (one answer for all), expired or
// mis-bound 403 with their own types, a step no longer waiting 409.
void TokenProblem(HttpResponse& res, const Status& s) {
  const std::string& m = s.message();
  if (s.code() == Code::kConflict && m.rfind(preview_commit::kAlreadyCountedMessage, 0) == 0) {
    return Problem(res, 409, "already-decided", "Already decided by this person", m);
  }
  if (s.code() == Code::kFailedPrecondition &&
      m.rfind(preview_commit::kRoleMissingMessage, 0) == 0) {
    return Problem(res, 403, "role-missing", "Forbidden", m);
  }
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

bool Holds(const Principal& p, const std::string& role) {
  return std::find(p.roles.begin(), p.roles.end(), role) != p.roles.end();
}

// The policy's rule of the commit `step` waits for, when it asks a role.
std::optional<preview_commit::PolicyDemand> AskedRole(const storage::StepRecord& step) {
  auto phase = preview_commit::PhaseRecord::FromJson(step.phase);
  if (!phase || !phase->policy || !phase->policy->pass.empty()) return std::nullopt;
  return phase->policy;
}

// Why `p` may not decide on the commit of `step` in `saga`, or "".
std::string WhyNot(const ServerContext& ctx, const Principal& p, const storage::SagaRecord& saga,
                   const storage::StepRecord& step) {
  if (ctx.auth->enabled() && OwnerOf(saga.summary.intent_key) == p.name) {
    return p.name +
           " requested this saga: the requester never counts toward its approval; "
           "another person decides";
  }
  auto policy = AskedRole(step);
  if (!policy) {
    return Holds(p, kRoleApprover) || !ctx.auth->enabled()
               ? ""
               : "this commit needs the role approver; " + p.name + " holds none";
  }
  if (ctx.auth->enabled() && !Holds(p, policy->role)) {
    return "this commit needs " + std::to_string(policy->quorum) + " distinct " + policy->role +
           " approval(s); " + p.name + " does not hold the role " + policy->role;
  }
  auto phase = preview_commit::PhaseRecord::FromJson(step.phase);
  for (const auto& a : phase->approvals) {
    if (a.by == p.name) {
      return p.name + " already approved this commit at " + FormatTimeMs(a.at_ms) +
             "; another person decides";
    }
  }
  return "";
}

}  // namespace

Json MayDecide(const ServerContext& ctx, const Principal& p, const PendingApproval& a) {
  std::string why = WhyNot(ctx, p, a.saga, a.step);
  Json out = {{"may_decide", why.empty()}};
  if (!why.empty()) out["why_not"] = why;
  return out;
}

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

const Principal* Decider(const ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Identify(req);
  if (p != nullptr && MayDecideApprovals(*p)) return p;
  return ctx.auth->Authorize(req, res, {kRoleApprover});  // the 401, or the 403 naming the role
}

void ListApprovals(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = Decider(ctx, req, res);
  if (p == nullptr) return;
  auto pending = ListPendingApprovals(ctx);
  if (!pending.ok()) return ProblemFor(res, pending.status());
  Json out = Json::array();
  for (auto& a : *pending) {
    a.view.update(MayDecide(ctx, *p, a));
    out.push_back(std::move(a.view));
  }
  SendJson(res, 200, {{"approvals", out}});
}

void DecideApproval(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, bool approve) {
  const Principal* p = Decider(ctx, req, res);
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
                   "a caller cannot decide on a commit of its own saga (" + p->name +
                       " requested it: the requester never counts toward its approval)");
  }
  // The role the commit needs: its policy's rule, else approver.
  std::optional<preview_commit::PolicyDemand> policy;
  for (const auto& st : rec->steps) {
    if (st.step_id == claims->step_id) policy = AskedRole(st);
  }
  if (ctx.auth->enabled()) {
    const std::string role = policy ? policy->role : kRoleApprover;
    if (!Holds(*p, role)) {
      return Problem(res, 403, policy ? "role-missing" : "forbidden", "Forbidden",
                     policy ? std::string(preview_commit::kRoleMissingMessage) + role + ": " +
                                  p->name + " does not hold it (the commit needs " +
                                  std::to_string(policy->quorum) + " distinct " + role +
                                  " approval(s))"
                            : "this operation needs the role approver");
    }
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
  d.roles = p->roles;
  d.any_role = !ctx.auth->enabled();
  auto out = ctx.engine->Decide(token, d);
  ctx.pool->EndDrive(claims->saga_id);
  if (!out.ok()) return TokenProblem(res, out.status());
  SendSaga(ctx, res, 200, *out);
}

}  // namespace idem::server
