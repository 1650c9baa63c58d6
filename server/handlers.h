#pragma once
// The API's handlers, grouped by resource, one file each: sagas
// (sagas.cc), specs (specs.cc), approvals (approvals.cc), health and
// metrics (health.cc). They read and write the server's own HttpRequest /
// HttpResponse (server/http.h) and know no HTTP library; server/routes.cc
// maps paths to them. Every answer follows server/openapi.json.
//
// Thread safety: handlers run on the HTTP threads, many at once; `ctx` is
// shared and its parts are thread-safe.

#include "server/context.h"
#include "server/http.h"

namespace idem::server {

// ---- sagas (sagas.cc)

/// POST /v1/sagas: validates the body and its spec (parsed once), then
/// submits it under the caller's Idempotency-Key.
void PostSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /v1/sagas/{id}
void GetSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /v1/sagas?status=S&limit=N
void ListSagas(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);

// ---- operator endpoints (control.cc)

/// POST /v1/sagas/{id}/cancel {reason?}: Engine::Cancel (agent: its own
/// saga; operator: any).
void CancelSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/sagas/{id}/pause {reason?}: Engine::Pause (operator).
void PauseSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/sagas/{id}/resume {reason?}: Engine::Resume (operator).
void ResumeSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/sagas/{id}/resolve {step, decision, result?, note?}:
/// Engine::Resolve (operator).
void ResolveSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);

// ---- open sagas (open_sagas.cc): steps appended one call at a time

/// POST /v1/open-sagas: Engine::Begin (agent).
void PostOpenSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/sagas/{id}/calls: Engine::Call, `Prefer: wait=N` (agent: its own; operator).
void PostCall(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /v1/sagas/{id}/calls/{call_id}: the recorded answer, calling nothing.
void GetCall(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/sagas/{id}/commit {decision?}: Engine::Commit.
void CommitOpenSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/sagas/{id}/rollback {reason?}: Engine::Rollback, `Prefer: wait=N`.
void RollbackOpenSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);

// ---- specs (specs.cc)

/// PUT /v1/specs/{name}
void PutSpec(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /v1/specs
void ListSpecs(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /v1/specs/{name}?version=N
void GetSpec(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// The 403 problem for a spec of another caller that is not shared.
void NotShared(HttpResponse& res, const std::string& name);

// ---- approvals (approvals.cc)

/// A commit waiting for a person: its saga, its step and the approval's
/// view (ApprovalView + requested_by, spec), as GET /v1/approvals lists it.
struct PendingApproval {
  storage::SagaRecord saga;
  storage::StepRecord step;
  Json view;
};
/// Every commit waiting for a person (sagas newest first).
Result<std::vector<PendingApproval>> ListPendingApprovals(ServerContext& ctx);
/// Whether `p` may decide on `a` now, for the lists:
/// {"may_decide": bool, "why_not": "..."} (why_not only when refused): the
/// role the commit needs (its policy's rule, else `approver`), not the
/// requester, not one who already decided.
Json MayDecide(const ServerContext& ctx, const Principal& p, const PendingApproval& a);
/// GET /v1/approvals
void ListApprovals(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// POST /v1/approvals/{token}/approve (approve) or /reject.
void DecideApproval(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, bool approve);

// ---- health and metrics (health.cc)

/// GET /healthz
void Healthz(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /readyz: the store answers and the server is not stopping.
void Readyz(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
/// GET /metrics (Prometheus text format 0.0.4)
void MetricsPage(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);

}  // namespace idem::server
