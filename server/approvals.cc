// The approval resource: commits waiting for a person, and their decisions.

#include <string>
#include <utility>

#include "preview_commit/phase.h"
#include "preview_commit/token.h"
#include "preview_commit/two_phase.h"
#include "saga/approval_rights.h"
#include "saga/engine.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/auth.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"

#include "common/principal_name.h"

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
  if (s.code() == Code::kFailedPrecondition && m.rfind(kSelfApprovalMessage, 0) == 0) {
    return Problem(res, 403, "self-approval", "Forbidden", m);
  }
  if (s.code() == Code::kFailedPrecondition && m.rfind(kUnauthenticatedMessage, 0) == 0) {
    return Problem(res, 403, "authentication-required", "Forbidden",
                   m + " (start the server with --auth FILE)");
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

// The decision `p` would make: its name and roles, authenticated unless the
// server runs without auth (then nobody in particular, with every role).
ApprovalDecision DecisionOf(const ServerContext& ctx, const Principal& p) {
  ApprovalDecision d;
  d.who = p.name;
  d.roles = p.roles;
  d.any_role = !ctx.auth->enabled();
  d.authenticated = ctx.auth->enabled();
  return d;
}

// Why `p` may not decide on the commit of `step` in `saga`, or "": the
// engine's rules (saga/approval_rights.h), and under a policy a person who
// already approved this commit.
std::string WhyNot(const ServerContext& ctx, const Principal& p, const storage::SagaRecord& saga,
                   const storage::StepRecord& step) {
  Status s = CheckDecider(saga, step, DecisionOf(ctx, p));
  if (!s.ok()) return s.message();
  auto phase = preview_commit::PhaseRecord::FromJson(step.phase);
  if (!phase || !phase->policy) return "";
  for (const auto& a : phase->approvals) {
    if (SameName(a.by, p.name)) {
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
      // The caller of an open saga's call, else the saga's owner.
      const std::vector<std::string> requesters = Requesters(*rec, st.step_id);
      (*view)["requested_by"] = requesters.empty() ? "" : requesters.back();
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
  // Who may decide (the role, the requester) is the engine's to check, for
  // every surface alike (saga/approval_rights.h).
  if (!ctx.pool->BeginDrive(claims->saga_id)) {
    res.SetHeader("Retry-After", "1");
    return Problem(res, 409, "saga-busy", "Saga is being driven",
                   "the saga is busy; decide again in a moment");
  }
  ApprovalDecision d = DecisionOf(ctx, *p);
  d.approve = approve;
  d.note = note;
  auto out = ctx.engine->Decide(token, d);
  ctx.pool->EndDrive(claims->saga_id);
  if (!out.ok()) return TokenProblem(res, out.status());
  SendSaga(ctx, res, 200, *out);
}

}  // namespace idem::server
